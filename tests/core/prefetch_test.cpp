// forward_prefetch, backward_prefetch and limit_all_gathers: the next unit's
// all-gather really starts early, at most two units are full at once with
// the limit, and training results do not change.
#include <gtest/gtest.h>

#include "../support/thread_ranks.h"
#include "../support/models.h"

using namespace fsdp;
using namespace fsdp::testing;

namespace {

// A block that reports, at its forward, how many units hold full parameters.
struct ProbeImpl : torch::nn::Module {
  ProbeImpl() { fc = register_module("fc", torch::nn::Linear(5, 5)); }
  torch::Tensor forward(torch::Tensor x) {
    if (probe) probe();
    return torch::tanh(fc(x));
  }
  torch::nn::Linear fc{nullptr};
  std::function<void()> probe;
};
TORCH_MODULE(Probe);

std::vector<int64_t> full_units_seen(dist::ProcessGroup& pg, bool forward_prefetch, bool limit, int blocks) {
  torch::nn::Sequential seq;
  std::vector<Probe> probes;
  {
    std::lock_guard<std::mutex> lock(rng_mutex());
    torch::manual_seed(0);
    for (int i = 0; i < blocks; ++i) {
      probes.emplace_back();
      seq->push_back(probes.back());
    }
  }
  FSDPOptions o;
  o.process_group(borrow(pg));
  o.use_orig_params(true);
  o.auto_wrap_policy(transformer_auto_wrap_policy<ProbeImpl>());
  o.forward_prefetch(forward_prefetch);
  o.limit_all_gathers(limit);
  FullyShardedDataParallel<torch::nn::SequentialImpl> model(seq, o);
  std::vector<int64_t> seen;
  const int64_t unit_bytes = memory_stats(model.ptr()).largest_unit_bytes;
  for (auto& p : probes) {
    p->probe = [&] { seen.push_back(memory_stats(model.ptr()).unsharded_param_bytes / unit_bytes); };
  }
  for (int iter = 0; iter < 2; ++iter) {
    seen.clear();  // keep the second iteration's: the first records the order
    model(torch::ones({2, 5})).sum().backward();
  }
  return seen;
}

// A model run inside another model's forward (a frozen teacher called from a
// student's unit) still starts a new iteration at each of its forwards: the
// forward depth that tells a root's forward from a nested one is counted per
// model, not per thread. So it records its forward order and prefetches from
// it as it does when run on its own.
TEST(Prefetch, AModelRunInsideAnotherModelsForwardPrefetchesAsAlone) {
  run_ranks(2, [](dist::ProcessGroup& pg) {
    auto make_teacher = [&] {
      torch::nn::Sequential seq;
      {
        std::lock_guard<std::mutex> lock(rng_mutex());
        for (int i = 0; i < 3; ++i) seq->push_back(Probe());
      }
      FSDPOptions o;
      o.process_group(borrow(pg));
      o.auto_wrap_policy(transformer_auto_wrap_policy<ProbeImpl>());
      o.forward_prefetch(true);
      return FullyShardedDataParallel<torch::nn::SequentialImpl>(seq, o);
    };
    auto run_teacher = [](FullyShardedDataParallel<torch::nn::SequentialImpl>& teacher) {
      torch::NoGradGuard no_grad;
      teacher(torch::ones({2, 5}));
    };
    auto alone = make_teacher();
    for (int i = 0; i < 3; ++i) run_teacher(alone);
    auto nested = make_teacher();
    Probe student_module;
    student_module->probe = [&] { run_teacher(nested); };
    FSDPOptions o;
    o.process_group(borrow(pg));
    FullyShardedDataParallel<ProbeImpl> student(student_module, o);
    for (int i = 0; i < 3; ++i) student(torch::ones({2, 5})).sum().backward();
    EXPECT_GT(runtime_stats(alone.ptr()).prefetches, 0);
    EXPECT_EQ(runtime_stats(nested.ptr()).prefetches, runtime_stats(alone.ptr()).prefetches);
  });
}

TEST(Prefetch, ForwardPrefetchGathersTheNextUnitEarly) {
  run_ranks(2, [](dist::ProcessGroup& pg) {
    EXPECT_EQ(full_units_seen(pg, false, true, 4), (std::vector<int64_t>{1, 1, 1, 1}));
    // The next block's all-gather is in flight while the current one runs.
    EXPECT_EQ(full_units_seen(pg, true, true, 4), (std::vector<int64_t>{2, 2, 2, 1}));
  });
}

// SHARD_GRAD_OP keeps each unit full until backward: when b runs, a and b
// are full, so the limit stops the prefetch of c that would make three.
struct PairImpl : torch::nn::Module {
  PairImpl() {
    a = register_module("a", Unit<ProbeImpl>(std::make_shared<ProbeImpl>()));
    b = register_module("b", Unit<ProbeImpl>(std::make_shared<ProbeImpl>()));
    c = register_module("c", Unit<ProbeImpl>(std::make_shared<ProbeImpl>()));
  }
  torch::Tensor forward(torch::Tensor x) { return c(b(a(x))); }
  Unit<ProbeImpl> a{nullptr}, b{nullptr}, c{nullptr};
};

TEST(Prefetch, LimitAllGathersBoundsFullUnits) {
  run_ranks(2, [](dist::ProcessGroup& pg) {
    for (bool limit : {true, false}) {
      std::shared_ptr<PairImpl> net;
      {
        std::lock_guard<std::mutex> lock(rng_mutex());
        torch::manual_seed(0);
        net = std::make_shared<PairImpl>();
      }
      FSDPOptions o;
      o.process_group(borrow(pg));
      o.use_orig_params(true);
      o.auto_wrap_policy(transformer_auto_wrap_policy<ProbeImpl>());
      o.forward_prefetch(true);
      o.sharding_strategy(ShardingStrategy::kShardGradOp);  // keeps each unit full until backward
      o.limit_all_gathers(limit);
      FullyShardedDataParallel<PairImpl> model(net, o);
      const int64_t unit_bytes = memory_stats(model.ptr()).largest_unit_bytes;
      int64_t at_b = 0;
      net->b->probe = [&] { at_b = memory_stats(model.ptr()).unsharded_param_bytes / unit_bytes; };
      for (int iter = 0; iter < 2; ++iter) model(torch::ones({2, 5})).sum().backward();
      EXPECT_EQ(at_b, limit ? 2 : 3) << "limit_all_gathers=" << limit;
    }
  });
}

TEST(Prefetch, TrainingResultsDoNotChange) {
  const auto batches = make_batches(4, 12, 5);
  auto ref_net = make_net(9);
  torch::optim::AdamW ref_opt(ref_net->parameters(), torch::optim::AdamWOptions(0.01));
  const auto reference = train_local(*ref_net, ref_opt, batches);
  run_ranks(3, [&](dist::ProcessGroup& pg) {
    for (bool fwd : {false, true}) {
      for (auto bwd : {BackwardPrefetch::kNone, BackwardPrefetch::kBackwardPre, BackwardPrefetch::kBackwardPost}) {
        FSDPOptions o;
        o.process_group(borrow(pg));
        o.auto_wrap_policy(transformer_auto_wrap_policy<BlockImpl>());
        o.forward_prefetch(fwd);
        o.backward_prefetch(bwd);
        FullyShardedDataParallel<NetImpl> model(make_net(9), o);
        torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(0.01));
        for (const auto& b : batches) {
          opt.zero_grad();
          torch::nn::functional::cross_entropy(model(b.tokens.narrow(0, pg.rank() * 4, 4)),
                                               b.target.narrow(0, pg.rank() * 4, 4))
              .backward();
          opt.step();
        }
        auto got = to_map(full_parameters(model.ptr()));
        for (auto& [name, w] : reference) {
          EXPECT_LE((got.at(name) - w).abs().max().item<double>(), 1e-5)
              << name << " forward_prefetch=" << fwd << " backward_prefetch=" << static_cast<int>(bwd);
        }
      }
    }
  });
}

}  // namespace
