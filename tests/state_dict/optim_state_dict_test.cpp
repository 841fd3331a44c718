// Optimizer state dicts: a run saved at world N and resumed at world M (model
// and optimizer state) ends where an uninterrupted single-process run ends,
// for SGD with momentum and AdamW, full and sharded forms, both
// use_orig_params modes; names, and the errors of bad states.
#include <gtest/gtest.h>

#include <mutex>

#include "../support/thread_ranks.h"
#include "fsdp/error.h"
#include "fsdp/state_dict/optim_state_dict.h"
#include "fsdp/state_dict/state_dict.h"
#include "../support/trainer.h"

using namespace fsdp;
using namespace fsdp::testing;

namespace {

constexpr int64_t kGlobalBatch = 12;
constexpr int kStepsBefore = 3, kStepsAfter = 3;

struct Saved {
  StateDict model;
  OptimStateDict optim;
};

std::map<std::string, torch::Tensor> reference(Opt opt, const std::vector<Batch>& batches) {
  auto net = make_net(77);
  auto optimizer = make_optimizer(opt, net->parameters());
  return train_local(*net, *optimizer, batches);
}

struct ResumeCase {
  int save_world;
  int load_world;
  ShardingStrategy strategy;
  bool use_orig;
  Opt opt;
  StateDictType type;
};

class OptimStateDictResume : public ::testing::TestWithParam<ResumeCase> {};

TEST_P(OptimStateDictResume, ResumedRunEndsWhereTheUninterruptedOneEnds) {
  const ResumeCase c = GetParam();
  const auto batches = make_batches(kStepsBefore + kStepsAfter, kGlobalBatch, 5);
  const auto want = reference(c.opt, batches);
  Saved saved;
  std::mutex mu;
  auto strategy_at = [&](int world) {
    return c.strategy == ShardingStrategy::kHybridShard && world % 2 != 0 ? ShardingStrategy::kFullShard : c.strategy;
  };
  run_ranks(c.save_world, [&](dist::ProcessGroup& pg) {
    Trainer t(pg, c.opt, 77, strategy_at(pg.size()), c.use_orig);
    t.train(pg, batches, 0, kStepsBefore);
    StateDictTypeGuard guard(t.model.ptr(), c.type);
    StateDict msd = state_dict(t.model.ptr());
    OptimStateDict osd = optim_state_dict(t.model.ptr(), *t.optimizer);
    if (c.type == StateDictType::kSharded) {
      // Another world cannot use this rank's pieces: gather them (collective).
      for (const auto& [key, v] : osd.state) EXPECT_TRUE(key.find(".step") != std::string::npos ||
                                                         std::holds_alternative<ShardedTensor>(v)) << key;
      msd = gather_state_dict(msd, pg);
      osd.state = gather_state_dict(osd.state, pg);
    }
    if (pg.rank() == 0) {
      std::lock_guard<std::mutex> lock(mu);
      saved = {msd, osd};
    }
  });
  run_ranks(c.load_world, [&](dist::ProcessGroup& pg) {
    Trainer t(pg, c.opt, 999, strategy_at(pg.size()), c.use_orig);  // other initial weights: all must be loaded
    load_state_dict(t.model.ptr(), saved.model);
    load_optim_state_dict(t.model.ptr(), *t.optimizer, saved.optim);
    t.train(pg, batches, kStepsBefore, kStepsBefore + kStepsAfter);
    expect_close(to_map(full_parameters(t.model.ptr())), want, 2e-5, "resumed at world " + std::to_string(pg.size()));
  });
}

INSTANTIATE_TEST_SUITE_P(
    Cases, OptimStateDictResume,
    ::testing::Values(ResumeCase{2, 2, ShardingStrategy::kFullShard, false, Opt::kAdamW, StateDictType::kFull},
                      ResumeCase{2, 1, ShardingStrategy::kFullShard, false, Opt::kSgd, StateDictType::kFull},
                      ResumeCase{2, 3, ShardingStrategy::kFullShard, true, Opt::kAdamW, StateDictType::kFull},
                      ResumeCase{3, 2, ShardingStrategy::kShardGradOp, false, Opt::kSgd, StateDictType::kSharded},
                      ResumeCase{1, 3, ShardingStrategy::kFullShard, false, Opt::kAdamW, StateDictType::kSharded},
                      ResumeCase{2, 4, ShardingStrategy::kNoShard, true, Opt::kSgd, StateDictType::kFull},
                      ResumeCase{4, 2, ShardingStrategy::kHybridShard, false, Opt::kAdamW, StateDictType::kSharded},
                      ResumeCase{3, 3, ShardingStrategy::kFullShard, true, Opt::kSgd, StateDictType::kSharded}),
    [](const auto& info) {
      const auto& c = info.param;
      return std::string(to_string(c.strategy)) + "_world" + std::to_string(c.save_world) + "_to_" +
             std::to_string(c.load_world) + (c.use_orig ? "_orig" : "_flat") +
             (c.opt == Opt::kSgd ? "_sgd_" : "_adamw_") + (c.type == StateDictType::kFull ? "full" : "sharded");
    });

TEST(OptimStateDict, ShardedLoadsInPlaceAtTheSameWorld) {
  const auto batches = make_batches(kStepsBefore + kStepsAfter, kGlobalBatch, 6);
  const auto want = reference(Opt::kAdamW, batches);
  run_ranks(3, [&](dist::ProcessGroup& pg) {
    Trainer t(pg, Opt::kAdamW, 77, ShardingStrategy::kFullShard, false);
    t.train(pg, batches, 0, kStepsBefore);
    StateDictTypeGuard guard(t.model.ptr(), StateDictType::kSharded);
    StateDict msd = state_dict(t.model.ptr());
    OptimStateDict osd = optim_state_dict(t.model.ptr(), *t.optimizer);
    // Deep copies: the sharded values are views of live state.
    auto clone = [](const torch::Tensor& x) { return x.clone(); };
    StateDict msd_copy = map_tensors(msd, clone);
    osd.state = map_tensors(osd.state, clone);
    Trainer fresh(pg, Opt::kAdamW, 999, ShardingStrategy::kFullShard, false);
    StateDictTypeGuard guard2(fresh.model.ptr(), StateDictType::kSharded);
    load_state_dict(fresh.model.ptr(), msd_copy);
    load_optim_state_dict(fresh.model.ptr(), *fresh.optimizer, osd);
    fresh.train(pg, batches, kStepsBefore, kStepsBefore + kStepsAfter);
    expect_close(to_map(full_parameters(fresh.model.ptr())), want, 2e-5, "sharded resume");
  });
}

TEST(OptimStateDict, NamesFieldsAndGroups) {
  const auto batches = make_batches(1, kGlobalBatch, 7);
  run_ranks(2, [&](dist::ProcessGroup& pg) {
    Trainer t(pg, Opt::kAdamW, 77, ShardingStrategy::kFullShard, false);
    t.train(pg, batches, 0, 1);
    OptimStateDict osd = optim_state_dict(t.model.ptr(), *t.optimizer);
    ASSERT_EQ(osd.param_groups.size(), 1u);
    const auto& names = osd.param_groups[0].params;
    std::vector<std::string> model_names;
    for (auto& [name, tensor] : full_parameters(t.model.ptr())) model_names.push_back(name);
    std::sort(model_names.begin(), model_names.end());
    auto sorted = names;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, model_names);  // every parameter once, by its unwrapped name
    EXPECT_DOUBLE_EQ(osd.param_groups[0].options.at("lr"), 0.01);
    EXPECT_DOUBLE_EQ(osd.param_groups[0].options.at("weight_decay"), 0.1);
    for (const auto& n : names) {
      ASSERT_TRUE(osd.state.contains(n + ".exp_avg")) << n;
      EXPECT_TRUE(osd.state.contains(n + ".exp_avg_sq")) << n;
      EXPECT_FALSE(osd.state.contains(n + ".max_exp_avg_sq")) << n;  // amsgrad off
      EXPECT_EQ(osd.state.tensor(n + ".step").item<int64_t>(), 1) << n;
    }
    EXPECT_EQ(osd.state.tensor("emb.weight.exp_avg").sizes(), (std::vector<int64_t>{kVocab, kDim}));
  });
}

