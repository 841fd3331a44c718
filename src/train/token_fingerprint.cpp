// The tokenizer's fingerprint in llm.c's header (token_fingerprint.h).
#include "token_fingerprint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <tuple>
#include <vector>

#include "fsdp/error.h"
#include "fsdp/formats/format.h"  // crc32, entry_kind
#include "fsdp/train/batches.h"   // kLlmcMagic, kLlmcHeaderBytes

namespace fsdp::train {

namespace fs = std::filesystem;

namespace {

// CRC-32 and size of the regular file `path` (read whole, a MiB at a time).
std::pair<uint32_t, uint32_t> crc_of(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  struct stat st {};
  if (fd < 0 || ::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const std::string why = fd < 0 ? std::strerror(errno) : "not a regular file";
    if (fd >= 0) ::close(fd);
    throw ConfigError(path + ": cannot read the tokenizer file for its fingerprint: " + why);
  }
  std::vector<char> buf(1 << 20);
  uint32_t crc = 0;
  uint64_t size = 0;
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const std::string why = std::strerror(errno);
      ::close(fd);
      throw ConfigError(path + ": cannot read the tokenizer file for its fingerprint: " + why);
    }
    if (n == 0) break;
    crc = formats::crc32(buf.data(), static_cast<size_t>(n), crc);
    size += static_cast<uint64_t>(n);
  }
  ::close(fd);
  return {crc, static_cast<uint32_t>(size)};
}

int32_t word(const uint8_t* h, int i) {
  const uint8_t* p = h + 4 * i;
  return static_cast<int32_t>(uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24);
}

void put_word(uint8_t* h, int i, uint32_t v) {
  for (int k = 0; k < 4; ++k) h[4 * i + k] = static_cast<uint8_t>(v >> (8 * k));
}

std::string hex(uint32_t v) {
  std::ostringstream os;
  os << std::hex << v;
  return os.str();
}

std::string id_text(const std::optional<int64_t>& id) { return id ? std::to_string(*id) : std::string("none"); }

}  // namespace

std::optional<TokenizerFingerprint> tokenizer_files(const std::string& path) {
  TokenizerFingerprint f;
  std::string file = path;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    const fs::path d(path);
    if (fs::exists(d / "tokenizer.json", ec)) {
      file = (d / "tokenizer.json").string();
    } else if (fs::exists(d / "tokenizer.model", ec)) {
      file = (d / "tokenizer.model").string();
    } else {
      return std::nullopt;
    }
    const std::string config = (d / "tokenizer_config.json").string();
    if (fs::is_regular_file(config, ec)) {
      f.has_config = true;
      std::tie(f.config_crc, f.config_size) = crc_of(config);
    }
  }
  const std::string name = fs::path(file).filename().string();
  f.sentencepiece = name.size() < 5 || name.compare(name.size() - 5, 5, ".json") != 0;
  std::tie(f.file_crc, f.file_size) = crc_of(file);
  return f;
}

void put_fingerprint(const TokenizerFingerprint& f, uint8_t* h) {
  put_word(h, 3, static_cast<uint32_t>(kTokenizerMark));
  put_word(h, 4, 1);
  put_word(h, 5, static_cast<uint32_t>(f.vocab_size));
  put_word(h, 6, f.bos ? static_cast<uint32_t>(*f.bos + 1) : 0);
  put_word(h, 7, f.eos ? static_cast<uint32_t>(*f.eos + 1) : 0);
  put_word(h, 8, f.file_crc);
  put_word(h, 9, f.file_size);
  put_word(h, 10, f.config_crc);
  put_word(h, 11, (f.has_config ? 1u : 0u) | (f.sentencepiece ? 2u : 0u));
  put_word(h, 12, f.config_size);
}

std::optional<TokenizerFingerprint> fingerprint_in_header(const uint8_t* h) {
  if (word(h, 0) != kLlmcMagic || word(h, 3) != kTokenizerMark || word(h, 4) != 1) return std::nullopt;
  TokenizerFingerprint f;
  f.vocab_size = static_cast<uint32_t>(word(h, 5));
  if (word(h, 6) != 0) f.bos = static_cast<int64_t>(static_cast<uint32_t>(word(h, 6))) - 1;
  if (word(h, 7) != 0) f.eos = static_cast<int64_t>(static_cast<uint32_t>(word(h, 7))) - 1;
  f.file_crc = static_cast<uint32_t>(word(h, 8));
  f.file_size = static_cast<uint32_t>(word(h, 9));
  f.config_crc = static_cast<uint32_t>(word(h, 10));
  f.has_config = (word(h, 11) & 1) != 0;
  f.sentencepiece = (word(h, 11) & 2) != 0;
  f.config_size = static_cast<uint32_t>(word(h, 12));
  return f;
}

void check_data_tokenizer(const std::string& data, const std::string& dir, bool allow_change, int64_t model_vocab) {
  if (dir.empty() || data.empty()) return;
  uint8_t head[kLlmcHeaderBytes] = {};
  {
    const int fd = ::open(data.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return;  // the data checks name it
    const ssize_t n = ::pread(fd, head, sizeof head, 0);
    ::close(fd);
    if (n != static_cast<ssize_t>(sizeof head)) return;
  }
  const auto was = fingerprint_in_header(head);
  if (!was) return;  // prepared before fingerprints, or by llm.c
  const auto now = tokenizer_files(dir);
  if (!now) return;  // no tokenizer files to compare with
  const std::string file = was->sentencepiece ? "tokenizer.model" : "tokenizer.json";
  const std::string now_file = now->sentencepiece ? "tokenizer.model" : "tokenizer.json";
  std::vector<std::string> differ;
  if (now_file != file || now->file_crc != was->file_crc || now->file_size != was->file_size) {
    differ.push_back("the tokenizer file: " + file + " of CRC-32 " + hex(was->file_crc) + ", " +
                     std::to_string(was->file_size) + " bytes, when prepared; " + dir + "/" + now_file +
                     " is of CRC-32 " + hex(now->file_crc) + ", " + std::to_string(now->file_size) + " bytes");
  }
  if (was->has_config && (!now->has_config || now->config_crc != was->config_crc || now->config_size != was->config_size)) {
    differ.push_back("tokenizer_config.json (its BOS and EOS): CRC-32 " + hex(was->config_crc) + ", " +
                     std::to_string(was->config_size) + " bytes, when prepared; " +
                     (now->has_config ? "CRC-32 " + hex(now->config_crc) + ", " + std::to_string(now->config_size) +
                                            " bytes in " + dir
                                      : dir + " has none"));
  }
  if (was->vocab_size > model_vocab) {
    differ.push_back("the vocabulary: " + std::to_string(was->vocab_size) + " tokens when prepared, more than the "
                     "model's vocab_size " + std::to_string(model_vocab));
  }
  if (differ.empty()) return;
  std::string what = "--data " + data + " was prepared with another tokenizer than --model hf:" + dir + "'s (it " +
                     "recorded vocab " + std::to_string(was->vocab_size) + ", BOS " + id_text(was->bos) + ", EOS " +
                     id_text(was->eos) + "); differing: ";
  for (size_t i = 0; i < differ.size(); ++i) what += (i ? "; " : "") + differ[i];
  if (!allow_change) {
    throw ConfigError(what + ". Its ids would be other tokens to this model: expected the file prepared with this "
                      "model's tokenizer (fsdp-train prepare --tokenizer " + dir + "), or --allow-tokenizer-change "
                      "to train on it on purpose");
  }
  std::cerr << "fsdp-train: WARNING: " << what << "; training on it (--allow-tokenizer-change)" << std::endl;
}

}  // namespace fsdp::train
