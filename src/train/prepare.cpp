// `fsdp-train prepare` (fsdp/train/prepare.h): text files to llm.c's token
// file, tokenized in pieces cut at line breaks where the tokenizers'
// pre-tokenizers always split.
#include "fsdp/train/prepare.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fsdp/error.h"
#include "fsdp/formats/format.h"  // AtomicFile
#include "fsdp/train/batches.h"   // kLlmcMagic, kLlmcHeaderBytes
#include "token_fingerprint.h"
#ifndef FSDP_NO_TOKENIZERS
#include "fsdp/tokenizers/tokenizer.h"
#endif

namespace fsdp::train {

#ifdef FSDP_NO_TOKENIZERS

PrepareResult prepare(const PrepareOptions&) {
#ifdef FSDP_TOKENIZERS_CLASH
  throw ConfigError("prepare: this fsdp-train is built on Debian's LibTorch 1.13, without fsdp::tokenizers: that "
                    "LibTorch's libprotobuf and Debian's libsentencepiece cannot share a process (they crash at "
                    "start-up): expected the wheel build's fsdp-train (FSDP_LIBTORCH=wheel) to prepare the file; any "
                    "build trains on it");
#else
  throw ConfigError("prepare: this fsdp-train was built without fsdp::tokenizers (configured with "
                    "-DFSDP_TOKENIZERS=OFF): expected a build with them (scripts/deps.sh installs what they need)");
#endif
}

#else

namespace fs = std::filesystem;

namespace {

// Whether code point `c` is white space to a tokenizer's regex: Unicode's
// White_Space (what Oniguruma's \s matches) and U+180E (PCRE2's \s too).
bool is_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 || c == 0x180E ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// The code point whose UTF-8 starts at s[i] (no checks beyond the string's
// end: text that is not UTF-8 is refused by encode).
uint32_t code_point_at(const std::string& s, size_t i) {
  const auto b = [&](size_t k) { return i + k < s.size() ? static_cast<uint8_t>(s[i + k]) : uint8_t{0}; };
  const uint8_t c = b(0);
  if (c < 0x80) return c;
  if ((c & 0xE0) == 0xC0) return (uint32_t{c} & 0x1F) << 6 | (b(1) & 0x3F);
  if ((c & 0xF0) == 0xE0) return (uint32_t{c} & 0x0F) << 12 | (b(1) & 0x3F) << 6 | (b(2) & 0x3F);
  return (uint32_t{c} & 0x07) << 18 | (b(1) & 0x3F) << 12 | (b(2) & 0x3F) << 6 | (b(3) & 0x3F);
}

// The code point whose UTF-8 ends at s[i].
uint32_t code_point_ending_at(const std::string& s, size_t i) {
  size_t start = i;
  while (start > 0 && i - start < 3 && (static_cast<uint8_t>(s[start]) & 0xC0) == 0x80) --start;
  return code_point_at(s, start);
}

// The last place p in (from, s.size()) where s may be cut (prepare.h): s[p -
// 1] is "\n", the character before it and the one at p are not white space.
// 0 when there is none.
size_t last_cut(const std::string& s, size_t from) {
  for (size_t p = s.size() - 1; p > from && p >= 2; --p) {
    if (s[p - 1] != '\n' || s[p - 2] == '\n') continue;
    if (!is_space(code_point_at(s, p)) && !is_space(code_point_ending_at(s, p - 2))) return p;
  }
  return 0;
}

// Writes ids as llm.c's tokens of `width` bytes (little-endian) into `out`.
class TokenWriter {
 public:
  TokenWriter(formats::AtomicFile& out, int width) : out_(out), width_(width) {}