TEST(OptimStateDict, BadStatesAreRejectedWithEveryProblemNamed) {
  const auto batches = make_batches(1, kGlobalBatch, 8);
  run_ranks(2, [&](dist::ProcessGroup& pg) {
    Trainer t(pg, Opt::kSgd, 77, ShardingStrategy::kFullShard, false);
    t.train(pg, batches, 0, 1);
    OptimStateDict osd = optim_state_dict(t.model.ptr(), *t.optimizer);
    OptimStateDict bad = osd;
    bad.state.insert("nope.momentum_buffer", torch::zeros({2}));
    bad.state.set("emb.weight.momentum_buffer", torch::zeros({3, 3}));
    bad.param_groups[0].params[0] = "renamed";
    try {
      load_optim_state_dict(t.model.ptr(), *t.optimizer, bad);
      ADD_FAILURE() << "no error";
    } catch (const ConfigError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("unexpected key(s): nope.momentum_buffer"), std::string::npos) << m;
      EXPECT_NE(m.find("size mismatch for emb.weight.momentum_buffer"), std::string::npos) << m;
      EXPECT_NE(m.find("param_groups[0] holds [renamed"), std::string::npos) << m;
    }
    // Nothing was changed by the failed load: the good state still loads and matches.
    load_optim_state_dict(t.model.ptr(), *t.optimizer, osd);
    OptimStateDict again = optim_state_dict(t.model.ptr(), *t.optimizer);
    for (const auto& [k, v] : osd.state) EXPECT_TRUE(torch::equal(again.state.tensor(k), std::get<torch::Tensor>(v))) << k;
    {
      StateDictTypeGuard guard(t.model.ptr(), StateDictType::kLocal);
      EXPECT_THROW(optim_state_dict(t.model.ptr(), *t.optimizer), ConfigError);
    }
    torch::optim::LBFGS lbfgs(t.model->parameters());
    EXPECT_THROW(optim_state_dict(t.model.ptr(), lbfgs), ConfigError);
    torch::Tensor stranger = torch::zeros({2}, torch::requires_grad());
    torch::optim::SGD other({stranger}, torch::optim::SGDOptions(0.1));
    EXPECT_THROW(optim_state_dict(t.model.ptr(), other), ConfigError);
  });
}

TEST(OptimStateDict, Rank0OnlyGivesOtherRanksNothing) {
  const auto batches = make_batches(1, kGlobalBatch, 9);
  run_ranks(2, [&](dist::ProcessGroup& pg) {
    Trainer t(pg, Opt::kSgd, 77, ShardingStrategy::kFullShard, true);
    t.train(pg, batches, 0, 1);
    StateDictTypeGuard guard(t.model.ptr(), StateDictType::kFull, FullStateDictConfig{true, true});
    OptimStateDict osd = optim_state_dict(t.model.ptr(), *t.optimizer);
    EXPECT_EQ(osd.state.empty(), pg.rank() != 0);
    EXPECT_EQ(osd.param_groups.empty(), pg.rank() != 0);
  });
}

}  // namespace
