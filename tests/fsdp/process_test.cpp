// Tests that need each rank to be a process of its own (run under fsdp-run by
// CTest), where every rank must draw from its own random generator: dropout
// at world 2, and empty_init's materialisation at setup.
#include <gtest/gtest.h>

#include <cstdlib>

#include "fsdp/dist/process_group.h"
#include "fsdp/models/gpt.h"
#include "fsdp/strategy.h"
#include "transformer_model.h"

namespace {

fsdp::dist::ProcessGroupPtr world() {
  static fsdp::dist::ProcessGroupPtr pg = fsdp::dist::init_process_group_from_env();
  return pg;
}

TEST(ActivationCheckpointingProcesses, DropoutAtWorldTwoGivesTheSameTraining) {
  if (std::getenv("RANK") == nullptr) GTEST_SKIP() << "run under fsdp-run";
  auto pg = world();
  ASSERT_EQ(pg->size(), 2);
  torch::Tensor data;
  {
    torch::manual_seed(22);
    data = torch::randint(0, fsdp::testing::kVocab, {3, 10, 4});
  }
  // Each rank draws its own dropout masks; the checkpointed run must replay them.
  auto plain = fsdp::testing::train_transformer(pg.get(), 0.1, false, data);
  auto ckpt = fsdp::testing::train_transformer(pg.get(), 0.1, true, data);
  for (auto& [name, t] : plain) EXPECT_TRUE(torch::equal(ckpt.at(name), t)) << name;
  // Dropout really acted: a run without it ends elsewhere.
  auto no_dropout = fsdp::testing::train_transformer(pg.get(), 0.0, false, data);
  double diff = 0;
  for (auto& [name, t] : plain) diff = std::max(diff, (t - no_dropout.at(name)).abs().max().item<double>());
  EXPECT_GT(diff, 1e-4);
}

// Under module_init_context(empty_init=true) each rank draws the values of
// its units at setup: ranks seeded alike draw the same ones, so the shards
// form the model a one-process materialisation of the same seed gives.
TEST(EmptyInitProcesses, RanksMaterialiseTheSameValues) {
  if (std::getenv("RANK") == nullptr) GTEST_SKIP() << "run under fsdp-run";
  auto pg = world();
  fsdp::models::GPTConfig c;
  c.context = 16;
  c.dim = 64;
  c.layers = 4;
  auto build = [&](bool empty_init) {
    torch::manual_seed(8);
    fsdp::EmptyInitGuard guard(empty_init);
    return std::make_shared<fsdp::models::GPTImpl>(c);
  };
  auto reference = build(true);
  fsdp::materialize(reference);
  fsdp::FSDPStrategy s(fsdp::FSDPStrategyOptions().world(pg).seed(8).auto_wrap_module_types<fsdp::models::GPTBlockImpl>());
  s.setup_environment();
  std::shared_ptr<fsdp::models::GPTImpl> net;
  {
    torch::manual_seed(8);
    auto init = s.module_init_context(true);
    net = std::make_shared<fsdp::models::GPTImpl>(c);
  }
  auto model = s.setup_module(net);
  auto want = reference->named_parameters();
  for (const auto& [name, t] : fsdp::full_parameters(model.ptr())) {
    ASSERT_TRUE(want.contains(name)) << name;
    EXPECT_TRUE(torch::equal(t, want[name])) << name;
  }
  // Not a tautology: another seed gives other values.
  auto other = build(false);
  EXPECT_FALSE(torch::equal(other->named_parameters()["blocks.0.fc.weight"], want["blocks.0.fc.weight"]));
}

}  // namespace
