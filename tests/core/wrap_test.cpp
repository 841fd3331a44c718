// Wrapping: names, units, ignored modules, buffers, sync_module_states,
// memory per rank, and the errors for misuse.
#include <gtest/gtest.h>

#include "../support/thread_ranks.h"
#include <atomic>
#include <thread>

#include "fsdp/error.h"
#include "../support/models.h"

using namespace fsdp;
using namespace fsdp::testing;

namespace {

FSDPOptions options_for(dist::ProcessGroup& pg, bool use_orig, bool auto_wrap = true) {
  FSDPOptions o;
  o.process_group(borrow(pg));
  o.use_orig_params(use_orig);
  if (auto_wrap) o.auto_wrap_policy(transformer_auto_wrap_policy<BlockImpl>());
  return o;
}

std::vector<std::string> names_of(torch::nn::Module& m) {
  std::vector<std::string> out;
  for (auto& p : m.named_parameters()) out.push_back(p.key());
  return out;
}

std::string config_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no ConfigError)";
}

TEST(Wrap, OrigParamsKeepTheUnwrappedNamesAndUnitsArePlacedByPolicy) {
  run_ranks(2, [](dist::ProcessGroup& pg) {
    auto plain = make_net(1);
    const auto expected = names_of(*plain);
    FullyShardedDataParallel<NetImpl> model(make_net(1), options_for(pg, /*use_orig=*/true));
    EXPECT_EQ(names_of(*model), expected);
    std::vector<std::string> units;
    for (auto& [path, m] : fsdp_modules(model.ptr())) units.push_back(path);
    EXPECT_EQ(units, (std::vector<std::string>{"", "blocks.0", "blocks.1", "extra"}));
    EXPECT_TRUE(model->extra.is_fsdp_unit());
    // Outside forward each original parameter holds this rank's 1-D slice.
    int64_t local = 0, total = 0;
    for (auto& p : plain->parameters()) total += p.numel();
    for (auto& p : model->parameters()) {
      EXPECT_EQ(p.dim(), 1);
      local += p.numel();
    }
    EXPECT_LT(local, total);
    EXPECT_GT(local, 0);
  });
}

TEST(Wrap, FlatParamsAreNamedLikePyTorch) {
  run_ranks(2, [](dist::ProcessGroup& pg) {
    FullyShardedDataParallel<NetImpl> model(make_net(1), options_for(pg, /*use_orig=*/false));
    EXPECT_EQ(names_of(*model), (std::vector<std::string>{"flat_param", "blocks.0.flat_param", "blocks.1.flat_param",
                                                          "extra.flat_param"}));
    // Buffers are untouched and whole on every rank.
    auto buffers = model->named_buffers();
    ASSERT_EQ(buffers.size(), 3u);
    EXPECT_TRUE(torch::equal(buffers["extra.scale"], torch::full({kDim}, 0.5)));
  });
}

TEST(Wrap, UnwrappedModelRunsWithTheUnitHolder) {
  // A model that declares fsdp::Unit members runs unchanged without FSDP.
  auto net = make_net(3);
  auto batch = make_batches(1, 4, 5)[0];
  auto out = net->forward(batch.tokens);
  EXPECT_EQ(out.sizes(), (std::vector<int64_t>{4, kVocab}));
  EXPECT_FALSE(net->extra.is_fsdp_unit());
}

TEST(Wrap, SyncModuleStatesMakesDifferentlySeededRanksEqual) {
  run_ranks(3, [](dist::ProcessGroup& pg) {
    auto net = make_net(100 + pg.rank());  // different initial weights per rank
    net->extra->scale.fill_(static_cast<float>(pg.rank()));
    auto o = options_for(pg, true);
    o.sync_module_states(true);
    FullyShardedDataParallel<NetImpl> model(net, o);
    auto got = to_map(full_parameters(model.ptr()));
    auto want = named_params(*make_net(100));  // rank 0's
    for (auto& [name, w] : want) EXPECT_TRUE(torch::equal(got[name], w)) << name;
    EXPECT_TRUE(torch::equal(model->extra->scale, torch::zeros({kDim})));
  });
}

