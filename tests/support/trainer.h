// A small FSDP training job for the state-dict and checkpoint tests: the test
// Net auto-wrapped by blocks (FSDP1), or fully_shard-ed by blocks (FSDP2), an
// optimizer on it, and steps over a global batch that every rank slices by
// rank.
#pragma once

#include <memory>
#include <vector>

#include "fsdp/fsdp2/fully_shard.h"
#include "fsdp/state_dict/distributed_state_dict.h"
#include "models.h"

namespace fsdp::testing {

enum class Opt { kSgd, kAdamW };
enum class Engine { kFsdp1, kFsdp2 };

inline std::unique_ptr<torch::optim::Optimizer> make_optimizer(Opt opt, std::vector<torch::Tensor> params) {
  if (opt == Opt::kSgd) {
    return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.1).momentum(0.9));
  }
  return std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(0.01).weight_decay(0.1));
}

struct Trainer {
  Unit<NetImpl> model{nullptr};
  std::unique_ptr<torch::optim::Optimizer> optimizer;

  Trainer(dist::ProcessGroup& pg, Opt opt, uint64_t seed, ShardingStrategy s = ShardingStrategy::kFullShard,
          bool use_orig = false) {
    FSDPOptions o = options_for_strategy(pg, s);
    o.use_orig_params(use_orig);
    o.auto_wrap_policy(transformer_auto_wrap_policy<BlockImpl>());
    model = FullyShardedDataParallel<NetImpl>(make_net(seed), o);
    optimizer = make_optimizer(opt, model->parameters());
  }
  // FSDP2: fully_shard on each block, then on the root, over the whole world.
  Trainer(dist::ProcessGroup& pg, Opt opt, uint64_t seed, Engine engine) {
    if (engine == Engine::kFsdp1) {
      *this = Trainer(pg, opt, seed);
      return;
    }
    model = FullyShard<NetImpl>(make_net(seed), FullyShardOptions(Mesh::of(borrow(pg))),
                                transformer_auto_wrap_policy<BlockImpl>());
    optimizer = make_optimizer(opt, model->parameters());
  }
  Trainer(Trainer&&) = default;
  Trainer& operator=(Trainer&&) = default;
  // Steps over batches [from, to); each batch is global, each rank takes its slice.
  void train(dist::ProcessGroup& pg, const std::vector<Batch>& batches, int from, int to) {
    for (int i = from; i < to; ++i) {
      const auto& b = batches[static_cast<size_t>(i)];
      const int64_t local = b.tokens.size(0) / pg.size();
      optimizer->zero_grad();
      torch::nn::functional::cross_entropy(model(b.tokens.narrow(0, pg.rank() * local, local)),
                                           b.target.narrow(0, pg.rank() * local, local))
          .backward();
      optimizer->step();
    }
  }
  // The full state dict and full optimizer state (collectives), for exact
  // comparisons, through torch.distributed.checkpoint.state_dict's API:
  // the same keys for either engine.
  std::map<std::string, torch::Tensor> snapshot() {
    const auto full = StateDictOptions().full_state_dict(true);
    std::map<std::string, torch::Tensor> out;
    for (const auto& [k, v] : get_model_state_dict(model.ptr(), full)) out[k] = std::get<torch::Tensor>(v);
    OptimStateDict osd = get_optimizer_state_dict(model.ptr(), *optimizer, full);
    for (const auto& [k, v] : osd.state) out["optim/" + k] = std::get<torch::Tensor>(v);
    return out;
  }
};

}  // namespace fsdp::testing
