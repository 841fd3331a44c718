// The index of both formats: its records, each encoded and decoded here
// (docs/checkpoint-format.md). Checksums and dtype names: checksums.cpp;
// the bounded JSON pass: json_budget.cpp.
#include "fsdp/formats/format.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <regex>
#include <set>

#include "fsdp/error.h"
#include "fsdp/text/bytes_json.h"

namespace fsdp::formats {

using Json = nlohmann::ordered_json;

namespace {

constexpr int64_t kMaxDims = 16;
constexpr int64_t kMaxDim = int64_t{1} << 40;
constexpr int64_t kMaxNumel = int64_t{1} << 48;

[[noreturn]] void bad(const std::string& where, const std::string& what) {
  throw ConfigError("checkpoint: " + where + ": " + what);
}

}  // namespace

// ---------------------------------------------------------------------------
// Records <-> JSON: each record's encode and decode, side by side.

bool safe_file_name(const std::string& f) {
  static const std::regex ok("[A-Za-z0-9_][A-Za-z0-9._-]{0,200}");
  return std::regex_match(f, ok);
}

namespace {

int64_t int_field(const Json& j, const char* name, const std::string& where, int64_t lo, int64_t hi) {
  if (!j.contains(name) || !j.at(name).is_number_integer()) bad(where, std::string("field '") + name + "' must be an integer");
  const int64_t v = j.at(name).get<int64_t>();
  if (v < lo || v > hi) {
    bad(where, std::string("field '") + name + "' = " + std::to_string(v) + " is out of range [" + std::to_string(lo) +
                   ", " + std::to_string(hi) + "]");
  }
  return v;
}

std::string str_field(const Json& j, const char* name, const std::string& where) {
  if (!j.contains(name) || !j.at(name).is_string()) bad(where, std::string("field '") + name + "' must be a string");
  return j.at(name).get<std::string>();
}

const Json& list_field(const Json& j, const char* name, const std::string& where) {
  if (!j.contains(name) || !j.at(name).is_array()) bad(where, std::string("field '") + name + "' must be a list");
  return j.at(name);
}

std::vector<int64_t> int_list(const Json& j, const char* name, const std::string& where, int64_t max_value) {
  const Json& a = list_field(j, name, where);
  if (static_cast<int64_t>(a.size()) > kMaxDims) bad(where, std::string("field '") + name + "' has too many dimensions");
  std::vector<int64_t> out;
  for (const auto& x : a) {
    if (!x.is_number_integer()) bad(where, std::string("field '") + name + "' must hold integers");
    const int64_t v = x.get<int64_t>();
    if (v < 0 || v > max_value) bad(where, std::string("field '") + name + "' holds " + std::to_string(v) + ", out of range");
    out.push_back(v);
  }
  return out;
}

std::vector<std::string> str_list(const Json& j, const char* name, const std::string& where) {
  std::vector<std::string> out;
  for (const auto& x : list_field(j, name, where)) {
    if (!x.is_string()) bad(where, std::string("field '") + name + "' must hold strings");
    out.push_back(x.get<std::string>());
  }
  return out;
}

int64_t checked_numel(const std::vector<int64_t>& shape, const std::string& where) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d != 0 && n > kMaxNumel / d) bad(where, "the shape's element count is too large");
    n *= d;
  }
  return n;
}

// Entry types.

constexpr std::pair<EntryType, const char*> kEntryTypes[] = {
    {EntryType::kModel, "model"}, {EntryType::kOptimizer, "optimizer"}, {EntryType::kInt, "int"},
    {EntryType::kFloat, "float"}, {EntryType::kBool, "bool"},           {EntryType::kStr, "str"},
    {EntryType::kTensor, "tensor"}};

EntryType parse_entry_type(const std::string& name, const std::string& where) {
  for (const auto& [t, n] : kEntryTypes) {
    if (name == n) return t;
  }
  bad(where, "unknown entry type '" + name + "'");
}

// Parameter groups: [{"params": [...], "options": {name: number}}].

