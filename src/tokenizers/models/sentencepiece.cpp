// SentencePiece models (tokenizer.model) through libsentencepiece: the
// library that wrote them encodes and decodes them; this file adds BOS,
// bounds and errors.
#include <sentencepiece_processor.h>

#include <memory>
#include <string>
#include <vector>

#include "../files.h"
#include "../unicode.h"
#include "fsdp/error.h"
#include "fsdp/tokenizers/tokenizer.h"

namespace fsdp::tokenizers {

namespace {

class SentencePieceTokenizer : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(const std::string& path) : Tokenizer(path) {
    const std::string bytes =
        detail::read_tokenizer_file(path, "a SentencePiece model (tokenizer.model)", kMaxTokenizerFileBytes);
    const auto status = sp_.LoadFromSerializedProto(bytes);
    if (!status.ok()) {
      throw ConfigError("tokenizer: " + path + ": sentencepiece refuses the model: " + status.ToString() +
                        " (expected a SentencePiece model, tokenizer.model)");
    }
    if (sp_.bos_id() >= 0) bos_id_ = sp_.bos_id();
    if (sp_.eos_id() >= 0) eos_id_ = sp_.eos_id();
  }

  std::vector<int64_t> encode(const std::string& text, bool add_special_tokens) const override {
    if (const size_t bad = detail::invalid_utf8_at(text); bad != std::string::npos) {
      throw ConfigError("tokenizer: " + source_ + ": encode: the text is not valid UTF-8 at byte " +
                        std::to_string(bad) + " (expected UTF-8 text)");
    }
    std::vector<int> pieces;
    const auto status = sp_.Encode(text, &pieces);
    if (!status.ok()) throw Error("tokenizer: " + source_ + ": sentencepiece cannot encode: " + status.ToString());
    std::vector<int64_t> ids;
    ids.reserve(pieces.size() + 1);
    if (add_special_tokens && bos_id_) ids.push_back(*bos_id_);
    ids.insert(ids.end(), pieces.begin(), pieces.end());
    return ids;
  }

  std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const override {
    // sentencepiece decodes its control tokens (BOS, EOS) to nothing either way.
    std::vector<int> pieces;
    pieces.reserve(ids.size());
    for (int64_t id : ids) {
      if (id < 0 || id >= vocab_size()) {
        throw ConfigError("tokenizer: " + source_ + ": decode: id " + std::to_string(id) +
                          " is outside the vocab (0 to " + std::to_string(vocab_size() - 1) + ")");
      }
      pieces.push_back(static_cast<int>(id));
    }
    std::string text;
    const auto status = sp_.Decode(pieces, &text);
    if (!status.ok()) throw Error("tokenizer: " + source_ + ": sentencepiece cannot decode: " + status.ToString());
    return text;
  }

  int64_t vocab_size() const override { return sp_.GetPieceSize(); }

  std::optional<int64_t> token_to_id(const std::string& token) const override {
    const int id = sp_.PieceToId(token);
    if (id < 0 || (sp_.IsUnknown(id) && sp_.IdToPiece(id) != token)) return std::nullopt;
    return id;
  }

  std::optional<std::string> id_to_token(int64_t id) const override {
    if (id < 0 || id >= vocab_size()) return std::nullopt;
    return sp_.IdToPiece(static_cast<int>(id));
  }

 private:
  sentencepiece::SentencePieceProcessor sp_;
};

}  // namespace

std::unique_ptr<Tokenizer> load_sentencepiece(const std::string& path) {
  return std::make_unique<SentencePieceTokenizer>(path);
}

}  // namespace fsdp::tokenizers
