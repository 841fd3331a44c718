// PCRE2 for tokenizer.json's patterns. Compiled with PCRE2_UTF | PCRE2_UCP
// (Unicode properties for \s, \p{L}, ...), JIT-compiled where PCRE2 can,
// and matched with bounded effort: a pattern that backtracks without end is
// an error, not a hang.
#include "regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <cctype>
#include <memory>

#include "fsdp/error.h"
#include "unicode.h"

namespace fsdp::tokenizers::detail {

namespace {

constexpr uint32_t kMatchLimit = 10'000'000;  // backtracking steps per match attempt
constexpr uint32_t kDepthLimit = 100'000;
constexpr uint32_t kHeapLimitKiB = 64 * 1024;

// One JIT stack per thread (a JIT stack serves one match at a time), handed
// to PCRE2 through the match context's callback; freed when the thread ends.
struct JitStack {
  pcre2_jit_stack* stack = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, nullptr);
  ~JitStack() {
    if (stack) pcre2_jit_stack_free(stack);
  }
};

pcre2_jit_stack* thread_jit_stack(void*) {
  thread_local JitStack s;
  return s.stack;
}

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  if (pcre2_get_error_message(code, buffer, sizeof(buffer)) < 0) return "error " + std::to_string(code);
  return reinterpret_cast<const char*>(buffer);
}

}  // namespace

Regex::Regex(const std::string& pattern, const std::string& where) : pattern_(pattern), where_(where) {
  compile(where);
}

Regex Regex::literal(const std::string& literal, const std::string& where) {
  // Every ASCII character that is not a letter or digit gets a backslash
  // (PCRE2 reads \<punctuation> as the character itself); others stay.
  std::string escaped;
  for (char c : literal) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x80 && !std::isalnum(u)) {
      if (u < 0x20 || u == 0x7f) {
        const char* hex = "0123456789abcdef";
        escaped += "\\x{";
        escaped += hex[u >> 4];
        escaped += hex[u & 15];
        escaped += '}';
        continue;
      }
      escaped += '\\';
    }
    escaped += c;
  }
  Regex r;
  r.pattern_ = escaped;
  r.where_ = where;
  r.compile(where);
  return r;
}

void Regex::compile(const std::string& where) {
  if (invalid_utf8_at(pattern_) != std::string_view::npos) {
    throw ConfigError("tokenizer: " + where + ": the pattern is not valid UTF-8");
  }
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern_.data()), pattern_.size(),
                                   PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (!code) {
    throw ConfigError("tokenizer: " + where + ": bad regular expression '" + pattern_ + "': " + pcre2_message(error) +
                      " at offset " + std::to_string(offset) + " (expected a pattern PCRE2 compiles)");
  }
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  if (!context) {
    pcre2_code_free(code);
    throw Error("tokenizer: out of memory for a PCRE2 match context");
  }
  pcre2_set_match_limit(context, kMatchLimit);
  pcre2_set_depth_limit(context, kDepthLimit);
  pcre2_set_heap_limit(context, kHeapLimitKiB);
  if (pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0) pcre2_jit_stack_assign(context, thread_jit_stack, nullptr);
  code_ = code;
  context_ = context;
}

Regex::~Regex() {
  if (context_) pcre2_match_context_free(static_cast<pcre2_match_context*>(context_));
  if (code_) pcre2_code_free(static_cast<pcre2_code*>(code_));
}

Regex::Regex(Regex&& other) noexcept
    : pattern_(std::move(other.pattern_)),
      where_(std::move(other.where_)),
      code_(other.code_),
      context_(other.context_) {
  other.code_ = nullptr;
  other.context_ = nullptr;
}

std::vector<Span> Regex::find_matches(std::string_view text) const {
  if (text.empty()) return {Span{0, 0, false}};
  const auto* code = static_cast<const pcre2_code*>(code_);
  auto* context = static_cast<pcre2_match_context*>(context_);
  std::unique_ptr<pcre2_match_data, void (*)(pcre2_match_data*)> data(
      pcre2_match_data_create_from_pattern(code, nullptr), pcre2_match_data_free);
  if (!data) throw Error("tokenizer: out of memory for PCRE2 match data");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());

  std::vector<Span> spans;
  size_t prev = 0;      // the end of the last match: where the next gap starts
  size_t last_end = 0;  // where the next search starts
  bool have_match = false;
  while (last_end <= text.size()) {
    const int rc = pcre2_match(code, subject, text.size(), last_end, PCRE2_NO_UTF_CHECK, data.get(), context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      throw ConfigError("tokenizer: " + where_ + ": the regular expression '" + pattern_ + "' gave up on a text of " +
                        std::to_string(text.size()) + " bytes: " + pcre2_message(rc) +
                        " (a pattern that backtracks without end)");
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data.get());
    const size_t start = ovector[0], end = ovector[1];
    if (start == end && have_match && end == prev) {
      // onig's find_iter: no empty match right after the last match; move one character on.
      last_end += last_end < text.size() ? utf8_length(static_cast<unsigned char>(text[last_end])) : 1;
      continue;
    }
    if (prev != start) spans.push_back({prev, start, false});
    spans.push_back({start, end, true});
    prev = last_end = end;
    have_match = true;
  }
  if (prev != text.size()) spans.push_back({prev, text.size(), false});
  return spans;
}

std::optional<std::string> replace_all(const Regex& pattern, std::string_view text, const std::string& content,
                                       size_t limit) {
  std::string out;
  out.reserve(std::min(text.size(), limit));
  for (const Span& s : pattern.find_matches(text)) {
    const size_t add = s.match ? content.size() : s.end - s.begin;
    if (add > limit - out.size()) return std::nullopt;
    if (s.match) {
      out += content;
    } else {
      out.append(text.substr(s.begin, s.end - s.begin));
    }
  }
  return out;
}

}  // namespace fsdp::tokenizers::detail