Json encode_param_groups(const std::vector<ParamGroup>& groups) {
  Json a = Json::array();
  for (const auto& g : groups) a.push_back(Json{{"params", g.params}, {"options", g.options}});
  return a;
}

std::vector<ParamGroup> decode_param_groups(const Json& x, const std::string& where) {
  std::vector<ParamGroup> out;
  for (const auto& g : list_field(x, "param_groups", where)) {
    if (!g.is_object()) bad(where, "a parameter group must be an object");
    ParamGroup pg;
    pg.params = str_list(g, "params", where);
    if (!g.contains("options") || !g["options"].is_object()) bad(where, "a parameter group needs 'options'");
    for (const auto& [k, v] : g["options"].items()) {
      if (!v.is_number()) bad(where, "option '" + k + "' must be a number");
      pg.options[k] = v.get<double>();
    }
    out.push_back(std::move(pg));
  }
  return out;
}

// Scalar values: a float that is not finite is written as a string.

Json encode_value(const EntryRecord& e) {
  switch (e.type) {
    case EntryType::kInt: return std::get<int64_t>(e.value);
    case EntryType::kBool: return std::get<bool>(e.value);
    case EntryType::kStr: return ::fsdp::text::escape_bytes(std::get<std::string>(e.value));  // bytes, losslessly
    case EntryType::kFloat: {
      const double v = std::get<double>(e.value);
      if (std::isfinite(v)) return v;
      return std::isnan(v) ? "nan" : v > 0 ? "inf" : "-inf";
    }
    default: return Json();
  }
}

std::variant<int64_t, double, bool, std::string> decode_value(const Json& x, EntryType type, const std::string& where) {
  const Json* v = x.contains("value") ? &x.at("value") : nullptr;
  switch (type) {
    case EntryType::kInt:
      if (!v || !v->is_number_integer() || (v->is_number_unsigned() && v->get<uint64_t>() > INT64_MAX)) {
        bad(where, "'value' must be an integer");
      }
      return v->get<int64_t>();
    case EntryType::kBool:
      if (!v || !v->is_boolean()) bad(where, "'value' must be true or false");
      return v->get<bool>();
    case EntryType::kStr: return ::fsdp::text::unescape_bytes(str_field(x, "value", where));
    case EntryType::kFloat:
      if (v && v->is_number()) return v->get<double>();
      if (v && v->is_string()) {  // "nan", "inf", "-inf"
        const std::string s = v->get<std::string>();
        char* end = nullptr;
        const double d = std::strtod(s.c_str(), &end);
        if (!s.empty() && end == s.c_str() + s.size()) return d;
      }
      bad(where, "'value' must be a number");
    default: return int64_t{0};
  }
}

// Entries.

Json encode_entry(const EntryRecord& e) {
  Json x;
  x["name"] = e.name;
  x["type"] = entry_type_name(e.type);
  if (e.is_state_dict()) x["keys"] = e.keys;
  if (e.type == EntryType::kOptimizer) x["param_groups"] = encode_param_groups(e.param_groups);
  if (e.type == EntryType::kOptimizer && !e.optimizer_class.empty()) x["class"] = e.optimizer_class;
  if (!e.is_state_dict() && e.type != EntryType::kTensor) x["value"] = encode_value(e);
  return x;
}

EntryRecord decode_entry(const Json& x, const std::string& where) {
  if (!x.is_object()) bad(where, "an entry must be an object");
  EntryRecord e;
  e.name = str_field(x, "name", where);
  const std::string ew = where + ", entry '" + e.name + "'";
  e.type = parse_entry_type(str_field(x, "type", where), ew);
  if (e.is_state_dict()) e.keys = str_list(x, "keys", ew);
  if (e.type == EntryType::kOptimizer) e.param_groups = decode_param_groups(x, ew);
  if (e.type == EntryType::kOptimizer && x.contains("class")) e.optimizer_class = str_field(x, "class", ew);
  if (!e.is_state_dict() && e.type != EntryType::kTensor) e.value = decode_value(x, e.type, ew);
  return e;
}

// Chunks, and tensors' dtype and shape.

