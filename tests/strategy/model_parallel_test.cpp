// ModelParallelStrategy (fsdp/strategy/model_parallel.h): Lightning's
// ModelParallelStrategy over fully_shard. The user's parallelize_fn shards the
// model on the strategy's mesh; training through the strategy equals training
// the same fully_shard model by hand; checkpoints of both kinds resume the
// run exactly at another world size; what Lightning refuses is refused.
#include <gtest/gtest.h>

#include <mutex>

#include "../support/subprocess.h"
#include "../support/thread_ranks.h"
#include "../support/trainer.h"
#include "fsdp/error.h"
#include "fsdp/strategy/model_parallel.h"

using namespace fsdp;
using namespace fsdp::testing;

namespace {

constexpr int64_t kBatch = 12;

// torch's recipe: fully_shard on each block, then the root (held by a Unit).
ModelParallelStrategyOptions::ParallelizeFn shard_blocks() {
  return [](std::shared_ptr<torch::nn::Module> m, const Mesh& mesh) {
    return FullyShard<NetImpl>(std::dynamic_pointer_cast<NetImpl>(m), FullyShardOptions(mesh),
                               transformer_auto_wrap_policy<BlockImpl>())
        .ptr();
  };
}

struct StrategyRun {
  ModelParallelStrategy strategy;
  std::shared_ptr<torch::nn::Module> model;
  std::unique_ptr<torch::optim::Optimizer> opt;

  StrategyRun(dist::ProcessGroup& pg, uint64_t seed, bool distributed_checkpoint = true)
      : strategy(ModelParallelStrategyOptions()
                     .parallelize_fn(shard_blocks())
                     .world(borrow(pg))
                     .save_distributed_checkpoint(distributed_checkpoint)) {
    {
      // setup_environment seeds the process-wide generator, which the other
      // rank's make_net may be drawing from (ranks are threads here).
      std::lock_guard<std::mutex> lock(rng_mutex());
      strategy.setup_environment();
    }
    model = strategy.setup_module(make_net(seed));
    opt = make_optimizer(Opt::kAdamW, model->parameters());
    strategy.setup_optimizer(*opt);
  }
  void train(dist::ProcessGroup& pg, const std::vector<Batch>& batches, int from, int to) {
    for (int i = from; i < to; ++i) {
      const auto& b = batches[static_cast<size_t>(i)];
      const int64_t local = b.tokens.size(0) / pg.size();
      opt->zero_grad();
      Unit<NetImpl> holder(std::dynamic_pointer_cast<NetImpl>(model));  // the root's hooks run through it
      torch::nn::functional::cross_entropy(holder(b.tokens.narrow(0, pg.rank() * local, local)),
                                           b.target.narrow(0, pg.rank() * local, local))
          .backward();
      strategy.clip_gradients_norm(model, 1.0);
      opt->step();
    }
  }
  std::map<std::string, torch::Tensor> snapshot() {
    const auto full = StateDictOptions().full_state_dict(true);
    std::map<std::string, torch::Tensor> out;
    for (const auto& [k, v] : get_model_state_dict(model, full)) out[k] = std::get<torch::Tensor>(v);
    for (const auto& [k, v] : get_optimizer_state_dict(model, *opt, full).state) {
      out["optim/" + k] = std::get<torch::Tensor>(v);
    }
    return out;
  }
};

void expect_same(const std::map<std::string, torch::Tensor>& got, const std::map<std::string, torch::Tensor>& want,
                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (const auto& [k, v] : want) EXPECT_TRUE(torch::equal(got.at(k), v)) << what << ": " << k;
}

}  // namespace

