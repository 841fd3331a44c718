// fsdp-train's run settings' table (fsdp/train/run_settings.h) is the one
// source of every place a setting shows: each row is in --help,
// --print-config, a checkpoint's record, the hyperparameters and the loss
// curve's title as the row says; a setting that may not change on resume
// is refused when changed; and the configuration digest of a fixed
// configuration is the one the code before the table gave (a run directory
// written then resumes with the same identity).
//
// The runs are in-process (train() on one thread rank) with the tiny
// preset and 1 or 2 steps, plus fsdp-train --help and --print-config.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "../support/errors.h"
#include "../support/models.h"
#include "../support/subprocess.h"
#include "../support/thread_ranks.h"
#include "../support/train_config.h"
#include "fsdp/checkpoint/checkpoint_io.h"
#include "fsdp/error.h"
#include "fsdp/train/gpt_trainer.h"
#include "fsdp/train/run_settings.h"

using namespace fsdp;
using namespace fsdp::testing;
using Json = nlohmann::json;

namespace {

void train_one_rank(const train::TrainConfig& c) {
  run_ranks(1, [&](dist::ProcessGroup& pg) { train::train(c, borrow(pg)); });
}

std::string digest_of_run(const std::string& out) {
  std::ifstream in(out + "/run.json");
  return Json::parse(in).at("config_digest").get<std::string>();
}

}  // namespace

// The digests below were written into run.json by fsdp-train before the
// settings became a table (the same flags on the command line); they must
// never change: a resume compares nothing by them, but they name what a
// run is in run.json and in every checkpoint of existing run directories.
TEST(RunSettings, ConfigDigestOfAFixedConfigIsPinned) {
  TempDir a;
  train::TrainConfig c = tiny_train_config(a.path(), 1, 2);
  c.eval_every = 0;
  c.loggers = "none";
  train_one_rank(c);
  EXPECT_EQ(digest_of_run(a.path()), "eb3ad437e4aa2e7f");

  // Every setting the digest covers away from its default.
  TempDir b;
  train::TrainConfig d = tiny_train_config(b.path(), 2, 2);
  d.eval_every = 0;
  d.loggers = "none";
  d.model.dim = 32;
  d.lr = 0.01;
  d.min_lr = 0.0005;
  d.warmup_steps = 1;
  d.strategy.seed(7).precision("bf16-mixed");
  d.strategy.state_dict_type(CheckpointFormat::kFull);
  d.strategy.sharding_strategy(ShardingStrategy::kHybridShard).device_mesh(1, 1);
  train_one_rank(d);
  EXPECT_EQ(digest_of_run(b.path()), "24f18bcaf9094e12");
}

// Each row shows where it says it does, by its name or flag.
TEST(RunSettings, EveryRowShowsInEachOutputItFeeds) {
  const auto help = run_program({FSDP_TRAIN_PATH, "--help"}, std::chrono::seconds(60));
  ASSERT_EQ(help.exit_code(), 0) << help.output;
  const train::TrainConfig defaults;
  const Json printed = Json::parse(train::config_json(defaults));
  const auto print_config = run_program({FSDP_TRAIN_PATH, "--print-config"}, std::chrono::seconds(60));
  ASSERT_EQ(print_config.exit_code(), 0) << print_config.output;
  EXPECT_EQ(Json::parse(print_config.output.substr(print_config.output.find('{'))), printed);
  const Hyperparameters hparams = train::hyperparameters(defaults, 2);
  const std::string title = train::loss_curve_title(defaults, 2);
  int rows = 0;
  for (const auto& row : train::run_settings()) {
    ++rows;
    const std::string name = row.name, flag = row.flag;
    if (!flag.empty()) {
      EXPECT_NE(help.output.find(flag), std::string::npos) << flag << " is not in --help";
      EXPECT_NE(help.output.find(row.help), std::string::npos) << flag << "'s help is not in --help";
      if (row.off_flag) EXPECT_NE(help.output.find(row.off_flag), std::string::npos) << row.off_flag;
    }
    Json::json_pointer at("/" + name.substr(0, name.find('.')) +
                          (name.find('.') == std::string::npos ? "" : "/" + name.substr(name.find('.') + 1)));
    ASSERT_TRUE(printed.contains(at)) << name << " is not in --print-config";
    EXPECT_EQ(hparams.count(train::short_name(row)), row.hyperparameter ? 1u : 0u) << name;
    if (row.in_title) {
      EXPECT_NE(title.find(flag + " " + train::setting_text(row.get(defaults))), std::string::npos)
          << name << " is not in the title: " << title;
    }
    EXPECT_EQ(train::find_setting(name), &row);
  }
  EXPECT_EQ(hparams.count("world"), 1u);
  EXPECT_GT(rows, 30);
  // A row's flag sets what the row prints: --lr 0.02 reaches lr, and only it.
  const auto changed = run_program({FSDP_TRAIN_PATH, "--print-config", "--lr", "0.02", "--no-forward-prefetch"},
                                   std::chrono::seconds(60));
  ASSERT_EQ(changed.exit_code(), 0) << changed.output;
  Json expected = printed;
  expected["lr"] = 0.02;
  expected["min_lr"] = 0.002;
  expected["strategy"]["forward_prefetch"] = false;
  const Json got = Json::parse(changed.output.substr(changed.output.find('{')));
  EXPECT_NEAR(got["min_lr"].get<double>(), 0.002, 1e-12);
  expected["min_lr"] = got["min_lr"];
  EXPECT_EQ(got, expected);
  // A bad value is an error naming the row's flag.
  const auto bad = run_program({FSDP_TRAIN_PATH, "--print-config", "--steps", "ten"}, std::chrono::seconds(60));
  EXPECT_NE(bad.exit_code(), 0);
  EXPECT_NE(bad.output.find("--steps 'ten'"), std::string::npos) << bad.output;
}

