// One setting, one default (issue 31, item 5): FSDP's settings have their
// defaults in FSDPOptions (fsdp/core/options.h) only. The strategy, fsdp-train
// (TrainConfig holds the strategy's options; its flags start from them) and
// fsdp-bench must show the same ones, except where a difference is chosen and
// said: the strategy's use_orig_params is Lightning's, true.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <string>

#include "../support/subprocess.h"
#include "fsdp/core/options.h"
#include "fsdp/strategy/strategy.h"
#include "fsdp/train/train_config.h"

using namespace fsdp;
using namespace fsdp::testing;
using Json = nlohmann::json;

namespace {

// The last line of `output` that parses as a JSON object.
Json last_json_object(const std::string& output) {
  Json found;
  size_t begin = 0;
  while (begin < output.size()) {
    size_t end = output.find('\n', begin);
    if (end == std::string::npos) end = output.size();
    const std::string line = output.substr(begin, end - begin);
    if (!line.empty() && line.front() == '{') {
      Json j = Json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (j.is_object()) found = j;
    }
    begin = end + 1;
  }
  return found;
}

}  // namespace

TEST(Defaults, TheStrategysFsdpSettingsAreFsdpOptionsExceptLightningsUseOrigParams) {
  const FSDPOptions fsdp;
  const FSDPStrategyOptions strategy;
  EXPECT_EQ(strategy.sharding_strategy(), fsdp.sharding_strategy());
  EXPECT_EQ(strategy.forward_prefetch(), fsdp.forward_prefetch());
  EXPECT_EQ(strategy.backward_prefetch(), fsdp.backward_prefetch());
  EXPECT_EQ(strategy.limit_all_gathers(), fsdp.limit_all_gathers());
  EXPECT_EQ(strategy.sync_module_states(), fsdp.sync_module_states());
  EXPECT_EQ(strategy.cpu_offload().offload_params, fsdp.cpu_offload().offload_params);
  EXPECT_EQ(strategy.fsdp().max_reductions_in_flight(), fsdp.max_reductions_in_flight());
  EXPECT_EQ(strategy.fsdp().hybrid_shard_size(), fsdp.hybrid_shard_size());
  EXPECT_FALSE(strategy.fsdp().mixed_precision().param_dtype.has_value());
  // The one chosen difference: Lightning's FSDPStrategy sets use_orig_params=True.
  EXPECT_FALSE(fsdp.use_orig_params());
  EXPECT_TRUE(strategy.use_orig_params());
}

