#include "fsdp/train/batches.h"

#include <ATen/ATen.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>
#include <utility>

#include "fsdp/error.h"

namespace fsdp::train {

int64_t held_out_tokens(int64_t total, int64_t context) {
  const int64_t want = std::max<int64_t>(total / 10, (context + 2) * 8);
  return total - want >= context + 2 ? want : 0;
}

int64_t min_tokens_to_hold_out(int64_t context) { return (context + 2) * 9; }

const char* const kDataFormats = "text, uint16, uint32 or auto";

void check_data_format(const std::string& format) {
  if (format != "text" && format != "uint16" && format != "uint32" && format != "auto") {
    throw ConfigError("--data-format '" + format + "': expected " + kDataFormats);
  }
}

namespace {

// A little-endian int32 at p.
int32_t le32(const uint8_t* p) {
  return static_cast<int32_t>(uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24);
}

// The layout of `name`, a file of `size` bytes that begins with `head` (its
// first min(size, kLlmcHeaderBytes) bytes), read under `format`.
DataLayout layout_of(const std::string& name, const std::string& format, int64_t size, const uint8_t* head) {
  check_data_format(format);
  const int64_t n = std::min(size, kLlmcHeaderBytes);
  const bool magic = n >= 4 && le32(head) == kLlmcMagic;
  const int32_t version = n >= 8 ? le32(head + 4) : 0, count = n >= 12 ? le32(head + 8) : -1;
  const int version_width = version == 1 ? 2 : version == 2 ? 4 : 0;
  if (format == "text") return DataLayout{"text", 1, 0, size};
  if (format == "uint16" || format == "uint32") {
    const int w = format == "uint16" ? 2 : 4;
    // llm.c's magic and a version it writes (1 or 2) begin the file: its
    // header, whatever header[2] counts (a count that lies is a header all
    // the same, issue 50 item 10). Raw ids that begin so (ids 54600, 308,
    // then 1 or 2, 0 as uint16) would be a coincidence of 8 bytes.
    if (magic && n >= 8 && version_width > 0) {
      const bool true_count = n == kLlmcHeaderBytes && count >= 0 && size - kLlmcHeaderBytes == int64_t{count} * version_width;
      throw ConfigError(name + ": it starts with llm.c's header (magic " + std::to_string(kLlmcMagic) + ", version " +
                        std::to_string(version) + ", header[2] = " + std::to_string(count) + " tokens" +
                        (true_count ? std::string() : std::string(", which the file's size does not hold")) +
                        "), which --data-format " + format + " would read as token ids: expected --data-format auto, " +
                        "which reads the header (--data-format " + format + " takes raw little-endian ids without one)");
    }
    if (size % w != 0) {
      throw ConfigError(name + ": its " + std::to_string(size) + " bytes are not a whole number of " + format +
                        " ids (" + std::to_string(w) + " bytes each): expected a file of little-endian " + format +
                        " ids without a header, its size a multiple of " + std::to_string(w));
    }
    return DataLayout{format, w, 0, size / w};
  }
  if (!magic) return DataLayout{"text", 1, 0, size};  // auto: anything but llm.c's format is text
  const std::string header = name + ": llm.c's header (it starts with llm.c's magic " + std::to_string(kLlmcMagic) + ")";
  if (size < kLlmcHeaderBytes) {
    throw ConfigError(header + ": the file holds " + std::to_string(size) + " bytes, fewer than the header's " +
                      std::to_string(kLlmcHeaderBytes) + " (256 int32): expected a whole header and its tokens " +
                      "(or --data-format text to read the file as text)");
  }
  if (version_width == 0) {
    throw ConfigError(header + ": header[1] (the version) is " + std::to_string(version) +
                      ": expected 1 (uint16 tokens) or 2 (uint32 tokens)");
  }
  const int64_t body = size - kLlmcHeaderBytes;
  if (count < 0 || body != int64_t{count} * version_width) {
    const std::string width = version == 1 ? "uint16" : "uint32";
    const bool whole = body % version_width == 0;
    const std::string expected =
        whole ? "header[2] = " + std::to_string(body / version_width) + ", the " + width + " tokens its size holds"
              : "a file of " + std::to_string(kLlmcHeaderBytes) + " + " + std::to_string(version_width) +
                    " x header[2] = " +
                    std::to_string(kLlmcHeaderBytes + int64_t{std::max(count, int32_t{0})} * version_width) +
                    " bytes";
    throw ConfigError(header + ": header[2] (the number of tokens) is " + std::to_string(count) + ", but the " +
                      std::to_string(body) + " bytes after the header hold " +
                      (whole ? std::to_string(body / version_width) : std::string("no whole number of")) + " " +
                      width + " tokens (version " + std::to_string(version) + "): expected " + expected +
                      " (the file may be truncated or appended to)");
  }
  return DataLayout{"llm.c v" + std::to_string(version) + " (" + (version == 1 ? "uint16" : "uint32") + ")",
                    version_width, kLlmcHeaderBytes, count};
}

// The first min(size, kLlmcHeaderBytes) bytes of the open file `fd`, into
// `head`; ConfigError naming `name` when they cannot be read.
void read_head(int fd, int64_t size, const std::string& name, uint8_t* head) {
  const int64_t n = std::min(size, kLlmcHeaderBytes);
  int64_t done = 0;
  while (done < n) {
    const ssize_t r = ::pread(fd, head + done, static_cast<size_t>(n - done), static_cast<off_t>(done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      throw ConfigError(name + ": cannot read its first " + std::to_string(n) + " bytes: " +
                        (r < 0 ? std::string(std::strerror(errno)) : std::string("the file is shorter now")));
    }
    done += r;
  }
}

// The file at `path`, opened for reading (O_NONBLOCK: a FIFO is refused
// instead of waited on), and its size: a regular file that is not empty.
// ConfigError naming `name` otherwise.
int open_data_file(const std::string& path, const std::string& name, int64_t& size) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) throw ConfigError(name + ": cannot open it: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw ConfigError(name + ": not a regular file (a FIFO, device or directory); expected a text file");
  }
  if (st.st_size == 0) {
    ::close(fd);
    throw ConfigError(name + ": the file is empty");
  }
  size = st.st_size;
  return fd;
}

}  // namespace

