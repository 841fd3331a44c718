// Tests that need each rank to be a process of its own (run under fsdp-run by
// CTest): here, dropout at world 2, where every rank must draw from its own
// random generator.
#include <gtest/gtest.h>

#include <cstdlib>

#include "fsdp/dist/process_group.h"
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

}  // namespace
