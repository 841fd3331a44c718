// tokenizer.json's normalizers (private; normalizers/ of tokenizers 0.23):
// NFC, Prepend, Replace and Sequence, each bounded in how much it may grow
// a text, and their reading from the file.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../json_reader.h"
#include "../regex.h"
#include "fsdp/tokenizers/tokenizer.h"

namespace fsdp::tokenizers::detail {

// The longest normalized text (fsdp/tokenizers/tokenizer.h):
// kMaxNormalizedGrowth times the text's bytes plus kNormalizedSlackBytes.
size_t normalized_limit(size_t text_bytes);

class Normalizer {
 public:
  // `where`: the file and the normalizer's key, e.g.
  // "tokenizer.json: normalizer.normalizers[3] (Replace)", for errors.
  explicit Normalizer(std::string where) : where_(std::move(where)) {}
  virtual ~Normalizer() = default;
  // The text normalized. ConfigError naming the normalizer that would make
  // it longer than normalized_limit(text.size()), and the lengths.
  std::string normalize(std::string text) const {
    const size_t input = text.size();
    return apply(std::move(text), input);
  }
  // One step; `input` is the length of the text given to normalize().
  virtual std::string apply(std::string text, size_t input) const = 0;

 protected:
  // Throws the ConfigError of a text that would grow past the limit.
  [[noreturn]] void too_long(size_t input) const;
  std::string where_;
};

class NfcNormalizer : public Normalizer {
 public:
  using Normalizer::Normalizer;
  std::string apply(std::string text, size_t input) const override;
};

// Prepends `prepend` to a non-empty text.
class PrependNormalizer : public Normalizer {
 public:
  PrependNormalizer(std::string prepend, std::string where) : Normalizer(std::move(where)), prepend_(std::move(prepend)) {}
  std::string apply(std::string text, size_t input) const override;

 private:
  std::string prepend_;
};

// Every match of `pattern` becomes `content`.
class ReplaceNormalizer : public Normalizer {
 public:
  ReplaceNormalizer(Regex pattern, std::string content, std::string where)
      : Normalizer(std::move(where)), pattern_(std::move(pattern)), content_(std::move(content)) {}
  std::string apply(std::string text, size_t input) const override;

 private:
  Regex pattern_;
  std::string content_;
};

class SequenceNormalizer : public Normalizer {
 public:
  SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps, std::string where)
      : Normalizer(std::move(where)), steps_(std::move(steps)) {}
  std::string apply(std::string text, size_t input) const override;

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

// The normalizer `j` at the JSON path `path` (e.g. "normalizer"); nullptr
// for null. ConfigError naming the key for a malformed one, or naming an
// unknown type with the list of those supported.
std::unique_ptr<Normalizer> parse_normalizer(const Reader& r, const Json& j, const std::string& path);

}  // namespace fsdp::tokenizers::detail
