// tokenizer.json's pre-tokenizers (private; pre_tokenizers/ of tokenizers
// 0.23): Split, ByteLevel (with GPT-2's byte alphabet, which the ByteLevel
// decoder reads back), Metaspace and Sequence, and their reading from the
// file.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "../json_reader.h"
#include "../piece.h"
#include "../regex.h"

namespace fsdp::tokenizers::detail {

// Each pre-tokenizer cuts every piece without an id into pieces; empty
// pieces are dropped.
class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  virtual void apply(std::vector<Piece>& pieces) const;

 protected:
  virtual void split(const Piece& piece, std::vector<Piece>& out) const = 0;
};

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// tokenizers' SplitDelimiterBehavior over a text's matches and gaps
// (NormalizedString::split): the ranges to keep.
std::vector<Span> split_by_behavior(std::vector<Span> spans, SplitBehavior behavior);

class SplitPreTokenizer : public PreTokenizer {
 public:
  SplitPreTokenizer(Regex pattern, SplitBehavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}

 protected:
  void split(const Piece& piece, std::vector<Piece>& out) const override;

 private:
  Regex pattern_;
  SplitBehavior behavior_;
  bool invert_;
};

// GPT-2's pre-tokenizer: a space before each piece (add_prefix_space), its
// regex (use_regex), then each byte as its printable character.
class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex, const std::string& where);

 protected:
  void split(const Piece& piece, std::vector<Piece>& out) const override;

 private:
  bool add_prefix_space_;
  std::optional<Regex> regex_;
};

// GPT-2's byte-level alphabet: byte -> its character (UTF-8), and back.
const std::string& byte_level_char(unsigned char byte);
std::optional<unsigned char> byte_level_byte(char32_t c);
// GPT-2's regex (tokenizers' ByteLevel with use_regex).
extern const char* const kGpt2Regex;

// Where Metaspace puts its ▁ (the pre-tokenizer and the decoder share it).
enum class PrependScheme { kAlways, kNever, kFirst };

// SentencePiece's spaces: ' ' becomes `replacement` (▁), which is put before
// the piece (always, never, or only before the text's first piece), and the
// piece is split before each ▁ (split).
class MetaspacePreTokenizer : public PreTokenizer {
 public:
  MetaspacePreTokenizer(std::string replacement, PrependScheme scheme, bool split, const std::string& where)
      : replacement_(std::move(replacement)),
        scheme_(scheme),
        split_(split),
        replacement_pattern_(Regex::literal(replacement_, where)) {}

 protected:
  void split(const Piece& piece, std::vector<Piece>& out) const override;

 private:
  std::string replacement_;
  PrependScheme scheme_;
  bool split_;
  Regex replacement_pattern_;
};

class SequencePreTokenizer : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> steps) : steps_(std::move(steps)) {}
  void apply(std::vector<Piece>& pieces) const override;

 protected:
  void split(const Piece& piece, std::vector<Piece>& out) const override;

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

// The pre-tokenizer `j` at the JSON path `path`; nullptr for null.
// `has_normalizer`: the file has a normalizer (Metaspace's 'first' scheme is
// refused after one). ConfigError naming the key for a malformed one, or an
// unknown type with the list of those supported.
std::unique_ptr<PreTokenizer> parse_pre_tokenizer(const Reader& r, const Json& j, const std::string& path,
                                                  bool has_normalizer);

// A Metaspace component's prepend_scheme (default always), or the older
// add_prefix_space: false (never); the decoder reads it too.
PrependScheme parse_prepend_scheme(const Reader& r, const Json& j, const std::string& path);

}  // namespace fsdp::tokenizers::detail