TEST(Wrap, IgnoredModulesStayWholeOnEveryRank) {
  run_ranks(2, [](dist::ProcessGroup& pg) {
    auto net = make_net(1);
    auto o = options_for(pg, true);
    o.ignored_modules({net->emb.ptr()});
    FullyShardedDataParallel<NetImpl> model(net, o);
    EXPECT_EQ(model->emb->weight.sizes(), (std::vector<int64_t>{kVocab, kDim}));
    auto full = to_map(full_parameters(model.ptr()));
    ASSERT_TRUE(full.count("emb.weight"));
    EXPECT_TRUE(torch::equal(full["emb.weight"], make_net(1)->emb->weight));
    // The ignored embedding still trains locally (its gradient is not reduced).
    auto b = make_batches(1, 4, 2)[0];
    torch::nn::functional::cross_entropy(model(b.tokens), b.target).backward();
    EXPECT_TRUE(model->emb->weight.grad().defined());
    EXPECT_EQ(model->emb->weight.grad().sizes(), model->emb->weight.sizes());
  });
}

TEST(Wrap, FullShardHoldsAboutOneNthPerRank) {
  for (int world : {2, 4}) {
    run_ranks(world, [world](dist::ProcessGroup& pg) {
      FullyShardedDataParallel<NetImpl> model(make_net(1), options_for(pg, true));
      torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-3));
      auto b = make_batches(1, 8, 2)[0];
      const int64_t local = 8 / world;
      auto loss = torch::nn::functional::cross_entropy(model(b.tokens.narrow(0, pg.rank() * local, local)),
                                                       b.target.narrow(0, pg.rank() * local, local));
      loss.backward();
      opt.step();
      // Single-process bytes of parameters + gradients + AdamW state (2 moments).
      int64_t total = 0;
      for (auto& p : make_net(1)->parameters()) total += p.numel() * 4;
      const int64_t single = total * 4;
      auto stats = memory_stats(model.ptr());
      int64_t adam = 0;
      for (auto& p : model->parameters()) {
        auto& state = static_cast<torch::optim::AdamWParamState&>(
            *opt.state().at(optimizer_state_key(opt, p)));
        adam += (state.exp_avg().numel() + state.exp_avg_sq().numel()) * 4;
      }
      EXPECT_EQ(stats.unsharded_param_bytes, 0) << "full parameters alive outside forward/backward";
      const int64_t held = stats.sharded_param_bytes + stats.grad_bytes + adam;
      // 1/N of everything, plus the largest unit's full size and padding (< 4 units x N elements x 4 states).
      const int64_t bound = single / world + stats.largest_unit_bytes + 4 * 4 * world * 4;
      EXPECT_LE(held, bound) << "world " << world << ": held " << held << " of " << single;
      EXPECT_LT(held, single / world + single / 4) << "world " << world;
    });
  }
}

TEST(WrapErrors, WrappingTwice) {
  run_ranks(1, [](dist::ProcessGroup& pg) {
    auto net = make_net(1);
    FullyShardedDataParallel<NetImpl> model(net, options_for(pg, true));
    EXPECT_NE(config_error([&] { FullyShardedDataParallel<NetImpl> again(net, options_for(pg, true)); })
                  .find("is already wrapped by FullyShardedDataParallel"),
              std::string::npos);
  });
}

struct PlainMemberImpl : torch::nn::Module {
  PlainMemberImpl() { block = register_module("block", Block()); }
  torch::Tensor forward(torch::Tensor x) { return block(x); }
  Block block{nullptr};
};

TEST(WrapErrors, PolicySelectsAModuleWhoseForwardCannotBeInterposed) {
  run_ranks(1, [](dist::ProcessGroup& pg) {
    FSDPOptions o = options_for(pg, true);
    const std::string e =
        config_error([&] { FullyShardedDataParallel<PlainMemberImpl> m(std::make_shared<PlainMemberImpl>(), o); });
    EXPECT_NE(e.find("auto_wrap_policy selected module 'block'"), std::string::npos) << e;
    EXPECT_NE(e.find("hold it in a fsdp::Unit<"), std::string::npos) << e;
  });
}

