// fsdp/train/tokenize.h — `fsdp-train tokenize`: text to token ids, printed,
// one line per input, as Hugging Face's tokenizer encodes it (to check a
// tokenizer, a prompt, or what `prepare` will write). Local: no LibTorch.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace fsdp::train {

// The largest file tokenize() reads (64 MiB): it encodes each input whole;
// `prepare` tokenizes bigger text in pieces.
constexpr int64_t kMaxTokenizeFileBytes = int64_t{64} << 20;

struct TokenizeOptions {
  // The tokenizer, as fsdp::tokenizers::load_tokenizer takes it: a model
  // directory (tokenizer.json, else tokenizer.model) or one file.
  std::string tokenizer;
  // Texts (UTF-8), each one input (--text).
  std::vector<std::string> texts;
  // Text files (UTF-8), each one input, its whole text; "-" is standard input.
  std::vector<std::string> files;
  // The tokenizer's special tokens (its template's BOS and the like):
  // true by default, as Hugging Face's `Tokenizer.encode(text)` and
  // transformers' `tokenizer.encode(text)` / `tokenizer(text)` default.
  bool add_special_tokens = true;
};

// Encodes each input, the texts first and then the files, in order, and
// writes one line per input to `out`: its ids in decimal, separated by one
// space (an empty line for none).
//
// The ids are encode(text, add_special_tokens) of fsdp::tokenizers: for a
// tokenizer.json, those of Hugging Face's `tokenizers`
// (`Tokenizer.from_file(path).encode(text).ids`, add_special_tokens=True by
// default), which transformers' `AutoTokenizer.from_pretrained(dir)
// .encode(text)` also gives where it keeps the file's post-processor (it may
// rewrite it from tokenizer_config.json's add_bos_token / add_eos_token for
// some classes). For a tokenizer.model: sentencepiece's ids with the BOS
// first, as transformers' LlamaTokenizer gives them.
//
// ConfigError naming the input (`--text 2`, the file) and what was expected:
// no inputs, a tokenizer that does not load (its own errors, after
// `--tokenizer DIR`), a file that is missing, not a regular file (a FIFO is
// refused before it is opened), over kMaxTokenizeFileBytes, or unreadable,
// text that is not UTF-8.
void tokenize(const TokenizeOptions& options, std::ostream& out);

}  // namespace fsdp::train
