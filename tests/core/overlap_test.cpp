// Asynchronous gradient reduction and prefetching (issue 15): reductions are
// issued as soon as a unit's gradients are ready and stay in flight while
// backward computes the units before it; never more than the bound are in
// flight; all-gathers and full units stay within limit_all_gathers; and the
// results are exactly those of waiting for every reduction where it is issued.
#include <gtest/gtest.h>

#include <map>

#include "../support/thread_ranks.h"
#include "fsdp/error.h"
#include "../support/models.h"

using namespace fsdp;
using namespace fsdp::testing;

namespace {

// A block that, during backward, records what the runtime has in flight at
// the moment its input's gradient is computed: every unit after it in the
// forward has finished its backward by then.
struct SpyImpl : torch::nn::Module {
  SpyImpl() { fc = register_module("fc", torch::nn::Linear(8, 8)); }
  torch::Tensor forward(torch::Tensor x) {
    if (spy && x.requires_grad()) x.register_hook([this](const torch::Tensor&) { spy(); });
    return torch::tanh(fc(x));
  }
  torch::nn::Linear fc{nullptr};
  std::function<void()> spy;
};
TORCH_MODULE(Spy);

struct Trained {
  std::vector<RuntimeStats> seen;  // at each spy, second iteration
  RuntimeStats after;              // after the second iteration's backward
  std::map<std::string, at::Tensor> params;  // full parameters after training
};

Trained train(dist::ProcessGroup& pg, ShardingStrategy strategy, int max_in_flight, bool forward_prefetch = false,
          bool no_sync_first = false) {
  torch::nn::Sequential seq;
  std::vector<Spy> spies;
  {
    std::lock_guard<std::mutex> lock(rng_mutex());
    torch::manual_seed(3);
    for (int i = 0; i < 6; ++i) {
      spies.emplace_back();
      seq->push_back(spies.back());
    }
  }
  FSDPOptions o;
  if (strategy == ShardingStrategy::kHybridShard) {
    o.process_group(borrow(pg));
    o.hybrid_shard_size(2);
  } else {
    o.process_group(borrow(pg));
  }
  o.sharding_strategy(strategy);
  o.auto_wrap_policy(transformer_auto_wrap_policy<SpyImpl>());
  o.max_reductions_in_flight(max_in_flight);
  o.forward_prefetch(forward_prefetch);
  FullyShardedDataParallel<torch::nn::SequentialImpl> model(seq, o);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
  Trained run;
  for (auto& s : spies) s->spy = [&] { run.seen.push_back(runtime_stats(model.ptr())); };
  auto batch = [&](int i) { return torch::full({3, 8}, 0.1 * (i + 1) + 0.01 * pg.rank()); };
  for (int iter = 0; iter < 3; ++iter) {
    if (iter == 2) {
      run.seen.clear();  // the first iterations record the order prefetching follows
      reset_runtime_stats(model.ptr());
    }
    opt.zero_grad();
    if (no_sync_first) {
      NoSync guard(model.ptr());
      model(batch(iter + 10)).pow(2).sum().backward();
    }
    model(batch(iter)).pow(2).sum().backward();
    // The optimizer sees finished gradients only: nothing is in flight.
    EXPECT_EQ(runtime_stats(model.ptr()).reductions_in_flight, 0);
    opt.step();
  }
  run.after = runtime_stats(model.ptr());
  for (auto& [name, t] : full_parameters(model.ptr())) run.params[name] = t;
  return run;
}

int max_reductions_seen(const Trained& r) {
  int m = 0;
  for (const auto& s : r.seen) m = std::max(m, s.reductions_in_flight);
  return m;
}

void expect_same_params(const Trained& a, const Trained& b) {
  ASSERT_EQ(a.params.size(), b.params.size());
  for (const auto& [name, t] : a.params) EXPECT_TRUE(torch::equal(t, b.params.at(name))) << name;
}

}  // namespace