// The C++ trap: a model that calls a unit's module as unit->forward(x)
// skips the holder, so the unit's parameters are never gathered. Detected
// where LibTorch fails on the shards: an error that says what to call.
struct DirectCallImpl : torch::nn::Module {
  DirectCallImpl() { block = register_module("block", Unit<BlockImpl>(std::make_shared<BlockImpl>())); }
  torch::Tensor forward(torch::Tensor x) { return block->forward(x); }  // should be block(x)
  Unit<BlockImpl> block{nullptr};
};

TEST(WrapErrors, CallingAUnitsModuleDirectlyIsNamed) {
  run_ranks(2, [](dist::ProcessGroup& pg) {
    for (const bool use_orig : {true, false}) {
      FullyShardedDataParallel<DirectCallImpl> model(std::make_shared<DirectCallImpl>(), options_for(pg, use_orig));
      ASSERT_TRUE(model->block.is_fsdp_unit());
      const std::string e = config_error([&] { model(torch::ones({2, kDim})); });
      EXPECT_NE(e.find("FSDP unit(s) 'block' below it held only their shards"), std::string::npos) << e;
      EXPECT_NE(e.find("as unit->forward(x), call unit(x) instead"), std::string::npos) << e;
      EXPECT_NE(e.find("LibTorch's error: "), std::string::npos) << e;
    }
    // Other LibTorch errors pass through unchanged.
    FullyShardedDataParallel<BlockImpl> plain(std::make_shared<BlockImpl>(), options_for(pg, true, false));
    EXPECT_THROW(plain(torch::ones({2, kDim + 1})), c10::Error);
  });
}

struct SharedAcrossUnitsImpl : torch::nn::Module {
  SharedAcrossUnitsImpl() {
    a = register_module("a", Unit<torch::nn::LinearImpl>(torch::nn::Linear(3, 3)));
    b = register_module("b", torch::nn::Linear(3, 3));
    b->weight = b->register_parameter("weight_tied", a->weight);  // a's weight registered in b too
  }
  torch::Tensor forward(torch::Tensor x) { return b(a(x)); }
  Unit<torch::nn::LinearImpl> a{nullptr};
  torch::nn::Linear b{nullptr};
};

TEST(WrapErrors, ParameterSharedByTwoUnits) {
  run_ranks(1, [](dist::ProcessGroup& pg) {
    FSDPOptions o = options_for(pg, true, false);
    // A user function as policy: wrap the module named "a" only.
    o.auto_wrap_policy([](const torch::nn::Module&, const std::string& name, int64_t) { return name == "a"; });
    const std::string e = config_error(
        [&] { FullyShardedDataParallel<SharedAcrossUnitsImpl> m(std::make_shared<SharedAcrossUnitsImpl>(), o); });
    EXPECT_NE(e.find("parameter 'b.weight_tied' is also a parameter of another FSDP unit"), std::string::npos) << e;
  });
}

TEST(WrapErrors, OptimizerBuiltBeforeWrapping) {
  run_ranks(2, [](dist::ProcessGroup& pg) {
    auto net = make_net(1);
    torch::optim::SGD early(net->parameters(), torch::optim::SGDOptions(0.1));
    FullyShardedDataParallel<NetImpl> model(net, options_for(pg, /*use_orig=*/false));
    EXPECT_EQ(config_error([&] { check_optimizer(model.ptr(), early); }),
              "The optimizer does not seem to reference any FSDP parameters. HINT: Make sure to create the optimizer "
              "after setting up the model.");
    torch::optim::SGD late(model->parameters(), torch::optim::SGDOptions(0.1));
    EXPECT_NO_THROW(check_optimizer(model.ptr(), late));
    // Several models: the optimizer must step one of them.
    using Models = std::vector<std::shared_ptr<torch::nn::Module>>;
    FullyShardedDataParallel<NetImpl> other(make_net(2), options_for(pg, /*use_orig=*/false));
    EXPECT_NO_THROW(check_optimizer(Models{other.ptr(), model.ptr()}, late));
    EXPECT_NE(config_error([&] { check_optimizer(Models{other.ptr()}, late); }).find("does not seem to reference"),
              std::string::npos);
    EXPECT_NE(config_error([&] { check_optimizer(Models{}, late); }).find("does not seem to reference"),
              std::string::npos);
  });
}

