// fsdp/formats/pickle_writer.h — writes Python pickles, protocol 2, with only
// the opcodes torch.load(weights_only=True) accepts (docs/python-formats.md
// §5): the counterpart of torch_pickle.h's reader, for the pickles of the
// checkpoint formats (a full checkpoint's data.pkl; a DCP checkpoint's items
// and .metadata). It writes what it is told: the caller composes values from
// the opcodes below, in pickle's stack order. Header-only; part of the
// formats module (FSDP-free). Costs: appends to a string in memory.
#pragma once

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace fsdp::formats::pickle {

class Writer {
 public:
  Writer() { out_ += "\x80\x02"; }  // PROTO 2

  // The pickle so far, with STOP appended.
  std::string finish() {
    op('.');
    return std::move(out_);
  }

  // Single opcodes (their pickle names).
  void mark() { op('('); }
  void empty_dict() { op('}'); }
  void empty_list() { op(']'); }
  void empty_tuple() { op(')'); }
  void setitem() { op('s'); }
  void setitems() { op('u'); }  // after mark, key, value, key, value, ...
  void append() { op('a'); }
  void appends() { op('e'); }   // after mark, items...
  void tuple() { op('t'); }     // after mark, items...
  void tuple1() { op('\x85'); }
  void tuple2() { op('\x86'); }
  void tuple3() { op('\x87'); }
  void reduce() { op('R'); }    // callable, argument tuple
  void build() { op('b'); }     // object, state
  void newobj() { op('\x81'); } // class, argument tuple
  void binpersid() { op('Q'); } // persistent id tuple

  void none() { op('N'); }
  void boolean(bool b) { op(b ? '\x88' : '\x89'); }
  void integer(int64_t v) {
    if (v >= INT32_MIN && v <= INT32_MAX) {
      op('J');  // BININT
      u32(static_cast<uint32_t>(static_cast<int32_t>(v)));
    } else {
      op('\x8a');  // LONG1, 8 bytes little-endian two's complement
      out_ += static_cast<char>(8);
      for (int i = 0; i < 8; ++i) out_ += static_cast<char>((static_cast<uint64_t>(v) >> (8 * i)) & 0xff);
    }
  }
  void floating(double v) {
    op('G');  // BINFLOAT, big-endian
    uint64_t bits;
    std::memcpy(&bits, &v, 8);
    for (int i = 7; i >= 0; --i) out_ += static_cast<char>((bits >> (8 * i)) & 0xff);
  }
  void str(const std::string& s) {
    op('X');  // BINUNICODE
    u32(static_cast<uint32_t>(s.size()));
    out_ += s;
  }
  void global(const char* module, const char* name) {
    op('c');
    out_ += module;
    out_ += '\n';
    out_ += name;
    out_ += '\n';
  }
  // A tuple of ints (shapes, strides, offsets).
  void int_tuple(const std::vector<int64_t>& v) {
    mark();
    for (auto x : v) integer(x);
    tuple();
  }

  // A tensor as torch.save writes it: torch._utils._rebuild_tensor_v2 of
  // the persistent storage ('storage', torch.<T>Storage, key, 'cpu', numel),
  // contiguous, offset 0. `storage_class`: pickle::storage_class(dtype).
  void tensor(const std::string& storage_key, const char* storage_class, const std::vector<int64_t>& shape) {
    global("torch._utils", "_rebuild_tensor_v2");
    mark();
    mark();
    str("storage");
    global("torch", storage_class);
    str(storage_key);
    str("cpu");
    int64_t numel = 1;
    for (auto s : shape) numel *= s;
    integer(numel);
    tuple();
    binpersid();
    integer(0);
    int_tuple(shape);
    std::vector<int64_t> strides(shape.size());
    int64_t stride = 1;
    for (size_t i = shape.size(); i-- > 0;) {
      strides[i] = stride;
      stride *= std::max<int64_t>(shape[i], 1);
    }
    int_tuple(strides);
    boolean(false);
    global("collections", "OrderedDict");
    empty_tuple();
    reduce();
    tuple();
    reduce();
  }

 private:
  void op(char c) { out_ += c; }
  void u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) out_ += static_cast<char>((v >> (8 * i)) & 0xff);
  }
  std::string out_;
};

}  // namespace fsdp::formats::pickle
