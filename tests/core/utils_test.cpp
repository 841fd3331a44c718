// no_sync, clip_grad_norm_ and summon_full_params.
#include <gtest/gtest.h>

#include <cmath>

#include "../support/thread_ranks.h"
#include "fsdp/error.h"
#include "../support/models.h"

using namespace fsdp;
using namespace fsdp::testing;

namespace {

FSDPOptions options_for(dist::ProcessGroup& pg, bool use_orig, ShardingStrategy s = ShardingStrategy::kFullShard) {
  FSDPOptions o;
  o.process_group(borrow(pg));
  o.use_orig_params(use_orig);
  o.sharding_strategy(s);
  o.auto_wrap_policy(transformer_auto_wrap_policy<BlockImpl>());
  return o;
}

torch::Tensor loss_of(torch::Tensor logits, torch::Tensor target) {
  return torch::nn::functional::cross_entropy(logits, target);
}

// Two micro-batches, the first under no_sync, then one step == one step on
// the concatenated batch (each micro-batch loss weighted 1/2).
TEST(NoSync, TwoMicroBatchesEqualOneStepOnTheConcatenatedBatch) {
  const auto batches = make_batches(2, 8, 7);  // 2 steps of 8 samples
  auto ref_net = make_net(5);
  torch::optim::SGD ref_opt(ref_net->parameters(), torch::optim::SGDOptions(0.2));
  const auto reference = train_local(*ref_net, ref_opt, batches);
  for (bool use_orig : {false, true}) {
    run_ranks(2, [&](dist::ProcessGroup& pg) {
      FullyShardedDataParallel<NetImpl> model(make_net(5), options_for(pg, use_orig));
      torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.2));
      for (const auto& b : batches) {
        opt.zero_grad();
        // This rank's 4 samples, as two micro-batches of 2.
        auto tokens = b.tokens.narrow(0, pg.rank() * 4, 4), target = b.target.narrow(0, pg.rank() * 4, 4);
        {
          NoSync no_sync(model.ptr());
          (loss_of(model(tokens.narrow(0, 0, 2)), target.narrow(0, 0, 2)) / 2).backward();
        }
        (loss_of(model(tokens.narrow(0, 2, 2)), target.narrow(0, 2, 2)) / 2).backward();
        opt.step();
      }
      expect_close(to_map(full_parameters(model.ptr())), reference, 1e-5, use_orig ? "orig" : "flat");
    });
  }
}

TEST(ClipGradNorm, EqualsTheNormOfTheFullGradients) {
  for (double norm_type : {2.0, 1.0, static_cast<double>(INFINITY)}) {
    const auto batches = make_batches(2, 6, 3);
    std::vector<double> ref_norms;
    auto ref_net = make_net(8);
    torch::optim::SGD ref_opt(ref_net->parameters(), torch::optim::SGDOptions(0.5));
    const auto reference = train_local(*ref_net, ref_opt, batches, [&] {
      ref_norms.push_back(torch::nn::utils::clip_grad_norm_(ref_net->parameters(), 0.05, norm_type));
    });
    for (auto strategy : {ShardingStrategy::kFullShard, ShardingStrategy::kNoShard}) {
      for (bool use_orig : {false, true}) {
        run_ranks(3, [&](dist::ProcessGroup& pg) {
          FullyShardedDataParallel<NetImpl> model(make_net(8), options_for(pg, use_orig, strategy));
          torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.5));
          for (size_t i = 0; i < batches.size(); ++i) {
            opt.zero_grad();
            const auto& b = batches[i];
            loss_of(model(b.tokens.narrow(0, pg.rank() * 2, 2)), b.target.narrow(0, pg.rank() * 2, 2)).backward();
            const double norm = clip_grad_norm_(model.ptr(), 0.05, norm_type).item<double>();
            EXPECT_NEAR(norm, ref_norms[i], 1e-5 * std::max(1.0, ref_norms[i])) << "p=" << norm_type;
            opt.step();
          }
          expect_close(to_map(full_parameters(model.ptr())), reference, 1e-5,
                       std::string(to_string(strategy)) + " p=" + std::to_string(norm_type));
        });
      }
    }
  }
}