TEST(WrapErrors, RanksRunningDifferentForwardsGetTheTimeoutError) {
  std::atomic<bool> rank0_done{false};
  run_ranks(
      2,
      [&](dist::ProcessGroup& pg) {
        FullyShardedDataParallel<NetImpl> model(make_net(1), options_for(pg, true));
        if (pg.rank() == 1) {  // skips the forward, stays alive
          while (!rank0_done) std::this_thread::sleep_for(std::chrono::milliseconds(10));
          return;
        }
        auto b = make_batches(1, 2, 1)[0];
        try {
          model(b.tokens);
          ADD_FAILURE() << "a forward completed without rank 1";
        } catch (const CollectiveError& e) {
          EXPECT_EQ(e.collective(), "all_gather");
          EXPECT_NE(std::string(e.what()).find("timeout 2s"), std::string::npos) << e.what();
        }
        rank0_done = true;
      },
      std::chrono::seconds(2));
}

TEST(WrapErrors, BadOptions) {
  run_ranks(1, [](dist::ProcessGroup& pg) {
    FSDPOptions none;
    EXPECT_NE(config_error([&] { FullyShardedDataParallel<NetImpl> m(make_net(1), none); })
                  .find("options.process_group is null"),
              std::string::npos);
    FSDPOptions hybrid = options_for(pg, true);
    hybrid.sharding_strategy(ShardingStrategy::kHybridShard);
    EXPECT_NE(config_error([&] { FullyShardedDataParallel<NetImpl> m(make_net(1), hybrid); })
                  .find("the hybrid sharding strategy (HYBRID_SHARD) needs a device_mesh"),
              std::string::npos);
    EXPECT_EQ(config_error([] { parse_sharding_strategy("half_shard"); }),
              "sharding strategy 'half_shard' is unknown: expected one of FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, "
              "HYBRID_SHARD");
    EXPECT_EQ(parse_sharding_strategy("shard-grad-op"), ShardingStrategy::kShardGradOp);
  });
}

// FSDPOptions: TORCH_ARG setters chain, getters read back, and the defaults
// are the documented ones.
TEST(Options, SettersChainAndDefaultsHold) {
  const FSDPOptions defaults;
  EXPECT_EQ(defaults.process_group(), nullptr);
  EXPECT_EQ(defaults.sharding_strategy(), ShardingStrategy::kFullShard);
  EXPECT_FALSE(defaults.use_orig_params());
  EXPECT_TRUE(defaults.forward_prefetch());
  EXPECT_EQ(defaults.backward_prefetch(), BackwardPrefetch::kBackwardPre);
  EXPECT_TRUE(defaults.limit_all_gathers());
  EXPECT_EQ(defaults.max_reductions_in_flight(), 2);
  EXPECT_EQ(defaults.hybrid_shard_size(), 0);
  EXPECT_FALSE(defaults.device_mesh().has_value());
  EXPECT_FALSE(static_cast<bool>(defaults.auto_wrap_policy()));
  const FSDPOptions o = FSDPOptions()
                            .sharding_strategy(ShardingStrategy::kNoShard)
                            .use_orig_params(true)
                            .backward_prefetch(BackwardPrefetch::kBackwardPost)
                            .max_reductions_in_flight(0)
                            .cpu_offload(CPUOffload{true})
                            .mixed_precision(MixedPrecision{at::kBFloat16, std::nullopt, std::nullopt});
  EXPECT_EQ(o.sharding_strategy(), ShardingStrategy::kNoShard);
  EXPECT_TRUE(o.use_orig_params());
  EXPECT_EQ(o.backward_prefetch(), BackwardPrefetch::kBackwardPost);
  EXPECT_EQ(o.max_reductions_in_flight(), 0);
  EXPECT_TRUE(o.cpu_offload().offload_params);
  EXPECT_EQ(o.mixed_precision().param_dtype, at::kBFloat16);
  EXPECT_TRUE(o.forward_prefetch());  // untouched fields keep their defaults
}

