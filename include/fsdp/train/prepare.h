// fsdp/train/prepare.h — `fsdp-train prepare`: text files to a token-id file
// for --data, tokenized with a model's tokenizer (fsdp/tokenizers/) and
// written in llm.c's format (fsdp/train/batches.h: a header of 256 int32,
// then the ids). Local: no collectives, no LibTorch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fsdp::train {

struct PrepareOptions {
  // The tokenizer, as fsdp::tokenizers::load_tokenizer takes it: a model
  // directory (tokenizer.json, else tokenizer.model) or one file.
  std::string tokenizer;
  // The file written: llm.c's format, version 1 (uint16 ids) when the
  // tokenizer's vocabulary fits (vocab_size <= 65536), else version 2
  // (uint32 ids).
  std::string out;
  // Text files (UTF-8), tokenized in order, one after the other.
  std::vector<std::string> inputs;
  // The tokenizer's EOS id after each input (a document boundary).
  bool append_eos = false;
  // The tokenizer's BOS id before each input, as transformers' tok(text)
  // puts it for Llama-family tokenizers (prepare encodes without special
  // tokens otherwise).
  bool add_bos = false;
  // The text encoded at a time (see prepare()); at least 1.
  int64_t chunk_bytes = int64_t{1} << 20;
};

// What prepare() wrote.
struct PrepareResult {
  int64_t tokens = 0;      // ids written (header[2])
  int version = 1;         // llm.c's version: 1 (uint16) or 2 (uint32)
  int64_t vocab_size = 0;  // the tokenizer's
};

// The header's free words record the tokenizer's fingerprint: its
// vocab_size, BOS and EOS, and the CRC-32 and size of its tokenizer.json
// (or tokenizer.model) and of the tokenizer_config.json beside it
// (src/train/token_fingerprint.h); fsdp-train --model hf:DIR compares them
// with DIR's tokenizer and refuses another (--allow-tokenizer-change
// overrides). llm.c reads only header[0..2].
//
// Tokenizes each input without special tokens (encode(text, false): no BOS
// unless add_bos, unlike transformers' tok(text), which adds a Llama's BOS;
// EOS only by append_eos) and writes the ids to `out`, crash-safely: the ids
// go to a temporary beside it, which is synced and renamed over `out` once
// whole (fsdp::formats::AtomicFile): nothing is at `out` before, and a run
// that fails or is killed leaves what was there.
//
// Memory stays bounded on big files: each input is read about chunk_bytes
// at a time and encoded in pieces cut after a line break, where the piece
// before ends in a character that is not white space, then a single "\n",
// and the next begins with a character that is not white space (Unicode's
// White_Space, and U+180E). The byte-level BPE tokenizers (Llama 3, Qwen2,
// GPT-2: their pre-tokenizers' regexes) always end a pre-token there, so the
// ids equal those of encoding the file whole. They differ where the
// tokenizer joins text across such a break or adds to each text it is given:
// an added token that strips the white space around it (lstrip, rstrip), a
// prefix space (ByteLevel's add_prefix_space, Metaspace's or a Prepend
// normalizer's "▁", SentencePiece models), which each piece then gets as if
// it were a text of its own. A piece that finds no such break grows until
// one comes (a text without one is encoded whole).
//
// ConfigError naming the file and what was expected: a tokenizer that does
// not load (its own errors), no inputs, an input that cannot be read, text
// that is not UTF-8 (naming the input and the piece's bytes), append_eos
// (add_bos) with a tokenizer whose EOS (BOS) is unknown, an id that does not fit the
// version's width, more than 2^31 - 1 ids (header[2] is an int32), an `out`
// that is not a regular file or whose directory does not exist. Errors of
// writing (a full disk) are Errors naming `out`.
PrepareResult prepare(const PrepareOptions& options);

}  // namespace fsdp::train
