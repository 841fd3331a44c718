// fsdp-train fine-tuning a Hugging Face model, as the README shows it: a
// small random Llama with a Llama 3-style tokenizer, made by transformers
// (tests/python/hf_models.py make-tuneable), its text tokenized by
// `fsdp-train prepare`, trained on 2 processes with --model hf:DIR, fully
// (FSDP1) and with LoRA (fully_shard), and what comes out checked by
// transformers and peft: the exported directory loads with no missing keys
// and holds weights moved a little off the base's; greedy generation from
// the run's checkpoint gives transformers' text; the adapters load in peft
// with fsdp-cpp's merged logits, the base untouched, and the checkpoint
// exported merged gives them in transformers alone. Settings that do not
// fit together are named before anything trains.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "../support/errors.h"
#include "../support/subprocess.h"
#include "../support/thread_ranks.h"
#include "../support/train_config.h"
#include "fsdp/checkpoint/checkpoint_io.h"
#include "fsdp/formats/safetensors.h"
#include "fsdp/hf/hf_model.h"
#include "fsdp/models/llama.h"
#include "fsdp/train/gpt_trainer.h"
#include "fsdp/train/run_settings.h"

namespace fsdp::testing {
namespace {

namespace fs = std::filesystem;

// A TrainConfig of --model `source` whose settings are checked (resolve_model, validate_settings).
void check(train::TrainConfig c) {
  train::resolve_model(c);
  train::validate_settings(c);
}

TEST(HfFineTuneSettings, SettingsThatDoNotFitAreNamedBeforeAnythingIsBuilt) {
  TempDir dir;
  const std::string data = dir.path() + "/tokens.bin";
  std::ofstream(data) << std::string(4096, 'x');
  auto with = [&](const std::vector<std::pair<std::string, std::string>>& flags) {
    train::TrainConfig c = tiny_train_config(dir.path() + "/run", 2, 2);
    for (const auto& [flag, value] : flags) {
      for (const auto& row : train::run_settings()) {
        if (flag == row.flag) row.set(c, value);
      }
    }
    return c;
  };
  EXPECT_NE(config_error([&] { check(with({{"--model", "bert"}})); }).find("--model 'bert': expected gpt"),
            std::string::npos);
  EXPECT_NE(config_error([&] { check(with({{"--model", "llama"}, {"--data", data}})); }).find("needs --config"),
            std::string::npos);
  EXPECT_NE(config_error([&] { check(with({{"--config", data}})); }).find("--config is the config.json of --model llama"),
            std::string::npos);
  EXPECT_NE(config_error([&] { check(with({{"--model", "hf:"}})); }).find("names no directory"), std::string::npos);
  // An hf: directory without config.json: named by its path.
  EXPECT_NE(config_error([&] { check(with({{"--model", "hf:" + dir.path()}, {"--data", data}})); })
                .find(dir.path() + "/config.json"),
            std::string::npos);
  EXPECT_NE(config_error([&] { check(with({{"--lora-rank", "4"}})); }).find("LoRA adapters are for a Llama"),
            std::string::npos);
  EXPECT_NE(config_error([&] { check(with({{"--save-hf", dir.path() + "/out"}})); }).find("of a Llama-family model"),
            std::string::npos);
  EXPECT_NE(config_error([&] { check(with({{"--save-hf", dir.path()}})); }).find("already exists"), std::string::npos);
  // Written by transformers' rules, a config.json for the checks that need one.
  const std::string config = dir.path() + "/config.json";
  std::ofstream(config) << R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 300,
    "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "max_position_embeddings": 64, "rms_norm_eps": 1e-6})";
  EXPECT_NE(config_error([&] { check(with({{"--model", "llama"}, {"--config", config}})); }).find("without --data"),
            std::string::npos);
  const auto llama = [&](std::vector<std::pair<std::string, std::string>> more) {
    more.insert(more.begin(), {{"--model", "llama"}, {"--config", config}, {"--data", data}});
    return with(more);
  };
  EXPECT_NE(config_error([&] { check(llama({{"--lora-rank", "4"}})); }).find("expected --engine fsdp2"),
            std::string::npos);
  EXPECT_NE(config_error([&] { check(llama({{"--lora-rank", "4"}, {"--engine", "fsdp2"}, {"--lora-targets", "qkv"}})); })
                .find("qkv"),
            std::string::npos);
  // The model's sizes are its config.json's, and --print-config says so.
  train::TrainConfig c = llama({{"--lora-rank", "4"}, {"--engine", "fsdp2"}});
  train::resolve_model(c);
  EXPECT_EQ(c.model.vocab_size, 300);
  EXPECT_EQ(c.model.dim, 32);
  const auto printed = nlohmann::json::parse(train::config_json(c));
  EXPECT_EQ(printed.at("model").at("source"), "llama");
  EXPECT_EQ(printed.at("model").at("vocab"), 300);
  EXPECT_EQ(printed.at("model").at("lora_rank"), 4);
  EXPECT_EQ(printed.at("model").at("lora_targets"), "q_proj,v_proj");
}

#ifdef FSDP_TEST_TRANSFORMERS
// The base model, its tokenized text, made once for the suite.
class HfFineTune : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    auto r = run_program({FSDP_TEST_PYTHON, FSDP_TEST_SOURCE_DIR "/python/hf_models.py", "make-tuneable", dir_->path()},
                         std::chrono::seconds(240));
    output_ = r.output;
    if (r.exit_code() != 0) return;
    r = run_program({FSDP_TRAIN_PATH, "prepare", "--tokenizer", base(), "--out", tokens(), dir_->path() + "/corpus.txt"},
                    std::chrono::seconds(60));
    output_ += r.output;
    made_ = r.exit_code() == 0;
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override { ASSERT_TRUE(made_) << output_; }