  // `ids` (from `where`), each checked to fit the width.
  void write(const std::vector<int64_t>& ids, const std::string& where) {
    const int64_t most = width_ == 2 ? int64_t{0xFFFF} : int64_t{0xFFFFFFFF};
    buffer_.clear();
    for (const int64_t id : ids) {
      if (id < 0 || id > most) {
        throw ConfigError("prepare: " + where + ": the tokenizer gave id " + std::to_string(id) +
                          ", which llm.c's version " + (width_ == 2 ? "1 (uint16" : "2 (uint32") +
                          " ids) cannot hold: expected ids from 0 to " + std::to_string(most));
      }
      for (int k = 0; k < width_; ++k) buffer_.push_back(static_cast<char>((id >> (8 * k)) & 0xFF));
    }
    if (count_ + static_cast<int64_t>(ids.size()) > std::numeric_limits<int32_t>::max()) {
      throw ConfigError("prepare: " + where + ": more than 2147483647 tokens in all, which llm.c's header (header[2], "
                        "an int32) cannot count: expected fewer inputs per file (prepare them into several files)");
    }
    out_.write(buffer_.data(), buffer_.size());
    count_ += static_cast<int64_t>(ids.size());
  }

  int64_t count() const { return count_; }

 private:
  formats::AtomicFile& out_;
  int width_;
  int64_t count_ = 0;
  std::string buffer_;
};

// Tokenizes the text file `path` piece by piece into `writer`.
void tokenize_file(const tokenizers::Tokenizer& tok, const std::string& path, int64_t chunk_bytes,
                   TokenWriter& writer) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) {
    throw ConfigError("prepare: " + path + ": " + (fs::exists(path, ec) ? "not a regular file" : "no such file") +
                      "; expected a text file (UTF-8)");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError("prepare: " + path + ": cannot open it: " + std::strerror(errno));
  std::string pending;      // text read and not yet encoded
  int64_t pending_at = 0;   // its offset in the file
  size_t searched = 0;      // pending[0, searched] holds no cut
  auto encode = [&](size_t n) {
    const std::string piece = pending.substr(0, n);
    std::vector<int64_t> ids;
    const std::string where = path + " (bytes " + std::to_string(pending_at) + " to " +
                              std::to_string(pending_at + static_cast<int64_t>(n)) + ")";
    try {
      ids = tok.encode(piece, /*add_special_tokens=*/false);
    } catch (const ConfigError& e) {
      throw ConfigError("prepare: " + where + ": " + e.what());
    }
    writer.write(ids, where);
    pending.erase(0, n);
    pending_at += static_cast<int64_t>(n);
    searched = 0;
  };
  // No more than the file holds (and one byte to see its end).
  const auto size = static_cast<int64_t>(fs::file_size(path, ec));
  std::vector<char> buf(static_cast<size_t>(std::max<int64_t>(1, std::min<int64_t>(chunk_bytes, size + 1))));
  while (true) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const auto got = static_cast<size_t>(in.gcount());
    if (in.bad()) throw ConfigError("prepare: " + path + ": cannot read it: " + std::strerror(errno));
    const size_t before = pending.size();
    pending.append(buf.data(), got);
    if (got < buf.size()) break;  // the end of the file
    if (const size_t cut = last_cut(pending, searched); cut > 0) {
      encode(cut);
    } else {
      // None yet: the next read goes on from here (3 bytes back: a character that the read cut).
      searched = before + got > 3 ? before + got - 3 : 0;
    }
  }
  if (!pending.empty()) encode(pending.size());
}

}  // namespace

