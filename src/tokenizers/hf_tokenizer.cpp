// tokenizer.json: the Tokenizer that runs its pipeline as Hugging Face's
// tokenizers does (tokenizer/mod.rs): added tokens are cut out of the raw
// text, the rest normalized (normalizers/), pre-tokenized (pre_tokenizers/)
// and given to the model (models/bpe.h); the post-processor adds the
// template's tokens (processors/); the decoders turn tokens back into text
// (decoders/). Each component's folder reads it from the file: every
// refusal names the file, the key (a JSON path) and what was expected, and
// a component this module does not implement is refused by its type name
// with the list of those it does.
#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "added_vocabulary.h"
#include "decoders/decoders.h"
#include "files.h"
#include "fsdp/error.h"
#include "fsdp/tokenizers/tokenizer.h"
#include "json_reader.h"
#include "models/bpe.h"
#include "normalizers/normalizers.h"
#include "piece.h"
#include "pre_tokenizers/pre_tokenizers.h"
#include "processors/processors.h"
#include "unicode.h"

namespace fsdp::tokenizers {

namespace {

using namespace detail;

class HfTokenizer : public Tokenizer {
 public:
  HfTokenizer(const Json& root, const std::string& source) : Tokenizer(source) {
    const Reader r(source);
    r.object(root, "", "a tokenizer.json object");
    if (const Json* v = Reader::find(root, "version"); v && r.string(*v, "version") != "1.0") {
      r.fail("version", "unknown version '" + v->get<std::string>() + "' (expected 1.0)");
    }
    for (const char* setting : {"truncation", "padding"}) {
      if (const Json* s = Reader::find(root, setting); s && !s->is_null()) {
        r.fail(setting, "not supported (expected null: encode returns every id of the text, unpadded)");
      }
    }
    model_ = parse_model(r, root);
    const Json null;
    const auto part = [&](const char* name) -> const Json& {
      const Json* p = Reader::find(root, name);
      return p ? *p : null;
    };
    normalizer_ = parse_normalizer(r, part("normalizer"), "normalizer");
    pre_tokenizer_ = parse_pre_tokenizer(r, part("pre_tokenizer"), "pre_tokenizer", normalizer_ != nullptr);
    parse_post_processor(r, part("post_processor"), "post_processor", templates_);
    decoder_ = parse_decoder(r, part("decoder"), "decoder");

    parse_added_tokens(r, part("added_tokens"), *model_, added_);
    added_.finish(normalizer_.get(), *model_, source);

    std::unordered_set<std::string> tokens;
    for (const auto& entry : model_->vocab()) tokens.insert(entry.first);
    for (const auto& entry : added_.tokens()) tokens.insert(entry.first);
    vocab_size_ = static_cast<int64_t>(tokens.size());

    // BOS and EOS: the special tokens around the sequence in the first template.
    if (!templates_.empty() && !templates_[0].empty()) {
      const Template& t = templates_[0];
      if (!t.front().sequence && t.front().ids.size() == 1) bos_id_ = t.front().ids[0];
      if (t.size() > 1 && !t.back().sequence && t.back().ids.size() == 1) eos_id_ = t.back().ids[0];
    }
  }

  std::vector<int64_t> encode(const std::string& text, bool add_special_tokens) const override {
    if (const size_t bad = invalid_utf8_at(text); bad != std::string::npos) {
      throw ConfigError("tokenizer: " + source_ + ": encode: the text is not valid UTF-8 at byte " +
                        std::to_string(bad) + " (expected UTF-8 text)");
    }
    std::vector<Piece> pieces = added_.extract_and_normalize(normalizer_.get(), text);
    if (pre_tokenizer_) pre_tokenizer_->apply(pieces);
    std::vector<int64_t> ids;
    ids.reserve(text.size() / 3 + 4);
    for (const Piece& p : pieces) {
      if (p.id >= 0) {
        ids.push_back(p.id);
      } else {
        model_->tokenize(p.text, ids);
      }
    }
    if (add_special_tokens) apply_templates(templates_, ids);
    return ids;
  }

  std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const override {
    std::vector<std::string> tokens;
    tokens.reserve(ids.size());
    for (int64_t id : ids) {
      if (id < 0) {
        throw ConfigError("tokenizer: " + source_ + ": decode: id " + std::to_string(id) +
                          " is negative (expected ids from 0)");
      }
      const std::string* token = token_of(id);
      if (!token || (skip_special_tokens && added_.is_special(*token))) continue;
      tokens.push_back(*token);
    }
    std::string out;
    if (decoder_) {
      size_t input = 0;
      for (const std::string& t : tokens) input += t.size();
      for (const std::string& s : decoder_->decode_chain(std::move(tokens), input)) out += s;
    } else {
      for (size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
    }
    return out;
  }

  int64_t vocab_size() const override { return vocab_size_; }

  std::optional<int64_t> token_to_id(const std::string& token) const override {
    if (auto id = added_.token_to_id(token)) return *id;
    if (auto id = model_->token_to_id(token)) return *id;
    return std::nullopt;
  }

  std::optional<std::string> id_to_token(int64_t id) const override {
    const std::string* token = id >= 0 ? token_of(id) : nullptr;
    if (!token) return std::nullopt;
    return *token;
  }

 private:
  const std::string* token_of(int64_t id) const {
    if (id < 0 || id > UINT32_MAX) return nullptr;
    const auto id32 = static_cast<uint32_t>(id);
    const std::string* token = added_.id_to_token(id32);
    return token ? token : model_->id_to_token(id32);
  }

  std::unique_ptr<Bpe> model_;
  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::vector<Template> templates_;
  std::unique_ptr<Decoder> decoder_;
  AddedVocabulary added_;
  int64_t vocab_size_ = 0;
};

}  // namespace

std::unique_ptr<Tokenizer> hf_tokenizer_from_json(std::string_view json, const std::string& source) {
  const Json root = parse_json(json, source);
  try {
    return std::make_unique<HfTokenizer>(root, source);
  } catch (const Json::exception& e) {  // a type this reader did not check (it checks each)
    throw ConfigError("tokenizer: " + source + ": unexpected JSON: " + e.what());
  }
}

std::unique_ptr<Tokenizer> load_hf_tokenizer_json(const std::string& path) {
  const std::string text = read_tokenizer_file(path, "a tokenizer.json", kMaxTokenizerFileBytes);
  return hf_tokenizer_from_json(text, path);
}

}  // namespace fsdp::tokenizers
