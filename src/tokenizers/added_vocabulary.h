// tokenizer.json's added tokens (private; tokenizer/added_vocabulary.rs of
// tokenizers 0.23): their ids, and the raw text cut at them before the
// normalizer and the pre-tokenizers see the rest.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "json_reader.h"
#include "models/bpe.h"
#include "normalizers/normalizers.h"
#include "piece.h"

namespace fsdp::tokenizers::detail {

struct AddedToken {
  std::string content;
  bool single_word = false, lstrip = false, rstrip = false, normalized = true, special = false;
  bool operator==(const AddedToken& o) const {
    return content == o.content && single_word == o.single_word && lstrip == o.lstrip && rstrip == o.rstrip &&
           normalized == o.normalized && special == o.special;
  }
};

// tokenizers' AddedVocabulary: ids given as add_tokens gives them, and the
// two leftmost-longest matchers (tokens matched in the raw text, and those
// matched in the normalized text).
class AddedVocabulary {
 public:
  // Adds one token of tokenizer.json's added_tokens, in file order; O(1)
  // (amortized), so N tokens load in O(N). ConfigError naming `where` if an
  // id would not fit in 32 bits.
  void add(const AddedToken& token, const Bpe& model, const std::string& where);
  // Builds the matchers once every token is added. ConfigError naming
  // `where` for a token that normalizes to nothing.
  void finish(const Normalizer* normalizer, const Bpe& model, const std::string& where);

  // The raw text cut at its added tokens, each other piece normalized and
  // cut again at the normalized tokens.
  std::vector<Piece> extract_and_normalize(const Normalizer* normalizer, std::string_view text) const;

  std::optional<uint32_t> token_to_id(const std::string& token) const;
  // The token an id names, as decode sees it: a token with normalized: true
  // as the normalizer makes it (tokenizers 0.23 does so).
  const std::string* id_to_token(uint32_t id) const;
  bool is_special(const std::string& token) const { return special_set_.count(token) > 0; }
  const std::unordered_map<std::string, uint32_t>& tokens() const { return map_; }

 private:
  // Byte trie over the patterns: the longest pattern at a position.
  struct Matcher {
    struct Node {
      std::map<unsigned char, int> next;
      int pattern = -1;
    };
    std::vector<Node> nodes{1};
    std::vector<uint32_t> ids;  // per pattern
    void insert(std::string_view pattern, uint32_t id);
    // The length and pattern of the longest match at text[i], or {0, -1}.
    std::pair<size_t, int> longest_at(std::string_view text, size_t i) const;
  };
  std::vector<Piece> find_matches(std::string_view text, size_t start, const Matcher& matcher) const;

  static std::string key_of(const AddedToken& t);

  std::unordered_map<std::string, uint32_t> map_;
  uint32_t max_id_ = 0;  // the largest id of map_ (valid when map_ is not empty)
  std::unordered_map<uint32_t, AddedToken> map_r_;
  std::unordered_set<std::string> map_r_keys_;         // key_of each token of map_r_
  std::unordered_map<uint32_t, std::string> decoded_;  // id -> the token as id_to_token gives it
  std::vector<AddedToken> added_, special_;
  std::unordered_set<std::string> special_set_;
  Matcher raw_, normalized_;
};

// tokenizer.json's added_tokens (`j`, null or a list) added to `out` in
// file order (AddedVocabulary::add; finish is the caller's, once the
// normalizer is known). ConfigError naming the key of a malformed token.
void parse_added_tokens(const Reader& r, const Json& j, const Bpe& model, AddedVocabulary& out);

}  // namespace fsdp::tokenizers::detail
