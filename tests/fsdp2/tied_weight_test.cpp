// A tied weight (an embedding's weight registered in the output head too)
// listed twice in the optimizer. LibTorch's Module::parameters() lists it
// under each name, where PyTorch's lists it once, so AdamW(net->parameters())
// — the PyTorch habit — would step it twice per step. Every place the
// library is handed an optimizer refuses that by the parameter's name, for
// both engines (FSDP1, FSDP2), and fsdp::unique_parameters gives the list
// PyTorch's parameters() gives.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>

#include "../support/errors.h"
#include "../support/thread_ranks.h"
#include "fsdp/error.h"
#include "fsdp/fsdp.h"
#include "fsdp/fsdp2/fully_shard.h"
#include "fsdp/optim/adamw.h"
#include "fsdp/state_dict/distributed_state_dict.h"
#include "fsdp/state_dict/optim_state_dict.h"
#include "fsdp/strategy/model_parallel.h"
#include "fsdp/strategy/strategy.h"

using namespace fsdp;
using namespace fsdp::testing;

namespace {

constexpr int64_t kVocab = 11, kDim = 8;

// The output head, projecting with the weight it is given.
struct TiedHeadImpl : torch::nn::Module {
  explicit TiedHeadImpl(const at::Tensor& w) {
    weight = register_parameter("weight", w);
    bias = register_parameter("bias", torch::zeros({w.size(0)}));
  }
  at::Tensor forward(const at::Tensor& x) { return torch::linear(x, weight, bias); }
  at::Tensor weight, bias;
};
TORCH_MODULE(TiedHead);

// tok.weight is head.weight: parameters() lists tok.weight, head.weight
// (the same tensor) and head.bias.
struct TiedLMImpl : torch::nn::Module {
  TiedLMImpl() {
    tok = register_module("tok", torch::nn::Embedding(kVocab, kDim));
    head = register_module("head", TiedHead(tok->weight));
  }
  at::Tensor forward(const at::Tensor& tokens) { return head(tok(tokens).mean(1)); }
  torch::nn::Embedding tok{nullptr};
  TiedHead head{nullptr};
};

const std::string kTwice =
    "the optimizer lists parameter 'tok.weight' (also named 'head.weight') twice, in param group 0 at positions 0 "
    "and 1, and would step it twice per step";

at::Tensor train_step(torch::optim::Optimizer& opt, const std::function<at::Tensor(const at::Tensor&)>& forward) {
  opt.zero_grad();
  at::Tensor tokens = (at::arange(12).reshape({4, 3}) * 5 + 1) % kVocab;
  at::Tensor loss = torch::nn::functional::cross_entropy(forward(tokens), at::arange(4) % kVocab);
  loss.backward();
  opt.step();
  return loss;
}

// Before: check_optimizer, get_optimizer_state_dict, get_state_dict and
// ModelParallelStrategy::setup_optimizer took AdamW(net->parameters())
// without a word (a user's run: the tied weight stepped twice, step 2's loss
// 7.23846 instead of 7.23033, and only get_state_dict after a step threw
// "key 'tok.weight.exp_avg' is already present"); set_optimizer_state_dict
// said "param_groups[0] holds [tok.weight, head.bias] but the optimizer's
// group holds [head.bias, tok.weight, tok.weight]".
TEST(TiedWeight, ListedTwiceInTheOptimizerIsRefusedByNameInFullyShard) {
  run_ranks(2, [](dist::ProcessGroup& pg) {
    auto net = std::make_shared<TiedLMImpl>();
    FullyShard<TiedLMImpl> model(net, FullyShardOptions(Mesh::of(borrow(pg))));
    ASSERT_EQ(net->parameters().size(), 3u);
    optim::AdamW twice(net->parameters(), torch::optim::AdamWOptions(1e-2));
    expect_config_error([&] { check_optimizer(model.ptr(), twice); }, "check_optimizer: " + kTwice);
    expect_config_error([&] { get_optimizer_state_dict(model.ptr(), twice); }, "optim_state_dict: " + kTwice);
    expect_config_error([&] { get_state_dict(model.ptr(), twice); }, "optim_state_dict: " + kTwice);
    expect_config_error([&] { optim_state_dict(model.ptr(), twice); }, "fsdp::unique_parameters(model)");

    // As PyTorch's parameters(): each tensor once, and the state dict's
    // doors take it.
    const auto once = unique_parameters(model.ptr());
    ASSERT_EQ(once.size(), 2u);
    EXPECT_TRUE(once[0].is_same(net->tok->weight));
    EXPECT_TRUE(once[1].is_same(net->head->bias));
    optim::AdamW good(once, torch::optim::AdamWOptions(1e-2));
    EXPECT_NO_THROW(check_optimizer(model.ptr(), good));
    train_step(good, [&](const at::Tensor& t) { return model(t); });
    const OptimStateDict state = get_optimizer_state_dict(model.ptr(), good);
    EXPECT_TRUE(state.state.contains("tok.weight.exp_avg"));
    EXPECT_NO_THROW(set_optimizer_state_dict(model.ptr(), good, state));
    expect_config_error([&] { set_optimizer_state_dict(model.ptr(), twice, state); },
                        "load_optim_state_dict: " + kTwice);
    // Across param groups (torch.optim refuses it too).
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(std::vector<at::Tensor>{net->tok->weight});
    groups.emplace_back(once);
    torch::optim::SGD split(groups, torch::optim::SGDOptions(0.1));
    expect_config_error([&] { check_optimizer(model.ptr(), split); },
                        "lists parameter 'tok.weight' (also named 'head.weight') twice, in param groups 0 (position 0) "
                        "and 1 (position 0)");

    // ModelParallelStrategy (fully_shard through parallelize_fn).
    ModelParallelStrategy strategy(ModelParallelStrategyOptions()
                                       .parallelize_fn([](std::shared_ptr<torch::nn::Module> m, const Mesh& mesh) {
                                         return FullyShard<TiedLMImpl>(std::dynamic_pointer_cast<TiedLMImpl>(m),
                                                                       FullyShardOptions(mesh))
                                             .ptr();
                                       })
                                       .world(borrow(pg)));
    strategy.setup_environment();
    auto sharded = strategy.setup_module(std::make_shared<TiedLMImpl>());
    optim::AdamW mp_twice(sharded->parameters(), torch::optim::AdamWOptions(1e-2));
    expect_config_error([&] { strategy.setup_optimizer(mp_twice); }, "check_optimizer: " + kTwice);
  });
}

// Before: check_optimizer, get_optimizer_state_dict and
// FSDPStrategy::setup_optimizer (which with use_orig_params=true checked
// nothing at all) took the tied weight twice, and the flat parameter in two
// param groups, without a word.
TEST(TiedWeight, ListedTwiceInTheOptimizerIsRefusedByNameInFsdp1) {
  run_ranks(2, [](dist::ProcessGroup& pg) {
    {
      FullyShardedDataParallel<TiedLMImpl> model(std::make_shared<TiedLMImpl>(),
                                                 FSDPOptions().process_group(borrow(pg)).use_orig_params(true));
      optim::AdamW twice(model->parameters(), torch::optim::AdamWOptions(1e-2));
      expect_config_error([&] { check_optimizer(model.ptr(), twice); }, "check_optimizer: " + kTwice);
      expect_config_error([&] { get_optimizer_state_dict(model.ptr(), twice); }, "optim_state_dict: " + kTwice);
      optim::AdamW good(unique_parameters(model.ptr()), torch::optim::AdamWOptions(1e-2));
      EXPECT_NO_THROW(check_optimizer(model.ptr(), good));
      train_step(good, [&](const at::Tensor& t) { return model(t); });
      EXPECT_NO_THROW(get_optimizer_state_dict(model.ptr(), good));
    }
    {
      // Flat parameters: the one flat parameter in two groups.
      FullyShardedDataParallel<TiedLMImpl> model(std::make_shared<TiedLMImpl>(),
                                                 FSDPOptions().process_group(borrow(pg)).use_orig_params(false));
      ASSERT_EQ(model->parameters().size(), 1u);
      std::vector<torch::optim::OptimizerParamGroup> groups;
      groups.emplace_back(model->parameters());
      groups.emplace_back(model->parameters());
      torch::optim::SGD split(groups, torch::optim::SGDOptions(0.1));
      expect_config_error([&] { check_optimizer(model.ptr(), split); },
                          "lists parameter 'flat_param' twice, in param groups 0 (position 0) and 1 (position 0)");
    }
    {
      // FSDPStrategy, either use_orig_params.
      FSDPStrategy strategy(FSDPStrategyOptions().world(borrow(pg)).use_orig_params(true));
      strategy.setup_environment();
      auto model = strategy.setup_module(std::make_shared<TiedLMImpl>());
      optim::AdamW twice(model->parameters(), torch::optim::AdamWOptions(1e-2));
      expect_config_error([&] { strategy.setup_optimizer(twice); }, "setup_optimizer: " + kTwice);
      optim::AdamW good(unique_parameters(model.ptr()), torch::optim::AdamWOptions(1e-2));
      EXPECT_NO_THROW(strategy.setup_optimizer(good));
    }
  });
}

}  // namespace
