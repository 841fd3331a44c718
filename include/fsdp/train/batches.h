// fsdp/train/batches.h — the trainer's data: a corpus of tokens (a
// memory-mapped file: text, whose bytes are its tokens, or token ids; or a
// text held in memory), split into training tokens and a held-out tail, and
// the batches of each step. Local: no collectives.
//
// The sample stream: sample i (i = 0, 1, 2, ...) is the window of context + 1
// tokens of the training tokens starting at token sample_start(i), a
// function of the seed and i alone. A step at world W takes the next batch *
// W samples of the stream, from the global sample position P: rank r the
// samples [P + r * batch, P + (r + 1) * batch). The position after the step
// is P + batch * W. A run keeps the position in its checkpoints, so a job
// that resumes at another world size (an elastic resize) continues the
// stream where the checkpoint left it: across any number of resizes every
// sample is trained on once, in order, none skipped or seen twice. At one
// world size P = step * batch * W; world 1 with batch 2B sees what world 2
// with batch B sees, step by step. A text's tokens are its bytes (0..255):
// its stream is the one a file of the same bytes written as uint16 ids has.
//
// The formats of a --data file (TrainConfig::data_format):
//   text    its bytes, one token each (ids 0..255).
//   uint16  little-endian uint16 ids, no header (nanoGPT's train.bin).
//   uint32  little-endian uint32 ids, no header (vocabularies over 65536).
//   auto    llm.c's format when the file starts with its magic (below), read
//           by its header; anything else is text.
// llm.c's format (karpathy/llm.c, dev/data/data_common.py write_datafile): a
// header of 256 little-endian int32, header[0] = 20240520 (the magic),
// header[1] = the version (1: uint16 ids, GPT-2; 2: uint32 ids, Llama 3),
// header[2] = the number of tokens; then the tokens. `fsdp-train prepare`
// writes it (fsdp/train/prepare.h).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <string>

