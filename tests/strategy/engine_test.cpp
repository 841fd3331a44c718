// fsdp::Engine and make_strategy (fsdp/strategy/engine.h): one Strategy
// interface over both engines. A loop written against Strategy& trains
// under FSDP2 exactly as fully_shard by hand does; FSDP1 options without a
// fully_shard form are refused by name.
#include <gtest/gtest.h>

#include <mutex>

#include "../support/errors.h"
#include "../support/thread_ranks.h"
#include "../support/trainer.h"  // make_net, make_batches, make_optimizer
#include "fsdp/error.h"
#include "fsdp/strategy/engine.h"

using namespace fsdp;
using fsdp::testing::Batch;
using fsdp::testing::make_batches;
using fsdp::testing::make_net;
using fsdp::testing::NetImpl;
using fsdp::testing::BlockImpl;

namespace {

// Two steps of the test Net through `strategy` (any engine), clipped to norm 1.
std::map<std::string, torch::Tensor> train_through(Strategy& strategy, dist::ProcessGroup& pg,
                                                   const std::vector<Batch>& batches) {
  {
    std::lock_guard<std::mutex> lock(fsdp::testing::rng_mutex());  // ranks are threads: one seeds at a time
    strategy.setup_environment();
  }
  Unit<NetImpl> model = strategy.setup_module(make_net(1));
  auto opt = fsdp::testing::make_optimizer(fsdp::testing::Opt::kAdamW, model->parameters());
  strategy.setup_optimizer(*opt);
  for (const auto& b : batches) {
    const int64_t local = b.tokens.size(0) / pg.size();
    opt->zero_grad();
    strategy.backward(torch::nn::functional::cross_entropy(model(b.tokens.narrow(0, pg.rank() * local, local)),
                                                           b.target.narrow(0, pg.rank() * local, local)));
    strategy.clip_gradients_norm(model.ptr(), *opt, 1.0);
    EXPECT_TRUE(strategy.optimizer_step(*opt));
  }
  const auto full = StateDictOptions().full_state_dict(true);
  std::map<std::string, torch::Tensor> out;
  for (const auto& [k, v] : get_model_state_dict(model.ptr(), full)) out[k] = std::get<torch::Tensor>(v);
  return out;
}

}  // namespace

TEST(Engine, NamesComeFromOneTable) {
  EXPECT_STREQ(to_string(Engine::kFsdp1), "fsdp1");
  EXPECT_STREQ(to_string(Engine::kFsdp2), "fsdp2");
  EXPECT_EQ(parse_engine("fsdp2"), Engine::kFsdp2);
  fsdp::testing::expect_config_error([] { parse_engine("fsdp3"); }, "'fsdp3' is not an engine: expected fsdp1 or fsdp2");
}

// make_strategy(kFsdp2, FSDP1's options) trains as fully_shard applied by
// hand (the same units, bit for bit); kFsdp1 gives FSDP1 units, close to it.
TEST(Engine, MakeStrategyTrainsEitherEngineThroughOneInterface) {
  const auto batches = make_batches(2, 12, 2);
  fsdp::testing::run_ranks(2, [&](dist::ProcessGroup& pg) {
    const auto options = FSDPStrategyOptions().auto_wrap_module_types<BlockImpl>().world(fsdp::testing::borrow(pg));
    auto fsdp2 = make_strategy(Engine::kFsdp2, options);
    ASSERT_NE(dynamic_cast<ModelParallelStrategy*>(fsdp2.get()), nullptr);
    const auto got2 = train_through(*fsdp2, pg, batches);

    // torch's recipe by hand: fully_shard on each block, then the root.
    ModelParallelStrategy by_hand(ModelParallelStrategyOptions().world(fsdp::testing::borrow(pg)).parallelize_fn(
        [](std::shared_ptr<torch::nn::Module> m, const Mesh& mesh) {
          return FullyShard<NetImpl>(std::dynamic_pointer_cast<NetImpl>(m), FullyShardOptions(mesh),
                                     transformer_auto_wrap_policy<BlockImpl>())
              .ptr();
        }));
    const auto want = train_through(by_hand, pg, batches);
    for (const auto& [k, v] : got2) EXPECT_TRUE(torch::equal(v, want.at(k))) << "fsdp2: " << k;

    auto fsdp1 = make_strategy(Engine::kFsdp1, options);
    ASSERT_NE(dynamic_cast<FSDPStrategy*>(fsdp1.get()), nullptr);
    const auto got1 = train_through(*fsdp1, pg, batches);
    for (const auto& [k, v] : got1) EXPECT_TRUE(torch::allclose(v, got2.at(k), 1e-4, 1e-5)) << "fsdp1: " << k;
  });
}

// FSDP1's HYBRID_SHARD mesh becomes fully_shard's 2-D mesh; what has no
// fully_shard form is a ConfigError naming it.
TEST(Engine, Fsdp2TakesFsdp1sMeshAndRefusesWhatItCannotShard) {
  fsdp::testing::run_ranks(2, [&](dist::ProcessGroup& pg) {
    auto options = FSDPStrategyOptions().auto_wrap_module_types<BlockImpl>().world(fsdp::testing::borrow(pg));
    options.sharding_strategy(ShardingStrategy::kHybridShard).device_mesh(1, 2);
    auto hybrid = make_strategy(Engine::kFsdp2, options);
    hybrid->setup_environment();
    EXPECT_EQ(dynamic_cast<ModelParallelStrategy&>(*hybrid).device_mesh().ndim(), 2);
  });
  const auto options = FSDPStrategyOptions().auto_wrap_module_types<BlockImpl>();
  fsdp::testing::expect_config_error(
      [&] { make_strategy(Engine::kFsdp2, FSDPStrategyOptions(options).sharding_strategy(ShardingStrategy::kNoShard)); },
      "sharding_strategy NO_SHARD has no fully_shard form");
  fsdp::testing::expect_config_error(
      [&] { make_strategy(Engine::kFsdp2, FSDPStrategyOptions(options).precision("16-mixed")); },
      "precision 16-mixed has no fully_shard form");
}