DataLayout read_data_layout(const std::string& path, const std::string& format, const std::string& flag) {
  check_data_format(format);
  const std::string name = flag + " " + path;
  int64_t size = 0;
  const int fd = open_data_file(path, name, size);
  uint8_t head[kLlmcHeaderBytes];
  try {
    read_head(fd, size, name, head);
    const DataLayout layout = layout_of(name, format, size, head);
    ::close(fd);
    return layout;
  } catch (...) {
    ::close(fd);
    throw;
  }
}

at::Tensor bytes_to_tokens(const std::string& text) {
  at::Tensor t = at::empty({static_cast<int64_t>(text.size())}, at::kByte);
  std::memcpy(t.data_ptr(), text.data(), text.size());
  return t.to(at::kLong);
}

Corpus Corpus::map_file(const std::string& path, const std::string& flag, const std::string& format) {
  check_data_format(format);
  const std::string name = flag + " " + path;
  int64_t size = 0;
  const int fd = open_data_file(path, name, size);
  DataLayout layout;
  try {
    uint8_t head[kLlmcHeaderBytes];
    read_head(fd, size, name, head);
    layout = layout_of(name, format, size, head);
  } catch (...) {
    ::close(fd);
    throw;
  }
  void* p = ::mmap(nullptr, static_cast<size_t>(size), PROT_READ, MAP_SHARED, fd, 0);
  const int err = errno;
  if (p == MAP_FAILED) {
    ::close(fd);
    throw ConfigError(name + ": cannot memory-map its " + std::to_string(size) + " bytes: " + std::strerror(err) +
                      "; expected a file that fits this process's address space (see ulimit -v)");
  }
  ::madvise(p, static_cast<size_t>(size), MADV_RANDOM);  // samples are random windows: no read-ahead
  Corpus c;
  c.mapping_ = p;
  c.fd_ = fd;  // read()'s: samples are copied out with pread, never through the mapping
  c.data_ = static_cast<const uint8_t*>(p);
  c.size_ = size;
  c.layout_ = std::move(layout);
  c.name_ = name;
  return c;
}

Corpus Corpus::hold(std::string text, std::string name) {
  Corpus c;
  c.text_ = std::move(text);
  c.data_ = reinterpret_cast<const uint8_t*>(c.text_.data());
  c.size_ = static_cast<int64_t>(c.text_.size());
  c.layout_ = DataLayout{"text", 1, 0, c.size_};
  c.name_ = std::move(name);
  return c;
}

Corpus::Corpus(Corpus&& other) noexcept { *this = std::move(other); }

Corpus& Corpus::operator=(Corpus&& other) noexcept {
  if (this == &other) return *this;
  release();
  text_ = std::move(other.text_);
  mapping_ = std::exchange(other.mapping_, nullptr);
  fd_ = std::exchange(other.fd_, -1);
  // A held text's bytes may move with it (a short string lives inside it).
  data_ = mapping_ != nullptr ? static_cast<const uint8_t*>(mapping_) : reinterpret_cast<const uint8_t*>(text_.data());
  size_ = std::exchange(other.size_, 0);
  other.data_ = nullptr;
  layout_ = std::exchange(other.layout_, DataLayout{});
  name_ = std::move(other.name_);
  return *this;
}