// An inf gradient on one rank: with error_if_nonfinite every rank throws
// PyTorch's message and keeps its gradients (no rank is left waiting in a
// collective); without it the non-finite norm comes back, as in PyTorch.
TEST(ClipGradNorm, NonFiniteGradientsAreNamedOnEveryRank) {
  const auto batches = make_batches(1, 6, 3);
  run_ranks(2, [&](dist::ProcessGroup& pg) {
    FullyShardedDataParallel<NetImpl> model(make_net(8), options_for(pg, false, ShardingStrategy::kFullShard));
    const auto& b = batches[0];
    loss_of(model(b.tokens.narrow(0, pg.rank() * 3, 3)), b.target.narrow(0, pg.rank() * 3, 3)).backward();
    auto params = model->parameters();
    if (pg.rank() == 1) {
      torch::NoGradGuard no_grad;
      params[0].mutable_grad().view({-1})[0].fill_(INFINITY);
    }
    std::vector<torch::Tensor> before;
    for (const auto& p : params) before.push_back(p.grad().clone());
    try {
      clip_grad_norm_(model.ptr(), 0.05, 2.0, /*error_if_nonfinite=*/true);
      ADD_FAILURE() << "no error on rank " << pg.rank();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("for gradients from `parameters` is non-finite, so it cannot be clipped"),
                std::string::npos)
          << e.what();
    }
    for (size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(torch::equal(params[i].grad(), before[i])) << i;
    EXPECT_TRUE(std::isinf(clip_grad_norm_(model.ptr(), 0.05).item<double>()));
  });
}

// torch multiplies the gradients by the clamped coefficient even when it is
// 1: a NaN gradient on one rank makes the norm NaN and every gradient on
// every rank NaN. Before (issue 50, item 20): fsdp-cpp skipped the multiply
// unless max_norm / norm was below 1, so the other gradients stayed finite.
TEST(ClipGradNorm, NanNormMakesEveryGradientNan) {
  const auto batches = make_batches(1, 6, 3);
  for (bool use_orig : {false, true}) {
    run_ranks(2, [&](dist::ProcessGroup& pg) {
      FullyShardedDataParallel<NetImpl> model(make_net(8), options_for(pg, use_orig));
      const auto& b = batches[0];
      loss_of(model(b.tokens.narrow(0, pg.rank() * 3, 3)), b.target.narrow(0, pg.rank() * 3, 3)).backward();
      std::vector<torch::Tensor> grads;
      for (const auto& p : model->parameters()) {
        if (p.grad().defined() && p.grad().numel() > 0) grads.push_back(p.grad());
      }
      ASSERT_FALSE(grads.empty());
      if (pg.rank() == 1) {
        torch::NoGradGuard no_grad;
        grads[0].view({-1})[0].fill_(NAN);
      }
      EXPECT_TRUE(std::isnan(clip_grad_norm_(model.ptr(), 0.05).item<double>()));
      for (size_t i = 0; i < grads.size(); ++i) {
        EXPECT_TRUE(grads[i].isnan().all().item<bool>()) << (use_orig ? "orig" : "flat") << " rank " << pg.rank()
                                                         << " gradient " << i;
      }
    });
  }
}

