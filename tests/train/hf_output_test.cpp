// Where fsdp-train --save-hf and the Hugging Face export write (issue 50):
// a destination the export would refuse is named before step 1 (item 7), and
// the staging directory a killed export left is removed by the next export
// of the same output when proven ours, never anything else (item 8).
#include <gtest/gtest.h>
#include <sys/file.h>
#include <fcntl.h>
#include <unistd.h>

#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "../../src/hf/new_directory.h"
#include "../support/errors.h"
#include "../support/subprocess.h"
#include "../support/thread_ranks.h"
#include "../support/train_config.h"
#include "../models/hostile_model_dir.h"
#include "fsdp/checkpoint/checkpoint_io.h"
#include "fsdp/core/fully_sharded_data_parallel.h"  // fsdp::Unit
#include "fsdp/fsdp2/fully_shard.h"
#include "fsdp/hf/export.h"
#include "fsdp/models/llama.h"
#include "fsdp/train/gpt_trainer.h"
#include "fsdp/train/run_settings.h"

namespace fsdp::testing {
namespace {

namespace fs = std::filesystem;

// Issue 50 item 7. Before the fix each of these passed the start-up check,
// trained the whole run, then failed in the export ("export: the output …
// exists", "… is the source directory … or inside it").
TEST(SaveHf, ADestinationTheExportWouldRefuseIsNamedBeforeTraining) {
  TempDir dir;
  const std::string model = dir.path() + "/model", data = dir.path() + "/tokens.bin", out = dir.path() + "/run";
  fs::create_directories(model);
  const std::string config = R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "vocab_size": 300, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "max_position_embeddings": 64, "rms_norm_eps": 1e-6})";
  std::ofstream(model + "/config.json") << config;
  write_zero_weights(model, config);  // resolve_model checks the config against the weights' headers
  std::ofstream(data) << std::string(4096, 'x');
  auto check = [&](const std::string& save_hf, const std::string& run_out) {
    train::TrainConfig c = tiny_train_config(run_out, 2, 2);
    c.model_source = "hf:" + model;
    c.data = data;
    c.save_hf = save_hf;
    train::resolve_model(c);
    train::validate_settings(c);
  };
  struct Case {
    std::string save_hf, out, error;
  };
  const std::vector<Case> refused = {
      {model + "/tuned", out, " is the --model hf: directory " + model + " or inside it"},
      {model, out, "already exists"},
      {out, out, "--save-hf " + out + " is --out " + out + ", which the run creates before its export"},
      {out + "/checkpoints", out, "is --out's checkpoints directory or inside it (" + out + "/checkpoints)"},
      {out + "/checkpoints/hf", out, "is --out's checkpoints directory or inside it"},
      {dir.path() + "/a", dir.path() + "/a/b/run", "--save-hf " + dir.path() + "/a holds --out"},
      {out + "/./", out, " is --out "},  // the same directory, spelled otherwise
  };
  for (const auto& k : refused) {
    SCOPED_TRACE(k.save_hf + " with --out " + k.out);
    const std::string e = config_error([&] { check(k.save_hf, k.out); });
    EXPECT_NE(e.find(k.error), std::string::npos) << e;
    if (k.error != "already exists") EXPECT_NE(e.find("would refuse it, after the whole run trained"), std::string::npos) << e;
  }
  // Through a symbolic link to the source: resolved.
  fs::create_symlink(model, dir.path() + "/link");
  EXPECT_NE(config_error([&] { check(dir.path() + "/link/tuned", out); }).find("is the --model hf: directory"),
            std::string::npos);
  // Under a regular file: nothing can be created there.
  std::ofstream(dir.path() + "/file") << "x";
  EXPECT_NE(config_error([&] { check(dir.path() + "/file/hf", out); }).find(dir.path() + "/file is not a directory"),
            std::string::npos);
  // Beside them, or inside --out but outside its checkpoints: accepted.
  check(out + "/hf", out);
  check(dir.path() + "/tuned", out);
  // fsdp-train itself refuses before training: nothing is written into --out.
  const auto r = run_program({FSDP_RUN_PATH, "--nproc-per-node", "1", "--", FSDP_TRAIN_PATH, "--model", "hf:" + model,
                              "--data", data, "--out", out, "--save-hf", out},
                             std::chrono::seconds(60));
  EXPECT_NE(r.exit_code(), 0) << r.output;
  EXPECT_NE(r.output.find("is --out"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(out + "/checkpoints")) << r.output;
}

// A tiny Llama's full checkpoint at `path`, and its config.
models::LlamaConfig save_tiny_llama(const std::string& path) {
  models::LlamaConfig c;
  c.vocab_size = 16, c.hidden_size = 8, c.intermediate_size = 16, c.num_hidden_layers = 1;
  c.num_attention_heads = 2, c.num_key_value_heads = 1, c.head_dim = 4;
  run_ranks(1, [&](dist::ProcessGroup& pg) {
    fsdp::Unit<models::LlamaImpl> model(c);
    Mesh mesh = Mesh::of(borrow(pg));
    fully_shard(model, mesh);
    CheckpointState state;
    state.model("model", model.ptr());
    save_checkpoint(path, state, pg, {CheckpointFormat::kFull});
  });
  return c;
}

// Issue 50 item 8. Before the fix: `kill -9` during an export left
// .<name>.tmp-<id>/model.safetensors.tmp-<id> forever; the next export of the
// same output succeeded beside it and left it. Now the next export removes a
// staging directory proven ours: its exact name, no live writer's lock, and
// only files the export writes. A user's directory of the same shape of name
// but other contents, a live export's, and a symbolic link stay.
TEST(SaveHf, TheNextExportRemovesOnlyOurOwnStaleStagingDirectories) {
  if (TORCH_VERSION_MAJOR < 2) GTEST_SKIP() << "the Llama needs LibTorch 2 (scaled_dot_product_attention)";
  TempDir dir;
  const std::string ckpt = dir.path() + "/ckpt.pt", out = dir.path() + "/k";
  hf::ExportOptions o;
  o.config = save_tiny_llama(ckpt);
  const std::string stale = dir.path() + "/.k.tmp-18c1f0a9b2e-3fa2c1", stale2 = dir.path() + "/.k.tmp-18c1f0a9b2e-5";
  fs::create_directories(stale);
  write_file(stale + "/model.safetensors.tmp-18c1f0a9b2e-3fa2c3", std::string(4096, 'w'));  // what kill -9 left
  write_file(stale + "/config.json", "{}");
  fs::create_directories(stale2);  // a killed export of several shards
  write_file(stale2 + "/model-00001-of-00002.safetensors", "w");
  write_file(stale2 + "/model-00002-of-00002.safetensors.tmp-18c1f0a9b2f-1", "w");
  // Not provably ours: a user's file inside, a name without a save id, a
  // symbolic link, and one whose writer is alive (it holds the lock).
  const std::string users = dir.path() + "/.k.tmp-18c1f0a9b2e-3fa2c4", no_id = dir.path() + "/.k.tmp-notes",
                    link = dir.path() + "/.k.tmp-18c1f0a9b2e-3fa2c6", live = dir.path() + "/.k.tmp-18c1f0a9b2e-3fa2c7";
  for (const auto& d : {users, no_id, live, dir.path() + "/elsewhere"}) fs::create_directories(d);
  write_file(users + "/model.safetensors", "w");
  write_file(users + "/notes.txt", "mine");
  write_file(no_id + "/model.safetensors", "w");
  write_file(live + "/model.safetensors.tmp-18c1f0a9b2e-3fa2c8", "w");
  write_file(dir.path() + "/elsewhere/model.safetensors", "w");
  fs::create_directory_symlink(dir.path() + "/elsewhere", link);
  const int held = ::open(live.c_str(), O_RDONLY | O_DIRECTORY);
  ASSERT_GE(held, 0);
  ASSERT_EQ(::flock(held, LOCK_EX | LOCK_NB), 0);
  hf::export_hf(ckpt, out, o);
  ::close(held);
  EXPECT_TRUE(fs::exists(out + "/model.safetensors"));
  EXPECT_FALSE(fs::exists(stale)) << "a killed export's staging directory stays";
  EXPECT_FALSE(fs::exists(stale2)) << "a killed export's staging directory stays";
  EXPECT_EQ(read_file(users + "/notes.txt"), "mine");
  EXPECT_TRUE(fs::exists(users + "/model.safetensors"));
  EXPECT_TRUE(fs::exists(no_id + "/model.safetensors"));
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_TRUE(fs::exists(dir.path() + "/elsewhere/model.safetensors"));
  EXPECT_TRUE(fs::exists(live + "/model.safetensors.tmp-18c1f0a9b2e-3fa2c8")) << "a live export's staging directory";
  // Only the staging siblings of the output written are looked at: an
  // export of k2 leaves k's; the next of k removes the one no writer holds now.
  fs::remove_all(out);
  hf::export_hf(ckpt, dir.path() + "/k2", o);
  EXPECT_TRUE(fs::exists(live));
  hf::export_hf(ckpt, out, o);
  EXPECT_FALSE(fs::exists(live)) << "no writer holds it now";
  EXPECT_TRUE(fs::exists(users + "/notes.txt"));
}

}  // namespace
}  // namespace fsdp::testing