// A row checks its own value and names its flag; a rule between settings
// is one of cross_setting_rules, each named once; the defaults pass all.
TEST(RunSettings, RowsCheckTheirOwnRangeAndRulesBetweenSettingsAreNamed) {
  const train::TrainConfig defaults;
  for (const auto& row : train::run_settings()) {
    if (row.check) EXPECT_NO_THROW(row.check(defaults)) << row.name;
  }
  train::TrainConfig c;
  c.batch = 0;
  expect_config_error([&] { train::find_setting("batch")->check(c); }, "--batch must be positive, got 0");
  c = train::TrainConfig();
  c.save_every = -2;
  expect_config_error([&] { train::find_setting("save_every")->check(c); },
                      "--save-every must be 0 (only at the end) or positive, got -2");
  std::set<std::string> names;
  for (const auto& rule : train::cross_setting_rules()) {
    EXPECT_TRUE(names.insert(rule.name).second) << rule.name;
    EXPECT_NO_THROW(rule.check(defaults)) << rule.name;
  }
  ASSERT_TRUE(names.count("--min-lr at most --lr"));
  c = train::TrainConfig();
  c.min_lr = 1;  // each alone in range; together not
  EXPECT_NO_THROW(train::find_setting("min_lr")->check(c));
  expect_config_error([&] { train::validate_settings(c); }, "--min-lr must be at most --lr");
}

// A checkpoint records each recorded row under "config.<record>"; on
// --resume each row that may not change (the model's shape) is refused
// when changed, naming it, and each that may is applied and named.
TEST(RunSettings, CheckpointRecordsRowsAndResumeRefusesFixedOnes) {
  TempDir dir;
  train::TrainConfig c = tiny_train_config(dir.path(), 1, 2);
  c.eval_every = 0;
  c.loggers = "none";
  train_one_rank(c);
  const CheckpointInfo info = inspect_checkpoint(dir.path() + "/checkpoints/step-00000001");
  int fixed = 0, llama_only = 0;
  for (const auto& row : train::run_settings()) {
    if (!row.record) continue;
    ASSERT_TRUE(info.values.count(std::string("config.") + row.record)) << row.record << " is not recorded";
    if (row.may_change_on_resume || !row.set) continue;
    // Twice the value: a shape the model can take (heads still divide dim).
    train::TrainConfig r = tiny_train_config(dir.path(), 2, 2);
    r.eval_every = 0;
    r.loggers = "none";
    r.resume = true;
    // The model's source and a Llama's LoRA settings: a GPT run cannot
    // take them (tests/train/hf_finetune_test.cpp resumes a LoRA run).
    if (std::string(row.name) == "model.source" || train::short_name(row).rfind("lora_", 0) == 0) {
      ++llama_only;
      continue;
    }
    ++fixed;
    const int64_t now = std::get<int64_t>(row.get(r));
    row.set(r, std::to_string(now * 2));
    run_ranks(1, [&](dist::ProcessGroup& pg) {
      expect_config_error([&] { train::train(r, borrow(pg)); },
                          " " + train::short_name(row) + " " + std::to_string(now) + " (checkpoint) vs " +
                              std::to_string(now * 2) + ";");
    });
  }
  EXPECT_EQ(fixed, 5);       // vocab, context, dim, layers, heads
  EXPECT_EQ(llama_only, 4);  // source, lora_rank, lora_alpha, lora_targets
}
