// LoRA as an adapter pass (fsdp/peft/lora.h) on a model that is not a
// Llama: the GPT. inject_lora finds its linear layers by PEFT's rule, the
// adapted model starts as the base model, only the adapters train under
// fully_shard, and the adapters go out as PEFT's files and back in
// (fsdp/hf/peft.h).
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "fsdp/error.h"
#include "fsdp/fsdp2/fully_shard.h"
#include "fsdp/hf/peft.h"
#include "fsdp/models/gpt.h"
#include "fsdp/optim/adamw.h"
#include "fsdp/peft/lora.h"
#include "../support/errors.h"
#include "../support/models.h"
#include "../support/subprocess.h"
#include "../support/thread_ranks.h"

namespace fsdp::testing {
namespace {

using models::GPTConfig;
using models::GPTImpl;

GPTConfig tiny() {
  GPTConfig c;
  c.vocab_size = 32;
  c.context = 8;
  c.dim = 16;
  c.layers = 2;
  c.heads = 2;
  return c;
}

// A GPT from `seed`, adapted with `lora` when its rank is not 0. Ranks are
// threads sharing LibTorch's generator: built under rng_mutex().
// `deferred`: its blocks built under fsdp::EmptyInitGuard (as fsdp-train's
// default), their values drawn again when they are materialised.
std::shared_ptr<GPTImpl> gpt(uint64_t seed, const peft::LoraConfig& lora = {}, bool deferred = false) {
  std::lock_guard<std::mutex> lock(rng_mutex());
  torch::manual_seed(seed);
  fsdp::EmptyInitGuard guard(deferred);
  auto net = std::make_shared<GPTImpl>(tiny());
  if (lora.rank > 0) peft::inject_lora(*net, lora);
  return net;
}

at::Tensor some_tokens() { return at::arange(0, 14, at::kLong).remainder(32).reshape({2, 7}); }

TEST(Lora, TargetsMatchAsPeftMatchesThem) {
  EXPECT_TRUE(peft::matches_target("q_proj", "q_proj"));
  EXPECT_TRUE(peft::matches_target("model.layers.0.self_attn.q_proj", "q_proj"));
  EXPECT_TRUE(peft::matches_target("blocks.1.proj", "1.proj"));
  EXPECT_FALSE(peft::matches_target("blocks.1.fc_proj", "proj"));
  EXPECT_FALSE(peft::matches_target("blocks.1.proj", "blocks"));
  EXPECT_EQ(peft::parse_lora_targets("qkv,fc"), (std::vector<std::string>{"qkv", "fc"}));
  EXPECT_EQ(peft::lora_targets_text({"qkv", "fc"}), "qkv,fc");
}

// The GPT's linear layers take adapters; everything else freezes; with B
// zero the adapted model computes what the base does, bit for bit.
TEST(Lora, InjectsIntoTheGptsLinearLayersAndStartsAsTheBase) {
  auto base = gpt(3), net = gpt(3);
  const auto names = peft::inject_lora(*net, {/*rank=*/2, /*alpha=*/4, {"qkv", "proj"}});
  EXPECT_EQ(names, (std::vector<std::string>{"blocks.0.qkv", "blocks.0.proj", "blocks.1.qkv", "blocks.1.proj"}));
  int64_t trained = 0;
  for (const auto& p : net->named_parameters()) {
    EXPECT_EQ(p.value().requires_grad(), peft::is_lora_key(p.key())) << p.key();
    trained += p.value().requires_grad();
  }
  EXPECT_EQ(trained, 2 * 4);
  const auto params = net->named_parameters();
  EXPECT_EQ(params["blocks.0.qkv.lora_A.weight"].sizes().vec(), (std::vector<int64_t>{2, 16}));
  EXPECT_EQ(params["blocks.0.qkv.lora_B.weight"].sizes().vec(), (std::vector<int64_t>{48, 2}));
  EXPECT_TRUE(params["blocks.0.qkv.lora_B.weight"].eq(0).all().item<bool>());
  EXPECT_FALSE(params["blocks.0.qkv.lora_A.weight"].eq(0).all().item<bool>());
  for (const auto& p : base->named_parameters()) EXPECT_TRUE(p.value().equal(params[p.key()])) << p.key();
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(net->forward(some_tokens()).equal(base->forward(some_tokens())));
}

// A model whose blocks wait for FSDP takes its adapters before it is
// materialised, and ends with an eager build's values, adapters included.
TEST(Lora, AModelBuiltDeferredIsAdaptedAsAnEagerOne) {
  const peft::LoraConfig lora{/*rank=*/2, /*alpha=*/4, {"fc", "proj"}};
  auto eager = gpt(7, lora), deferred = gpt(7, lora, /*deferred=*/true);
  fsdp::materialize(deferred);
  const auto want = eager->named_parameters();
  ASSERT_EQ(deferred->named_parameters().size(), want.size());
  for (const auto& p : deferred->named_parameters()) {
    EXPECT_TRUE(p.value().equal(want[p.key()])) << p.key();
    EXPECT_EQ(p.value().requires_grad(), want[p.key()].requires_grad()) << p.key();
  }
}

TEST(Lora, RefusesWhatItCannotAdaptByName) {
  // LibTorch's own Linear: named, with the type to build it as instead.
  struct Plain : torch::nn::Module {
    Plain() { register_module("q", torch::nn::Linear(4, 4)); }
  };
  Plain plain;
  expect_config_error([&] { peft::inject_lora(plain, {2, 4, {"q"}}); }, "build it as fsdp::peft::Linear");
  auto net = gpt(1);
  expect_config_error([&] { peft::inject_lora(*net, {2, 4, {"q_proj"}}); }, "no module of the model matches");
  expect_config_error([&] { peft::inject_lora(*net, {2, 4, {"ln1"}}); }, "not a linear module");
  expect_config_error([&] { peft::inject_lora(*net, {0, 4, {"fc"}}); }, "rank 0");
  peft::inject_lora(*net, {2, 4, {"fc"}});
  expect_config_error([&] { peft::inject_lora(*net, {2, 4, {"fc"}}); }, "has LoRA adapters already");
}

// At world 2 under fully_shard: the adapted GPT's first logits are the
// base's, two AdamW steps move only the adapters (the base gets no
// gradient), and PEFT's files of the adapters load into a fresh adapted GPT
// that then computes the trained model's logits.
TEST(Lora, TheGptTrainsOnlyItsAdaptersUnderFullyShardAndTheyLoadBack) {
  TempDir dir;
  const std::string adapter = dir.path() + "/adapter";
  const peft::LoraConfig lora{/*rank=*/2, /*alpha=*/8, {"qkv", "fc_proj"}};
  run_ranks(2, [&](dist::ProcessGroup& pg) {
    auto base = gpt(5);
    fsdp::Unit<GPTImpl> model(gpt(5, lora));
    fully_shard_tree(model.ptr(), FullyShardOptions(Mesh::of(borrow(pg))),
                     transformer_auto_wrap_policy<models::GPTBlockImpl>());
    // Each rank's shards, before a forward leaves the root's parameters gathered.
    std::map<std::string, at::Tensor> before;
    std::vector<at::Tensor> trained;
    for (const auto& p : model->named_parameters()) {
      before[p.key()] = p.value().detach().clone();
      if (p.value().requires_grad()) trained.push_back(p.value());
    }
    const at::Tensor tokens = some_tokens();
    {
      torch::NoGradGuard no_grad;
      EXPECT_TRUE(model(tokens).equal(base->forward(tokens)));
    }
    optim::AdamW opt(trained, torch::optim::AdamWOptions(1e-2));
    for (int step = 0; step < 2; ++step) {
      opt.zero_grad();
      auto logits = model(tokens);
      models::gpt_loss(logits.slice(1, 0, -1), tokens.slice(1, 1)).backward();
      for (const auto& p : model->named_parameters()) {
        if (!peft::is_lora_key(p.key())) EXPECT_FALSE(p.value().grad().defined()) << p.key();
      }
      opt.step();
    }
    for (const auto& p : model->named_parameters()) {
      const bool moved = !p.value().detach().equal(before.at(p.key()));
      if (!peft::is_lora_key(p.key())) EXPECT_FALSE(moved) << p.key();
      if (p.key().find(".lora_B.") != std::string::npos && p.value().numel() > 0) EXPECT_TRUE(moved) << p.key();
    }
    hf::save_peft_adapter(model.ptr(), lora, adapter, "gpt-tiny", pg);
    torch::NoGradGuard no_grad;
    const at::Tensor trained_logits = model(tokens);
    // Each rank alone: a fresh adapted GPT with the saved adapters.
    const peft::LoraConfig read = hf::read_peft_config(adapter);
    EXPECT_EQ(read.rank, 2);
    EXPECT_EQ(read.alpha, 8);
    EXPECT_EQ(read.targets, lora.targets);
    auto fresh = gpt(5, read);  // the same base; the adapters come from the file
    hf::load_peft_adapter(fresh, adapter);
    EXPECT_TRUE(torch::allclose(fresh->forward(tokens), trained_logits, 1e-5, 1e-6));
  });
  // A model adapted otherwise is refused by name, before anything is written.
  auto other = gpt(5, {2, 8, {"qkv"}});
  expect_config_error([&] { hf::load_peft_adapter(other, adapter); }, "is no adapter of the model");
}

}  // namespace
}  // namespace fsdp::testing