Json encode_chunk(const Chunk& c) {
  return Json{{"file", c.file}, {"offset", c.offset}, {"nbytes", c.nbytes},
              {"offsets", c.offsets}, {"sizes", c.sizes}, {"crc32", c.crc}};
}

// A chunk of the tensor `t` (its dtype and shape), checked to lie inside it.
Chunk decode_chunk(const Json& c, const TensorEntry& t, const std::string& where) {
  if (!c.is_object()) bad(where, "a chunk must be an object");
  Chunk ch;
  ch.file = str_field(c, "file", where);
  ch.offset = int_field(c, "offset", where, 0, int64_t{1} << 56);
  ch.nbytes = int_field(c, "nbytes", where, 0, int64_t{1} << 56);
  ch.offsets = int_list(c, "offsets", where, kMaxDim);
  ch.sizes = int_list(c, "sizes", where, kMaxDim);
  ch.crc = static_cast<uint32_t>(int_field(c, "crc32", where, 0, 0xffffffffLL));
  if (ch.offsets.size() != t.shape.size() || ch.sizes.size() != t.shape.size()) {
    bad(where, "a chunk's offsets and sizes must have one value per dimension of the shape");
  }
  for (size_t d = 0; d < t.shape.size(); ++d) {
    if (ch.offsets[d] + ch.sizes[d] > t.shape[d]) bad(where, "a chunk lies outside the tensor's shape");
  }
  const int64_t want = checked_numel(ch.sizes, where) * static_cast<int64_t>(c10::elementSize(t.dtype));
  if (want != ch.nbytes) {
    bad(where, "a chunk of " + std::to_string(ch.nbytes) + " bytes does not match its sizes x dtype (" +
                   std::to_string(want) + " bytes)");
  }
  return ch;
}

void encode_tensor_type(Json& x, at::ScalarType dtype, const std::vector<int64_t>& shape) {
  x["dtype"] = dtype_name(dtype);
  x["shape"] = shape;
}

TensorEntry decode_tensor_type(const Json& x, const std::string& where) {
  if (!x.is_object()) bad(where, "must be an object");
  TensorEntry t;
  t.dtype = parse_dtype(str_field(x, "dtype", where), where);
  t.shape = int_list(x, "shape", where, kMaxDim);
  checked_numel(t.shape, where);
  return t;
}

// Tensors of the index: {"dtype", "shape", "chunks": [...]}, their chunks in
// the checkpoint's files (sharded) or records (full).

Json encode_tensor(const TensorEntry& t) {
  Json x;
  encode_tensor_type(x, t.dtype, t.shape);
  Json chunks = Json::array();
  for (const auto& c : t.chunks) chunks.push_back(encode_chunk(c));
  x["chunks"] = std::move(chunks);
  return x;
}

TensorEntry decode_tensor(const Json& x, const Index& ix, const std::string& where) {
  static const std::regex record("data/[0-9]{1,12}");
  TensorEntry t = decode_tensor_type(x, where);
  const Json& chunks = list_field(x, "chunks", where);
  if (chunks.size() > 1000000) bad(where, "too many chunks");
  for (const auto& c : chunks) {
    Chunk ch = decode_chunk(c, t, where);
    if (ix.kind == Index::Kind::kSharded) {
      if (std::find(ix.files.begin(), ix.files.end(), ch.file) == ix.files.end()) {
        bad(where, "chunk file '" + ch.file + "' is not one of the checkpoint's data files");
      }
    } else if (!std::regex_match(ch.file, record)) {
      bad(where, "chunk record '" + ch.file + "' is not a data record of the checkpoint");
    }
    t.chunks.push_back(std::move(ch));
  }
  return t;
}

// The index's header: format, kind, version, world size, save id, files.

void encode_header(Json& j, const Index& index) {
  j["format"] = "fsdp-cpp";
  j["kind"] = index.kind == Index::Kind::kSharded ? "sharded" : "full";
  j["version"] = index.version;
  j["world_size"] = index.world_size;
  j["save_id"] = index.save_id;
  if (index.kind == Index::Kind::kSharded) j["files"] = index.files;
  if (index.has_metadata_crc) j["metadata_crc32"] = index.metadata_crc;
}