  static std::string base() { return dir_->path() + "/base"; }
  static std::string tokens() { return dir_->path() + "/tokens.bin"; }
  static std::string path(const std::string& name) { return dir_->path() + "/" + name; }

  // fsdp-train on 2 processes, on the base model and its tokens, with `flags`.
  static RunResult train_on_two(const std::string& out, const std::vector<std::string>& flags) {
    std::vector<std::string> argv{FSDP_RUN_PATH, "--nproc-per-node", "2", "--", FSDP_TRAIN_PATH,
                                  "--model", "hf:" + base(), "--data", tokens(), "--context", "16", "--batch", "2",
                                  "--warmup-steps", "0", "--eval-every", "0", "--logger", "jsonl", "--out", out};
    argv.insert(argv.end(), flags.begin(), flags.end());
    return run_program(argv, std::chrono::seconds(240));
  }

  static std::vector<double> losses(const std::string& out) {
    std::vector<double> l;
    std::ifstream in(out + "/metrics.jsonl");
    for (std::string line; std::getline(in, line);) l.push_back(nlohmann::json::parse(line).at("loss").get<double>());
    return l;
  }

  // The text between the lines "<<<" and ">>>" of `output`.
  static std::string between_markers(const std::string& output) {
    const auto from = output.find("<<<\n"), to = output.rfind("\n>>>");
    if (from == std::string::npos || to == std::string::npos || to < from + 4) return "(no text in: " + output + ")";
    return output.substr(from + 4, to - from - 4);
  }

