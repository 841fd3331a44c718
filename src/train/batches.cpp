#include "fsdp/train/batches.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace fsdp::train {

int64_t held_out_bytes(int64_t total, int64_t context) {
  const int64_t want = std::max<int64_t>(total / 10, (context + 2) * 8);
  return total - want >= context + 2 ? want : 0;
}

at::Tensor bytes_to_tokens(const std::string& text) {
  at::Tensor t = at::empty({static_cast<int64_t>(text.size())}, at::kByte);
  std::memcpy(t.data_ptr(), text.data(), text.size());
  return t.to(at::kLong);
}

BatchSampler::BatchSampler(const std::string& text, int64_t context, int64_t batch, uint64_t seed, int rank, int world,
                           at::Device device)
    : context_(context), batch_(batch), seed_(seed), rank_(rank), world_(world), device_(device) {
  const at::Tensor all = bytes_to_tokens(text);
  const int64_t split = all.numel() - held_out_bytes(all.numel(), context);
  const bool holds_out = split < all.numel();
  training_ = holds_out ? all.narrow(0, 0, split) : all;
  held_out_ = holds_out ? all.narrow(0, split, all.numel() - split) : all;
}

Batch BatchSampler::training(int64_t step) const { return draw(training_, seed_, step); }

Batch BatchSampler::held_out(int64_t i) const { return draw(held_out_, seed_ + 7777, i); }

Batch BatchSampler::draw(const at::Tensor& tokens, uint64_t seed, int64_t index) const {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed * 1000003ULL + static_cast<uint64_t>(index));
  const int64_t span = context_ + 1;
  at::Tensor starts = at::randint(0, tokens.numel() - span, {batch_ * world_}, gen, at::kLong);
  at::Tensor mine = starts.narrow(0, rank_ * batch_, batch_);
  std::vector<at::Tensor> rows;
  for (int64_t i = 0; i < batch_; ++i) rows.push_back(tokens.narrow(0, mine[i].item<int64_t>(), span));
  at::Tensor b = at::stack(rows).to(device_);
  return {b.narrow(1, 0, context_), b.narrow(1, 1, context_)};
}

}  // namespace fsdp::train
