// A model of LibTorch's transformer encoder and decoder layers, built as the
// seed's FSDP(CheckpointWrapper(layer)) pattern, and a training loop over it
// for any world size (ranks as threads or processes).
#pragma once

#include <gtest/gtest.h>

#include "fsdp/core/activation_checkpointing.h"
#include "models.h"

namespace fsdp::testing {

// The seed's manual FSDP(CheckpointWrapper(layer)) on transformer encoder and
// decoder layers (LibTorch's own, several tensor arguments each).
using EncImpl = torch::nn::TransformerEncoderLayerImpl;
using DecImpl = torch::nn::TransformerDecoderLayerImpl;

struct TransformerNetImpl : torch::nn::Module {
  TransformerNetImpl(double dropout, const FSDPOptions* o, bool checkpoint) {
    emb = register_module("emb", torch::nn::Embedding(kVocab, 8));
    for (int i = 0; i < 2; ++i) {
      auto e = std::make_shared<EncImpl>(torch::nn::TransformerEncoderLayerOptions(8, 2).dim_feedforward(16).dropout(dropout));
      auto d = std::make_shared<DecImpl>(torch::nn::TransformerDecoderLayerOptions(8, 2).dim_feedforward(16).dropout(dropout));
      enc.push_back(register_module("enc" + std::to_string(i), layer(e, o, checkpoint)));
      dec.push_back(register_module("dec" + std::to_string(i), layer(d, o, checkpoint)));
    }
    out = register_module("out", torch::nn::Linear(8, kVocab));
  }
  template <class M>
  static Unit<M> layer(std::shared_ptr<M> m, const FSDPOptions* o, bool checkpoint) {
    if (o && checkpoint) return FullyShardedDataParallel<M>(CheckpointWrapper<M>(m), *o);
    if (o) return FullyShardedDataParallel<M>(m, *o);
    if (checkpoint) return CheckpointWrapper<M>(m);
    return Unit<M>(m);
  }
  // src, tgt: [time, batch] tokens -> [tgt time, batch, vocab].
  torch::Tensor forward(torch::Tensor src, torch::Tensor tgt) {
    auto memory = enc[1](enc[0](emb(src)));
    auto y = dec[1](dec[0](emb(tgt), memory), memory);
    return out(y);
  }
  torch::nn::Embedding emb{nullptr};
  std::vector<Unit<EncImpl>> enc;
  std::vector<Unit<DecImpl>> dec;
  torch::nn::Linear out{nullptr};
};

inline std::map<std::string, torch::Tensor> train_transformer(dist::ProcessGroup* pg, double dropout, bool checkpoint,
                                                       const torch::Tensor& data) {
  FSDPOptions o;
  if (pg) o.process_group(borrow(*pg));
  std::shared_ptr<TransformerNetImpl> net;
  {
    std::lock_guard<std::mutex> lock(rng_mutex());
    torch::manual_seed(21);
    net = std::make_shared<TransformerNetImpl>(dropout, pg ? &o : nullptr, checkpoint);
  }
  const int world = pg ? pg->size() : 1, rank = pg ? pg->rank() : 0;
  const int64_t local = data.size(2) / world;
  auto run = [&](auto&& model, std::vector<torch::Tensor> params) {
    // SGD, not Adam: the key part of attention's in_proj_bias has an exactly
    // zero gradient up to rounding noise, which Adam would blow up to full steps.
    torch::optim::SGD opt(params, torch::optim::SGDOptions(0.1).momentum(0.9));
    for (int64_t s = 0; s < data.size(0); ++s) {
      if (dropout > 0) {  // tests with dropout run one rank: the only thread drawing
        std::lock_guard<std::mutex> lock(rng_mutex());
        torch::manual_seed(900 + s);
      }
      auto d = data[s].narrow(1, rank * local, local);  // [time, batch]
      opt.zero_grad();
      auto logits = model(d.narrow(0, 0, 5), d.narrow(0, 5, 4));
      torch::nn::functional::cross_entropy(logits.reshape({-1, kVocab}), d.narrow(0, 6, 4).reshape({-1})).backward();
      opt.step();
    }
  };
  if (!pg) {
    run([&](torch::Tensor a, torch::Tensor b) { return net->forward(a, b); }, net->parameters());
    return named_params(*net);
  }
  FullyShardedDataParallel<TransformerNetImpl> model(net, o);
  pg->barrier();  // all ranks built: checkpointed backwards reset the shared RNG state
  EXPECT_EQ(fsdp_modules(model.ptr()).size(), 5u);
  EXPECT_EQ(is_checkpointed(*net->dec[1]), checkpoint);
  run([&](torch::Tensor a, torch::Tensor b) { return model(a, b); }, model->parameters());
  return to_map(full_parameters(model.ptr()));
}


}  // namespace fsdp::testing