TEST(Options, EnumNamesParseBackAndUnknownNamesListTheValidOnes) {
  for (auto s : {ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp, ShardingStrategy::kNoShard,
                 ShardingStrategy::kHybridShard}) {
    EXPECT_EQ(parse_sharding_strategy(to_string(s)), s);
  }
  for (auto w : {BackwardPrefetch::kNone, BackwardPrefetch::kBackwardPre, BackwardPrefetch::kBackwardPost}) {
    EXPECT_EQ(parse_backward_prefetch(to_string(w)), w);
  }
  EXPECT_STREQ(to_string(BackwardPrefetch::kBackwardPre), "BACKWARD_PRE");
  // The command line's short names.
  EXPECT_EQ(parse_backward_prefetch("pre"), BackwardPrefetch::kBackwardPre);
  EXPECT_EQ(parse_backward_prefetch("post"), BackwardPrefetch::kBackwardPost);
  EXPECT_EQ(parse_backward_prefetch("none"), BackwardPrefetch::kNone);
  EXPECT_EQ(parse_backward_prefetch("backward-post"), BackwardPrefetch::kBackwardPost);
  EXPECT_EQ(config_error([] { parse_backward_prefetch("sometimes"); }),
            "backward prefetch 'sometimes' is unknown: expected one of BACKWARD_PRE (or pre), BACKWARD_POST (or "
            "post), NONE (or none)");
  EXPECT_THROW(parse_backward_prefetch("backward_none"), ConfigError);
}

// A unit's forward takes its non-tensor arguments themselves (a counter it
// updates, by reference) and, under mixed precision, its floating-point
// tensors in the compute dtype, those inside a vector too (torch's
// _cast_forward_inputs): FSDP1's unit runs as the same forward hooks as
// fully_shard's.
struct ArgsImpl : torch::nn::Module {
  ArgsImpl() { fc = register_module("fc", torch::nn::Linear(4, 4)); }
  torch::Tensor forward(torch::Tensor x, std::vector<torch::Tensor> extra, int& calls) {
    ++calls;
    dtypes = {x.scalar_type(), extra[0].scalar_type(), extra[1].scalar_type()};
    return fc(x) + extra[0];
  }
  torch::nn::Linear fc{nullptr};
  std::vector<at::ScalarType> dtypes;
};

TEST(Wrap, AUnitsForwardTakesItsArgumentsAsTheEngineHooksGiveThem) {
  run_ranks(2, [](dist::ProcessGroup& pg) {
    FSDPOptions o;
    o.process_group(borrow(pg));
    MixedPrecision mp;
    mp.param_dtype = torch::kBFloat16;
    o.mixed_precision(mp);
    std::shared_ptr<ArgsImpl> impl;
    {
      std::lock_guard<std::mutex> lock(rng_mutex());
      impl = std::make_shared<ArgsImpl>();
    }
    FullyShardedDataParallel<ArgsImpl> model(impl, o);
    int calls = 0;
    model(torch::ones({2, 4}), std::vector<torch::Tensor>{torch::ones({2, 4}), torch::ones({2}, torch::kLong)}, calls);
    EXPECT_EQ(calls, 1);
    EXPECT_EQ(impl->dtypes, (std::vector<at::ScalarType>{torch::kBFloat16, torch::kBFloat16, torch::kLong}));
  });
}

}  // namespace