namespace fsdp::train {

// Tokens of a corpus of `total` tokens held out for evaluation (its end): a
// tenth, but at least 8 samples' worth ((context + 2) * 8), and 0 when the
// rest would then be shorter than one sample (nothing is held out).
int64_t held_out_tokens(int64_t total, int64_t context);

// The fewest tokens from which held_out_tokens holds anything out at
// `context`: (context + 2) * 9.
int64_t min_tokens_to_hold_out(int64_t context);

// The same for a text, whose bytes are its tokens.
inline int64_t held_out_bytes(int64_t total, int64_t context) { return held_out_tokens(total, context); }
inline int64_t min_bytes_to_hold_out(int64_t context) { return min_tokens_to_hold_out(context); }

// llm.c's data files (see the top of this file).
constexpr int32_t kLlmcMagic = 20240520;
constexpr int64_t kLlmcHeaderBytes = 256 * 4;

// The values --data-format takes, for messages: "text, uint16, uint32 or auto".
extern const char* const kDataFormats;
// ConfigError "--data-format '<format>': expected text, uint16, uint32 or
// auto" unless it is one of them.
void check_data_format(const std::string& format);

// Where a data file's tokens lie.
struct DataLayout {
  // What it was read as: "text", "uint16", "uint32", "llm.c v1 (uint16)",
  // "llm.c v2 (uint32)". Checkpoints keep it ("data_format").
  std::string format;
  int width = 1;        // bytes per token: 1 (text), 2 or 4
  int64_t offset = 0;   // bytes before the first token (llm.c's header)
  int64_t tokens = 0;   // the tokens the file holds
  // The unit of its lengths in messages: "bytes" (text) or "tokens".
  const char* unit() const { return format == "text" ? "bytes" : "tokens"; }
};

// How the file at `path` holds its tokens under --data-format `format`
// (text, uint16, uint32, auto), from its size and its first bytes (reads at
// most kLlmcHeaderBytes). ConfigError naming `flag`, the path and what was
// expected: a file that cannot be opened or is not a regular file; an
// unknown format; uint16/uint32 on a size that is not a multiple of the
// width, or on a file that starts with llm.c's header (magic, a version of
// 1 or 2 and the token count its size holds: it is read with auto); under
// auto an llm.c header shorter than 1024 bytes, of another version, or whose
// token count does not match the size (naming header[1] or header[2], the
// value and the one expected).
DataLayout read_data_layout(const std::string& path, const std::string& format, const std::string& flag = "--data");

// The size of the generated corpus a run trains on without --data
// (generated_corpus's default, below).
constexpr int64_t kGeneratedCorpusBytes = int64_t{1} << 20;

// The generated corpus: deterministic English-like text (no file needed);
// what fsdp-train trains on without --data.
std::string generated_corpus(size_t bytes = 1 << 20);

// The held-out set: the first kHeldOutSamples samples of the held-out
// stream, the same samples at any world size and batch (an elastic resize
// evaluates on the same set).
constexpr int64_t kHeldOutSamples = 64;

// One token per byte of `text` (0..255), a CPU tensor of int64.
at::Tensor bytes_to_tokens(const std::string& text);

// The tokens a run trains on, read where they are sampled, never copied
// whole: a file (text or token ids, its DataLayout), or a text held in
// memory. Move-only; const calls are thread-safe.
class Corpus {
 public:
  // The file at `path`, memory-mapped read-only (MAP_SHARED, MADV_RANDOM).
  // Costs address space of the file's size and no memory up front: the
  // kernel reads a page when a sample first touches it and keeps it in the
  // page cache (shared by the ranks of a machine, and given back under
  // memory pressure), so a rank's memory does not grow with the file.
  // `flag` names the setting in errors (e.g. "--data"). ConfigError naming
  // the flag, the path, and (when it cannot be mapped) the size and the
  // system's reason: a file that cannot be opened, is not a regular file, is
  // empty, or does not fit the address space (e.g. under ulimit -v).
  // The samples are copied out with pread(2) (read()), never through the
  // mapping: a file truncated while the run reads it is a ConfigError
  // naming it, not SIGBUS. `format` says how its tokens lie
  // (read_data_layout, with its errors): text, uint16, uint32 or auto.
  static Corpus map_file(const std::string& path, const std::string& flag = "--data",
                         const std::string& format = "auto");

  // Holds `text` itself (its size in memory). `name` names it in messages.
  static Corpus hold(std::string text, std::string name);

  Corpus(Corpus&& other) noexcept;
  Corpus& operator=(Corpus&& other) noexcept;
  Corpus(const Corpus&) = delete;
  Corpus& operator=(const Corpus&) = delete;
  ~Corpus();  // unmaps

  // Its bytes (the file's, headers included).
  int64_t size() const { return size_; }
  // Where its tokens lie (a held text: text, its bytes).
  const DataLayout& layout() const { return layout_; }
  int64_t tokens() const { return layout_.tokens; }
  // The bytes [0, size()); valid while the Corpus lives. Reading a mapped
  // file through it after the file shrank raises SIGBUS: read() is the
  // guarded copy.
  const uint8_t* data() const { return data_; }
  // Copies the bytes [offset, offset + length) into `out`: from the file
  // with pread(2), or from the held text. ConfigError naming the file, the
  // bytes asked for and its size now when the file no longer holds them (it
  // was truncated or replaced while the run reads it). Thread-safe.
  void read(int64_t offset, int64_t length, uint8_t* out) const;
  // A cheap fingerprint of the contents, to notice a file changed between
  // a checkpoint and a resume: "<size>:fnv1a64:<16 hex digits>", the hash
  // over 64 pages of 4 KiB spread evenly over the bytes (all of them when
  // fewer). Costs 64 reads of a page. ConfigError as read().
  std::string fingerprint() const;
  // What it is, for messages: "--data PATH" or the name given to hold().
  const std::string& name() const { return name_; }

