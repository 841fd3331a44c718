// Hugging Face's tokenizer.json pipeline by hand, for the components that
// Llama 2 and 3, Mistral, Qwen2 and GPT-2 use: each one follows the Rust
// library's code (tokenizers 0.23: normalizers/, pre_tokenizers/,
// tokenizer/added_vocabulary.rs, processors/template.rs; decoders/ in
// decoders.cpp),
// including its corner cases, so that the ids and texts are the same.
#include "pipeline.h"

#include <algorithm>
#include <array>
#include <cstdint>

#include "fsdp/error.h"
#include "unicode.h"

namespace fsdp::tokenizers::detail {

// --- normalizers --------------------------------------------------------------

size_t normalized_limit(size_t text_bytes) {
  if (text_bytes > (SIZE_MAX - kNormalizedSlackBytes) / kMaxNormalizedGrowth) return SIZE_MAX;
  return text_bytes * kMaxNormalizedGrowth + kNormalizedSlackBytes;
}

void Normalizer::too_long(size_t input) const {
  throw ConfigError("tokenizer: " + where_ + ": the normalized text would be over " +
                    std::to_string(normalized_limit(input)) + " bytes, the limit for a text of " +
                    std::to_string(input) + " bytes (" + std::to_string(kMaxNormalizedGrowth) + " x its bytes + " +
                    std::to_string(kNormalizedSlackBytes >> 10) +
                    " KiB; expected normalizers that grow a text by a few times at most)");
}

std::string NfcNormalizer::apply(std::string text, size_t input) const {
  std::string out = nfc(text);
  if (out.size() > normalized_limit(input)) too_long(input);
  return out;
}

std::string PrependNormalizer::apply(std::string text, size_t input) const {
  if (text.empty()) return text;
  if (text.size() + prepend_.size() > normalized_limit(input)) too_long(input);
  return prepend_ + text;
}

std::string ReplaceNormalizer::apply(std::string text, size_t input) const {
  std::optional<std::string> out = replace_all(pattern_, text, content_, normalized_limit(input));
  if (!out) too_long(input);
  return std::move(*out);
}

std::string SequenceNormalizer::apply(std::string text, size_t input) const {
  for (const auto& step : steps_) text = step->apply(std::move(text), input);
  return text;
}

// --- pre-tokenizers -----------------------------------------------------------

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

// --- added tokens ---------------------------------------------------------------

namespace {

// The Rust regex crate's \w$, ^\w, \s*$ and ^\s* (added_vocabulary.rs).
bool ends_with_word(std::string_view s) {
  if (s.empty()) return false;
  size_t i = s.size() - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  return is_word_character(next_code_point(s, i));
}

bool starts_with_word(std::string_view s) {
  if (s.empty()) return false;
  size_t i = 0;
  return is_word_character(next_code_point(s, i));
}

// Where the run of white space that ends `s` starts.
size_t trailing_space_start(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    size_t i = end - 1;
    while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
    size_t j = i;
    if (!is_white_space(next_code_point(s, j))) break;
    end = i;
  }
  return end;
}

// The length of the run of white space that starts `s`.
size_t leading_space_length(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    size_t j = i;
    if (!is_white_space(next_code_point(s, j))) break;
    i = j;
  }
  return i;
}

}  // namespace

std::string AddedVocabulary::key_of(const AddedToken& t) {
  std::string key = t.content;
  key += '\0';
  for (bool b : {t.single_word, t.lstrip, t.rstrip, t.normalized, t.special}) key += b ? '1' : '0';
  return key;
}

std::optional<uint32_t> AddedVocabulary::token_to_id(const std::string& token) const {
  auto it = map_.find(token);
  if (it == map_.end()) return std::nullopt;
  return it->second;
}

const std::string* AddedVocabulary::id_to_token(uint32_t id) const {
  auto it = decoded_.find(id);
  return it == decoded_.end() ? nullptr : &it->second;
}

void AddedVocabulary::add(const AddedToken& token, const Bpe& model, const std::string& where) {
  // AddedVocabulary::add_tokens, one token at a time (as the file is read).
  if (token.special && !token.content.empty() && special_set_.insert(token.content).second) special_.push_back(token);
  if (token.content.empty() || map_r_keys_.count(key_of(token))) return;  // ignored, as tokenizers ignores it
  uint64_t id = 0;
  if (auto known = token_to_id(token.content)) {
    id = *known;
  } else if (auto in_model = model.token_to_id(token.content)) {
    id = *in_model;
  } else if (map_.empty()) {
    id = model.size();
  } else {
    // tokenizers takes the largest id of the map here; kept as it grows
    // (each id of map_ stays once given), so N tokens cost O(N), not O(N^2).
    const uint64_t max = max_id_;
    id = max >= model.size() || model.size() == 0 ? max + 1 : model.size();
  }
  if (id > UINT32_MAX) {
    throw ConfigError("tokenizer: " + where + ": added_tokens: the id for '" + token.content +
                      "' would be over 2^32 - 1 (expected ids below 2^32, as tokenizers keeps them)");
  }
  const auto id32 = static_cast<uint32_t>(id);
  map_[token.content] = id32;
  max_id_ = std::max(max_id_, id32);
  auto old = map_r_.find(id32);
  if (old != map_r_.end()) map_r_keys_.erase(key_of(old->second));
  map_r_[id32] = token;
  map_r_keys_.insert(key_of(token));
  if (!special_set_.count(token.content)) added_.push_back(token);
}