Corpus::~Corpus() { release(); }

void Corpus::release() {
  if (mapping_ != nullptr) ::munmap(mapping_, static_cast<size_t>(size_));
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  mapping_ = nullptr;
  data_ = nullptr;
  size_ = 0;
  layout_ = DataLayout{};
  text_.clear();
}

void Corpus::read(int64_t offset, int64_t length, uint8_t* out) const {
  if (offset < 0 || length < 0 || offset > size_ - length) {
    throw Error("Corpus::read: bytes [" + std::to_string(offset) + ", " + std::to_string(offset + length) +
                ") lie outside " + name_ + " (" + std::to_string(size_) + " bytes)");
  }
  if (fd_ < 0) {
    std::memcpy(out, data_ + offset, static_cast<size_t>(length));
    return;
  }
  int64_t done = 0;
  while (done < length) {
    const ssize_t n = ::pread(fd_, out + done, static_cast<size_t>(length - done), static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : 0;
      struct stat st {};
      const std::string now =
          ::fstat(fd_, &st) == 0 ? std::to_string(st.st_size) + " bytes now" : std::string("its size unknown");
      throw ConfigError(name_ + ": cannot read bytes [" + std::to_string(offset) + ", " +
                        std::to_string(offset + length) + ") of a sample: " +
                        (err != 0 ? std::string(std::strerror(err)) : std::string("they lie past its end")) +
                        " (it held " + std::to_string(size_) + " bytes when the run started, " + now +
                        "): it was truncated or rewritten while the run reads it. The run stops here; its newest "
                        "checkpoint is intact: restore the file and --resume");
    }
    done += n;
  }
}

