// Writing DCP checkpoints: items (standalone torch.save zips) and `.metadata`
// (DCP's Metadata as a protocol-2 pickle).
#include <caffe2/serialize/inline_container.h>

#include <algorithm>
#include <exception>
#include <functional>
#include <map>

#include "fsdp/formats/dcp.h"
#include "fsdp/error.h"
#include "fsdp/formats/pickle_writer.h"
#include "fsdp/formats/torch_pickle.h"

namespace fsdp::formats {

WrittenItem write_torch_save(AtomicFile& file, const std::string& file_name, const std::string& pkl,
                             const std::vector<RecordBytes>& records) {
  WrittenItem out;
  out.storage.file = file_name;
  out.storage.offset = file.size();
  // A write error (a full disk) is kept and rethrown once the zip writer is
  // gone: it must not see a failure (it would throw from its destructor).
  std::exception_ptr error;
  {
    caffe2::serialize::PyTorchStreamWriter zip([&](const void* buf, size_t len) -> size_t {
      if (error) return len;
      try {
        file.write(buf, len);
      } catch (...) {
        error = std::current_exception();
      }
      return len;
    });
    zip.writeRecord("data.pkl", pkl.data(), pkl.size());
    zip.writeRecord(".format_version", "1", 1);
    zip.writeRecord(".storage_alignment", "64", 2);
    zip.writeRecord("byteorder", "little", 6);
    for (size_t i = 0; i < records.size(); ++i) {
      zip.writeRecord("data/" + std::to_string(i), records[i].data, static_cast<size_t>(records[i].n));
    }
    zip.writeEndOfFile();
  }
  if (error) std::rethrow_exception(error);
  out.storage.length = file.size() - out.storage.offset;
  if (!records.empty()) {
    // Where the first record's bytes landed: read back from the zip's own headers.
    FullReader item(file.temp_path(), out.storage.offset, out.storage.length);
    out.data_offset = out.storage.offset + item.record_offset("data/0");
  }
  return out;
}

WrittenItem write_dcp_item(AtomicFile& file, const std::string& file_name, const std::string& pkl, const void* data,
                           int64_t n) {
  std::vector<RecordBytes> records;
  if (data) records.push_back({data, n});
  return write_torch_save(file, file_name, pkl, records);
}

namespace {

constexpr const char* kMd = "torch.distributed.checkpoint.metadata";

// A dataclass as Python pickles it: cls.__new__(cls) (NEWOBJ), then BUILD
// with the state dict that `items` fills (key, value pairs between MARK and SETITEMS).
template <class F>
void dataclass(pickle::Writer& w, const char* module, const char* cls, F&& items) {
  w.global(module, cls);
  w.empty_tuple();
  w.newobj();
  w.empty_dict();
  w.mark();
  items();
  w.setitems();
  w.build();
}

void size(pickle::Writer& w, const std::vector<int64_t>& v) {  // torch.Size((...))
  w.global("torch", "Size");
  w.int_tuple(v);
  w.tuple1();
  w.reduce();
}

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size());
  int64_t stride = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    s[i] = stride;
    stride *= std::max<int64_t>(shape[i], 1);
  }
  return s;
}

void properties(pickle::Writer& w, at::ScalarType dtype, const std::vector<int64_t>& shape) {
  // TensorProperties.__getstate__: (dtype, layout, requires_grad, memory_format, pin_memory, strides)
  w.global(kMd, "TensorProperties");
  w.empty_tuple();
  w.newobj();
  w.mark();
  const std::string name = dtype_name(dtype);
  w.global("torch", name.c_str());
  w.global("torch.serialization", "_get_layout");
  w.str("torch.strided");
  w.tuple1();
  w.reduce();
  w.boolean(false);
  w.global("builtins", "getattr");
  w.global(kMd, "_MEM_FORMAT_ENCODING");
  w.str("TORCH_CONTIGUOUS_FORMAT");
  w.tuple2();
  w.reduce();
  w.boolean(false);
  w.int_tuple(contiguous_strides(shape));
  w.tuple();
  w.build();
}

