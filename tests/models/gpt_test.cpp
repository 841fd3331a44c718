// The GPT model of the benchmark and trainer: shapes, causality, and FSDP
// training parity with the unwrapped model.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../support/models.h"
#include "../support/thread_ranks.h"
#include "fsdp/error.h"
#include "fsdp/models/gpt.h"

using fsdp::models::GPTConfig;
using fsdp::models::GPTImpl;

namespace {

GPTConfig tiny() {
  GPTConfig c;
  c.vocab_size = 31;
  c.context = 9;
  c.dim = 12;
  c.layers = 2;
  c.heads = 3;
  return c;
}

std::shared_ptr<GPTImpl> make_gpt(uint64_t seed) {
  std::lock_guard<std::mutex> lock(fsdp::testing::rng_mutex());
  torch::manual_seed(seed);
  return std::make_shared<GPTImpl>(tiny());
}

TEST(GPT, ShapesAndCausality) {
  auto gpt = make_gpt(1);
  auto x = torch::randint(0, 31, {2, 9});
  auto logits = gpt->forward(x);
  EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{2, 9, 31}));
  // Changing the last token changes no earlier position's logits.
  auto y = x.clone();
  y.index_put_({torch::indexing::Slice(), 8}, (x.index({torch::indexing::Slice(), 8}) + 1) % 31);
  auto logits2 = gpt->forward(y);
  EXPECT_TRUE(torch::allclose(logits.narrow(1, 0, 8), logits2.narrow(1, 0, 8)));
  EXPECT_FALSE(torch::allclose(logits.narrow(1, 8, 1), logits2.narrow(1, 8, 1)));
  EXPECT_THROW(gpt->forward(torch::zeros({1, 10}, torch::kLong)), fsdp::ConfigError);
  GPTConfig bad = tiny();
  bad.heads = 5;
  EXPECT_THROW(GPTImpl{bad}, fsdp::ConfigError);
}

// gpt_state_shapes (what a checkpoint's configuration is checked against)
// lists exactly the model's state dict: the same keys, order and shapes.
TEST(GPT, StateShapesAreTheModelsStateDict) {
  for (int64_t layers : {0, 1, 3}) {
    GPTConfig c = tiny();
    c.layers = layers;
    GPTImpl model(c);
    std::vector<std::pair<std::string, std::vector<int64_t>>> got;
    for (const auto& p : model.named_parameters()) got.emplace_back(p.key(), p.value().sizes().vec());
    for (const auto& b : model.named_buffers()) got.emplace_back(b.key(), b.value().sizes().vec());
    EXPECT_EQ(fsdp::models::gpt_state_shapes(c), got) << "layers " << layers;
  }
}

TEST(GPT, FullShardTrainingMatchesUnwrapped) {
  torch::Tensor data;
  {
    std::lock_guard<std::mutex> lock(fsdp::testing::rng_mutex());
    torch::manual_seed(3);
    data = torch::randint(0, 31, {3, 4, 10});  // 3 steps of 4 samples
  }
  std::map<std::string, torch::Tensor> reference;
  {
    auto gpt = make_gpt(2);
    torch::optim::AdamW opt(gpt->parameters(), torch::optim::AdamWOptions(1e-2));
    for (int s = 0; s < 3; ++s) {
      opt.zero_grad();
      auto d = data[s];
      fsdp::models::gpt_loss(gpt->forward(d.narrow(1, 0, 9)), d.narrow(1, 1, 9)).backward();
      opt.step();
    }
    reference = fsdp::testing::named_params(*gpt);
  }
  fsdp::testing::run_ranks(2, [&](fsdp::dist::ProcessGroup& pg) {
    fsdp::FSDPOptions o;
    o.process_group(fsdp::testing::borrow(pg));
    o.auto_wrap_policy(fsdp::transformer_auto_wrap_policy<fsdp::models::GPTBlockImpl>());
    fsdp::FullyShardedDataParallel<GPTImpl> model(make_gpt(2), o);
    EXPECT_EQ(fsdp::fsdp_modules(model.ptr()).size(), 3u);  // root + 2 blocks
    torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-2));
    for (int s = 0; s < 3; ++s) {
      opt.zero_grad();
      auto d = data[s].narrow(0, pg.rank() * 2, 2);
      fsdp::models::gpt_loss(model(d.narrow(1, 0, 9)), d.narrow(1, 1, 9)).backward();
      opt.step();
    }
    auto got = fsdp::testing::to_map(fsdp::full_parameters(model.ptr()));
    ASSERT_EQ(got.size(), reference.size());
    for (auto& [name, w] : reference) EXPECT_LE((got.at(name) - w).abs().max().item<double>(), 1e-5) << name;
  });
}

}  // namespace