PrepareResult prepare(const PrepareOptions& o) {
  if (o.inputs.empty()) throw ConfigError("prepare: no input files: expected one or more text files to tokenize");
  if (o.chunk_bytes < 1) {
    throw ConfigError("prepare: --chunk-bytes " + std::to_string(o.chunk_bytes) + ": expected a positive count of bytes");
  }
  if (o.out.empty()) throw ConfigError("prepare: --out is empty: expected the token file to write (e.g. train.bin)");
  formats::check_file_destination(o.out, "prepare: --out");
  std::error_code ec;
  const fs::path dir = fs::path(o.out).parent_path();
  if (!dir.empty() && !fs::is_directory(dir, ec)) {
    throw ConfigError("prepare: --out " + o.out + ": its directory " + dir.string() +
                      " does not exist: expected an existing directory");
  }
  std::unique_ptr<tokenizers::Tokenizer> tok;
  try {
    tok = tokenizers::load_tokenizer(o.tokenizer);
  } catch (const ConfigError& e) {
    throw ConfigError("prepare: --tokenizer " + o.tokenizer + ": " + e.what());
  }
  // What the tokenizer was, for a --model hf: run to compare (its files
  // read now, before the text: a tokenizer changed meanwhile is not it).
  std::optional<TokenizerFingerprint> fingerprint = tokenizer_files(o.tokenizer);
  if (fingerprint) {
    fingerprint->vocab_size = tok->vocab_size();
    fingerprint->bos = tok->bos_id();
    fingerprint->eos = tok->eos_id();
  }
  PrepareResult r;
  r.vocab_size = tok->vocab_size();
  r.version = r.vocab_size <= 65536 ? 1 : 2;
  const int width = r.version == 1 ? 2 : 4;
  if (o.append_eos && !tok->eos_id()) {
    throw ConfigError("prepare: --append-eos: the tokenizer " + tok->source() +
                      " has no EOS token it knows of (tokenizer_config.json's eos_token, or the last special token "
                      "of its template): expected a tokenizer with one, or no --append-eos");
  }
  if (o.add_bos && !tok->bos_id()) {
    throw ConfigError("prepare: --add-bos: the tokenizer " + tok->source() +
                      " has no BOS token it knows of (tokenizer_config.json's bos_token, or the first special token "
                      "of its template): expected a tokenizer with one, or no --add-bos");
  }
  std::optional<formats::AtomicFile> file;
  try {
    file.emplace(o.out);  // its temporary beside it
  } catch (const Error& e) {
    throw ConfigError("prepare: --out " + o.out + ": " + e.what());
  }
  formats::AtomicFile& out = *file;
  // The header, its count written once known (below).
  const std::vector<char> zeros(static_cast<size_t>(kLlmcHeaderBytes), 0);
  out.write(zeros.data(), zeros.size());
  TokenWriter writer(out, width);
  for (const std::string& input : o.inputs) {
    if (o.add_bos) writer.write({*tok->bos_id()}, input + " (its BOS, --add-bos)");
    tokenize_file(*tok, input, o.chunk_bytes, writer);
    if (o.append_eos) writer.write({*tok->eos_id()}, input + " (its EOS, --append-eos)");
  }
  r.tokens = writer.count();
  // header[0..2]: magic, version, count, little-endian, then the
  // tokenizer's fingerprint in the free words (token_fingerprint.h); into
  // the temporary, which commit() syncs (the file's, whichever descriptor
  // wrote it) and renames.
  uint8_t header[64] = {};
  const uint32_t fields[3] = {static_cast<uint32_t>(kLlmcMagic), static_cast<uint32_t>(r.version),
                              static_cast<uint32_t>(r.tokens)};
  for (int f = 0; f < 3; ++f) {
    for (int k = 0; k < 4; ++k) header[f * 4 + k] = static_cast<uint8_t>(fields[f] >> (8 * k));
  }
  if (fingerprint) {
    std::vector<uint8_t> whole(static_cast<size_t>(kLlmcHeaderBytes), 0);
    put_fingerprint(*fingerprint, whole.data());
    std::memcpy(header + 12, whole.data() + 12, sizeof header - 12);
  }
  const int fd = ::open(out.temp_path().c_str(), O_WRONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0 || ::pwrite(fd, header, sizeof header, 0) != static_cast<ssize_t>(sizeof header)) {
    const int err = errno;
    if (fd >= 0) ::close(fd);
    throw Error("prepare: writing llm.c's header into " + out.temp_path() + " (for " + o.out + ") failed: " +
                std::strerror(err));
  }
  if (::close(fd) != 0) {
    throw Error("prepare: writing llm.c's header into " + out.temp_path() + " failed: " + std::strerror(errno));
  }
  out.commit();
  return r;
}

#endif  // FSDP_NO_TOKENIZERS

}  // namespace fsdp::train
