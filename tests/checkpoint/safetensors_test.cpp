// Safetensors without Python (runs on both LibTorch builds): fsdp-cpp's
// export loads back into any layout at any world size, also under a name
// without the .safetensors extension (recognized by content); bad files fail
// the load naming the file on every rank; FIFOs, directories and outputs
// inside the checkpoint are refused; `fsdp-ckpt export`. The format alone
// (writer, hostile headers): tests/formats/safetensors_test.cpp.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <mutex>

#include "fsdp/formats/safetensors.h"
#include "../support/errors.h"
#include "../support/index_files.h"
#include "../support/subprocess.h"
#include "../support/thread_ranks.h"
#include "fsdp/checkpoint/checkpoint_io.h"
#include "../support/raw_state.h"

using namespace fsdp;
using namespace fsdp::testing;
namespace fs = std::filesystem;

namespace {


// A trained model at world 2, saved in `format` at `path`; returns its full state.
NamedTensors save_trained(const std::string& path, CheckpointFormat format) {
  const auto batches = make_batches(2, 8, 3);
  NamedTensors saved;
  std::mutex mu;
  run_ranks(2, [&](dist::ProcessGroup& pg) {
    Trainer t(pg, Opt::kAdamW, 7);
    t.train(pg, batches, 0, 2);
    CheckpointState s;
    s.model("model", t.model.ptr()).optimizer("optimizer", *t.optimizer).value("step", int64_t{2});
    save_checkpoint(path, s, pg, {format});
    auto state = full_state(t.model.ptr());
    std::lock_guard<std::mutex> lock(mu);
    if (pg.rank() == 0) saved = std::move(state);
  });
  return saved;
}

void expect_same(const NamedTensors& got, const NamedTensors& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].first, want[i].first) << what;
    EXPECT_TRUE(torch::equal(got[i].second, want[i].second)) << what << ": " << got[i].first;
  }
}

TEST(Safetensors, ExportLoadsBackInAnyLayoutAtAnyWorldSize) {
  TempDir dir;
  const std::string sharded = dir.path() + "/ckpt", out = dir.path() + "/model.safetensors",
                    bare = dir.path() + "/weights.bin";
  const auto saved = save_trained(sharded, CheckpointFormat::kSharded);
  export_safetensors(sharded, out);
  fs::copy_file(out, bare);  // no extension: recognized by its content
  for (const std::string& file : {out, bare}) {
    auto plain = make_net(9);
    run_ranks(1, [&](dist::ProcessGroup& pg) { load_checkpoint(file, plain, pg); });
    expect_same(full_state(plain), saved, file + ", unwrapped");
    for (auto [world, strategy] : std::vector<std::pair<int, ShardingStrategy>>{{3, ShardingStrategy::kFullShard},
                                                                                {2, ShardingStrategy::kShardGradOp}}) {
      run_ranks(world, [&](dist::ProcessGroup& pg) {
        Trainer t(pg, Opt::kSgd, 5, strategy);
        load_checkpoint(file, t.model.ptr(), pg);
        expect_same(full_state(t.model.ptr()), saved, file + " at world " + std::to_string(world));
      });
    }
  }
}

TEST(Safetensors, ExportOfAFullCheckpointEqualsThatOfTheShardedOne) {
  TempDir dir;
  const std::string full = dir.path() + "/ckpt.pt", sharded = dir.path() + "/ckpt";
  save_trained(full, CheckpointFormat::kFull);
  save_trained(sharded, CheckpointFormat::kSharded);
  export_safetensors(full, dir.path() + "/a.safetensors");
  export_safetensors(sharded, dir.path() + "/b.safetensors");
  std::ifstream a(dir.path() + "/a.safetensors", std::ios::binary), b(dir.path() + "/b.safetensors", std::ios::binary);
  const std::string ba((std::istreambuf_iterator<char>(a)), {}), bb((std::istreambuf_iterator<char>(b)), {});
  EXPECT_GT(ba.size(), 1000u);
  EXPECT_TRUE(ba == bb) << "the same model's weights, byte for byte";
}


