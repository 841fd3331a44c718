// fsdp/tokenizers/tokenizer.h — Hugging Face's tokenizers in C++: text to
// token ids and back, equal token for token to the Python packages
// `tokenizers` (0.23) and `sentencepiece` (0.2) on the files that Llama 2
// and 3, Mistral, Qwen2 and GPT-2 ship. docs/tokenizers.md lists what is
// supported and how it is checked.
//
// Two kinds of file:
//   tokenizer.json   Hugging Face's tokenizers format, with a BPE model:
//                    byte-level (Llama 3, Qwen2, GPT-2) or SentencePiece-style
//                    with byte fallback (Llama 2, Mistral); its normalizer,
//                    pre-tokenizer, added tokens, post-processor and decoder.
//   tokenizer.model  a SentencePiece model (Llama 2, Mistral), run by the
//                    sentencepiece library itself.
//
// What is written by hand, and why: no C++ library reads tokenizer.json, so
// this module implements Hugging Face's pipeline for the parts these models
// use: the BPE merge loop, the byte-level mapping (GPT-2's bytes to
// characters), the matching of added tokens (their lstrip, rstrip,
// single_word and normalized flags), the split behaviours, the template
// post-processor and the decoders. Everything a library offers is taken from
// one: JSON (nlohmann-json), regular expressions (PCRE2, for the Oniguruma
// patterns of the Rust library), Unicode NFC and character properties
// (ICU), and SentencePiece models (libsentencepiece).
//
// What is refused: any component this module does not implement, by its
// type name, with the list of those it does (e.g. a WordPiece or Unigram
// model in tokenizer.json, a Lowercase normalizer, a Whitespace
// pre-tokenizer, a BertProcessing post-processor, BPE dropout, truncation or
// padding settings); see docs/tokenizers.md. The Unicode data differ where
// the libraries' versions do: PCRE2 10.42's \p{L} and \p{N} are Unicode 14's,
// Oniguruma's in tokenizers 0.23 Unicode 16's (characters encoded in Unicode
// 15 and 16 are neither letter nor digit here), PCRE2's \s also matches
// U+180E, and NFC is ICU 72's (Unicode 15), where tokenizers' older table
// orders a few recent combining marks differently.
//
// Errors: a file that cannot be read or is not what it should be (missing,
// a directory where a file is expected, over kMaxTokenizerFileBytes, not
// JSON, an unknown type, a merge that names a token the vocab lacks, a bad
// regular expression, a model that sentencepiece refuses) is a
// fsdp::ConfigError whose message names the file, the key (a JSON path such
// as `model.merges[3]`) and what was expected. Text that is not valid UTF-8
// is a ConfigError too (the Python packages take only valid strings).
//
// A Tokenizer is immutable after loading: encode and decode are const and
// may run on many threads at once. No cache: each call costs the same.
// Standard library, PCRE2, ICU, sentencepiece and nlohmann-json only; no
// LibTorch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace fsdp::tokenizers {

// The largest tokenizer.json or tokenizer.model read (256 MiB). Real ones
// are far smaller (Llama 3's tokenizer.json: 9 MB; the largest vocabularies'
// a few tens of MB), and a parsed tokenizer.json takes several times its
// size in memory, so a bigger file is refused before it is read.
constexpr int64_t kMaxTokenizerFileBytes = int64_t{256} << 20;

// The longest text a tokenizer.json's normalizer may make of a text of n
// bytes: kMaxNormalizedGrowth * n + kNormalizedSlackBytes (1 MiB may grow to
// 32 MiB + 64 KiB). Real normalizers grow a text by 3 times at most (Llama
// 2's ' ' -> '▁' and its Prepend, NFC); the bound keeps a hostile file's
// chain of Replace normalizers ('a' -> 1000 x 'a', 20 times) from
// allocating without end. Its Replace decoders are bounded the same way.
constexpr size_t kMaxNormalizedGrowth = 32;
constexpr size_t kNormalizedSlackBytes = size_t{64} << 10;

class Tokenizer {
 public:
  virtual ~Tokenizer();

