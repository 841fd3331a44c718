// tokenizer.json's added tokens, as tokenizers 0.23's
// tokenizer/added_vocabulary.rs gives them ids and finds them in a text,
// and their reading from the file.
#include "added_vocabulary.h"

#include <algorithm>

#include "fsdp/error.h"
#include "unicode.h"

namespace fsdp::tokenizers::detail {

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

// --- from tokenizer.json ---------------------------------------------------------

void parse_added_tokens(const Reader& r, const Json& j, const Bpe& model, AddedVocabulary& out) {
  if (j.is_null()) return;
  if (!j.is_array()) r.fail("added_tokens", "expected a list of tokens, got " + Reader::describe(j));
  for (size_t i = 0; i < j.size(); ++i) {
    const std::string p = index_path("added_tokens", i);
    const Json& t = r.object(j[i], p, "an added token object");
    r.unsigned_integer(r.need(t, p, "id", "the token's id"), member_path(p, "id"), UINT32_MAX);
    AddedToken token;
    token.content = r.string(r.need(t, p, "content", "the token's text"), member_path(p, "content"));
    token.single_word = r.boolean(r.need(t, p, "single_word", "true or false"), member_path(p, "single_word"));
    token.lstrip = r.boolean(r.need(t, p, "lstrip", "true or false"), member_path(p, "lstrip"));
    token.rstrip = r.boolean(r.need(t, p, "rstrip", "true or false"), member_path(p, "rstrip"));
    token.normalized = r.boolean(r.need(t, p, "normalized", "true or false"), member_path(p, "normalized"));
    token.special = r.boolean(r.need(t, p, "special", "true or false"), member_path(p, "special"));
    out.add(token, model, r.source());
  }
}

}  // namespace fsdp::tokenizers::detail
