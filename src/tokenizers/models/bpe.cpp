// BPE by hand: no C++ library implements Hugging Face's merge loop. This is
// tokenizers' Word::merge_all (a heap of candidate merges, lowest rank
// first, then leftmost; stale entries skipped) and BPE::merge_word (a
// character the vocab lacks becomes its <0xXX> byte tokens with
// byte_fallback, else the unk token, fused with its neighbours under
// fuse_unk, else nothing).
#include "bpe.h"

#include <cstdio>
#include <queue>

#include "../unicode.h"
#include "fsdp/error.h"

namespace fsdp::tokenizers::detail {

Bpe::Bpe(std::unordered_map<std::string, uint32_t> vocab,
         const std::vector<std::pair<std::string, std::string>>& merges, BpeOptions options, const std::string& where)
    : vocab_(std::move(vocab)), options_(std::move(options)) {
  vocab_r_.reserve(vocab_.size());
  for (const auto& [token, id] : vocab_) {
    auto [it, inserted] = vocab_r_.emplace(id, token);
    if (!inserted) {
      throw ConfigError("tokenizer: " + where + ": model.vocab: '" + it->second + "' and '" + token +
                        "' both have id " + std::to_string(id) + " (expected one token per id)");
    }
  }
  merges_.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const std::string& a = merges[i].first;
    const std::string& b = merges[i].second;
    const std::string key = "model.merges[" + std::to_string(i) + "]";
    auto lookup = [&](const std::string& token) {
      auto it = vocab_.find(token);
      if (it == vocab_.end()) {
        throw ConfigError("tokenizer: " + where + ": " + key + ": merge '" + a + "' + '" + b + "': '" + token +
                          "' is not in model.vocab (a merge joins two tokens of the vocab into a third)");
      }
      return it->second;
    };
    const uint32_t id_a = lookup(a), id_b = lookup(b), id_new = lookup(a + b);
    merges_[pair_key(id_a, id_b)] = Merge{static_cast<uint32_t>(i), id_new};
  }
  if (options_.unk_token) {
    auto it = vocab_.find(*options_.unk_token);
    if (it == vocab_.end()) {
      throw ConfigError("tokenizer: " + where + ": model.unk_token: '" + *options_.unk_token +
                        "' is not in model.vocab (expected the vocab's unknown token, or null)");
    }
    unk_id_ = it->second;
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    auto it = vocab_.find(name);
    if (it != vocab_.end()) {
      has_byte_[b] = true;
      byte_ids_[b] = it->second;
    }
  }
}

std::optional<uint32_t> Bpe::token_to_id(std::string_view token) const {
  auto it = vocab_.find(std::string(token));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* Bpe::id_to_token(uint32_t id) const {
  auto it = vocab_r_.find(id);
  return it == vocab_r_.end() ? nullptr : &it->second;
}

void Bpe::tokenize(std::string_view piece, std::vector<int64_t>& out) const {
  if (piece.empty()) return;
  if (options_.ignore_merges) {
    if (auto id = token_to_id(piece)) {
      out.push_back(*id);
      return;
    }
  }
  // The word: one symbol per character (merge_word).
  struct Symbol {
    uint32_t id;
    int64_t prev, next;
    size_t len;  // bytes of text it covers; 0: merged into its left neighbour
  };
  std::vector<Symbol> symbols;
  symbols.reserve(piece.size());
  auto add = [&](uint32_t id, size_t len) {
    const auto n = static_cast<int64_t>(symbols.size());
    if (n > 0) symbols.back().next = n;
    symbols.push_back({id, n - 1, -1, len});
  };
  bool pending_unk = false;  // an unk token waiting for its length (fuse_unk grows it)
  size_t unk_len = 0;
  std::string character;
  for (size_t i = 0; i < piece.size();) {
    const size_t n = utf8_length(static_cast<unsigned char>(piece[i]));
    character.assign(piece.substr(i, n));
    i += n;
    if (auto it = vocab_.find(character); it != vocab_.end()) {
      if (pending_unk) add(*unk_id_, unk_len);
      pending_unk = false;
      add(it->second, n);
      continue;
    }
    if (options_.byte_fallback) {
      bool all = true;
      for (unsigned char c : character) all = all && has_byte_[c];
      if (all) {
        for (unsigned char c : character) add(byte_ids_[c], 1);
        continue;
      }
    }
    if (unk_id_) {
      if (pending_unk && options_.fuse_unk) {
        unk_len += n;
      } else {
        if (pending_unk) add(*unk_id_, unk_len);
        pending_unk = true;
        unk_len = n;
      }
    }
  }
  if (pending_unk) add(*unk_id_, unk_len);

  // merge_all: candidate merges, lowest rank first, then leftmost.
  struct Candidate {
    uint32_t rank;
    size_t pos;
    uint32_t new_id;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  for (size_t i = 0; i + 1 < symbols.size(); ++i) {
    if (const Merge* m = find_merge(symbols[i].id, symbols[i + 1].id)) queue.push({m->rank, i, m->new_id});
  }
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.pos];
    if (left.len == 0 || left.next == -1) continue;
    const size_t next_pos = static_cast<size_t>(left.next);
    const Symbol right = symbols[next_pos];
    const Merge* m = find_merge(left.id, right.id);
    if (!m || m->new_id != top.new_id) continue;  // a stale entry
    left.id = top.new_id;
    left.len += right.len;
    left.next = right.next;
    symbols[next_pos].len = 0;
    if (right.next > -1 && static_cast<size_t>(right.next) < symbols.size()) {
      symbols[static_cast<size_t>(right.next)].prev = static_cast<int64_t>(top.pos);
    }
    if (left.prev >= 0) {
      const auto prev = static_cast<size_t>(left.prev);
      if (const Merge* pm = find_merge(symbols[prev].id, left.id)) queue.push({pm->rank, prev, pm->new_id});
    }
    if (left.next > -1 && static_cast<size_t>(left.next) < symbols.size()) {
      if (const Merge* nm = find_merge(left.id, symbols[static_cast<size_t>(left.next)].id)) {
        queue.push({nm->rank, top.pos, nm->new_id});
      }
    }
  }
  for (const Symbol& s : symbols) {
    if (s.len != 0) out.push_back(s.id);
  }
}