  // Text (UTF-8) to token ids. With add_special_tokens: tokenizer.json's
  // post-processor is applied (its template, e.g. Llama 3's
  // "<|begin_of_text|> $A", puts BOS first); a SentencePiece model gets its
  // BOS id first when it has one (as Hugging Face's LlamaTokenizer does; no
  // EOS). Special tokens written in the text (e.g. "<|eot_id|>") are always
  // their ids, with or without add_special_tokens. Cost: linear in the text
  // (times log of a pre-token's length for the BPE merges). ConfigError if
  // the text is not valid UTF-8, if a regular expression of the file
  // exceeds PCRE2's match limits on it (a pathological pattern), or if the
  // normalizer would make the text longer than kMaxNormalizedGrowth times
  // its bytes plus kNormalizedSlackBytes (a chain of Replace normalizers
  // that multiplies it), naming the normalizer (e.g.
  // `normalizer.normalizers[1] (Replace)`) and the lengths.
  virtual std::vector<int64_t> encode(const std::string& text, bool add_special_tokens = true) const = 0;

  // Token ids to text. skip_special_tokens drops the special tokens (BOS,
  // EOS, "<|eot_id|>", ...). Bytes that do not form UTF-8 (a sequence cut in
  // the middle of a character) become U+FFFD, as the libraries do. Cost:
  // linear in the ids.
  // tokenizer.json: an id that names no token is dropped (as `tokenizers`
  // does); a negative id is a ConfigError. SentencePiece: sentencepiece's
  // own decode, which turns BOS and EOS into nothing either way; an id
  // outside [0, vocab_size()) is a ConfigError (sentencepiece refuses it).
  // A Replace decoder that would make more than the same bound (over the
  // tokens' bytes) is a ConfigError naming it.
  virtual std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens = false) const = 0;

  // The number of distinct tokens, the added ones included (Python's
  // get_vocab_size(); sentencepiece's get_piece_size()).
  virtual int64_t vocab_size() const = 0;

  // The id of a token as the vocab writes it (e.g. "Ġthe", "▁the",
  // "<|eot_id|>"), nullopt for none.
  virtual std::optional<int64_t> token_to_id(const std::string& token) const = 0;
  // The token an id names, nullopt for none (an added token with
  // "normalized": true as the normalizer makes it: tokenizers 0.23 does so,
  // and decode uses it).
  virtual std::optional<std::string> id_to_token(int64_t id) const = 0;

  // BOS and EOS, where known. tokenizer.json: a "bos_token" / "eos_token" of
  // tokenizer_config.json beside it (read by load_tokenizer on a directory),
  // else the special token the template puts before (BOS) or after (EOS)
  // the text. SentencePiece: the model's own (nullopt where it has none).
  std::optional<int64_t> bos_id() const { return bos_id_; }
  std::optional<int64_t> eos_id() const { return eos_id_; }

  // The file it was read from (or the name given to hf_tokenizer_from_json).
  const std::string& source() const { return source_; }

 protected:
  explicit Tokenizer(std::string source) : source_(std::move(source)) {}
  std::string source_;
  std::optional<int64_t> bos_id_, eos_id_;

  friend std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path);
};

// A tokenizer as Hugging Face lays it out. `path`: a directory holding
// tokenizer.json (preferred) or tokenizer.model, and optionally
// tokenizer_config.json (its bos_token and eos_token set bos_id() and
// eos_id()); or one file: *.json is read as tokenizer.json, anything else as
// a SentencePiece model. ConfigError naming the path if nothing is there.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path);

// A tokenizer.json file. Cost: one read and parse of the file (8 MB with a
// 128,000-token vocab, Llama 3's size: about 0.5 s; memory: several times
// the file while parsing, then about twice the vocab and merges).
std::unique_ptr<Tokenizer> load_hf_tokenizer_json(const std::string& path);

// The same from the file's text; `source` names it in errors.
std::unique_ptr<Tokenizer> hf_tokenizer_from_json(std::string_view json, const std::string& source);

// A SentencePiece model file (tokenizer.model).
std::unique_ptr<Tokenizer> load_sentencepiece(const std::string& path);

}  // namespace fsdp::tokenizers