TEST(SummonFullParams, WritebackChangesStickAfterResharding) {
  run_ranks(2, [](dist::ProcessGroup& pg) {
    FullyShardedDataParallel<NetImpl> model(make_net(1), options_for(pg, /*use_orig=*/true));
    const auto before = to_map(full_parameters(model.ptr()));
    {
      SummonFullParams full(model.ptr());
      // Inside: original shapes and values.
      EXPECT_EQ(model->extra->fc1->weight.sizes(), (std::vector<int64_t>{kHidden, kDim}));
      EXPECT_TRUE(torch::equal(model->extra->fc1->weight, before.at("extra.fc1.weight")));
      torch::NoGradGuard no_grad;
      model->extra->fc1->weight.fill_(3.0);
      model->emb->weight.fill_(-1.0);
    }
    EXPECT_EQ(model->extra->fc1->weight.dim(), 1);  // sharded again
    auto after = to_map(full_parameters(model.ptr()));
    EXPECT_TRUE(torch::equal(after.at("extra.fc1.weight"), torch::full({kHidden, kDim}, 3.0)));
    EXPECT_TRUE(torch::equal(after.at("emb.weight"), torch::full({kVocab, kDim}, -1.0)));
    EXPECT_TRUE(torch::equal(after.at("blocks.0.fc1.weight"), before.at("blocks.0.fc1.weight")));
  });
}

TEST(SummonFullParams, WithoutWritebackChangesAreDropped) {
  for (auto strategy : {ShardingStrategy::kFullShard, ShardingStrategy::kNoShard}) {
    run_ranks(2, [strategy](dist::ProcessGroup& pg) {
      FullyShardedDataParallel<NetImpl> model(make_net(1), options_for(pg, true, strategy));
      const auto before = to_map(full_parameters(model.ptr()));
      {
        SummonOptions o;
        o.writeback = false;
        SummonFullParams full(model.ptr(), o);
        torch::NoGradGuard no_grad;
        model->extra->fc1->weight.fill_(3.0);
      }
      auto after = to_map(full_parameters(model.ptr()));
      EXPECT_TRUE(torch::equal(after.at("extra.fc1.weight"), before.at("extra.fc1.weight"))) << to_string(strategy);
    });
  }
}

TEST(SummonFullParams, Rank0OnlyAndOffloadOnWholeParameters) {
  run_ranks(2, [](dist::ProcessGroup& pg) {
    FullyShardedDataParallel<NetImpl> model(make_net(1), options_for(pg, true));
    SummonOptions o;
    o.rank0_only = true;
    o.writeback = false;
    {
      SummonFullParams full(model.ptr(), o);
      EXPECT_EQ(model->emb->weight.dim(), pg.rank() == 0 ? 2 : 1);
    }
    o.rank0_only = false;
    o.writeback = true;
    EXPECT_THROW(SummonFullParams(model.ptr(), SummonOptions{true, true, true, false}), ConfigError);
  });
  // NO_SHARD parameters live whole on CPU: offload_to_cpu must not free them.
  run_ranks(2, [](dist::ProcessGroup& pg) {
    FullyShardedDataParallel<NetImpl> model(make_net(1), options_for(pg, true, ShardingStrategy::kNoShard));
    const auto before = to_map(full_parameters(model.ptr()));
    {
      SummonOptions o;
      o.offload_to_cpu = true;
      SummonFullParams full(model.ptr(), o);
      EXPECT_TRUE(torch::equal(model->emb->weight, before.at("emb.weight")));
    }
    EXPECT_TRUE(torch::equal(model->emb->weight, before.at("emb.weight")));
    auto b = make_batches(1, 2, 1)[0];
    EXPECT_EQ(model(b.tokens).sizes(), (std::vector<int64_t>{2, kVocab}));
  });
}

TEST(SummonFullParams, ForwardInsideIsAnError) {
  run_ranks(2, [](dist::ProcessGroup& pg) {
    FullyShardedDataParallel<NetImpl> model(make_net(1), options_for(pg, true));
    auto b = make_batches(1, 2, 1)[0];
    SummonFullParams full(model.ptr());
    try {
      model(b.tokens);
      ADD_FAILURE() << "forward ran inside summon_full_params";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("inside summon_full_params"), std::string::npos) << e.what();
    }
    EXPECT_THROW(SummonFullParams again(model.ptr()), ConfigError);
  });
}

}  // namespace