TEST(Defaults, FsdpTrainsFlagsStartFromTheStrategysDefaults) {
  const FSDPOptions fsdp;
  const FSDPStrategyOptions strategy;
  const auto r = run_program({FSDP_TRAIN_PATH, "--print-config"}, std::chrono::seconds(60));
  ASSERT_EQ(r.exit_code(), 0) << r.output;
  const Json config = last_json_object(r.output);
  ASSERT_TRUE(config.contains("strategy")) << r.output;
  const Json& s = config["strategy"];
  EXPECT_EQ(s["sharding_strategy"], to_string(fsdp.sharding_strategy()));
  EXPECT_EQ(s["forward_prefetch"], fsdp.forward_prefetch());
  EXPECT_EQ(s["backward_prefetch"], to_string(fsdp.backward_prefetch()));
  EXPECT_EQ(s["limit_all_gathers"], fsdp.limit_all_gathers());
  EXPECT_EQ(s["cpu_offload"], fsdp.cpu_offload().offload_params);
  EXPECT_EQ(s["sync_module_states"], fsdp.sync_module_states());
  EXPECT_EQ(s["max_reductions_in_flight"], fsdp.max_reductions_in_flight());
  EXPECT_EQ(s["use_orig_params"], strategy.use_orig_params());
  EXPECT_EQ(s["precision"], strategy.precision());
  EXPECT_EQ(s["state_dict_type"], to_string(strategy.state_dict_type()));
  EXPECT_EQ(s["seed"], strategy.seed());
  EXPECT_EQ(s["activation_checkpointing"], false);
  EXPECT_EQ(s["mesh"], "");
  // What the library's TrainConfig holds is what the command line starts from.
  EXPECT_EQ(config, Json::parse(train::config_json(train::TrainConfig())));
  // A flag changes its setting, and only that one.
  const auto changed = run_program({FSDP_TRAIN_PATH, "--print-config", "--no-forward-prefetch", "--backward-prefetch",
                                    "post", "--mesh", "2,4", "--activation-checkpointing"},
                                   std::chrono::seconds(60));
  ASSERT_EQ(changed.exit_code(), 0) << changed.output;
  const Json c = last_json_object(changed.output)["strategy"];
  EXPECT_EQ(c["forward_prefetch"], false);
  EXPECT_EQ(c["backward_prefetch"], "BACKWARD_POST");
  EXPECT_EQ(c["mesh"], "2,4");
  EXPECT_EQ(c["sharding_strategy"], "HYBRID_SHARD");
  EXPECT_EQ(c["activation_checkpointing"], true);
  EXPECT_EQ(c["limit_all_gathers"], s["limit_all_gathers"]);
  EXPECT_EQ(c["precision"], s["precision"]);
  // Bad values are named by their flag before anything starts.
  const auto bad = run_program({FSDP_TRAIN_PATH, "--print-config", "--mesh", "2x4"}, std::chrono::seconds(60));
  EXPECT_NE(bad.exit_code(), 0);
  EXPECT_NE(bad.output.find("--mesh '2x4' is invalid"), std::string::npos) << bad.output;
  const auto bad_precision = run_program({FSDP_TRAIN_PATH, "--print-config", "--precision", "8-true"},
                                         std::chrono::seconds(60));
  EXPECT_NE(bad_precision.exit_code(), 0);
  EXPECT_NE(bad_precision.output.find("--precision: "), std::string::npos) << bad_precision.output;
}

TEST(Defaults, FsdpBenchRunsWithFsdpOptionsDefaults) {
  const FSDPOptions fsdp;
  const auto r = run_program({FSDP_BENCH_PATH, "--dim", "32", "--layers", "1", "--heads", "2", "--ctx", "8", "--batch",
                              "2", "--steps", "1", "--warmup", "0"},
                             std::chrono::seconds(120));
  ASSERT_EQ(r.exit_code(), 0) << r.output;
  const Json j = last_json_object(r.output);
  ASSERT_TRUE(j.contains("runtime")) << r.output;
  EXPECT_EQ(j["strategy"], to_string(fsdp.sharding_strategy()));
  EXPECT_EQ(j["runtime"]["forward_prefetch"], fsdp.forward_prefetch());
  EXPECT_EQ(j["runtime"]["backward_prefetch"], to_string(fsdp.backward_prefetch()));
  EXPECT_EQ(j["runtime"]["limit_all_gathers"], fsdp.limit_all_gathers());
  EXPECT_EQ(j["runtime"]["use_orig_params"], fsdp.use_orig_params());
  EXPECT_EQ(j["runtime"]["max_reductions_in_flight"], fsdp.max_reductions_in_flight());
}

// fsdp-bench reads --engine through fsdp::Engine's one name table, as
// fsdp-train does: a name that is not an engine is the same error, naming
// the flag, before anything starts.
TEST(Defaults, FsdpBenchAndFsdpTrainRefuseABadEngineAlike) {
  const std::string error = "--engine: 'fsdp3' is not an engine: expected fsdp1 or fsdp2";
  const auto bench = run_program({FSDP_BENCH_PATH, "--engine", "fsdp3"}, std::chrono::seconds(60));
  EXPECT_NE(bench.exit_code(), 0);
  EXPECT_NE(bench.output.find("fsdp-bench: " + error), std::string::npos) << bench.output;
  const auto train = run_program({FSDP_TRAIN_PATH, "--print-config", "--engine", "fsdp3"}, std::chrono::seconds(60));
  EXPECT_NE(train.exit_code(), 0);
  EXPECT_NE(train.output.find(error), std::string::npos) << train.output;
}
