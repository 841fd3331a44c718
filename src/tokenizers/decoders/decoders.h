// tokenizer.json's decoders (private; decoders/ of tokenizers 0.23):
// tokens back to text, and their reading from the file.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../json_reader.h"
#include "../pre_tokenizers/pre_tokenizers.h"
#include "../regex.h"

namespace fsdp::tokenizers::detail {

class Decoder {
 public:
  virtual ~Decoder() = default;
  // The tokens decoded; `input` is the bytes of the tokens given to the
  // first decoder of the chain: a Replace decoder refuses to make more than
  // normalized_limit(input) bytes, naming itself.
  virtual std::vector<std::string> decode_chain(std::vector<std::string> tokens, size_t input) const = 0;
};

// Tokens of the byte-level alphabet back to bytes, all of them as one
// string (invalid UTF-8 as U+FFFD); a token with another character is taken
// as it is.
class ByteLevelDecoder : public Decoder {
 public:
  std::vector<std::string> decode_chain(std::vector<std::string> tokens, size_t input) const override;
};

// Runs of <0xXX> tokens back to their bytes (one U+FFFD per token when they
// are not UTF-8).
class ByteFallbackDecoder : public Decoder {
 public:
  std::vector<std::string> decode_chain(std::vector<std::string> tokens, size_t input) const override;
};

class FuseDecoder : public Decoder {
 public:
  std::vector<std::string> decode_chain(std::vector<std::string> tokens, size_t input) const override;
};

// Removes up to `start` leading and `stop` trailing `content` characters of each token.
class StripDecoder : public Decoder {
 public:
  StripDecoder(char32_t content, size_t start, size_t stop) : content_(content), start_(start), stop_(stop) {}
  std::vector<std::string> decode_chain(std::vector<std::string> tokens, size_t input) const override;

 private:
  char32_t content_;
  size_t start_, stop_;
};

class ReplaceDecoder : public Decoder {
 public:
  // `where`: the file and the decoder's key, for errors.
  ReplaceDecoder(Regex pattern, std::string content, std::string where)
      : pattern_(std::move(pattern)), content_(std::move(content)), where_(std::move(where)) {}
  std::vector<std::string> decode_chain(std::vector<std::string> tokens, size_t input) const override;

 private:
  Regex pattern_;
  std::string content_, where_;
};

// ▁ back to ' ', except in the first token unless the prepend scheme is never.
class MetaspaceDecoder : public Decoder {
 public:
  MetaspaceDecoder(char32_t replacement, PrependScheme scheme) : replacement_(replacement), scheme_(scheme) {}
  std::vector<std::string> decode_chain(std::vector<std::string> tokens, size_t input) const override;

 private:
  char32_t replacement_;
  PrependScheme scheme_;
};

class SequenceDecoder : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> steps) : steps_(std::move(steps)) {}
  std::vector<std::string> decode_chain(std::vector<std::string> tokens, size_t input) const override;

 private:
  std::vector<std::unique_ptr<Decoder>> steps_;
};

// The decoder `j` at the JSON path `path`; nullptr for null. ConfigError
// naming the key for a malformed one, or an unknown type with the list of
// those supported.
std::unique_ptr<Decoder> parse_decoder(const Reader& r, const Json& j, const std::string& path);

}  // namespace fsdp::tokenizers::detail
