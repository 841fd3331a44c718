// Regular expressions for the tokenizers module (private): PCRE2 in UTF and
// UCP mode, for the Oniguruma patterns of tokenizer.json, with the matching
// rules of the Rust library (its Pattern::find_matches over onig's
// find_iter).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace fsdp::tokenizers::detail {

// [begin, end) byte offsets into a text, and whether the range is a match.
struct Span {
  size_t begin = 0, end = 0;
  bool match = false;
};

class Regex {
 public:
  // ConfigError naming `where` (file and key) and PCRE2's message and offset
  // if the pattern does not compile.
  Regex(const std::string& pattern, const std::string& where);
  // A pattern that matches `literal` (escaped), as tokenizers compiles a
  // {"String": ...} pattern.
  static Regex literal(const std::string& literal, const std::string& where);
  ~Regex();
  Regex(Regex&& other) noexcept;
  Regex& operator=(Regex&&) = delete;
  Regex(const Regex&) = delete;

  // The text cut into matches and the gaps between them, in order, covering
  // all of it; an empty text is one empty gap. An empty match right after
  // the previous match is skipped (onig's find_iter), other empty matches
  // are kept. `text` must be valid UTF-8. ConfigError if PCRE2 gives up
  // (its match or depth limit: a pattern that backtracks without end).
  std::vector<Span> find_matches(std::string_view text) const;

  const std::string& pattern() const { return pattern_; }

 private:
  Regex() = default;
  void compile(const std::string& where);
  std::string pattern_, where_;
  void* code_ = nullptr;     // pcre2_code*
  void* context_ = nullptr;  // pcre2_match_context*
};

// Each match of `pattern` in `text` replaced by `content`
// (NormalizedString::replace); nullopt, having allocated at most `limit`
// bytes, as soon as the result would be longer than `limit`.
std::optional<std::string> replace_all(const Regex& pattern, std::string_view text, const std::string& content,
                                       size_t limit = SIZE_MAX);

}  // namespace fsdp::tokenizers::detail
