// Situations real training loops create: evaluation without gradients between
// steps, frozen parameters, a unit applied twice in one forward, a unit
// without parameters.
#include <gtest/gtest.h>

#include "../support/thread_ranks.h"
#include "fsdp/error.h"
#include "../support/models.h"

using namespace fsdp;
using namespace fsdp::testing;

namespace {

torch::Tensor loss_of(torch::Tensor logits, torch::Tensor target) {
  return torch::nn::functional::cross_entropy(logits, target);
}

TEST(Edge, EvaluationWithoutGradientsBetweenSteps) {
  const auto batches = make_batches(3, 4, 21);
  auto ref_net = make_net(4);
  torch::optim::SGD ref_opt(ref_net->parameters(), torch::optim::SGDOptions(0.1));
  const auto reference = train_local(*ref_net, ref_opt, batches);
  for (auto strategy : {ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp}) {
    run_ranks(2, [&](dist::ProcessGroup& pg) {
      FSDPOptions o;
      o.process_group(borrow(pg));
      o.sharding_strategy(strategy);
      o.forward_prefetch(true);
      o.auto_wrap_policy(transformer_auto_wrap_policy<BlockImpl>());
      FullyShardedDataParallel<NetImpl> model(make_net(4), o);
      torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
      for (const auto& b : batches) {
        {
          torch::NoGradGuard no_grad;
          model->eval();
          auto logits = model(b.tokens);  // every rank evaluates the whole batch
          EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{4, kVocab}));
          EXPECT_EQ(memory_stats(model.ptr()).unsharded_param_bytes, 0) << "evaluation left full parameters";
          model->train();
        }
        opt.zero_grad();
        loss_of(model(b.tokens.narrow(0, pg.rank() * 2, 2)), b.target.narrow(0, pg.rank() * 2, 2)).backward();
        opt.step();
      }
      expect_close(to_map(full_parameters(model.ptr())), reference, 1e-5, to_string(strategy));
    });
  }
}

TEST(Edge, FrozenParametersStayFrozen) {
  const auto batches = make_batches(3, 4, 22);
  auto freeze = [](NetImpl& net) {
    net.emb->weight.set_requires_grad(false);
    net.blocks[0]->as<BlockImpl>()->fc1->weight.set_requires_grad(false);
  };
  auto ref_net = make_net(6);
  freeze(*ref_net);
  torch::optim::AdamW ref_opt(ref_net->parameters(), torch::optim::AdamWOptions(0.01).weight_decay(0.1));
  const auto reference = train_local(*ref_net, ref_opt, batches);
  EXPECT_TRUE(torch::equal(reference.at("emb.weight"), make_net(6)->emb->weight));
  run_ranks(2, [&](dist::ProcessGroup& pg) {
    auto net = make_net(6);
    freeze(*net);
    FSDPOptions o;
    o.process_group(borrow(pg));
    o.use_orig_params(true);
    o.auto_wrap_policy(transformer_auto_wrap_policy<BlockImpl>());
    FullyShardedDataParallel<NetImpl> model(net, o);
    torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(0.01).weight_decay(0.1));
    for (const auto& b : batches) {
      opt.zero_grad();
      loss_of(model(b.tokens.narrow(0, pg.rank() * 2, 2)), b.target.narrow(0, pg.rank() * 2, 2)).backward();
      EXPECT_FALSE(model->emb->weight.grad().defined());
      opt.step();
    }
    expect_close(to_map(full_parameters(model.ptr())), reference, 1e-5, "frozen, use_orig_params");
  });
  // A flat parameter has one requires_grad: mixing is PyTorch's error too.
  run_ranks(1, [&](dist::ProcessGroup& pg) {
    auto net = make_net(6);
    freeze(*net);
    FSDPOptions o;
    o.process_group(borrow(pg));
    o.auto_wrap_policy(transformer_auto_wrap_policy<BlockImpl>());
    try {
      FullyShardedDataParallel<NetImpl> model(net, o);
      ADD_FAILURE() << "mixed requires_grad accepted with use_orig_params=false";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("mixes parameters that require gradients and frozen ones"),
                std::string::npos)
          << e.what();
    }
  });
}

