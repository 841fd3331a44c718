// The public headers that moved into module folders (issue 31) keep their
// old paths for one release as forwarding headers: code written against the
// old paths still compiles and finds what they declared. (Each prints its
// deprecation note while this file compiles.)
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>

#include <string>
#include <type_traits>

#include "fsdp/checkpoint.h"
#include "fsdp/checkpoint_io.h"
#include "fsdp/dist/env.h"
#include "fsdp/dist/process_group.h"
#include "fsdp/dist/rank_errors.h"
#include "fsdp/loggers.h"
#include "fsdp/optim_state_dict.h"
#include "fsdp/profiler.h"
#include "fsdp/sharded_tensor.h"
#include "fsdp/state_dict.h"
#include "fsdp/state_dict_options.h"
#include "fsdp/strategy.h"
#include "fsdp/unit_list.h"

TEST(ForwardingHeaders, TheOldPathsStillDeclareWhatTheyDeclared) {
  // fsdp/checkpoint.h (activation checkpointing) and fsdp/unit_list.h gave fsdp.h's API too.
  EXPECT_STREQ(fsdp::to_string(fsdp::FSDPOptions().sharding_strategy()), "FULL_SHARD");
  EXPECT_TRUE(static_cast<bool>(fsdp::checkpoint_module_types<torch::nn::LinearImpl>()));
  EXPECT_TRUE((std::is_class_v<fsdp::UnitList<torch::nn::LinearImpl>>));
  // fsdp/checkpoint_io.h, fsdp/state_dict*.h, fsdp/sharded_tensor.h, fsdp/optim_state_dict.h.
  EXPECT_EQ(fsdp::parse_checkpoint_format("full"), fsdp::CheckpointFormat::kFull);
  EXPECT_STREQ(fsdp::to_string(fsdp::StateDictType::kSharded), "SHARDED_STATE_DICT");
  EXPECT_TRUE((std::is_class_v<fsdp::ShardedTensor>));
  EXPECT_TRUE((std::is_class_v<fsdp::OptimParamGroup>));
  // fsdp/strategy.h gave the strategy, the scaler and the registry.
  EXPECT_EQ(fsdp::FSDPStrategyOptions().precision(), "32-true");
  EXPECT_TRUE((std::is_class_v<fsdp::ShardedGradScaler>));
  EXPECT_FALSE(fsdp::StrategyRegistry::instance().names().empty());
  // fsdp/loggers.h, fsdp/profiler.h, fsdp/dist/env.h.
  EXPECT_EQ(fsdp::format_number(0.5), "0.5");
  EXPECT_EQ(fsdp::parse_step_range("2:3", "--profile-steps").last, 3);
  EXPECT_TRUE((std::is_class_v<fsdp::dist::DistEnv>));
  // fsdp/dist/process_group.h and rank_errors.h: the folder is distributed/ now.
  EXPECT_TRUE((std::is_class_v<fsdp::dist::ProcessGroup>));
  EXPECT_TRUE(fsdp::dist::outcome_failed(fsdp::dist::outcome("", "a failure")));
}
