// Hugging Face's safetensors format: the header's parser and validator, tensor
// reads, and the crash-safe writer (safetensors.h).
#include "fsdp/formats/safetensors.h"

#include <ATen/ATen.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "fsdp/formats/format.h"
#include "fsdp/error.h"

namespace fsdp::formats {

using Json = nlohmann::ordered_json;

namespace {

// The dtypes both sides know, with their rank in the safetensors package's
// Dtype enum (its save_file lays tensors out by that rank, highest first).
struct DtypeName {
  at::ScalarType type;
  const char* name;
  int rank;
};
constexpr DtypeName kDtypes[] = {{at::kBool, "BOOL", 0},  {at::kByte, "U8", 4},    {at::kChar, "I8", 5},
                                 {at::kShort, "I16", 11}, {at::kHalf, "F16", 13},  {at::kBFloat16, "BF16", 14},
                                 {at::kInt, "I32", 15},   {at::kFloat, "F32", 17}, {at::kDouble, "F64", 19},
                                 {at::kLong, "I64", 20}};

// Dtypes of the format (0.8) that fsdp-cpp does not read: LibTorch 1.13 lacks them.
constexpr const char* kOtherDtypes[] = {"F4",          "F6_E2M3",     "F6_E3M2", "F8_E5M2", "F8_E4M3", "F8_E8M0",
                                        "F8_E4M3FNUZ", "F8_E5M2FNUZ", "U16",     "U32",     "U64",     "C64"};

const DtypeName* find_dtype(at::ScalarType t) {
  for (const auto& d : kDtypes) {
    if (d.type == t) return &d;
  }
  return nullptr;
}

constexpr int64_t kMaxDims = 64;
constexpr int64_t kMaxBytes = int64_t{1} << 56;

[[noreturn]] void bad(const std::string& where, const std::string& what) {
  throw ConfigError("safetensors: " + where + ": " + what);
}

uint64_t header_length(std::string_view head) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(head[static_cast<size_t>(i)]);
  return n;
}

bool json_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// A non-negative integer of the header (the Rust reader's usize).
int64_t size_value(const Json& x, const std::string& where, const std::string& field) {
  if (!x.is_number_unsigned()) {  // nlohmann: a non-negative integer
    bad(where, "'" + field + "' must hold non-negative integers, not " + x.dump());
  }
  const uint64_t v = x.get<uint64_t>();
  if (v > static_cast<uint64_t>(kMaxBytes)) bad(where, "'" + field + "' holds " + std::to_string(v) + ", too large");
  return static_cast<int64_t>(v);
}

at::ScalarType parse_dtype_field(const Json& x, const std::string& where) {
  if (!x.is_string()) bad(where, "'dtype' must be a string");
  const std::string name = x.get<std::string>();
  for (const auto& d : kDtypes) {
    if (name == d.name) return d.type;
  }
  for (const char* other : kOtherDtypes) {
    if (name == other) {
      bad(where, "dtype '" + name +
                     "' is not supported by fsdp-cpp (it reads F64, F32, F16, BF16, I64, I32, I16, "
                     "I8, U8 and BOOL)");
    }
  }
  bad(where, "unknown dtype '" + name + "'");
}

SafetensorsTensor parse_tensor(const std::string& name, const Json& x, const std::string& file) {
  const std::string where = file + ", tensor '" + name + "'";
  if (!x.is_object()) bad(where, "its entry must be an object {\"dtype\", \"shape\", \"data_offsets\"}");
  for (const char* f : {"dtype", "shape", "data_offsets"}) {
    if (!x.contains(f)) bad(where, std::string("missing field '") + f + "'");
  }
  SafetensorsTensor t;
  t.name = name;
  t.dtype = parse_dtype_field(x.at("dtype"), where);
  const Json& shape = x.at("shape");
  if (!shape.is_array()) bad(where, "'shape' must be a list");
  if (static_cast<int64_t>(shape.size()) > kMaxDims) bad(where, "'shape' has too many dimensions");
  int64_t nbytes = static_cast<int64_t>(c10::elementSize(t.dtype));
  for (const auto& d : shape) {
    const int64_t v = size_value(d, where, "shape");
    if (v != 0 && nbytes > kMaxBytes / v) bad(where, "the shape's size overflows");
    nbytes *= v;
    t.shape.push_back(v);
  }
  const Json& off = x.at("data_offsets");
  if (!off.is_array() || off.size() != 2) bad(where, "'data_offsets' must be a list of two integers [begin, end]");
  t.begin = size_value(off[0], where, "data_offsets");
  t.end = size_value(off[1], where, "data_offsets");
  if (t.end < t.begin) bad(where, "'data_offsets' end before they begin");
  if (t.end - t.begin != nbytes) {
    bad(where, "its data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) + ") hold " +
                   std::to_string(t.end - t.begin) + " bytes, but dtype " + x.at("dtype").get<std::string>() +
                   " x shape " + shape.dump() + " is " + std::to_string(nbytes) + " bytes");
  }
  return t;
}

