// tokenizer.json's pre-tokenizers, as tokenizers 0.23's pre_tokenizers/
// runs them (split.rs, byte_level.rs, metaspace.rs, sequence.rs), corner
// cases included, and their reading from the file.
#include "pre_tokenizers.h"

#include <algorithm>
#include <array>
#include <memory>

#include "../unicode.h"

namespace fsdp::tokenizers::detail {

void PreTokenizer::apply(std::vector<Piece>& pieces) const {
  std::vector<Piece> out;
  out.reserve(pieces.size());
  std::vector<Piece> parts;
  for (Piece& p : pieces) {
    if (p.id >= 0) {
      out.push_back(std::move(p));
      continue;
    }
    parts.clear();
    split(p, parts);
    for (Piece& part : parts) {
      if (!part.text.empty()) out.push_back(std::move(part));
    }
  }
  pieces = std::move(out);
}

std::vector<Span> split_by_behavior(std::vector<Span> spans, SplitBehavior behavior) {
  std::vector<Span> out;
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::kIsolated:
      return spans;
    case SplitBehavior::kRemoved:
      for (const Span& s : spans) {
        if (!s.match) out.push_back(s);
      }
      return out;
    case SplitBehavior::kContiguous:
      for (const Span& s : spans) {
        if (s.match == previous_match && !out.empty()) {
          out.back().end = s.end;
        } else {
          out.push_back(s);
        }
        previous_match = s.match;
      }
      return out;
    case SplitBehavior::kMergedWithPrevious:
      for (const Span& s : spans) {
        if (s.match && !previous_match && !out.empty()) {
          out.back().end = s.end;
        } else {
          out.push_back(s);
        }
        previous_match = s.match;
      }
      return out;
    case SplitBehavior::kMergedWithNext:
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->match && !previous_match && !out.empty()) {
          out.back().begin = it->begin;
        } else {
          out.push_back(*it);
        }
        previous_match = it->match;
      }
      std::reverse(out.begin(), out.end());
      return out;
  }
  return spans;
}

void SplitPreTokenizer::split(const Piece& piece, std::vector<Piece>& out) const {
  std::vector<Span> spans = pattern_.find_matches(piece.text);
  if (invert_) {
    for (Span& s : spans) s.match = !s.match;
  }
  for (const Span& s : split_by_behavior(std::move(spans), behavior_)) {
    out.push_back({piece.text.substr(s.begin, s.end - s.begin), piece.start + s.begin, -1});
  }
}

const char* const kGpt2Regex = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

namespace {

// GPT-2's bytes_to_unicode: the printable bytes (! to ~, ¡ to ¬, ® to ÿ) are
// their own character; the others, in order, U+0100 onwards.
struct ByteLevelAlphabet {
  std::array<std::string, 256> chars;
  std::array<int, 324> bytes;  // code point -> byte, -1 for none
  ByteLevelAlphabet() {
    bytes.fill(-1);
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const char32_t c = printable ? static_cast<char32_t>(b) : next++;
      append_utf8(chars[static_cast<size_t>(b)], c);
      bytes[c] = b;
    }
  }
};

const ByteLevelAlphabet& alphabet() {
  static const ByteLevelAlphabet a;
  return a;
}

}  // namespace

const std::string& byte_level_char(unsigned char byte) { return alphabet().chars[byte]; }

std::optional<unsigned char> byte_level_byte(char32_t c) {
  if (c >= alphabet().bytes.size() || alphabet().bytes[c] < 0) return std::nullopt;
  return static_cast<unsigned char>(alphabet().bytes[c]);
}

ByteLevelPreTokenizer::ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex, const std::string& where)
    : add_prefix_space_(add_prefix_space) {
  if (use_regex) regex_.emplace(kGpt2Regex, where);
}

void ByteLevelPreTokenizer::split(const Piece& piece, std::vector<Piece>& out) const {
  const std::string text = add_prefix_space_ && piece.text.rfind(' ', 0) != 0 ? " " + piece.text : piece.text;
  const std::vector<Span> spans = regex_ ? regex_->find_matches(text) : std::vector<Span>{{0, text.size(), false}};
  for (const Span& s : spans) {
    Piece p{std::string(), piece.start + s.begin, -1};
    for (size_t i = s.begin; i < s.end; ++i) p.text += byte_level_char(static_cast<unsigned char>(text[i]));
    out.push_back(std::move(p));
  }
}

void MetaspacePreTokenizer::split(const Piece& piece, std::vector<Piece>& out) const {
  std::string text;
  for (char c : piece.text) {
    if (c == ' ') {
      text += replacement_;
    } else {
      text += c;
    }
  }
  const bool starts = text.compare(0, replacement_.size(), replacement_) == 0;
  if (!starts && (scheme_ == PrependScheme::kAlways || (scheme_ == PrependScheme::kFirst && piece.start == 0))) {
    text = replacement_ + text;
  }
  if (!split_) {
    out.push_back({std::move(text), piece.start, -1});
    return;
  }
  for (const Span& s : split_by_behavior(replacement_pattern_.find_matches(text), SplitBehavior::kMergedWithNext)) {
    out.push_back({text.substr(s.begin, s.end - s.begin), piece.start + s.begin, -1});
  }
}

