// src/train/token_fingerprint.h — the tokenizer's fingerprint that
// `fsdp-train prepare` writes into the free words of llm.c's header, and
// the check of a --model hf: run's --data against it (issue 50 item 15).
// Local: reads files only; needs no fsdp::tokenizers (the Debian build
// checks too).
//
// Words of the header (little-endian int32; llm.c writes 0 there and reads
// only header[0..2]):
//   [3] kTokenizerMark ("Ftok")   [4] 1, this layout's version
//   [5] the tokenizer's vocab_size  [6] BOS + 1, [7] EOS + 1 (0: none)
//   [8] CRC-32 of the tokenizer file (tokenizer.json or tokenizer.model)
//   [9] its size in bytes (low 32 bits)
//   [10] CRC-32 of tokenizer_config.json beside it, [12] its size
//   [11] flags: 1 = tokenizer_config.json was read, 2 = tokenizer.model
// A file without the mark (written before, or by llm.c) has no fingerprint.
#pragma once

#include <cstdint>
#include <optional>
#include <string>


namespace fsdp::train {

constexpr int32_t kTokenizerMark = 0x6B6F7446;  // the bytes "Ftok"

// A tokenizer as `prepare` used it, as far as its files tell.
struct TokenizerFingerprint {
  int64_t vocab_size = 0;
  std::optional<int64_t> bos, eos;
  uint32_t file_crc = 0, file_size = 0;        // tokenizer.json or tokenizer.model
  bool sentencepiece = false;                  // the file is tokenizer.model
  bool has_config = false;                     // tokenizer_config.json was read beside it
  uint32_t config_crc = 0, config_size = 0;
};

// The file part of the fingerprint of the tokenizer at `path`, as
// fsdp::tokenizers::load_tokenizer takes it (a directory: its
// tokenizer.json, else tokenizer.model, and tokenizer_config.json when
// present; or the file itself). vocab_size, bos and eos are left for the
// caller. nullopt when the directory holds no tokenizer file.
std::optional<TokenizerFingerprint> tokenizer_files(const std::string& path);

// Writes `f` into the words above of `header` (kLlmcHeaderBytes bytes).
void put_fingerprint(const TokenizerFingerprint& f, uint8_t* header);

// The fingerprint in `header` (its first kLlmcHeaderBytes bytes), nullopt
// when it has none.
std::optional<TokenizerFingerprint> fingerprint_in_header(const uint8_t* header);

// For a --model hf:DIR run whose --data is llm.c's file with a
// fingerprint: ConfigError naming the data file, DIR and each field that
// differs (the tokenizer file's CRC-32 and size, tokenizer_config.json's,
// a vocabulary larger than the model's vocab_size `model_vocab`), unless
// allow_change, which warns instead. Nothing for a file
// without one, another model, or a DIR without tokenizer files.
// `data`, `hf_dir` and `allow_change` are TrainConfig's data,
// hf_directory(config) and allow_tokenizer_change.
void check_data_tokenizer(const std::string& data, const std::string& hf_dir, bool allow_change, int64_t model_vocab);

}  // namespace fsdp::train