Index decode_header(const Json& j, const std::string& where) {
  if (!j.is_object() || !j.contains("format") || j["format"] != "fsdp-cpp") {
    bad(where, "not an fsdp-cpp checkpoint index (no \"format\": \"fsdp-cpp\")");
  }
  Index ix;
  ix.version = static_cast<int>(int_field(j, "version", where, 1, 1 << 30));
  if (ix.version > kVersion) {
    bad(where, "written by a newer fsdp-cpp (format version " + std::to_string(ix.version) +
                   "; this build reads versions up to " + std::to_string(kVersion) + ")");
  }
  const std::string kind = str_field(j, "kind", where);
  if (kind != "full" && kind != "sharded") bad(where, "field 'kind' must be \"full\" or \"sharded\"");
  ix.kind = kind == "sharded" ? Index::Kind::kSharded : Index::Kind::kFull;
  ix.world_size = static_cast<int>(int_field(j, "world_size", where, 1, 1 << 20));
  ix.save_id = str_field(j, "save_id", where);
  if (ix.kind == Index::Kind::kSharded) {
    ix.files = str_list(j, "files", where);
    for (const auto& f : ix.files) {
      if (!safe_file_name(f)) bad(where, "data file name '" + f + "' is not a plain file name inside the checkpoint");
    }
  }
  if (j.contains("metadata_crc32")) {
    ix.metadata_crc = static_cast<uint32_t>(int_field(j, "metadata_crc32", where, 0, 0xffffffffLL));
    ix.has_metadata_crc = true;
  }
  return ix;
}

// The index's own checksum: "crc32:<8 hex digits>" of the compact JSON of
// every other field, in the file's order.
constexpr const char* kChecksumField = "checksum";
std::string index_checksum(const Json& j_without_checksum) {
  const std::string text = ::fsdp::text::json_text(j_without_checksum.dump());  // as the file holds it
  char hex[16];
  std::snprintf(hex, sizeof hex, "%08x", crc32(text.data(), text.size()));
  return std::string("crc32:") + hex;
}

// The index's fields, every one known (a bit flip in a name must not make a
// field, the checksum above all, silently absent), and its checksum, which
// an index written before issue 19 lacks. Returns whether it had one.
bool check_fields_and_checksum(const Json& j, const std::string& where) {
  static const std::vector<std::string> known = {"format", "kind",    "version", "world_size",     "save_id",
                                                 "files",  "entries", "tensors", "metadata_crc32", kChecksumField};
  for (const auto& [key, v] : j.items()) {
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      bad(where, "has an unknown field '" + key + "' (the index is damaged, or from another program)");
    }
  }
  if (!j.contains(kChecksumField)) return false;
  const std::string recorded = str_field(j, kChecksumField, where);
  Json rest = j;
  rest.erase(kChecksumField);
  const std::string computed = index_checksum(rest);
  if (recorded != computed) {
    bad(where, "checksum mismatch: the index records " + recorded + ", its contents have " + computed +
                   " (the index is damaged; nothing in it is trusted)");
  }
  return true;
}

// Every state-dict key and tensor value of the entries has its tensor, and
// every tensor belongs to an entry.
void check_entries_match_tensors(const Index& ix, const std::string& where) {
  std::set<std::string> named;
  for (const auto& e : ix.entries) {
    if (e.is_state_dict()) {
      for (const auto& k : e.keys) named.insert(e.name + "/" + k);
    } else if (e.type == EntryType::kTensor) {
      named.insert(e.name);
    }
  }
  for (const auto& key : named) {
    if (!ix.tensors.count(key)) bad(where, "entry key '" + key + "' has no tensor in 'tensors'");
  }
  for (const auto& key : ix.tensor_order) {
    if (!named.count(key)) bad(where, "tensor '" + key + "' belongs to no entry");
  }
}

Json parse_json(const std::string& text, const std::string& where, const char* what) {
  check_json_budget(text, where, what);
  try {
    return Json::parse(::fsdp::text::json_input(text));  // "\udcXX": a byte (fsdp/text/bytes_json.h)
  } catch (const std::exception& e) {
    bad(where, std::string(what) + " is not valid JSON (" + e.what() + ")");
  }
}

}  // namespace

