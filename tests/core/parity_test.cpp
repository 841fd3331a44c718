// FSDP training equals single-process training on the same global batch:
// every sharding strategy, world sizes 1-4, SGD and AdamW, both
// use_orig_params modes, auto-wrapped and manually nested units, a tied
// parameter and buffers.
#include <gtest/gtest.h>

#include "../support/thread_ranks.h"
#include "fsdp/error.h"
#include "../support/models.h"

using namespace fsdp;
using namespace fsdp::testing;

namespace {

constexpr int kSteps = 5;
constexpr int64_t kGlobalBatch = 12;  // divides by 1, 2, 3 and 4

enum class Opt { kSgd, kAdamW };

std::unique_ptr<torch::optim::Optimizer> make_optimizer(Opt opt, std::vector<torch::Tensor> params) {
  if (opt == Opt::kSgd) {
    return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.1).momentum(0.9));
  }
  return std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(0.01).weight_decay(0.1));
}

std::map<std::string, torch::Tensor> train_reference(Opt opt, const std::vector<Batch>& batches) {
  auto net = make_net(1234);
  auto optimizer = make_optimizer(opt, net->parameters());
  return train_local(*net, *optimizer, batches);
}

enum class Nesting { kAutoWrap, kManual };

struct Case {
  ShardingStrategy strategy;
  int world;
};

std::map<std::string, torch::Tensor> train_fsdp(dist::ProcessGroup& pg, const Case& c, Opt opt, bool use_orig,
                                                Nesting nesting, const std::vector<Batch>& batches,
                                                bool zero_grad_after_forward = false) {
  FSDPOptions o = options_for_strategy(pg, c.strategy);
  o.use_orig_params(use_orig);
  std::shared_ptr<NetImpl> net;
  if (nesting == Nesting::kAutoWrap) {
    o.auto_wrap_policy(transformer_auto_wrap_policy<BlockImpl>());
    net = make_net(1234);
  } else {
    net = make_net(1234, &o);  // `extra` wrapped inside the model's constructor
  }
  FullyShardedDataParallel<NetImpl> model(net, o);
  auto optimizer = make_optimizer(opt, model->parameters());
  const int64_t local = kGlobalBatch / pg.size();
  for (const auto& b : batches) {
    if (!zero_grad_after_forward) optimizer->zero_grad();
    auto tokens = b.tokens.narrow(0, pg.rank() * local, local);
    auto target = b.target.narrow(0, pg.rank() * local, local);
    auto loss = torch::nn::functional::cross_entropy(model(tokens), target);
    if (zero_grad_after_forward) optimizer->zero_grad();
    loss.backward();
    optimizer->step();
  }
  return to_map(full_parameters(model.ptr()));
}

class Parity : public ::testing::TestWithParam<Case> {};

TEST_P(Parity, TrainingMatchesSingleProcess) {
  const Case c = GetParam();
  const auto batches = make_batches(kSteps, kGlobalBatch, 99);
  std::map<Opt, std::map<std::string, torch::Tensor>> reference;
  for (Opt opt : {Opt::kSgd, Opt::kAdamW}) reference[opt] = train_reference(opt, batches);
  // The tied head weight is the embedding's and no parameter of its own.
  EXPECT_EQ(reference[Opt::kSgd].count("head.weight"), 0u);
  run_ranks(c.world, [&](dist::ProcessGroup& pg) {
    for (Opt opt : {Opt::kSgd, Opt::kAdamW}) {
      for (bool use_orig : {false, true}) {
        for (Nesting nesting : {Nesting::kAutoWrap, Nesting::kManual}) {
          const std::string what = std::string(to_string(c.strategy)) + " world " + std::to_string(c.world) +
                                   (opt == Opt::kSgd ? " SGD" : " AdamW") + (use_orig ? " orig" : " flat") +
                                   (nesting == Nesting::kAutoWrap ? " auto" : " manual");
          expect_close(train_fsdp(pg, c, opt, use_orig, nesting, batches), reference[opt], 1e-5, what);
        }
      }
    }
  });
}

// AdamW stepping each unit's flat shard in one go (use_orig_params=false: one
// flat parameter per unit) is exactly AdamW stepping every original
// parameter's slice (use_orig_params=true): bit for bit, not just close.
TEST(FlatShardOptimizer, AdamWOverTheFlatShardIsExact) {
  const auto batches = make_batches(kSteps, kGlobalBatch, 7);
  for (auto strategy : {ShardingStrategy::kFullShard, ShardingStrategy::kNoShard}) {
    run_ranks(2, [&](dist::ProcessGroup& pg) {
      const Case c{strategy, 2};
      auto flat = train_fsdp(pg, c, Opt::kAdamW, false, Nesting::kAutoWrap, batches);
      auto per_param = train_fsdp(pg, c, Opt::kAdamW, true, Nesting::kAutoWrap, batches);
      ASSERT_EQ(flat.size(), per_param.size());
      for (const auto& [name, t] : flat) EXPECT_TRUE(torch::equal(t, per_param.at(name))) << to_string(strategy) << " " << name;
    });
  }
}

// `loss = model(x); opt.zero_grad(); loss.backward()` trains as zero_grad
// before the forward does, in every strategy and both use_orig_params modes
// (SHARD_GRAD_OP and NO_SHARD keep the full parameters from the forward to
// the backward): the gradient a step reduces is that step's alone.
TEST(ZeroGrad, BetweenForwardAndBackwardTrainsAsBeforeTheForward) {
  const auto batches = make_batches(kSteps, kGlobalBatch, 11);
  for (auto strategy : {ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp, ShardingStrategy::kNoShard}) {
    for (const bool use_orig : {false, true}) {
      run_ranks(2, [&](dist::ProcessGroup& pg) {
        const Case c{strategy, 2};
        auto before = train_fsdp(pg, c, Opt::kAdamW, use_orig, Nesting::kAutoWrap, batches);
        auto after = train_fsdp(pg, c, Opt::kAdamW, use_orig, Nesting::kAutoWrap, batches, true);
        ASSERT_EQ(before.size(), after.size());
        for (const auto& [name, t] : before) {
          EXPECT_TRUE(torch::equal(t, after.at(name))) << to_string(strategy) << " use_orig_params=" << use_orig << " "
                                                        << name;
        }
      });
    }
  }
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (auto s : {ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp, ShardingStrategy::kNoShard}) {
    for (int w = 1; w <= 4; ++w) out.push_back({s, w});
  }
  out.push_back({ShardingStrategy::kHybridShard, 4});  // 2 x 2 mesh
  out.push_back({ShardingStrategy::kHybridShard, 2});  // 2 replicas of 1
  return out;
}

INSTANTIATE_TEST_SUITE_P(StrategyWorld, Parity, ::testing::ValuesIn(cases()), [](const auto& info) {
  return std::string(to_string(info.param.strategy)) + "_world" + std::to_string(info.param.world);
});

}  // namespace