 private:
  Corpus() = default;
  void release();

  std::string text_;  // hold()'s bytes; empty for a mapping
  void* mapping_ = nullptr;
  int fd_ = -1;  // the mapped file, open for read()
  const uint8_t* data_ = nullptr;
  int64_t size_ = 0;
  DataLayout layout_;
  std::string name_;
};

// The vocabulary of a byte-level model: a text's tokens are its bytes.
constexpr int64_t kByteVocab = 256;

// Inputs [batch, context] and their targets, the same tokens shifted by one.
struct Batch {
  at::Tensor inputs, targets;
};

class BatchSampler {
 public:
  // Samples `corpus` (kept by the sampler), its last held_out_tokens()
  // apart, for a model of `vocab` tokens. Costs nothing per token of the
  // corpus. ConfigError naming the corpus, its length and the context when
  // the training tokens cannot hold a sample (fewer than context + 2: a
  // sample and a choice of where it starts; train::validate checks this
  // before a run). Requires: batch > 0, 0 <= rank < world, vocab > 0.
  BatchSampler(Corpus corpus, int64_t context, int64_t batch, uint64_t seed, int rank, int world, at::Device device,
               int64_t vocab = kByteVocab);

  // This rank's `batch` samples of the step that starts at the global
  // sample position `position` (>= 0): the samples position + rank * batch
  // onwards. Costs a hash per sample, a copy of this rank's windows (batch x
  // (context + 1) tokens, a few pages of the corpus touched), a look at
  // each of their ids and their conversion to int64 on the device.
  // ConfigError (Corpus::read) when the file shrank under the run; and
  // ConfigError naming the corpus, the token's index in it (0: its first
  // token, after any header), its id and the vocabulary size when a
  // window holds an id at or beyond `vocab` (a file is never scanned
  // whole: the first batch that holds one stops the run).
  Batch training(int64_t position) const;

  // The samples one step takes: batch * world.
  int64_t samples_per_step() const { return batch_ * world_; }

  // The token where sample `i` of the training stream starts in the corpus
  // (0: its first token): a 64-bit hash (SplitMix64) of (seed, i), reduced
  // to [0, training tokens - context - 1). The same on every machine and
  // LibTorch version.
  int64_t sample_start(int64_t i) const;

  // Whether the corpus is long enough to hold a tail out
  // (min_tokens_to_hold_out); the held-out tail never overlaps the training
  // tokens.
  bool has_held_out() const { return held_out_size_ > 0; }

  // The held-out set is samples [0, kHeldOutSamples) of a stream like the
  // training one, with seed + 7777, over the held-out tail: the same at
  // any world size and batch. It is evaluated in held_out_rounds() rounds;
  // in round i rank r takes the samples i * batch * world + r * batch
  // onwards, its first held_out_rows(i) rows real samples and the rest
  // padding (repeats, to be left out of the mean) so that every rank's
  // batch has `batch` rows: every rank runs the same forwards.
  int64_t held_out_rounds() const;
  int64_t held_out_rows(int64_t i) const;
  // Round i's batch of this rank. Costs as training(). Requires
  // has_held_out(): an fsdp::Error otherwise (it never draws from the
  // training text).
  Batch held_out(int64_t i) const;

  const Corpus& corpus() const { return corpus_; }

 private:
  // The windows of the samples first, first + 1, ... of the stream of
  // `seed` over the tokens [offset, offset + length), each index taken
  // modulo `wrap` (0: none).
  Batch draw(int64_t offset, int64_t length, uint64_t seed, int64_t first, int64_t wrap = 0) const;

  Corpus corpus_;
  int64_t training_size_, held_out_size_;
  int64_t context_, batch_, vocab_;
  uint64_t seed_;
  int rank_, world_;
  at::Device device_;
};

}  // namespace fsdp::train