// Through the strategy == by hand (the Trainer's fully_shard model, the same
// clipping), and both checkpoint kinds resume at world 3 what world 2 saved.
TEST(ModelParallelStrategy, TrainsAsByHandAndItsCheckpointsResumeAtAnotherWorldSize) {
  const auto batches = make_batches(4, kBatch, 2);
  for (const bool distributed : {true, false}) {
    TempDir dir;
    const std::string path = dir.path() + "/ckpt";
    std::map<std::string, torch::Tensor> want;
    std::mutex mu;
    run_ranks(2, [&](dist::ProcessGroup& pg) {
      StrategyRun run(pg, 1, distributed);
      EXPECT_EQ(run.strategy.device_mesh().dim_names, std::vector<std::string>{"data_parallel"});
      EXPECT_TRUE(fsdp_module_of(*run.model).has_value());
      run.train(pg, batches, 0, 2);
      Trainer by_hand(pg, Opt::kAdamW, 1, Engine::kFsdp2);
      for (int i = 0; i < 2; ++i) {
        const auto& b = batches[static_cast<size_t>(i)];
        const int64_t local = b.tokens.size(0) / pg.size();
        by_hand.optimizer->zero_grad();
        torch::nn::functional::cross_entropy(by_hand.model(b.tokens.narrow(0, pg.rank() * local, local)),
                                             b.target.narrow(0, pg.rank() * local, local))
            .backward();
        clip_grad_norm_(*fsdp_module_of(*by_hand.model.ptr()), 1.0);
        by_hand.optimizer->step();
      }
      expect_same(run.snapshot(), by_hand.snapshot(), "strategy vs by hand");
      run.strategy.save_checkpoint(path, CheckpointState().model("model", run.model).optimizer("optimizer", *run.opt));
      auto snap = run.snapshot();
      std::lock_guard<std::mutex> lock(mu);
      if (pg.rank() == 0) want = snap;
    });
    EXPECT_EQ(inspect_checkpoint(path).format, distributed ? CheckpointFormat::kSharded : CheckpointFormat::kFull);
    run_ranks(3, [&](dist::ProcessGroup& pg) {
      StrategyRun run(pg, 9, distributed);
      CheckpointState s;
      s.model("model", run.model).optimizer("optimizer", *run.opt);
      run.strategy.load_checkpoint(path, s);
      expect_same(run.snapshot(), want, distributed ? "sharded, world 2 -> 3" : "full, world 2 -> 3");
    });
  }
}

TEST(ModelParallelStrategy, NoBackwardSyncSkipsTheReductionUntilItEnds) {
  const auto batches = make_batches(1, kBatch, 3);
  run_ranks(2, [&](dist::ProcessGroup& pg) {
    StrategyRun run(pg, 1);
    const auto& b = batches[0];
    Unit<NetImpl> holder(std::dynamic_pointer_cast<NetImpl>(run.model));
    const uint64_t before = pg.bytes_sent();
    {
      auto guard = run.strategy.no_backward_sync(run.model);
      ASSERT_NE(guard, nullptr);
      torch::nn::functional::cross_entropy(holder(b.tokens), b.target).backward();
    }
    const uint64_t unsynced = pg.bytes_sent() - before;
    const uint64_t mark = pg.bytes_sent();
    torch::nn::functional::cross_entropy(holder(b.tokens), b.target).backward();
    const uint64_t synced = pg.bytes_sent() - mark;
    EXPECT_LT(unsynced, synced);  // the same gathers; only the synced backward reduce-scatters
    EXPECT_EQ(run.strategy.no_backward_sync(run.model, /*enabled=*/false), nullptr);
  });
}

TEST(ModelParallelStrategy, RefusesWhatLightningRefuses) {
  EXPECT_THROW({ ModelParallelStrategy s{ModelParallelStrategyOptions{}}; }, ConfigError);  // no parallelize_fn
  EXPECT_THROW({ ModelParallelStrategy s{ModelParallelStrategyOptions{}.parallelize_fn(shard_blocks()).tensor_parallel_size(2)}; },
               ConfigError);
  run_ranks(2, [&](dist::ProcessGroup& pg) {
    ModelParallelStrategy unset(ModelParallelStrategyOptions().parallelize_fn(shard_blocks()).world(borrow(pg)));
    EXPECT_THROW(unset.device_mesh(), ConfigError);  // before setup_environment
    ModelParallelStrategy wrong(
        ModelParallelStrategyOptions().parallelize_fn(shard_blocks()).world(borrow(pg)).data_parallel_size(3));
    try {
      std::lock_guard<std::mutex> lock(rng_mutex());
      wrong.setup_environment();
      ADD_FAILURE() << "data_parallel_size 3 at world 2";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("multiplied should equal the world size (2)"), std::string::npos) << e.what();
    }
    StrategyRun run(pg, 1);
    FSDPOptions o;
    o.process_group(borrow(pg));
    FullyShardedDataParallel<NetImpl> fsdp1(make_net(1), o);
    try {
      run.strategy.setup_module(fsdp1.ptr());
      ADD_FAILURE() << "an FSDP1 model";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("only supports the FSDP2 API"), std::string::npos) << e.what();
    }
    torch::optim::LBFGS lbfgs(run.model->parameters());
    EXPECT_THROW(run.strategy.setup_optimizer(lbfgs), ConfigError);
    EXPECT_THROW(run.strategy.clip_gradients_norm(make_net(1), 1.0), ConfigError);  // not sharded
  });
}
