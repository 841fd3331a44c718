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
#include <torch/version.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <cstdint>
#include <fstream>
#include <iomanip>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <variant>
#include <vector>

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

// FNV-1a (64 bits) of `text` as 16 hex digits: the configuration digest of
// the text fsdp-train hashes ("vocab 256 context 32 ...").
std::string fnv1a_hex(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : text) {
    h ^= ch;
    h *= 1099511628211ull;
  }
  std::ostringstream hex;
  hex << std::hex << std::setw(16) << std::setfill('0') << h;
  return hex.str();
}

// A tiny Llama's config.json (vocabulary 300, width 32, 2 layers, 4 heads)
// and a file of 2048 uint16 token ids in `dir`, and a one-step run of it
// into dir/run.
train::TrainConfig tiny_llama_run(const std::string& dir) {
  const std::string config = dir + "/config.json", data = dir + "/tokens.bin";
  std::ofstream(config) << R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 300,
    "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "max_position_embeddings": 64, "rms_norm_eps": 1e-6})";
  std::ofstream ids(data, std::ios::binary);
  for (int i = 0; i < 2048; ++i) {
    const int id = i % 300;
    const char le[2] = {static_cast<char>(id & 0xff), static_cast<char>(id >> 8)};
    ids.write(le, 2);
  }
  train::TrainConfig c = tiny_train_config(dir + "/run", 1, 2);
  c.eval_every = 0;
  c.loggers = "none";
  c.model_source = "llama";
  c.model_config = config;
  c.data = data;
  c.data_format = "uint16";
  return c;
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

// A Llama run's digest (the model's source and config.json's sizes, its
// LoRA settings: the places that join only when set), as fsdp-train wrote
// it before the digest's order came from the table.
TEST(RunSettings, ConfigDigestOfALlamaRunIsPinned) {
  if (TORCH_VERSION_MAJOR < 2) GTEST_SKIP() << "the Llama needs LibTorch 2 (scaled_dot_product_attention)";
  TempDir dir;
  train::TrainConfig c = tiny_llama_run(dir.path());
  c.engine = Engine::kFsdp2;
  c.lora.rank = 2;
  c.lora.alpha = 4;
  train_one_rank(c);
  // Its input in the order and form fsdp-train has hashed it since --model
  // came: the first sixteen places always, then those a run sets (the
  // default --lora-targets is left out).
  EXPECT_EQ(digest_of_run(c.out),
            fnv1a_hex("vocab 300 context 32 dim 32 layers 2 heads 4 lr 0.0030000000000000001 min_lr "
                      "0.00030000000000000003 warmup 0 steps 1 batch 2 seed 0 data " + c.data +
                      " precision 32-true sharding FULL_SHARD format sharded mesh  model llama config " + c.model_config +
                      " lora_rank 2 lora_alpha 4"));
  // Its recorded sizes are config.json's, not the preset's.
  const CheckpointInfo info = inspect_checkpoint(c.out + "/checkpoints/step-00000001");
  EXPECT_EQ(info.values.at("config.model.vocab"), "300");
  EXPECT_EQ(info.values.at("config.model.dim"), "32");
  EXPECT_EQ(info.values.at("config.model.context"), "32");
}

// The digest's places are not written by hand: the table's order gives
// them, first the rows always in the digest, then those that join it when
// set; every recorded row of the model's shape and schedule is in it.
TEST(RunSettings, DigestPlacesComeFromTheTablesOrder) {
  std::vector<int> always, when_set;
  for (const auto& row : train::run_settings()) {
    if (!row.digest_label) {
      EXPECT_EQ(row.digest_place, 0) << row.name;
      continue;
    }
    EXPECT_NE(row.record, nullptr) << row.name << " is in the digest but not recorded";
    (row.digest_when_set ? when_set : always).push_back(row.digest_place);
  }
  std::vector<int> places = always;
  places.insert(places.end(), when_set.begin(), when_set.end());
  ASSERT_EQ(places.size(), 21u);
  for (size_t i = 0; i < places.size(); ++i) EXPECT_EQ(places[i], static_cast<int>(i + 1));
  EXPECT_EQ(always.size(), 16u);  // the model's shape, the schedule, batch, seed, data, precision, sharding, format, mesh
}

// The model a run trains is one of a GPT spec and a Llama spec: a Llama's
// holds its config.json's sizes and no GPT's, and the GPT flags given with
// it change nothing the run builds, prints or records (they are not
// refused: the preset sets them all the same). The config is not changed.
TEST(RunSettings, ALlamaRunsSpecHoldsItsConfigJsonAndNoGptSizes) {
  TempDir dir;
  train::TrainConfig c = tiny_llama_run(dir.path());
  train::find_setting("model.dim")->set(c, "48");
  train::find_setting("model.layers")->set(c, "3");
  const train::TrainConfig before = c;
  const train::ModelSpec spec = train::model_spec(c);
  ASSERT_TRUE(std::holds_alternative<train::LlamaSpec>(spec));
  const auto& llama = std::get<train::LlamaSpec>(spec);
  EXPECT_EQ(llama.hf_directory, "");
  EXPECT_EQ(llama.config.vocab_size, 300);
  EXPECT_EQ(llama.config.hidden_size, 32);
  EXPECT_EQ(llama.config.num_hidden_layers, 2);
  EXPECT_EQ(c.model.dim, 48);  // the flags' value, as it was
  EXPECT_EQ(train::config_json(c), train::config_json(before));
  EXPECT_NO_THROW(train::validate_settings(c));
  const Json printed = Json::parse(train::config_json(c));
  EXPECT_EQ(printed.at("model").at("vocab"), 300);
  EXPECT_EQ(printed.at("model").at("dim"), 32);
  EXPECT_EQ(printed.at("model").at("layers"), 2);
  EXPECT_EQ(printed.at("model").at("heads"), 4);
  EXPECT_EQ(printed.at("model").at("context"), 32);  // the run's sequence length: --context's
  // A GPT run's spec: the flags' sizes.
  train::TrainConfig g = tiny_train_config(dir.path() + "/gpt", 1, 2);
  g.model.dim = 48;
  const train::ModelSpec gpt = train::model_spec(g);
  ASSERT_TRUE(std::holds_alternative<train::GptSpec>(gpt));
  EXPECT_EQ(std::get<train::GptSpec>(gpt).config.dim, 48);
}

// train() reads a Llama's config.json once: what a run records at each
// save (its settings' sizes) is the model it built, even when the file is
// edited or removed during the run.
TEST(RunSettings, ALlamaRunRecordsTheConfigJsonItReadAtItsStart) {
  TempDir dir;
  train::TrainConfig c = tiny_llama_run(dir.path());
  const train::ModelSpec spec = train::model_spec(c);
  c.llama_as_read = std::make_shared<const models::LlamaConfig>(std::get<train::LlamaSpec>(spec).config);
  const std::string recorded = train::config_json(c);
  std::ofstream(c.model_config) << R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 500,
    "hidden_size": 64, "intermediate_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4,
    "num_key_value_heads": 2, "max_position_embeddings": 64, "rms_norm_eps": 1e-6})";
  EXPECT_EQ(train::config_json(c), recorded);
  EXPECT_EQ(train::model_sizes(c).dim, 32);
  std::remove(c.model_config.c_str());
  EXPECT_EQ(train::config_json(c), recorded);
  EXPECT_EQ(train::llama_config(c).vocab_size, 300);
  // Without the snapshot, the file is what counts (and its absence is named).
  c.llama_as_read = nullptr;
  EXPECT_NE(config_error([&] { train::model_sizes(c); }).find(c.model_config), std::string::npos);
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