std::string Corpus::fingerprint() const {
  constexpr int64_t kPage = 4096, kPages = 64;
  // FNV-1a, 64 bits: the size first, then the sampled pages.
  uint64_t h = 0xcbf29ce484222325ULL;
  auto mix = [&](const uint8_t* p, int64_t n) {
    for (int64_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ULL;
  };
  const uint64_t size = static_cast<uint64_t>(size_);
  mix(reinterpret_cast<const uint8_t*>(&size), sizeof size);
  std::vector<uint8_t> page(static_cast<size_t>(kPage));
  if (size_ <= kPage * kPages) {
    for (int64_t at = 0; at < size_; at += kPage) {
      const int64_t n = std::min(kPage, size_ - at);
      read(at, n, page.data());
      mix(page.data(), n);
    }
  } else {
    for (int64_t i = 0; i < kPages; ++i) {  // the first and the last page among them
      const auto at = static_cast<int64_t>(static_cast<unsigned __int128>(size_ - kPage) * static_cast<unsigned>(i) /
                                           (kPages - 1));
      read(at, kPage, page.data());
      mix(page.data(), kPage);
    }
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return std::to_string(size_) + ":fnv1a64:" + hex;
}

BatchSampler::BatchSampler(Corpus corpus, int64_t context, int64_t batch, uint64_t seed, int rank, int world,
                           at::Device device, int64_t vocab)
    : corpus_(std::move(corpus)),
      training_size_(corpus_.tokens() - held_out_tokens(corpus_.tokens(), context)),
      held_out_size_(corpus_.tokens() - training_size_),
      context_(context),
      batch_(batch),
      vocab_(vocab),
      seed_(seed),
      rank_(rank),
      world_(world),
      device_(device) {
  const std::string unit = corpus_.layout().unit();
  if (training_size_ < context_ + 2) {
    throw ConfigError("--context " + std::to_string(context_) + ": the training text of " + corpus_.name() + " (" +
                      std::to_string(training_size_) + " " + unit + ") cannot hold a sample: --context " +
                      std::to_string(context_) + " needs at least " + std::to_string(context_ + 2) + " " + unit +
                      " (a sample of " + std::to_string(context_ + 1) +
                      " and room to place it); expected --context at most " + std::to_string(training_size_ - 2));
  }
}

namespace {

// SplitMix64's output function (Steele, Lea, Flood 2014; the seeding
// generator of xoshiro): a bijection of 64-bit words that mixes every input
// bit into every output bit.
uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// Where sample `i` of the stream of `seed` starts among `starts` positions.
int64_t start_of(uint64_t seed, int64_t i, int64_t starts) {
  return static_cast<int64_t>(splitmix64(splitmix64(seed) + static_cast<uint64_t>(i)) %
                              static_cast<uint64_t>(starts));
}

}  // namespace

Batch BatchSampler::training(int64_t position) const {
  if (position < 0) throw Error("BatchSampler::training: the sample position is " + std::to_string(position));
  return draw(0, training_size_, seed_, position);
}

int64_t BatchSampler::sample_start(int64_t i) const { return start_of(seed_, i, training_size_ - (context_ + 1)); }

Batch BatchSampler::held_out(int64_t i) const {
  if (!has_held_out()) {
    const std::string unit = corpus_.layout().unit();
    throw Error("BatchSampler::held_out: " + corpus_.name() + " (" + std::to_string(corpus_.tokens()) + " " + unit +
                ") is too short to hold any text out at context " + std::to_string(context_) + " (at least " +
                std::to_string(min_tokens_to_hold_out(context_)) + " " + unit +
                " needed); check has_held_out() first");
  }
  return draw(training_size_, held_out_size_, seed_ + 7777, i * batch_ * world_, kHeldOutSamples);
}

int64_t BatchSampler::held_out_rounds() const {
  const int64_t per_round = batch_ * world_;
  return (kHeldOutSamples + per_round - 1) / per_round;
}

int64_t BatchSampler::held_out_rows(int64_t i) const {
  const int64_t first = i * batch_ * world_ + rank_ * batch_;
  return std::clamp<int64_t>(kHeldOutSamples - first, 0, batch_);
}

// This rank's windows of the step whose samples start at `first` in the
// stream of `seed` over the tokens [offset, offset + length) of the corpus.
// Each window's ids are read little-endian and checked against the
// vocabulary as they are converted (text: its bytes).
Batch BatchSampler::draw(int64_t offset, int64_t length, uint64_t seed, int64_t first, int64_t wrap) const {
  const int64_t span = context_ + 1;
  const DataLayout& layout = corpus_.layout();
  const int width = layout.width;
  at::Tensor windows = at::empty({batch_, span}, at::kLong);
  int64_t* out = windows.data_ptr<int64_t>();
  std::vector<uint8_t> raw(static_cast<size_t>(span * width));
  for (int64_t i = 0; i < batch_; ++i) {
    int64_t sample = first + rank_ * batch_ + i;
    if (wrap > 0) sample %= wrap;
    const int64_t start = offset + start_of(seed, sample, length - span);  // a token of the corpus
    // pread: a truncated file is an error, never SIGBUS
    corpus_.read(layout.offset + start * width, span * width, raw.data());
    int64_t* row = out + i * span;
    for (int64_t j = 0; j < span; ++j) {
      const uint8_t* p = raw.data() + j * width;
      int64_t id = p[0];
      if (width >= 2) id |= int64_t{p[1]} << 8;
      if (width == 4) id |= int64_t{p[2]} << 16 | int64_t{p[3]} << 24;
      if (id >= vocab_) {
        throw ConfigError(corpus_.name() + ": token " + std::to_string(start + j) + " of the file (counting from 0" +
                          (layout.offset > 0 ? ", after llm.c's header" : "") + ", read as " + layout.format +
                          ") is id " + std::to_string(id) + ", at or beyond the model's vocabulary size " +
                          std::to_string(vocab_) + ": expected ids from 0 to " + std::to_string(vocab_ - 1) +
                          " (--vocab sets the model's vocabulary; fsdp-train prepare writes a tokenizer's ids)");
      }
      row[j] = id;
    }
  }
  at::Tensor b = windows.to(device_);
  return {b.narrow(1, 0, context_), b.narrow(1, 1, context_)};
}

std::string generated_corpus(size_t bytes) {
  static const char* subjects[] = {"the cat", "a dog", "the old man", "my sister", "the teacher", "a small bird",
                                   "the farmer", "our neighbour"};
  static const char* verbs[] = {"sees", "likes", "finds", "carries", "paints", "follows", "remembers", "keeps"};
  static const char* objects[] = {"the red ball", "a green apple", "the long road", "a quiet song", "the blue door",
                                  "a warm coat", "the river", "an old book"};
  static const char* endings[] = {"in the morning", "after dinner", "near the house", "every day", "with care",
                                  "at night"};
  std::mt19937 gen(1234);
  std::string out;
  while (out.size() < bytes) {
    out += subjects[gen() % 8];
    out += ' ';
    out += verbs[gen() % 8];
    out += ' ';
    out += objects[gen() % 8];
    out += ' ';
    out += endings[gen() % 6];
    out += ". ";
    if (gen() % 5 == 0) out += "\n";
  }
  out.resize(bytes);
  return out;
}

}  // namespace fsdp::train