// The header's JSON; ConfigError for invalid JSON, for a key given twice in
// an object (which JSON libraries resolve differently), and for a header
// beyond its memory budget (check_json_budget).
Json parse_json(std::string_view text, const std::string& where) {
  std::vector<std::set<std::string>> keys;
  std::string duplicate;
  const Json::parser_callback_t check = [&](int, Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::object_start) keys.emplace_back();
    if (event == Json::parse_event_t::object_end && !keys.empty()) keys.pop_back();
    if (event == Json::parse_event_t::key && !keys.empty() && !keys.back().insert(parsed.get<std::string>()).second &&
        duplicate.empty()) {
      duplicate = parsed.get<std::string>();
    }
    return true;
  };
  check_json_budget(text, where, "the header");
  Json j;
  try {
    j = Json::parse(text.begin(), text.end(), check);
  } catch (const Json::exception& e) {
    bad(where, std::string("the header is not valid JSON: ") + e.what());
  }
  if (!duplicate.empty()) bad(where, "the header has the key '" + duplicate + "' twice");
  return j;
}

at::Tensor empty_like_entry(const SafetensorsTensor& t) {
  return at::empty(t.shape, at::TensorOptions().dtype(t.dtype));
}

// A BOOL tensor's bytes must be 0 or 1 (LibTorch's bool).
void check_bools(const at::Tensor& t, const std::string& where) {
  if (t.scalar_type() == at::kBool && t.numel() > 0 && t.view(at::kByte).gt(1).any().item<bool>()) {
    bad(where, "dtype BOOL, but it holds bytes other than 0 and 1");
  }
}

void check_in_file(const SafetensorsHeader& h, const SafetensorsTensor& t, int64_t file_size,
                   const std::string& where) {
  if (h.data_start + t.end > file_size) {
    bad(where, "tensor '" + t.name + "' needs bytes up to " + std::to_string(h.data_start + t.end) + ", the file has " +
                   std::to_string(file_size) + " (changed since its header was read?)");
  }
}

}  // namespace

const char* safetensors_dtype_name(at::ScalarType dtype) {
  if (const auto* d = find_dtype(dtype)) return d->name;
  throw ConfigError(std::string("safetensors: tensors of dtype ") + c10::toString(dtype) +
                    " cannot be written (expected float32/64, float16, bfloat16, int8/16/32/64, uint8 or bool)");
}

bool looks_like_safetensors(std::string_view head, int64_t file_size) {
  if (head.size() < 9) return false;
  const uint64_t n = header_length(head);
  if (n < 2 || n > static_cast<uint64_t>(kSafetensorsMaxHeader) || static_cast<int64_t>(8 + n) > file_size)
    return false;
  for (size_t i = 8; i < head.size() && i < 8 + n; ++i) {
    if (!json_space(head[i])) return head[i] == '{';
  }
  return false;
}

SafetensorsHeader parse_safetensors(std::string_view head, int64_t file_size, const std::string& where) {
  if (head.size() < 8 || file_size < 8) {
    bad(where, "the file has " + std::to_string(std::min<int64_t>(file_size, static_cast<int64_t>(head.size()))) +
                   " bytes, fewer than the 8 of the header length");
  }
  const uint64_t n = header_length(head);
  if (n > static_cast<uint64_t>(kSafetensorsMaxHeader)) {
    bad(where, "the header length " + std::to_string(n) + " is over the format's limit of 100 MB");
  }
  const auto end = static_cast<int64_t>(8 + n);
  if (end > file_size) {
    bad(where, "the header length " + std::to_string(n) + " runs past the end of the file (" +
                   std::to_string(file_size) + " bytes): the file is truncated or not safetensors");
  }
  if (static_cast<int64_t>(head.size()) < end) bad(where, "the header is truncated");
  const Json j = parse_json(head.substr(8, n), where);
  if (!j.is_object()) bad(where, "the header must be a JSON object {name: tensor}, not " + std::string(j.type_name()));
  SafetensorsHeader h;
  h.data_start = end;
  for (const auto& [key, value] : j.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) bad(where, "'__metadata__' must be an object of strings");
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string()) bad(where, "'__metadata__' entry '" + mk + "' must be a string, not " + mv.dump());
        h.metadata[mk] = mv.get<std::string>();
      }
      continue;
    }
    h.tensors.push_back(parse_tensor(key, value, where));
  }
  // As the Rust reader: by offsets, each tensor starting where the last one
  // ended, the first at 0, the last at the end of the file.
  std::stable_sort(h.tensors.begin(), h.tensors.end(), [](const auto& a, const auto& b) {
    return std::make_pair(a.begin, a.end) < std::make_pair(b.begin, b.end);
  });
  int64_t at = 0;
  for (const auto& t : h.tensors) {
    if (t.begin != at) {
      bad(where, "tensor '" + t.name + "' starts at byte " + std::to_string(t.begin) + " of the data, expected " +
                     std::to_string(at) +
                     (t.begin < at ? " (it overlaps the tensor before it)" : " (a hole before it)"));
    }
    at = t.end;
  }
  if (end + at != file_size) {
    bad(where, "the tensors' data ends at byte " + std::to_string(end + at) + " but the file has " +
                   std::to_string(file_size) + " bytes" +
                   (end + at > file_size ? " (the file is truncated)" : " (bytes no tensor covers)"));
  }
  return h;
}