TEST(Safetensors, BadFilesFailTheLoadNamingTheFileOnEveryRank) {
  TempDir dir;
  const std::string z8(8, '\0');
  const std::string mismatch = dir.path() + "/mismatch.safetensors", cut = dir.path() + "/cut.safetensors",
                    cut_bare = dir.path() + "/cut.bin", fifo = dir.path() + "/fifo.safetensors",
                    folder = dir.path() + "/folder.safetensors";
  write_file(mismatch, st_bytes(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", z8));
  write_file(cut, st_bytes(kA, z8).substr(0, 30));
  write_file(cut_bare, st_bytes(kA, z8).substr(0, 30));
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  fs::create_directory(folder);
  run_ranks(2, [&](dist::ProcessGroup& pg) {
    Trainer t(pg, Opt::kSgd, 5);
    auto m = t.model.ptr();
    expect_config_error([&] { load_checkpoint(mismatch, m, pg); },
                        "safetensors: " + mismatch + ", tensor 'a': its data_offsets");
    expect_config_error([&] { load_checkpoint(cut, m, pg); },
                        cut + ": the header length 54 runs past the end of the file");
    // Without the extension, a file that does not start as safetensors is not one.
    expect_config_error([&] { load_checkpoint(cut_bare, m, pg); }, "does not point to a valid checkpoint");
    expect_config_error([&] { load_checkpoint(fifo, m, pg); },
                        "does not point to a valid checkpoint");  // not opened: no hang
    expect_config_error([&] { load_checkpoint(folder, m, pg); }, "does not point to a valid checkpoint");
  });
  expect_config_error([&] { formats::read_safetensors_header(fifo); }, fifo + ": not a regular file");
  expect_config_error([&] { formats::read_safetensors_header(folder); }, folder + ": not a regular file");
}

TEST(Safetensors, ExportAndStateLoadsRefuseWhatTheyCannotDo) {
  TempDir dir;
  const std::string full = dir.path() + "/ckpt.pt", sharded = dir.path() + "/ckpt", out = dir.path() + "/w.safetensors";
  save_trained(full, CheckpointFormat::kFull);
  save_trained(sharded, CheckpointFormat::kSharded);
  expect_config_error([&] { export_safetensors(full, full); }, "is the checkpoint");
  expect_config_error([&] { export_safetensors(sharded, sharded + "/w.safetensors"); }, "is inside the checkpoint");
  expect_config_error([&] { export_safetensors(sharded, sharded + "/./sub/../w.safetensors"); },
                      "is inside the checkpoint");
  expect_config_error([&] { export_safetensors(full, dir.path()); }, "is a directory");
  EXPECT_FALSE(fs::exists(sharded + "/w.safetensors"));
  export_safetensors(full, out);
  // A safetensors file holds weights only: not a checkpoint to export or to load a state from.
  expect_config_error([&] { export_safetensors(out, dir.path() + "/again.safetensors"); },
                      "does not point to a valid checkpoint");
  run_ranks(1, [&](dist::ProcessGroup& pg) {
    Trainer t(pg, Opt::kSgd, 5);
    CheckpointState s;
    s.model("model", t.model.ptr());
    expect_config_error([&] { load_checkpoint(out, s, pg); }, "it loads with load_checkpoint(path, module)");
  });
  expect_config_error([&] { inspect_checkpoint(out); }, "a safetensors file");
}

TEST(FsdpCkptTool, ExportSafetensors) {
  TempDir dir;
  const std::string sharded = dir.path() + "/ckpt", out = dir.path() + "/model.safetensors";
  const auto saved = save_trained(sharded, CheckpointFormat::kSharded);
  auto r = run_program({FSDP_CKPT_PATH, "export", sharded, out, "--format", "safetensors"}, std::chrono::seconds(60));
  ASSERT_EQ(r.exit_code(), 0) << r.output;
  EXPECT_NE(r.output.find("wrote " + out), std::string::npos) << r.output;
  auto plain = make_net(9);
  run_ranks(1, [&](dist::ProcessGroup& pg) { load_checkpoint(out, plain, pg); });
  expect_same(full_state(plain), saved, "fsdp-ckpt export");
  r = run_program({FSDP_CKPT_PATH, "export", sharded, dir.path() + "/m.gguf", "--format", "gguf"},
                  std::chrono::seconds(60));
  EXPECT_NE(r.exit_code(), 0) << r.output;
  EXPECT_NE(r.output.find("gguf"), std::string::npos) << r.output;
  r = run_program({FSDP_CKPT_PATH, "export", sharded, sharded + "/x.safetensors"}, std::chrono::seconds(60));
  EXPECT_EQ(r.exit_code(), 2) << r.output;
  EXPECT_NE(r.output.find("is inside the checkpoint"), std::string::npos) << r.output;
}

}  // namespace
