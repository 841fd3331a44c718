// fsdp/train/batches.h — the trainer's data: a text as byte tokens, split
// into training text and a held-out tail, and the batches of each step,
// which depend only on the seed and the step (the same on every run, and
// after a resume). Local: no collectives; every rank draws the same global
// batch and takes its own slice of it.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <string>

namespace fsdp::train {

// Bytes of a text of `total` bytes held out for evaluation (its end): a
// tenth, but at least 8 samples' worth ((context + 2) * 8), and 0 when the
// rest would then be shorter than one sample (nothing is held out).
int64_t held_out_bytes(int64_t total, int64_t context);

// One token per byte of `text` (0..255), a CPU tensor of int64.
at::Tensor bytes_to_tokens(const std::string& text);

// Inputs [batch, context] and their targets, the same tokens shifted by one.
struct Batch {
  at::Tensor inputs, targets;
};

class BatchSampler {
 public:
  // Keeps `text` as tokens (8 bytes per byte of text), its last
  // held_out_bytes() apart. Requires: text at least context + 2 bytes long
  // (train::validate checks a --data file), batch > 0, 0 <= rank < world.
  BatchSampler(const std::string& text, int64_t context, int64_t batch, uint64_t seed, int rank, int world,
               at::Device device);

  // This rank's `batch` samples of the global batch of 0-based `step`: the
  // global batch is batch * world random windows of the training text,
  // drawn from a generator seeded by (seed, step), and rank r takes the r-th
  // slice. Costs one small draw and one copy of the samples to the device.
  Batch training(int64_t step) const;

  // The i-th of the fixed evaluation batches: as training(i) with seed +
  // 7777, from the held-out tail (from the training text when the text is
  // too short to hold anything out).
  Batch held_out(int64_t i) const;

 private:
  Batch draw(const at::Tensor& tokens, uint64_t seed, int64_t index) const;

  at::Tensor training_, held_out_;
  int64_t context_, batch_;
  uint64_t seed_;
  int rank_, world_;
  at::Device device_;
};

}  // namespace fsdp::train