void storage_info(pickle::Writer& w, const DcpStorage& s) {
  dataclass(w, "torch.distributed.checkpoint.filesystem", "_StorageInfo", [&] {
    w.str("relative_path");
    w.str(s.file);
    w.str("offset");
    w.integer(s.offset);
    w.str("length");
    w.integer(s.length);
  });
}

}  // namespace

std::string dcp_metadata_bytes(const DcpMetadata& md) {
  pickle::Writer w;
  dataclass(w, kMd, "Metadata", [&] {
    w.str("state_dict_metadata");
    w.empty_dict();
    w.mark();
    for (const auto& it : md.items) {
      w.str(it.key);
      if (it.is_bytes) {
        w.global(kMd, "BytesStorageMetadata");
        w.empty_tuple();
        w.newobj();
        continue;
      }
      dataclass(w, kMd, "TensorStorageMetadata", [&] {
        w.str("properties");
        properties(w, it.dtype, it.shape);
        w.str("size");
        size(w, it.shape);
        w.str("chunks");
        w.empty_list();
        w.mark();
        for (const auto& c : it.chunks) {
          dataclass(w, kMd, "ChunkStorageMetadata", [&] {
            w.str("offsets");
            size(w, c.offsets);
            w.str("sizes");
            size(w, c.sizes);
          });
        }
        w.appends();
      });
    }
    w.setitems();
    w.str("planner_data");
    w.empty_dict();
    w.mark();
    for (const auto& it : md.items) {
      w.str(it.key);
      w.mark();
      for (size_t i = 0; i < it.path.size(); ++i) {
        if (i < it.path_is_int.size() && it.path_is_int[i]) {
          w.integer(std::stoll(it.path[i]));
        } else {
          w.str(it.path[i]);
        }
      }
      w.tuple();
    }
    w.setitems();
    w.str("storage_data");
    w.empty_dict();
    w.mark();
    for (const auto& it : md.items) {
      auto index = [&](const std::vector<int64_t>* offsets, int64_t i) {
        dataclass(w, kMd, "MetadataIndex", [&] {
          w.str("fqn");
          w.str(it.key);
          if (offsets) {
            w.str("offset");
            size(w, *offsets);
            w.str("index");
            w.integer(i);
          } else {
            w.str("index");
            w.none();
          }
        });
      };
      if (it.is_bytes) {
        index(nullptr, 0);
        storage_info(w, it.bytes);
        continue;
      }
      for (size_t i = 0; i < it.chunks.size(); ++i) {
        index(&it.chunks[i].offsets, static_cast<int64_t>(i));
        storage_info(w, it.chunks[i].storage);
      }
    }
    w.setitems();
    w.str("storage_meta");
    dataclass(w, kMd, "StorageMeta", [&] {
      w.str("checkpoint_id");
      w.none();
      w.str("save_id");
      w.str(md.save_id);
      w.str("load_id");
      w.none();
      w.str("modules");
      w.empty_list();
    });
    w.str("version");
    w.str("1.0.0");
  });
  return w.finish();
}

}  // namespace fsdp::formats

