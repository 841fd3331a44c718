// tokenizer.json's JSON, parsed in time linear in its size.
#include "json_reader.h"

namespace fsdp::tokenizers::detail {

namespace {

// The deepest nesting of objects and lists in `json`, or kMaxJsonDepth + 1
// as soon as it goes deeper (a brace or bracket inside a string does not
// count). Malformed JSON is left to the parser.
int nesting_depth(std::string_view json) {
  int depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < json.size(); ++i) {
    const char c = json[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      deepest = std::max(deepest, ++depth);
      if (deepest > kMaxJsonDepth) return deepest;
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return deepest;
}

}  // namespace

Json parse_json(std::string_view json, const std::string& source) {
  // The nesting first: the parser keeps a stack entry per level.
  if (nesting_depth(json) > kMaxJsonDepth) {
    throw ConfigError("tokenizer: " + source + ": nests objects and lists more than " + std::to_string(kMaxJsonDepth) +
                      " deep (expected a tokenizer.json; real ones nest about 6 deep)");
  }
  try {
    return Json::parse(json);  // no callback: see json_reader.h
  } catch (const Json::exception& e) {  // parse_error, or out_of_range for a number too big for a double
    throw ConfigError("tokenizer: " + source + ": not valid JSON: " + e.what() + " (expected a tokenizer.json)");
  }
}

}  // namespace fsdp::tokenizers::detail