SafetensorsHeader read_safetensors_header(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) bad(path, std::string("cannot open it: ") + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) bad(path, "not a regular file");
  const auto size = static_cast<int64_t>(st.st_size);
  std::string head = read_range(path, 0, std::min<int64_t>(size, 8));
  if (head.size() == 8) {
    const uint64_t n = header_length(head);
    if (n <= static_cast<uint64_t>(kSafetensorsMaxHeader) && static_cast<int64_t>(8 + n) <= size) {
      head = read_range(path, 0, static_cast<int64_t>(8 + n));
    }
  }
  return parse_safetensors(head, size, path);
}

at::Tensor read_safetensors_tensor(const std::string& path, const SafetensorsHeader& h, const SafetensorsTensor& t) {
  check_in_file(h, t, file_size(path), path);
  at::Tensor out = empty_like_entry(t);
  if (t.end > t.begin) read_into(path, h.data_start + t.begin, t.end - t.begin, out.data_ptr());
  check_bools(out, path + ", tensor '" + t.name + "'");
  return out;
}

at::Tensor safetensors_tensor_from(std::string_view file, const SafetensorsHeader& h, const SafetensorsTensor& t) {
  check_in_file(h, t, static_cast<int64_t>(file.size()), "(in memory)");
  at::Tensor out = empty_like_entry(t);
  if (t.end > t.begin) {
    std::memcpy(out.data_ptr(), file.data() + h.data_start + t.begin, static_cast<size_t>(t.end - t.begin));
  }
  check_bools(out, "(in memory), tensor '" + t.name + "'");
  return out;
}

SafetensorsWriter::SafetensorsWriter(const std::string& path, std::vector<SafetensorsTensor> tensors,
                                     const std::map<std::string, std::string>& metadata)
    : path_(path), layout_(std::move(tensors)) {
  std::set<std::string> names;
  for (const auto& t : layout_) {
    safetensors_dtype_name(t.dtype);
    if (t.name == "__metadata__") throw ConfigError("safetensors: " + path + ": a tensor cannot be named __metadata__");
    if (!names.insert(t.name).second)
      throw ConfigError("safetensors: " + path + ": tensor '" + t.name + "' given twice");
  }
  std::stable_sort(layout_.begin(), layout_.end(), [](const auto& a, const auto& b) {
    const int ra = find_dtype(a.dtype)->rank, rb = find_dtype(b.dtype)->rank;
    return ra != rb ? ra > rb : a.name < b.name;
  });
  Json header = Json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  int64_t at = 0;
  for (auto& t : layout_) {
    int64_t nbytes = static_cast<int64_t>(c10::elementSize(t.dtype));
    for (auto d : t.shape) nbytes *= d;
    t.begin = at;
    t.end = at += nbytes;
    header[t.name] =
        Json{{"dtype", safetensors_dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {t.begin, t.end}}};
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const Json::exception& e) {
    throw ConfigError("safetensors: " + path + ": a tensor name or metadata entry is not valid UTF-8: " + e.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');  // the buffer starts 8-aligned, as save_file does
  if (static_cast<int64_t>(text.size()) > kSafetensorsMaxHeader) {
    throw ConfigError("safetensors: " + path + ": the header would be over the format's limit of 100 MB");
  }
  unsigned char n[8];
  for (int i = 0; i < 8; ++i) n[i] = static_cast<unsigned char>((static_cast<uint64_t>(text.size()) >> (8 * i)) & 0xff);
  file_ = std::make_unique<AtomicFile>(path);
  file_->write(n, 8);
  file_->write(text.data(), text.size());
}

SafetensorsWriter::~SafetensorsWriter() = default;

void SafetensorsWriter::write(const at::Tensor& tensor) {
  if (next_ >= layout_.size()) throw Error("safetensors: " + path_ + ": more tensors written than planned");
  const SafetensorsTensor& t = layout_[next_];
  if (tensor.scalar_type() != t.dtype || tensor.sizes().vec() != t.shape) {
    throw ConfigError("safetensors: " + path_ + ": tensor '" + t.name + "' was planned as " +
                      safetensors_dtype_name(t.dtype) + " " + c10::str(at::IntArrayRef(t.shape)) + ", got " +
                      c10::toString(tensor.scalar_type()) + " " + c10::str(tensor.sizes()));
  }
  const at::Tensor c = tensor.to(at::kCPU).contiguous();
  if (c.numel() > 0) file_->write(c.data_ptr(), static_cast<size_t>(c.numel()) * c.element_size());
  ++next_;
}

void SafetensorsWriter::commit() {
  if (next_ != layout_.size()) {
    throw Error("safetensors: " + path_ + ": " + std::to_string(next_) + " of " + std::to_string(layout_.size()) +
                " tensors written before commit");
  }
  file_->commit();
}

}  // namespace fsdp::formats
