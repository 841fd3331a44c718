// The BPE model of tokenizer.json (private): vocab, merges and the merge
// loop of Hugging Face's tokenizers (models/bpe), with ignore_merges,
// byte_fallback, unk_token and fuse_unk; and its reading from the file.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../json_reader.h"

namespace fsdp::tokenizers::detail {

struct BpeOptions {
  std::optional<std::string> unk_token;
  bool fuse_unk = false;
  bool byte_fallback = false;
  bool ignore_merges = false;
};

class Bpe {
 public:
  // `merges` in rank order (a later duplicate of a pair takes its rank, as
  // in tokenizers). ConfigError naming `where` and model.merges[i] for a
  // merge whose tokens, or whose result, the vocab lacks, and naming
  // model.unk_token if the vocab lacks it.
  Bpe(std::unordered_map<std::string, uint32_t> vocab, const std::vector<std::pair<std::string, std::string>>& merges,
      BpeOptions options, const std::string& where);

  // Appends the ids of one pre-token (a non-empty piece of text). Cost:
  // O(n log n) in its characters.
  void tokenize(std::string_view piece, std::vector<int64_t>& out) const;

  std::optional<uint32_t> token_to_id(std::string_view token) const;
  const std::string* id_to_token(uint32_t id) const;
  size_t size() const { return vocab_.size(); }
  const std::unordered_map<std::string, uint32_t>& vocab() const { return vocab_; }

 private:
  struct Merge {
    uint32_t rank, new_id;
  };
  static uint64_t pair_key(uint32_t a, uint32_t b) { return (uint64_t{a} << 32) | b; }
  const Merge* find_merge(uint32_t a, uint32_t b) const {
    auto it = merges_.find(pair_key(a, b));
    return it == merges_.end() ? nullptr : &it->second;
  }

  std::unordered_map<std::string, uint32_t> vocab_;
  std::unordered_map<uint32_t, std::string> vocab_r_;
  std::unordered_map<uint64_t, Merge> merges_;
  BpeOptions options_;
  std::optional<uint32_t> unk_id_;
  uint32_t byte_ids_[256];
  bool has_byte_[256] = {};
};

// tokenizer.json's "model" of the top-level object `root` (BPE, the one
// model type supported). ConfigError naming the key for a malformed one
// (model.merges[i], model.vocab.<token>), a setting not supported (dropout,
// a subword prefix or suffix), or an unknown type with those supported.
std::unique_ptr<Bpe> parse_model(const Reader& r, const Json& root);

}  // namespace fsdp::tokenizers::detail