// While a unit's backward computes, the reductions of the units after it
// have been issued and not yet waited.
TEST(Overlap, ReductionsStayInFlightWhileEarlierUnitsComputeBackward) {
  run_ranks(2, [](dist::ProcessGroup& pg) {
    for (auto strategy : {ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp, ShardingStrategy::kNoShard}) {
      SCOPED_TRACE(to_string(strategy));
      Trained overlapped = train(pg, strategy, 2);
      ASSERT_EQ(overlapped.seen.size(), 5u);  // the first block's input needs no gradient
      // Autograd accumulates a block's weight gradients before it goes on
      // to the block below, so the last block's spy already sees that
      // block's reduction in flight; every later spy sees the bound's two.
      EXPECT_EQ(overlapped.seen.front().reductions_in_flight, 1);
      for (size_t i = 1; i < overlapped.seen.size(); ++i) EXPECT_EQ(overlapped.seen[i].reductions_in_flight, 2) << i;
      // Waiting for each where it is issued: never one in flight during compute.
      Trained waited = train(pg, strategy, 0);
      EXPECT_EQ(max_reductions_seen(waited), 0);
      EXPECT_EQ(waited.after.reductions, overlapped.after.reductions);
      expect_same_params(overlapped, waited);
    }
  });
}

TEST(Overlap, ReductionsInFlightNeverExceedTheBound) {
  run_ranks(2, [](dist::ProcessGroup& pg) {
    Trained reference = train(pg, ShardingStrategy::kFullShard, 0);
    for (int bound : {1, 2, 3, 10}) {
      SCOPED_TRACE("max_reductions_in_flight=" + std::to_string(bound));
      Trained r = train(pg, ShardingStrategy::kFullShard, bound);
      EXPECT_LE(max_reductions_seen(r), bound);
      EXPECT_LE(r.after.peak_reductions_in_flight, bound);
      // 7 units (6 blocks and the root) reduce once per backward.
      EXPECT_EQ(r.after.peak_reductions_in_flight, std::min(bound, 6));
      EXPECT_EQ(r.after.reductions, 6);  // the root owns no parameters: nothing to reduce
      expect_same_params(r, reference);
    }
  });
}

// HYBRID_SHARD (reduce-scatter in the shard group, then all-reduce across
// replicas) and the first synced backward after no_sync go the same way.
TEST(Overlap, HybridShardAndNoSyncReduceAsynchronouslyWithTheSameResults) {
  run_ranks(4, [](dist::ProcessGroup& pg) {
    Trained hybrid = train(pg, ShardingStrategy::kHybridShard, 2);
    EXPECT_EQ(max_reductions_seen(hybrid), 2);
    expect_same_params(hybrid, train(pg, ShardingStrategy::kHybridShard, 0));
    Trained accumulated = train(pg, ShardingStrategy::kFullShard, 2, false, /*no_sync_first=*/true);
    EXPECT_EQ(max_reductions_seen(accumulated), 2);
    expect_same_params(accumulated, train(pg, ShardingStrategy::kFullShard, 0, false, true));
  });
}

// All-gathers in flight and units holding full parameters stay within
// limit_all_gathers' two, with forward and backward prefetching on.
TEST(Overlap, PrefetchStaysWithinTheAllGatherLimit) {
  run_ranks(2, [](dist::ProcessGroup& pg) {
    Trained r = train(pg, ShardingStrategy::kFullShard, 2, /*forward_prefetch=*/true);
    EXPECT_GT(r.after.prefetches, 0);
    EXPECT_LE(r.after.peak_all_gathers_in_flight, 2);
    EXPECT_LE(r.after.peak_units_unsharded, 2);
    // Forward and backward gather each block once per iteration (the root owns nothing).
    EXPECT_EQ(r.after.all_gathers, 12);
    expect_same_params(r, train(pg, ShardingStrategy::kFullShard, 2, false));
  });
}

TEST(Overlap, NegativeBoundIsRefused) {
  run_ranks(1, [](dist::ProcessGroup& pg) {
    FSDPOptions o;
    o.process_group(borrow(pg));
    o.max_reductions_in_flight(-1);
    auto net = std::make_shared<SpyImpl>();
    try {
      FullyShardedDataParallel<SpyImpl> model(net, o);
      FAIL() << "expected ConfigError";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("max_reductions_in_flight=-1"), std::string::npos) << e.what();
    }
  });
}
