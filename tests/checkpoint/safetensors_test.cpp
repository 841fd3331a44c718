// Safetensors without Python (runs on both LibTorch builds): fsdp-cpp's
// export loads back into any layout at any world size, also under a name
// without the .safetensors extension (recognized by content); the writer lays
// files out as the safetensors package does; corrupt and hostile files are
// refused with a ConfigError naming the file and the offence, as the
// package's reader refuses them; FIFOs, directories and outputs inside the
// checkpoint are refused; `fsdp-ckpt export`.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <mutex>

#include "../../src/checkpoint/safetensors.h"
#include "../support/errors.h"
#include "../support/subprocess.h"
#include "../support/thread_ranks.h"
#include "fsdp/checkpoint/checkpoint_io.h"
#include "../support/raw_state.h"

using namespace fsdp;
using namespace fsdp::testing;
namespace fs = std::filesystem;
namespace checkpoint = fsdp::detail::checkpoint;  // the on-disk records (src/checkpoint/format.h)

namespace {

// A safetensors file's bytes: the header's length (`length`, or the header's
// own), the header, the data.
std::string st_bytes(const std::string& header, const std::string& data, int64_t length = -1) {
  const auto n = static_cast<uint64_t>(length < 0 ? static_cast<int64_t>(header.size()) : length);
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  return out + header + data;
}

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

TEST(Safetensors, TheWriterLaysOutFilesAsSaveFileDoes) {
  TempDir dir;
  const std::string path = dir.path() + "/mixed.safetensors";
  const std::vector<std::pair<std::string, at::Tensor>> tensors = {
      {"b", torch::arange(6, torch::kFloat32).reshape({2, 3}).t()},  // not contiguous
      {"a", torch::tensor({1.5, -2.0, 3.25}).to(torch::kBFloat16)},
      {"c", torch::tensor({int64_t{1} << 40})},
      {"d", torch::tensor({true, false, true})},
      {"e", torch::zeros({0, 4})},
      {"f", torch::tensor(7.0, torch::kFloat64)}};
  std::vector<checkpoint::SafetensorsTensor> plan;
  for (const auto& [k, t] : tensors) plan.push_back({k, t.scalar_type(), t.sizes().vec(), 0, 0});
  checkpoint::SafetensorsWriter w(path, plan, {{"format", "pt"}});
  std::vector<std::string> order;
  for (const auto& t : w.layout()) order.push_back(t.name);
  // As save_file: by dtype (I64, F64, F32, ..., BF16, ..., BOOL), then by name.
  EXPECT_EQ(order, (std::vector<std::string>{"c", "f", "b", "e", "a", "d"}));
  EXPECT_FALSE(fs::exists(path));  // nothing under the name before commit
  for (const auto& t : w.layout()) {
    for (const auto& [k, v] : tensors) {
      if (k == t.name) w.write(v);
    }
  }
  w.commit();
  const auto h = checkpoint::read_safetensors_header(path);
  EXPECT_EQ(h.data_start % 8, 0);
  EXPECT_EQ(h.metadata, (std::map<std::string, std::string>{{"format", "pt"}}));
  ASSERT_EQ(h.tensors.size(), tensors.size());
  for (const auto& t : h.tensors) {
    EXPECT_EQ(t.begin % static_cast<int64_t>(c10::elementSize(t.dtype)), 0) << t.name << " aligned";
    for (const auto& [k, v] : tensors) {
      if (k != t.name) continue;
      const auto got = checkpoint::read_safetensors_tensor(path, h, t);
      EXPECT_EQ(got.scalar_type(), v.scalar_type()) << k;
      EXPECT_TRUE(torch::equal(got, v)) << k;
    }
  }
  EXPECT_THROW(
      checkpoint::SafetensorsWriter(dir.path() + "/x", {{"a", at::kFloat, {1}, 0, 0}, {"a", at::kFloat, {1}, 0, 0}}, {}),
      ConfigError);
  EXPECT_THROW(checkpoint::SafetensorsWriter(dir.path() + "/x", {{"a", at::kComplexFloat, {1}, 0, 0}}, {}), ConfigError);
  checkpoint::SafetensorsWriter wrong(dir.path() + "/y", {{"a", at::kFloat, {2}, 0, 0}}, {});
  expect_config_error([&] { wrong.write(torch::zeros({3})); }, "tensor 'a' was planned as F32 [2]");
}

// The header of a file with one F32 tensor "a" of shape [2] (8 bytes).
const std::string kA = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";

TEST(Safetensors, CorruptAndHostileHeadersAreRefusedByName) {
  const std::string z8(8, '\0');
  struct Case {
    std::string bytes, error;
  };
  const std::vector<Case> cases = {
      {std::string("\x10\0\0", 3), "fewer than the 8 of the header length"},
      {st_bytes(kA, z8, 100'000'001), "over the format's limit of 100 MB"},
      {st_bytes(kA, z8, 1000), "runs past the end of the file"},
      {st_bytes(kA, z8).substr(0, 40), "runs past the end of the file"},
      {st_bytes(kA, z8.substr(0, 4)), "(the file is truncated)"},
      {st_bytes(kA, z8 + "xx"), "(bytes no tensor covers)"},
      {st_bytes(
           R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
           z8 + "1234"),
       "tensor 'b' starts at byte 4 of the data, expected 8 (it overlaps the tensor before it)"},
      {st_bytes(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", z8), "(a hole before it)"},
      {st_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,99999999999]}})", z8),
       "hold 99999999999 bytes, but dtype F32 x shape [2] is 8 bytes"},
      {st_bytes(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", z8),
       "but dtype F32 x shape [3] is 12 bytes"},
      {st_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", z8), "end before they begin"},
      {st_bytes(R"({"a":{"dtype":"Q32","shape":[2],"data_offsets":[0,8]}})", z8), "tensor 'a': unknown dtype 'Q32'"},
      {st_bytes(R"({"a":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2]}})", z8.substr(0, 2)),
       "dtype 'F8_E4M3' is not supported by fsdp-cpp"},
      {st_bytes(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", z8),
       "'shape' must hold non-negative integers"},
      {st_bytes(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,8]}})", z8),
       "the shape's size overflows"},
      {st_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8,8]}})", z8), "must be a list of two integers"},
      {st_bytes(R"({"a":{"dtype":"F32","data_offsets":[0,8]}})", z8), "missing field 'shape'"},
      {st_bytes(R"({"a":[1]})", ""), "its entry must be an object"},
      {st_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})", z8), "the header is not valid JSON"},
      {st_bytes("{\"\xff\":{}}", ""), "the header is not valid JSON"},
      {st_bytes(R"([1, 2])", ""), "must be a JSON object"},
      {st_bytes(kA.substr(0, kA.size() - 1) + R"(,"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", z8),
       "the header has the key 'a' twice"},
      {st_bytes(R"({"__metadata__":{"k":1}})", ""), "'__metadata__' entry 'k' must be a string"},
      {st_bytes(R"({"__metadata__":"x"})", ""), "'__metadata__' must be an object"},
  };
  for (const auto& c : cases) {
    expect_config_error([&] { checkpoint::parse_safetensors(c.bytes, static_cast<int64_t>(c.bytes.size()), "f.safetensors"); },
                        c.error);
  }
  // What the package accepts, fsdp-cpp accepts: padding, fields it ignores,
  // zero-size and 0-d tensors, metadata only.
  for (
      const std::string& ok :
      {st_bytes(kA + "   ", z8), st_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", z8),
       st_bytes(
           R"({"e":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},"s":{"dtype":"F64","shape":[],"data_offsets":[0,8]}})",
           z8),
       st_bytes(R"({"__metadata__":{"format":"pt"}})", "")}) {
    EXPECT_NO_THROW(checkpoint::parse_safetensors(ok, static_cast<int64_t>(ok.size()), "ok")) << ok.substr(8);
  }
  // BOOL bytes other than 0/1 would be undefined in LibTorch.
  const std::string b = st_bytes(R"({"b":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]}})", "\x01\x02");
  const auto h = checkpoint::parse_safetensors(b, static_cast<int64_t>(b.size()), "b");
  expect_config_error([&] { checkpoint::safetensors_tensor_from(b, h, h.tensors[0]); }, "holds bytes other than 0 and 1");
}

// Issue 28 item 5: a header whose JSON would take more memory than its size
// allows (a value every 3 bytes: about 30 bytes of DOM per byte) or nests
// deeper than 64 ends in a named error before its DOM is built.
TEST(Safetensors, HeaderBombsAreRefusedByName) {
  std::string dense = "{\"__metadata__\":{},\"a\":[";
  for (int i = 0; i < 3'000'000; ++i) dense += "{},";
  dense += "{}]}";
  const std::string bomb = st_bytes(dense, "");
  expect_config_error([&] { checkpoint::parse_safetensors(bomb, static_cast<int64_t>(bomb.size()), "bomb.safetensors"); },
                      "bomb.safetensors: the header expands beyond what its size allows");
  const std::string deep = st_bytes("{\"a\":" + std::string(1000, '[') + std::string(1000, ']') + "}", "");
  expect_config_error([&] { checkpoint::parse_safetensors(deep, static_cast<int64_t>(deep.size()), "deep.safetensors"); },
                      "the header nests arrays and objects more than 64 deep");
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
  expect_config_error([&] { checkpoint::read_safetensors_header(fifo); }, fifo + ": not a regular file");
  expect_config_error([&] { checkpoint::read_safetensors_header(folder); }, folder + ": not a regular file");
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