namespace fsdp::formats {

namespace {

std::vector<std::string> split_dots(const std::string& s) {
  std::vector<std::string> out;
  size_t from = 0;
  for (size_t dot; (dot = s.find('.', from)) != std::string::npos; from = dot + 1) out.push_back(s.substr(from, dot - from));
  out.push_back(s.substr(from));
  return out;
}

void scalar(pickle::Writer& w, const EntryRecord& e) {
  switch (e.type) {
    case EntryType::kInt: w.integer(std::get<int64_t>(e.value)); return;
    case EntryType::kFloat: w.floating(std::get<double>(e.value)); return;
    case EntryType::kBool: w.boolean(std::get<bool>(e.value)); return;
    case EntryType::kStr: w.str(std::get<std::string>(e.value)); return;
    default: throw Error("checkpoint: entry '" + e.name + "' is not a scalar value");
  }
}

bool is_scalar(const EntryRecord& e) { return !e.is_state_dict() && e.type != EntryType::kTensor; }

DcpItem bytes_item(std::vector<std::string> path, std::vector<bool> is_int) {
  DcpItem it;
  it.is_bytes = true;
  for (size_t i = 0; i < path.size(); ++i) it.key += (i ? "." : "") + path[i];
  it.path = std::move(path);
  it.path_is_int = std::move(is_int);
  return it;
}

}  // namespace

void set_dcp_key(const std::vector<EntryRecord>& entries, const std::string& tensor_key, DcpItem& item) {
  const auto slash = tensor_key.find('/');
  if (slash != std::string::npos) {
    const std::string entry = tensor_key.substr(0, slash), key = tensor_key.substr(slash + 1);
    for (const auto& e : entries) {
      if (e.name != entry) continue;
      if (e.type == EntryType::kOptimizer) {
        const auto dot = key.rfind('.');
        item.path = {entry, "state", key.substr(0, dot), key.substr(dot + 1)};
      } else {
        item.path = {entry, key};
      }
    }
  }
  if (item.path.empty()) item.path = split_dots(tensor_key);  // a tensor value
  item.path_is_int.assign(item.path.size(), false);
  item.key.clear();
  for (size_t i = 0; i < item.path.size(); ++i) item.key += (i ? "." : "") + item.path[i];
}

std::vector<std::pair<DcpItem, std::string>> dcp_bytes_items(const std::vector<EntryRecord>& entries,
                                                             const GroupOptions& group_options) {
  std::vector<std::pair<DcpItem, std::string>> out;
  for (const auto& e : entries) {
    if (is_scalar(e)) {
      pickle::Writer w;
      scalar(w, e);
      auto path = split_dots(e.name);
      out.emplace_back(bytes_item(path, std::vector<bool>(path.size(), false)), w.finish());
      continue;
    }
    if (e.type != EntryType::kOptimizer) continue;
    for (size_t g = 0; g < e.param_groups.size(); ++g) {
      const ParamGroup& group = e.param_groups[g];
      auto add = [&](const std::string& option, const std::function<void(pickle::Writer&)>& value) {
        pickle::Writer w;
        value(w);
        out.emplace_back(bytes_item({e.name, "param_groups", std::to_string(g), option}, {false, false, true, false}),
                         w.finish());
      };
      for (const auto& [key, write] : group_options(e.optimizer_class, group.options)) add(key, write);
      add("params", [&](pickle::Writer& w) {
        w.empty_list();
        if (group.params.empty()) return;
        w.mark();
        for (const auto& p : group.params) w.str(p);
        w.appends();
      });
    }
  }
  return out;
}

std::string lightning_meta_pickle(const std::vector<EntryRecord>& entries,
                                  const std::map<std::string, at::Tensor>& tensors, std::vector<at::Tensor>& records) {
  // A tree of dicts: a value "a.b" is {"a": {"b": value}}.
  struct Node {
    std::vector<std::pair<std::string, Node>> children;
    const EntryRecord* value = nullptr;
  } root;
  for (const auto& e : entries) {
    if (!is_scalar(e) && !(e.type == EntryType::kTensor && tensors.count(e.name))) continue;
    Node* n = &root;
    for (const auto& part : split_dots(e.name)) {
      auto it = std::find_if(n->children.begin(), n->children.end(), [&](const auto& c) { return c.first == part; });
      if (it == n->children.end()) it = n->children.insert(n->children.end(), {part, Node{}});
      n = &it->second;
    }
    n->value = &e;
  }
  pickle::Writer w;
  records.clear();
  std::function<void(const Node&)> write = [&](const Node& n) {
    if (n.value && n.children.empty()) {
      if (n.value->type != EntryType::kTensor) return scalar(w, *n.value);
      const at::Tensor t = tensors.at(n.value->name).detach().cpu().contiguous();
      w.tensor(std::to_string(records.size()), pickle::storage_class(t.scalar_type()), t.sizes().vec());
      records.push_back(t);
      return;
    }
    w.empty_dict();
    if (n.children.empty()) return;
    w.mark();
    for (const auto& [k, c] : n.children) {
      w.str(k);
      write(c);
    }
    w.setitems();
  };
  write(root);
  return w.finish();
}

}  // namespace fsdp::formats