// --- from tokenizer.json ---------------------------------------------------------

namespace {
const char* const kModels = "BPE";
}  // namespace

std::unique_ptr<Bpe> parse_model(const Reader& r, const Json& root) {
  const std::string path = "model";
  const Json& j = r.need(root, "", "model", "the model: {\"type\": \"BPE\", \"vocab\": ..., \"merges\": ...}");
  const std::string type = r.type(j, path, "model", kModels);
  if (type != "BPE") r.unknown(path, "model", type, kModels);

  BpeOptions options;
  if (const Json* d = Reader::find(j, "dropout"); d && !d->is_null()) {
    if (!d->is_number()) r.fail("model.dropout", "expected null or a number, got " + Reader::describe(*d));
    if (d->get<double>() != 0.0) {
      r.fail("model.dropout",
             "BPE dropout " + d->dump() + " is not supported (it makes encoding random; expected null)");
    }
  }
  if (const Json* u = Reader::find(j, "unk_token"); u && !u->is_null()) {
    options.unk_token = r.string(*u, "model.unk_token");
  }
  for (const char* affix : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const Json* a = Reader::find(j, affix);
    if (a && !a->is_null() && !r.string(*a, member_path(path, affix)).empty()) {
      r.fail(member_path(path, affix), "'" + a->get<std::string>() +
                                           "' is not supported (expected null or \"\", as byte-level and "
                                           "SentencePiece-style BPEs have)");
    }
  }
  options.fuse_unk = r.flag(j, path, "fuse_unk");
  options.byte_fallback = r.flag(j, path, "byte_fallback");
  options.ignore_merges = r.flag(j, path, "ignore_merges");

  const Json& vocab_json =
      r.object(r.need(j, path, "vocab", "an object of token: id"), "model.vocab", "an object of token: id");
  std::unordered_map<std::string, uint32_t> vocab;
  vocab.reserve(vocab_json.size());
  for (const auto& [token, id] : vocab_json.items()) {
    vocab[token] = static_cast<uint32_t>(r.unsigned_integer(id, "model.vocab." + token, UINT32_MAX));
  }

  const Json& merges_json = r.need(j, path, "merges", "a list of merges");
  if (!merges_json.is_array()) {
    r.fail("model.merges", "expected a list of merges, got " + Reader::describe(merges_json));
  }
  std::vector<std::pair<std::string, std::string>> merges;
  merges.reserve(merges_json.size());
  const bool as_strings = !merges_json.empty() && merges_json[0].is_string();
  for (size_t i = 0; i < merges_json.size(); ++i) {
    const Json& m = merges_json[i];
    const std::string key = index_path("model.merges", i);
    const char* expected = as_strings ? "a merge \"a b\" (two tokens, one space), as model.merges[0] is"
                                      : "a merge [\"a\", \"b\"] (two tokens), as model.merges[0] is";
    if (as_strings && m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
        r.fail(key, std::string("expected ") + expected + ", got " + Reader::describe(m));
      }
      merges.emplace_back(s.substr(0, space), s.substr(space + 1));
    } else if (!as_strings && m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    } else {
      r.fail(key, std::string("expected ") + expected + ", got " + Reader::describe(m));
    }
  }
  return std::make_unique<Bpe>(std::move(vocab), merges, std::move(options), r.source());
}

}  // namespace fsdp::tokenizers::detail
