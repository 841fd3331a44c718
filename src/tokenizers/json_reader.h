// Reading tokenizer.json (private): the JSON parsed with its nesting
// bounded, and a Reader whose accessors name the file and the key (a JSON
// path such as `model.merges[3]`) in each refusal.
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "fsdp/error.h"
#include "regex.h"
#include "unicode.h"

namespace fsdp::tokenizers::detail {

using Json = nlohmann::json;

// The deepest nesting of objects and lists read (real files nest about 6 deep).
constexpr int kMaxJsonDepth = 64;

// `json` parsed; ConfigError naming `source` if it is not JSON or nests
// deeper than kMaxJsonDepth (checked by a scan before the parse). O(size):
// nlohmann's parser with a callback (the other way to bound the depth)
// scans an array's earlier elements at the end of each object in it, which
// made a list of N objects (added_tokens, a template's pieces) O(N^2).
Json parse_json(std::string_view json, const std::string& source);

inline std::string member_path(const std::string& path, const std::string& name) {
  return path.empty() ? name : path + "." + name;
}
inline std::string index_path(const std::string& path, size_t i) { return path + "[" + std::to_string(i) + "]"; }

// The file's JSON with the reading context: each accessor names the key it
// reads in its refusals.
class Reader {
 public:
  explicit Reader(std::string source) : source_(std::move(source)) {}
  const std::string& source() const { return source_; }

  [[noreturn]] void fail(const std::string& path, const std::string& what) const {
    throw ConfigError("tokenizer: " + source_ + ": " + (path.empty() ? std::string("the top level") : path) + ": " +
                      what);
  }

  const Json& object(const Json& j, const std::string& path, const char* expected) const {
    if (!j.is_object()) fail(path, std::string("expected ") + expected + ", got " + describe(j));
    return j;
  }
  // obj[name], or nullptr when absent.
  static const Json* find(const Json& obj, const std::string& name) {
    auto it = obj.find(name);
    return it == obj.end() ? nullptr : &*it;
  }
  // obj[name], which must be there.
  const Json& need(const Json& obj, const std::string& path, const char* name, const char* expected) const {
    const Json* v = find(obj, name);
    if (!v) fail(member_path(path, name), std::string("missing (expected ") + expected + ")");
    return *v;
  }
  std::string string(const Json& j, const std::string& path) const {
    if (!j.is_string()) fail(path, "expected a string, got " + describe(j));
    return j.get<std::string>();
  }
  bool boolean(const Json& j, const std::string& path) const {
    if (!j.is_boolean()) fail(path, "expected true or false, got " + describe(j));
    return j.get<bool>();
  }
  // A boolean that may be absent or null (false then).
  bool flag(const Json& obj, const std::string& path, const char* name) const {
    const Json* v = find(obj, name);
    return v && !v->is_null() && boolean(*v, member_path(path, name));
  }
  uint64_t unsigned_integer(const Json& j, const std::string& path, uint64_t max) const {
    if (!j.is_number_integer() || (j.is_number_integer() && !j.is_number_unsigned() && j.get<int64_t>() < 0) ||
        j.get<uint64_t>() > max) {
      fail(path, "expected an integer from 0 to " + std::to_string(max) + ", got " + describe(j));
    }
    return j.get<uint64_t>();
  }
  // A string of exactly one character (Rust's char).
  char32_t character(const Json& j, const std::string& path) const {
    const std::string s = string(j, path);
    size_t i = 0;
    if (s.empty() || (next_code_point(s, i), i != s.size())) {
      fail(path, "expected one character, got '" + s + "'");
    }
    i = 0;
    return next_code_point(s, i);
  }
  // The "type" of a component, which must be an object.
  std::string type(const Json& j, const std::string& path, const char* what, const char* supported) const {
    object(j, path, (std::string("a ") + what + " object").c_str());
    const Json* t = find(j, "type");
    if (!t) {
      fail(member_path(path, "type"), std::string("missing (expected the ") + what + "'s type: " + supported + ")");
    }
    return string(*t, member_path(path, "type"));
  }
  [[noreturn]] void unknown(const std::string& path, const char* what, const std::string& name,
                            const char* supported) const {
    fail(member_path(path, "type"),
         std::string("unknown ") + what + " type '" + name + "' (supported: " + supported + "; docs/tokenizers.md)");
  }
  // {"String": s} (a literal) or {"Regex": r}, as a Regex.
  Regex pattern(const Json& j, const std::string& path) const {
    object(j, path, "{\"String\": ...} or {\"Regex\": ...}");
    if (const Json* s = find(j, "String")) {
      return Regex::literal(string(*s, member_path(path, "String")), source_ + ": " + member_path(path, "String"));
    }
    if (const Json* r = find(j, "Regex")) {
      return Regex(string(*r, member_path(path, "Regex")), source_ + ": " + member_path(path, "Regex"));
    }
    fail(path, "expected {\"String\": ...} or {\"Regex\": ...}");
  }

  static std::string describe(const Json& j) {
    std::string s = j.dump();
    if (s.size() > 60) s = s.substr(0, 57) + "...";
    return std::string(j.type_name()) + " " + s;
  }

 private:
  std::string source_;
};

}  // namespace fsdp::tokenizers::detail
