// Mixed precision: compute in bfloat16, reduce in bfloat16 / float16 /
// float32, step float32 master shards. Compared with a single-process run
// that makes the same casts.
#include <gtest/gtest.h>

#include "../support/thread_ranks.h"
#include "fsdp/error.h"
#include "../support/models.h"

using namespace fsdp;
using namespace fsdp::testing;

namespace {

constexpr int kSteps = 5;
constexpr int64_t kGlobalBatch = 12;

torch::Tensor loss_of(torch::Tensor logits, torch::Tensor target) {
  return torch::nn::functional::cross_entropy(logits.to(torch::kFloat), target);
}

// Single process, same casts: a low-precision copy of float32 master weights
// runs forward and backward on the whole batch; its gradients, rounded to the
// reduce dtype, step the masters.
std::map<std::string, torch::Tensor> train_local(const std::vector<Batch>& batches, std::optional<torch::Dtype> param,
                                                 torch::Dtype reduce) {
  auto master = make_net(1234);
  auto low = make_net(1234);
  if (param) low->to(*param);
  torch::optim::SGD opt(master->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  auto masters = master->named_parameters();
  for (const auto& b : batches) {
    {
      torch::NoGradGuard no_grad;
      for (auto& p : low->named_parameters()) p.value().copy_(masters[p.key()]);
    }
    low->zero_grad();
    loss_of(low->forward(b.tokens), b.target).backward();
    for (auto& p : low->named_parameters()) {
      masters[p.key()].mutable_grad() = p.value().grad().to(reduce).to(torch::kFloat);
    }
    opt.step();
  }
  return named_params(*master);
}

std::map<std::string, torch::Tensor> train_fsdp(dist::ProcessGroup& pg, ShardingStrategy s, MixedPrecision mp,
                                                bool use_orig, const std::vector<Batch>& batches) {
  FSDPOptions o = options_for_strategy(pg, s);
  o.use_orig_params(use_orig);
  o.mixed_precision(mp);
  o.auto_wrap_policy(transformer_auto_wrap_policy<BlockImpl>());
  FullyShardedDataParallel<NetImpl> model(make_net(1234), o);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  for (auto& p : model->parameters()) EXPECT_EQ(p.scalar_type(), torch::kFloat) << "master shards must stay float32";
  const int64_t local = kGlobalBatch / pg.size();
  for (const auto& b : batches) {
    opt.zero_grad();
    auto logits = model(b.tokens.narrow(0, pg.rank() * local, local));
    EXPECT_EQ(logits.scalar_type(), mp.param_dtype.value_or(torch::kFloat));
    loss_of(logits, b.target.narrow(0, pg.rank() * local, local)).backward();
    for (auto& p : model->parameters()) {
      if (p.grad().defined()) EXPECT_EQ(p.grad().scalar_type(), torch::kFloat);
    }
    opt.step();
  }
  auto full = to_map(full_parameters(model.ptr()));
  for (auto& [name, t] : full) EXPECT_EQ(t.scalar_type(), torch::kFloat) << name;
  return full;
}

double max_diff(const std::map<std::string, torch::Tensor>& a, const std::map<std::string, torch::Tensor>& b) {
  double d = 0;
  for (const auto& [name, t] : b) d = std::max(d, (a.at(name) - t).abs().max().item<double>());
  return d;
}

struct MpCase {
  ShardingStrategy strategy;
  int world;
  torch::Dtype reduce;
};

class MixedPrecisionParity : public ::testing::TestWithParam<MpCase> {};

// Tolerance: bfloat16 keeps 8 significant bits, so each rounding is off by up
// to 2^-9 of the value. FSDP and the single-process run round different
// partial sums (each rank's batch, then the average, versus the whole batch
// at once), so gradients differ by a few bf16 ulps of |g| (|g| < 1 here).
// Five SGD steps at lr 0.1 with momentum 0.9 scale a gradient difference by
// at most 0.1 * (1 + 1.9 + 2.71 + 3.44 + 4.1) ~= 1.3; one bf16 ulp of |g| is
// at most 2^-8, so about one ulp of drift per step gives ~5e-3 (measured:
// up to 1.3e-3). At world 1 the rounding is the same and the difference is 0.
// The float32 run differs from both by far more than float32 rounding, which
// shows the casts happen.
TEST_P(MixedPrecisionParity, MatchesSingleProcessWithTheSameCasts) {
  const MpCase c = GetParam();
  const auto batches = make_batches(kSteps, kGlobalBatch, 99);
  const auto reference = train_local(batches, torch::kBFloat16, c.reduce);
  const auto fp32 = train_local(batches, std::nullopt, torch::kFloat);
  EXPECT_GT(max_diff(reference, fp32), 1e-4) << "bfloat16 emulation equals float32: no cast happened";
  MixedPrecision mp;
  mp.param_dtype = torch::kBFloat16;
  mp.reduce_dtype = c.reduce;
  mp.buffer_dtype = torch::kBFloat16;
  run_ranks(c.world, [&](dist::ProcessGroup& pg) {
    for (bool use_orig : {false, true}) {
      auto got = train_fsdp(pg, c.strategy, mp, use_orig, batches);
      const double d = max_diff(got, reference);
      if (c.world == 1) EXPECT_EQ(d, 0.0);
      EXPECT_LE(d, 5e-3) << to_string(c.strategy) << " world " << c.world;
      EXPECT_GT(max_diff(got, fp32), 1e-4) << "FSDP bfloat16 equals float32: no cast happened";
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Cases, MixedPrecisionParity,
                         ::testing::Values(MpCase{ShardingStrategy::kFullShard, 2, torch::kBFloat16},
                                           MpCase{ShardingStrategy::kFullShard, 3, torch::kFloat},
                                           MpCase{ShardingStrategy::kShardGradOp, 2, torch::kHalf},
                                           MpCase{ShardingStrategy::kNoShard, 2, torch::kBFloat16},
                                           MpCase{ShardingStrategy::kHybridShard, 4, torch::kBFloat16},
                                           MpCase{ShardingStrategy::kFullShard, 1, torch::kBFloat16}),
                         [](const auto& info) {
                           return std::string(to_string(info.param.strategy)) + "_world" +
                                  std::to_string(info.param.world) + "_reduce" +
                                  std::string(c10::toString(info.param.reduce));
                         });

TEST(MixedPrecisionOptions, NonFloatingDtypeIsRejected) {
  fsdp::testing::run_ranks(1, [](dist::ProcessGroup& pg) {
    FSDPOptions o;
    o.process_group(borrow(pg));
    o.mixed_precision().param_dtype = torch::kLong;
    try {
      FullyShardedDataParallel<NetImpl> m(make_net(1), o);
      ADD_FAILURE();
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("mixed_precision.param_dtype=Long is not a floating-point dtype"),
                std::string::npos)
          << e.what();
    }
  });
}

TEST(CpuOffload, AcceptedOnCpuAndTrainsTheSame) {
  const auto batches = make_batches(3, 4, 1);
  std::map<std::string, torch::Tensor> results[2];
  for (int offload = 0; offload < 2; ++offload) {
    fsdp::testing::run_ranks(2, [&](dist::ProcessGroup& pg) {
      FSDPOptions o;
      o.process_group(borrow(pg));
      o.cpu_offload().offload_params = offload == 1;
      o.auto_wrap_policy(transformer_auto_wrap_policy<BlockImpl>());
      FullyShardedDataParallel<NetImpl> model(make_net(3), o);
      torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(0.01));
      for (const auto& b : batches) {
        opt.zero_grad();
        loss_of(model(b.tokens.narrow(0, pg.rank() * 2, 2)), b.target.narrow(0, pg.rank() * 2, 2)).backward();
        opt.step();
      }
      for (auto& p : model->parameters()) EXPECT_TRUE(p.device().is_cpu());
      auto full = to_map(full_parameters(model.ptr()));
      if (pg.rank() == 0) results[offload] = full;
    });
  }
  for (auto& [name, t] : results[0]) EXPECT_TRUE(torch::equal(t, results[1].at(name))) << name;
}

}  // namespace