// One unit called twice in one forward: its gradient is the sum of both uses.
struct TwiceImpl : torch::nn::Module {
  TwiceImpl() {
    block = register_module("block", Unit<BlockImpl>(std::make_shared<BlockImpl>()));
    out = register_module("out", torch::nn::Linear(kDim, 3));
  }
  torch::Tensor forward(torch::Tensor x) { return out(block(torch::relu(block(x)))); }
  Unit<BlockImpl> block{nullptr};
  torch::nn::Linear out{nullptr};
};

TEST(Edge, UnitAppliedTwiceInOneForward) {
  torch::Tensor x, y;
  {
    std::lock_guard<std::mutex> lock(rng_mutex());
    torch::manual_seed(1);
    x = torch::randn({3, 6, kDim});
    y = torch::randn({3, 6, 3});
  }
  auto make = [] {
    std::lock_guard<std::mutex> lock(rng_mutex());
    torch::manual_seed(2);
    return std::make_shared<TwiceImpl>();
  };
  std::map<std::string, torch::Tensor> reference;
  {
    auto net = make();
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.5));
    for (int s = 0; s < 3; ++s) {
      opt.zero_grad();
      torch::mse_loss(net->forward(x[s]), y[s]).backward();
      opt.step();
    }
    reference = named_params(*net);
  }
  for (auto strategy : {ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp, ShardingStrategy::kNoShard}) {
    run_ranks(3, [&](dist::ProcessGroup& pg) {
      FSDPOptions o;
      o.process_group(borrow(pg));
      o.sharding_strategy(strategy);
      o.auto_wrap_policy(transformer_auto_wrap_policy<BlockImpl>());
      FullyShardedDataParallel<TwiceImpl> model(make(), o);
      torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.5));
      for (int s = 0; s < 3; ++s) {
        opt.zero_grad();
        torch::mse_loss(model(x[s].narrow(0, pg.rank() * 2, 2)), y[s].narrow(0, pg.rank() * 2, 2)).backward();
        opt.step();
      }
      expect_close(to_map(full_parameters(model.ptr())), reference, 1e-5, to_string(strategy));
    });
  }
}

struct ScaleImpl : torch::nn::Module {
  torch::Tensor forward(torch::Tensor x) { return x * 2; }
};

struct WithParameterlessUnitImpl : torch::nn::Module {
  WithParameterlessUnitImpl() {
    fc = register_module("fc", torch::nn::Linear(4, 4));
    scale = register_module("scale", Unit<ScaleImpl>(std::make_shared<ScaleImpl>()));
  }
  torch::Tensor forward(torch::Tensor x) { return scale(fc(x)); }
  torch::nn::Linear fc{nullptr};
  Unit<ScaleImpl> scale{nullptr};
};

TEST(Edge, UnitWithoutParameters) {
  run_ranks(2, [](dist::ProcessGroup& pg) {
    FSDPOptions o;
    o.process_group(borrow(pg));
    o.auto_wrap_policy(transformer_auto_wrap_policy<ScaleImpl>());
    std::shared_ptr<WithParameterlessUnitImpl> net;
    {
      std::lock_guard<std::mutex> lock(rng_mutex());
      torch::manual_seed(0);
      net = std::make_shared<WithParameterlessUnitImpl>();
    }
    FullyShardedDataParallel<WithParameterlessUnitImpl> model(net, o);
    EXPECT_EQ(fsdp_modules(model.ptr()).size(), 2u);
    torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
    for (int s = 0; s < 2; ++s) {
      opt.zero_grad();
      model(torch::ones({2, 4})).sum().backward();
      opt.step();
    }
    auto full = to_map(full_parameters(model.ptr()));
    EXPECT_EQ(full.size(), 2u);
  });
}

}  // namespace