void SequencePreTokenizer::apply(std::vector<Piece>& pieces) const {
  for (const auto& step : steps_) step->apply(pieces);
}

void SequencePreTokenizer::split(const Piece& piece, std::vector<Piece>& out) const {
  std::vector<Piece> pieces{piece};
  apply(pieces);
  for (Piece& p : pieces) out.push_back(std::move(p));
}

// --- from tokenizer.json ---------------------------------------------------------

namespace {
const char* const kPreTokenizers = "ByteLevel, Metaspace, Split, Sequence";
}  // namespace

PrependScheme parse_prepend_scheme(const Reader& r, const Json& j, const std::string& path) {
  // Metaspace: prepend_scheme (default always), or the older add_prefix_space: false (never).
  PrependScheme scheme = PrependScheme::kAlways;
  if (const Json* s = Reader::find(j, "prepend_scheme")) {
    const std::string name = r.string(*s, member_path(path, "prepend_scheme"));
    if (name == "always") {
      scheme = PrependScheme::kAlways;
    } else if (name == "never") {
      scheme = PrependScheme::kNever;
    } else if (name == "first") {
      scheme = PrependScheme::kFirst;
    } else {
      r.fail(member_path(path, "prepend_scheme"), "unknown scheme '" + name + "' (expected always, never or first)");
    }
  }
  if (const Json* a = Reader::find(j, "add_prefix_space"); a && !a->is_null()) {
    if (!r.boolean(*a, member_path(path, "add_prefix_space"))) scheme = PrependScheme::kNever;
  }
  return scheme;
}

std::unique_ptr<PreTokenizer> parse_pre_tokenizer(const Reader& r, const Json& j, const std::string& path,
                                                  bool has_normalizer) {
  if (j.is_null()) return nullptr;
  const std::string type = r.type(j, path, "pre-tokenizer", kPreTokenizers);
  if (type == "ByteLevel") {
    r.boolean(r.need(j, path, "trim_offsets", "true or false"), member_path(path, "trim_offsets"));
    const Json* use_regex = Reader::find(j, "use_regex");
    return std::make_unique<ByteLevelPreTokenizer>(
        r.boolean(r.need(j, path, "add_prefix_space", "true or false"), member_path(path, "add_prefix_space")),
        !use_regex || r.boolean(*use_regex, member_path(path, "use_regex")), r.source() + ": " + path);
  }
  if (type == "Split") {
    const std::string behavior_path = member_path(path, "behavior");
    const std::string name = r.string(r.need(j, path, "behavior", "a split behavior"), behavior_path);
    SplitBehavior behavior;
    if (name == "Isolated") {
      behavior = SplitBehavior::kIsolated;
    } else if (name == "Removed") {
      behavior = SplitBehavior::kRemoved;
    } else if (name == "MergedWithPrevious") {
      behavior = SplitBehavior::kMergedWithPrevious;
    } else if (name == "MergedWithNext") {
      behavior = SplitBehavior::kMergedWithNext;
    } else if (name == "Contiguous") {
      behavior = SplitBehavior::kContiguous;
    } else {
      r.fail(behavior_path, "unknown behavior '" + name +
                                "' (expected Isolated, Removed, MergedWithPrevious, MergedWithNext or Contiguous)");
    }
    return std::make_unique<SplitPreTokenizer>(
        r.pattern(r.need(j, path, "pattern", "{\"String\": ...} or {\"Regex\": ...}"), member_path(path, "pattern")),
        behavior, r.boolean(r.need(j, path, "invert", "true or false"), member_path(path, "invert")));
  }
  if (type == "Metaspace") {
    const char32_t replacement =
        r.character(r.need(j, path, "replacement", "one character"), member_path(path, "replacement"));
    const PrependScheme scheme = parse_prepend_scheme(r, j, path);
    if (scheme == PrependScheme::kFirst && has_normalizer) {
      r.fail(member_path(path, "prepend_scheme"),
             "'first' after a normalizer is not supported (it needs the normalizer's alignments to the original "
             "text; expected normalizer: null, as Mistral's and Llama's files have)");
    }
    const Json* split = Reader::find(j, "split");
    std::string rep;
    append_utf8(rep, replacement);
    return std::make_unique<MetaspacePreTokenizer>(
        rep, scheme, !split || split->is_null() || r.boolean(*split, member_path(path, "split")),
        r.source() + ": " + path);
  }
  if (type == "Sequence") {
    const std::string list = member_path(path, "pretokenizers");
    const Json& items = r.need(j, path, "pretokenizers", "a list of pre-tokenizers");
    if (!items.is_array()) r.fail(list, "expected a list of pre-tokenizers, got " + Reader::describe(items));
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    for (size_t i = 0; i < items.size(); ++i) {
      if (auto p = parse_pre_tokenizer(r, items[i], index_path(list, i), has_normalizer)) steps.push_back(std::move(p));
    }
    return std::make_unique<SequencePreTokenizer>(std::move(steps));
  }
  r.unknown(path, "pre-tokenizer", type, kPreTokenizers);
}

}  // namespace fsdp::tokenizers::detail