  static TempDir* dir_;
  static bool made_;
  static std::string output_;
};
TempDir* HfFineTune::dir_ = nullptr;
bool HfFineTune::made_ = false;
std::string HfFineTune::output_;

TEST_F(HfFineTune, FullFineTuningExportsWhatTransformersLoadsAndGeneratesTheSameText) {
  const std::string out = path("full"), tuned = path("tuned");
  auto r = train_on_two(out, {"--steps", "8", "--lr", "3e-3", "--save-hf", tuned});
  ASSERT_EQ(r.exit_code(), 0) << r.output;
  EXPECT_NE(r.output.find("fsdp-train: loaded " + base()), std::string::npos) << r.output;
  const auto l = losses(out);
  ASSERT_EQ(l.size(), 8u);
  EXPECT_LT(l.back(), l.front());
  // The export loads in transformers, no key missing or unexpected, its
  // weights near the base's: fine-tuned from them (a model trained from
  // its own initialisation would differ by about 1).
  r = run_program({FSDP_TEST_PYTHON, FSDP_TEST_SOURCE_DIR "/python/hf_models.py", "check-tuned", base(), tuned, "0.1"},
                  std::chrono::seconds(240));
  EXPECT_EQ(r.exit_code(), 0) << r.output;
  for (const char* file : {"tokenizer.json", "tokenizer_config.json", "generation_config.json", "config.json"}) {
    EXPECT_TRUE(fs::exists(tuned + "/" + file)) << file;
  }
  // fsdp-ckpt exports the checkpoint with the config.json it records: the same model.
  r = run_program({FSDP_CKPT_PATH, "export", out + "/checkpoints/step-00000008", path("exported"), "--format", "hf"},
                  std::chrono::seconds(60));
  ASSERT_EQ(r.exit_code(), 0) << r.output;
  r = run_program({FSDP_TEST_PYTHON, FSDP_TEST_SOURCE_DIR "/python/hf_models.py", "check-tuned", tuned, path("exported"),
                   "0"},
                  std::chrono::seconds(240));
  EXPECT_EQ(r.exit_code(), 0) << r.output;
  // Greedy generation from the checkpoint through the tokenizer: the text
  // transformers generates from the export.
  const std::string prompt = "The quick brown";
  r = run_program({FSDP_TRAIN_PATH, "generate", "--checkpoint", out + "/checkpoints/step-00000008", "--prompt", prompt,
                   "--temperature", "0", "--tokens", "12"},
                  std::chrono::seconds(120));
  ASSERT_EQ(r.exit_code(), 0) << r.output;
  const std::string ours = r.output.substr(0, r.output.size() - (r.output.back() == '\n' ? 1 : 0));
  r = run_program({FSDP_TEST_PYTHON, FSDP_TEST_SOURCE_DIR "/python/hf_models.py", "generate-text", tuned, prompt, "12"},
                  std::chrono::seconds(240));
  ASSERT_EQ(r.exit_code(), 0) << r.output;
  const std::string theirs = between_markers(r.output);
  EXPECT_EQ(ours, theirs);
  EXPECT_GT(ours.size(), prompt.size());
  // Issue 50 item 13: generate --model hf:DIR from the export itself gives
  // the same text. Before: no --model flag; the directory as --checkpoint
  // said "a directory without .metadata or index.json". Now that says to use
  // --model hf:.
  r = run_program({FSDP_TRAIN_PATH, "generate", "--model", "hf:" + tuned, "--prompt", prompt, "--temperature", "0",
                   "--tokens", "12"},
                  std::chrono::seconds(120));
  ASSERT_EQ(r.exit_code(), 0) << r.output;
  EXPECT_EQ(r.output.substr(0, r.output.size() - (r.output.back() == '\n' ? 1 : 0)), theirs);
  r = run_program({FSDP_TRAIN_PATH, "generate", "--checkpoint", tuned, "--prompt", prompt}, std::chrono::seconds(60));
  EXPECT_NE(r.exit_code(), 0);
  EXPECT_NE(r.output.find(tuned + " is a Hugging Face model directory (config.json and model.safetensors), not a "
                          "checkpoint of fsdp-train's: expected --model hf:" + tuned),
            std::string::npos)
      << r.output;
}

TEST_F(HfFineTune, LoraTrainsOnlyTheAdaptersWhichPeftLoadsWithTheSameMergedLogits) {
  const std::string out = path("lora"), adapter = path("adapter");
  auto r = train_on_two(out, {"--steps", "6", "--lr", "1e-2", "--engine", "fsdp2", "--lora-rank", "4",
                              "--lora-alpha", "8", "--lora-targets", "q_proj,v_proj,down_proj", "--save-hf", adapter});
  ASSERT_EQ(r.exit_code(), 0) << r.output;
  EXPECT_TRUE(fs::exists(adapter + "/adapter_model.safetensors"));
  EXPECT_TRUE(fs::exists(adapter + "/adapter_config.json"));
  const std::string checkpoint = out + "/checkpoints/step-00000006";
  const train::CheckpointModel held = train::checkpoint_model(inspect_checkpoint(checkpoint), checkpoint);
  ASSERT_TRUE(held.llama.has_value());
  EXPECT_EQ(held.source, "hf:" + base());
  EXPECT_EQ(held.llama->lora.rank, 4);
  EXPECT_EQ(held.llama->lora.targets, (std::vector<std::string>{"q_proj", "v_proj", "down_proj"}));
  // The run's model, and the base as the directory holds it.
  fsdp::Unit<models::LlamaImpl> tuned(*held.llama), original(hf::read_config(base()));
  run_ranks(1, [&](dist::ProcessGroup& pg) {
    load_checkpoint(checkpoint, tuned.ptr(), pg);
    hf::load_weights(base(), original->config(), original.ptr(), pg);
  });
  const auto base_params = original->named_parameters();
  int64_t adapters = 0;
  for (const auto& p : tuned->named_parameters()) {
    if (p.key().find(".lora_") != std::string::npos) {
      ++adapters;
      if (p.key().find(".lora_B.") != std::string::npos) EXPECT_GT(p.value().abs().max().item<double>(), 0) << p.key();
      continue;
    }
    EXPECT_TRUE(p.value().equal(base_params[p.key()])) << p.key() << " moved: the base must stay frozen";
  }
  EXPECT_EQ(adapters, 2 * 3 * held.llama->num_hidden_layers);
  // peft merges the adapters into transformers' model: fsdp-cpp's logits.
  torch::NoGradGuard no_grad;
  tuned->eval();
  const at::Tensor ids = at::arange(3, 27, at::kLong).reshape({2, 12});
  const at::Tensor logits = tuned(ids);
  const std::string ours = path("lora.ours.safetensors");
  formats::SafetensorsWriter w(ours,
                               {{"logits", at::kFloat, logits.sizes().vec(), 0, 0},
                                {"tokens", at::kLong, ids.sizes().vec(), 0, 0}},
                               {});
  for (const auto& t : w.layout()) w.write(t.name == "logits" ? logits : ids);
  w.commit();
  r = run_program({FSDP_TEST_PYTHON, FSDP_TEST_SOURCE_DIR "/python/hf_models.py", "check-peft", base(), adapter, ours},
                  std::chrono::seconds(240));
  EXPECT_EQ(r.exit_code(), 0) << r.output;
  // fsdp-ckpt exports the checkpoint merged: transformers alone gives the same logits.
  r = run_program({FSDP_CKPT_PATH, "export", checkpoint, path("merged"), "--format", "hf"}, std::chrono::seconds(60));
  ASSERT_EQ(r.exit_code(), 0) << r.output;
  r = run_program({FSDP_TEST_PYTHON, FSDP_TEST_SOURCE_DIR "/python/hf_models.py", "check-export", path("merged"), ours},
                  std::chrono::seconds(240));
  EXPECT_EQ(r.exit_code(), 0) << r.output;
  // A resume of the run with another adapter shape is refused, naming it.
  r = train_on_two(out, {"--steps", "8", "--lr", "1e-2", "--engine", "fsdp2", "--lora-rank", "2", "--lora-alpha", "8",
                         "--lora-targets", "q_proj,v_proj,down_proj", "--resume"});
  EXPECT_NE(r.exit_code(), 0);
  EXPECT_NE(r.output.find("lora_rank 4 (checkpoint) vs 2"), std::string::npos) << r.output;
}
// Issue 50 item 15: `prepare` records the tokenizer's fingerprint in llm.c's
// header (its vocabulary, BOS, EOS, and its files' CRC-32s); --model hf:DIR
// compares it with DIR's tokenizer before anything is built. Before the fix:
// a file prepared with another tokenizer trained silently (unless an id
// reached the vocabulary size).
TEST_F(HfFineTune, ATokenFilePreparedWithAnotherTokenizerIsRefusedByName) {
  std::ifstream in(tokens(), std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GE(bytes.size(), 1024u);
  auto word = [&](int i) {
    uint32_t v = 0;
    for (int k = 0; k < 4; ++k) v |= uint32_t{static_cast<uint8_t>(bytes[static_cast<size_t>(4 * i + k)])} << (8 * k);
    return static_cast<int64_t>(v);
  };
  const auto config = hf::read_config(base());
  EXPECT_EQ(word(3), 0x6B6F7446) << "the mark \"Ftok\"";
  EXPECT_EQ(word(5), config.vocab_size);
  ASSERT_TRUE(config.bos_token_id.has_value());
  EXPECT_EQ(word(6), *config.bos_token_id + 1);
  EXPECT_EQ(word(7), config.eos_token_ids.at(0) + 1);
  auto print_config = [&](const std::string& model, const std::string& data, std::vector<std::string> more = {}) {
    std::vector<std::string> argv{FSDP_TRAIN_PATH, "--print-config", "--model", "hf:" + model, "--data", data,
                                  "--context", "16", "--out", path("fp-run")};
    argv.insert(argv.end(), more.begin(), more.end());
    return run_program(argv, std::chrono::seconds(60));
  };
  auto r = print_config(base(), tokens());
  EXPECT_EQ(r.exit_code(), 0) << r.output;
  // Another tokenizer: the same model, a tokenizer.json that differs.
  const std::string other = path("other-tokenizer");
  fs::copy(base(), other, fs::copy_options::recursive);
  std::string tj = read_file(base() + "/tokenizer.json");
  tj.insert(tj.size() - 1, " ");  // another file, as another tokenizer's is
  fs::remove(other + "/tokenizer.json");
  write_file(other + "/tokenizer.json", tj);
  r = print_config(other, tokens());
  EXPECT_NE(r.exit_code(), 0) << r.output;
  EXPECT_NE(r.output.find("--data " + tokens() + " was prepared with another tokenizer than --model hf:" + other +
                          "'s (it recorded vocab " + std::to_string(config.vocab_size)),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("differing: the tokenizer file: tokenizer.json of CRC-32"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("or --allow-tokenizer-change"), std::string::npos) << r.output;
  // Consent: it trains, warned.
  r = print_config(other, tokens(), {"--allow-tokenizer-change"});
  EXPECT_EQ(r.exit_code(), 0) << r.output;
  EXPECT_NE(r.output.find("WARNING: --data " + tokens() + " was prepared with another tokenizer"), std::string::npos)
      << r.output;
  // A file prepared before fingerprints (its free words zero) still trains.
  for (size_t i = 12; i < 1024; ++i) bytes[i] = 0;
  write_file(path("old.bin"), bytes);
  r = print_config(other, path("old.bin"));
  EXPECT_EQ(r.exit_code(), 0) << r.output;
}

// --model llama --config: the same architecture from scratch, drawn from the
// seed (so not the base's weights: its first loss is another); generate
// needs the tokenizer named, since such a run records none.
TEST_F(HfFineTune, FromScratchTrainsFromTheSeedAndGeneratesWithTheTokenizerItIsGiven) {
  const std::string out = path("scratch");
  auto r = run_program({FSDP_RUN_PATH, "--nproc-per-node", "1", "--", FSDP_TRAIN_PATH, "--model", "llama", "--config",
                        base() + "/config.json", "--data", tokens(), "--context", "16", "--batch", "2", "--steps", "3",
                        "--warmup-steps", "0", "--eval-every", "0", "--logger", "jsonl", "--out", out},
                       std::chrono::seconds(120));
  ASSERT_EQ(r.exit_code(), 0) << r.output;
  EXPECT_EQ(r.output.find("fsdp-train: loaded"), std::string::npos) << r.output;
  const auto l = losses(out);
  ASSERT_EQ(l.size(), 3u);
  // Drawn as transformers initialises (std 0.02): about ln(vocab) at first.
  const auto config = hf::read_config(base());
  EXPECT_NEAR(l.front(), std::log(static_cast<double>(config.vocab_size)), 0.3);
  const std::string checkpoint = out + "/checkpoints/step-00000003";
  r = run_program({FSDP_TRAIN_PATH, "generate", "--checkpoint", checkpoint, "--prompt", "The", "--tokens", "4"},
                  std::chrono::seconds(60));
  EXPECT_NE(r.exit_code(), 0);
  EXPECT_NE(r.output.find("expected --tokenizer DIR"), std::string::npos) << r.output;
  r = run_program({FSDP_TRAIN_PATH, "generate", "--checkpoint", checkpoint, "--prompt", "The", "--tokens", "4",
                   "--tokenizer", base()},
                  std::chrono::seconds(60));
  EXPECT_EQ(r.exit_code(), 0) << r.output;
  EXPECT_EQ(r.output.rfind("The", 0), 0u) << r.output;
}
#endif  // FSDP_TEST_TRANSFORMERS

}  // namespace
}  // namespace fsdp::testing