void AddedVocabulary::finish(const Normalizer* normalizer, const Bpe& model, const std::string& where) {
  // refresh_added_tokens: special tokens first, then the others; those with
  // normalized: true are matched in the normalized text, as normalized.
  for (const auto* list : {&special_, &added_}) {
    for (const AddedToken& t : *list) {
      auto id = token_to_id(t.content);
      if (!id) id = model.token_to_id(t.content);
      if (!t.normalized) {
        raw_.insert(t.content, *id);
        continue;
      }
      const std::string pattern = normalizer ? normalizer->normalize(t.content) : t.content;
      if (pattern.empty()) {
        throw ConfigError("tokenizer: " + where + ": added_tokens: '" + t.content +
                          "' (normalized: true) is empty once normalized (expected a token that can be matched)");
      }
      normalized_.insert(pattern, *id);
    }
  }
  for (const auto& [id, t] : map_r_) {
    decoded_[id] = t.normalized && normalizer ? normalizer->normalize(t.content) : t.content;
  }
}

void AddedVocabulary::Matcher::insert(std::string_view pattern, uint32_t id) {
  size_t node = 0;
  for (unsigned char c : pattern) {
    auto it = nodes[node].next.find(c);
    if (it == nodes[node].next.end()) {
      nodes[node].next[c] = static_cast<int>(nodes.size());
      node = nodes.size();
      nodes.emplace_back();
    } else {
      node = static_cast<size_t>(it->second);
    }
  }
  if (nodes[node].pattern < 0) {
    nodes[node].pattern = static_cast<int>(ids.size());
    ids.push_back(id);
  }
}

std::pair<size_t, int> AddedVocabulary::Matcher::longest_at(std::string_view text, size_t i) const {
  std::pair<size_t, int> best{0, -1};
  size_t node = 0;
  for (size_t k = i; k < text.size(); ++k) {
    auto it = nodes[node].next.find(static_cast<unsigned char>(text[k]));
    if (it == nodes[node].next.end()) break;
    node = static_cast<size_t>(it->second);
    if (nodes[node].pattern >= 0) best = {k + 1 - i, nodes[node].pattern};
  }
  return best;
}

std::vector<Piece> AddedVocabulary::find_matches(std::string_view text, size_t start, const Matcher& matcher) const {
  // added_vocabulary.rs find_matches over aho-corasick's leftmost-longest
  // matches (the matcher moves on past a match, even one the flags discard).
  std::vector<Piece> out;
  auto piece = [&](size_t b, size_t e, int64_t id) {
    out.push_back({std::string(text.substr(b, e - b)), start + b, id});
  };
  size_t cursor = 0;
  for (size_t pos = 0; pos < text.size();) {
    const auto [length, pattern] = matcher.longest_at(text, pos);
    if (pattern < 0) {
      ++pos;
      continue;
    }
    size_t begin = pos, end = pos + length;
    pos = end;
    const uint32_t id = matcher.ids[static_cast<size_t>(pattern)];
    const AddedToken& token = map_r_.at(id);
    if (token.single_word) {
      const bool space_before = begin == 0 || !ends_with_word(text.substr(0, begin));
      const bool space_after = end == text.size() || !starts_with_word(text.substr(end));
      if (!space_before || !space_after) continue;
    }
    if (token.lstrip) begin = std::max(trailing_space_start(text.substr(0, begin)), cursor);
    if (token.rstrip) end += leading_space_length(text.substr(end));
    if (cursor < begin) piece(cursor, begin, -1);
    piece(begin, end, id);
    cursor = end;
  }
  if (cursor < text.size()) piece(cursor, text.size(), -1);
  return out;
}

std::vector<Piece> AddedVocabulary::extract_and_normalize(const Normalizer* normalizer, std::string_view text) const {
  std::vector<Piece> out;
  for (Piece& raw : find_matches(text, 0, raw_)) {
    if (raw.text.empty()) continue;
    if (raw.id >= 0) {
      out.push_back(std::move(raw));
      continue;
    }
    const std::string normalized = normalizer ? normalizer->normalize(std::move(raw.text)) : std::move(raw.text);
    for (Piece& p : find_matches(normalized, raw.start, normalized_)) {
      if (!p.text.empty()) out.push_back(std::move(p));
    }
  }
  return out;
}

// --- post-processors --------------------------------------------------------------

void apply_templates(const std::vector<Template>& templates, std::vector<int64_t>& ids) {
  for (const Template& t : templates) {
    std::vector<int64_t> out;
    for (const TemplatePiece& p : t) {
      const std::vector<int64_t>& part = p.sequence ? ids : p.ids;
      out.insert(out.end(), part.begin(), part.end());
    }
    ids = std::move(out);
  }
}

}  // namespace fsdp::tokenizers::detail