const char* entry_type_name(EntryType type) {
  for (const auto& [t, n] : kEntryTypes) {
    if (t == type) return n;
  }
  return "?";
}

std::string value_text(const EntryRecord& entry) {
  if (entry.type == EntryType::kStr) return std::get<std::string>(entry.value);
  return encode_value(entry).dump();
}

std::string to_json(const Index& index) {
  Json j;
  encode_header(j, index);
  Json entries = Json::array();
  for (const auto& e : index.entries) entries.push_back(encode_entry(e));
  j["entries"] = std::move(entries);
  Json tensors = Json::object();
  for (const auto& key : index.tensor_order) tensors[key] = encode_tensor(index.tensors.at(key));
  j["tensors"] = std::move(tensors);
  j[kChecksumField] = index_checksum(j);
  return ::fsdp::text::json_text(j.dump(1));  // string values are bytes (fsdp/text/bytes_json.h)
}

Index parse_index(const std::string& text, const std::string& where) {
  const Json j = parse_json(text, where, "the index");
  try {
    if (!j.is_object() || !j.contains("format") || j["format"] != "fsdp-cpp") {
      bad(where, "not an fsdp-cpp checkpoint index (no \"format\": \"fsdp-cpp\")");
    }
    const bool checksummed = check_fields_and_checksum(j, where);  // before anything in it is trusted
    Index ix = decode_header(j, where);
    ix.checksummed = checksummed;
    for (const auto& x : list_field(j, "entries", where)) ix.entries.push_back(decode_entry(x, where));
    if (!j.contains("tensors") || !j["tensors"].is_object()) bad(where, "field 'tensors' must be an object");
    for (const auto& [key, x] : j["tensors"].items()) {
      ix.tensors.emplace(key, decode_tensor(x, ix, where + ", tensor '" + key + "'"));
      ix.tensor_order.push_back(key);
    }
    check_entries_match_tensors(ix, where);
    return ix;
  } catch (const nlohmann::json::exception& e) {
    bad(where, std::string("malformed index (") + e.what() + ")");
  }
}

std::string encode_pieces(const std::vector<PieceRecord>& pieces) {
  Json a = Json::array();
  for (const auto& p : pieces) {
    Json x = encode_chunk(p.chunk);
    x["key"] = p.key;
    x["item"] = {p.item_offset, p.item_length};
    encode_tensor_type(x, p.dtype, p.shape);
    a.push_back(std::move(x));
  }
  return a.dump();
}

std::vector<PieceRecord> decode_pieces(const std::string& text, const std::string& where) {
  const Json a = parse_json(text, where, "the list of pieces");
  try {
    if (!a.is_array()) bad(where, "the pieces must be a list");
    std::vector<PieceRecord> out;
    for (const auto& x : a) {
      PieceRecord p;
      p.key = str_field(x, "key", where);
      const TensorEntry t = decode_tensor_type(x, where + ", tensor '" + p.key + "'");
      p.dtype = t.dtype;
      p.shape = t.shape;
      p.chunk = decode_chunk(x, t, where + ", tensor '" + p.key + "'");
      const std::vector<int64_t> item = int_list(x, "item", where, int64_t{1} << 56);
      if (item.size() != 2) bad(where, "a piece's item must be [offset, length]");
      p.item_offset = item[0];
      p.item_length = item[1];
      out.push_back(std::move(p));
    }
    return out;
  } catch (const nlohmann::json::exception& e) {
    bad(where, std::string("malformed pieces (") + e.what() + ")");
  }
}

void add_piece(Index& index, const PieceRecord& piece) {
  auto it = index.tensors.find(piece.key);
  if (it == index.tensors.end()) {
    it = index.tensors.emplace(piece.key, TensorEntry{piece.dtype, piece.shape, {}}).first;
    index.tensor_order.push_back(piece.key);
  }
  it->second.chunks.push_back(piece.chunk);
}

}  // namespace fsdp::formats
