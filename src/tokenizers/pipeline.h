// The parts of a tokenizer.json pipeline (private), as Hugging Face's
// tokenizers runs them: added tokens are cut out of the raw text, the rest
// normalized, pre-tokenized and given to the model; the post-processor adds
// the template's tokens; decoders turn tokens back into text. hf_json.cpp
// builds them from the file.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "bpe.h"
#include "fsdp/tokenizers/tokenizer.h"
#include "regex.h"

namespace fsdp::tokenizers::detail {

// A piece of the text on its way through the pipeline.
struct Piece {
  std::string text;
  size_t start = 0;  // where it starts in the original text (exact when there is no normalizer)
  int64_t id = -1;   // an added token's id; -1: text for the pre-tokenizer and the model
};

// --- normalizers --------------------------------------------------------------

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

// --- pre-tokenizers -----------------------------------------------------------

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

// GPT-2's byte-level alphabet: byte -> its character (UTF-8), and back.
const std::string& byte_level_char(unsigned char byte);
std::optional<unsigned char> byte_level_byte(char32_t c);
// GPT-2's regex (tokenizers' ByteLevel with use_regex).
extern const char* const kGpt2Regex;

// --- added tokens ---------------------------------------------------------------

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

// --- post-processors --------------------------------------------------------------

// TemplateProcessing's `single` template (the sequence, and the ids of each
// special token around it); ByteLevel's post-processor changes no id, and a
// Sequence applies its templates in order.
struct TemplatePiece {
  bool sequence = false;
  std::vector<int64_t> ids;  // a special token's ids
};
using Template = std::vector<TemplatePiece>;
void apply_templates(const std::vector<Template>& templates, std::vector<int64_t>& ids);

// --- decoders --------------------------------------------------------------------

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

}  // namespace fsdp::tokenizers::detail
