// Safetensors with Hugging Face's own package (the wheel build's venv,
// requirements.txt): files that safetensors.torch.save_file wrote
// (tests/python/write_safetensors.py) load into wrapped models at world 1
// and 2 and into unwrapped ones, with dtypes converted and strict errors
// named; files fsdp-cpp exports read back in Python with
// safetensors.torch.load_file as the checkpoint's own values
// (tests/python/check_safetensors.py).
#include <gtest/gtest.h>

#include "../support/subprocess.h"
#include "../support/thread_ranks.h"
#include "fsdp/checkpoint/checkpoint_io.h"
#include "../support/raw_state.h"

using namespace fsdp;
using namespace fsdp::testing;

namespace {

// The files of write_safetensors.py, written once for the suite.
constexpr char kWriteSafetensors[] = "write_safetensors.py";
using SafetensorsFromPython = PythonWrittenFiles<kWriteSafetensors>;

TEST_F(SafetensorsFromPython, SaveFileLoadsIntoAWrappedModelAtWorld1And2) {
  for (int world : {1, 2}) {
    for (const char* name : {"f32.safetensors", "bf16.safetensors", "mixed.safetensors"}) {
      run_ranks(world, [&](dist::ProcessGroup& pg) {
        Trainer t(pg, Opt::kSgd, 5);  // other values: everything must come from the file
        load_checkpoint(file(name), t.model.ptr(), pg);
        const auto state = full_state(t.model.ptr());
        EXPECT_EQ(state.front().second.scalar_type(), torch::kFloat32);  // the model's dtype stays
        expect_written_values(state, std::string(name) + " at world " + std::to_string(world));
      });
    }
  }
}

TEST_F(SafetensorsFromPython, SaveFileLoadsIntoAnUnwrappedModel) {
  auto plain = make_net(5);
  run_ranks(1, [&](dist::ProcessGroup& pg) { load_checkpoint(file("mixed.safetensors"), plain, pg); });
  NamedTensors got;
  for (const auto& [k, v] : state_dict(plain)) got.emplace_back(k, std::get<torch::Tensor>(v));
  expect_written_values(got, "mixed.safetensors, unwrapped");
}

TEST_F(SafetensorsFromPython, StrictAndNonStrictNameTheKeys) {
  const auto keys = plain_state();
  const std::string last = keys.back().first, first = keys.front().first;
  run_ranks(2, [&](dist::ProcessGroup& pg) {
    Trainer t(pg, Opt::kSgd, 5);
    expect_config_error([&] { load_checkpoint(file("missing.safetensors"), t.model.ptr(), pg); }, last);
    expect_config_error([&] { load_checkpoint(file("extra.safetensors"), t.model.ptr(), pg); }, "extra_key");
    expect_config_error([&] { load_checkpoint(file("shape.safetensors"), t.model.ptr(), pg); }, first);
    load_checkpoint(file("missing.safetensors"), t.model.ptr(), pg, /*strict=*/false);
    load_checkpoint(file("extra.safetensors"), t.model.ptr(), pg, /*strict=*/false);
    expect_written_values(full_state(t.model.ptr()), "non-strict");
  });
}

TEST(SafetensorsToPython, ExportOfAFullAndAShardedCheckpointIsWhatLoadFileReads) {
  TempDir dir;
  const std::string full = dir.path() + "/full.pt", sharded = dir.path() + "/sharded";
  const auto batches = make_batches(2, 8, 3);
  run_ranks(2, [&](dist::ProcessGroup& pg) {
    Trainer t(pg, Opt::kAdamW, 7);
    t.train(pg, batches, 0, 2);  // values no initializer gives
    CheckpointState s;
    s.model("net", t.model.ptr()).optimizer("optimizer", *t.optimizer);
    save_checkpoint(full, s, pg, {CheckpointFormat::kFull});
    save_checkpoint(sharded, s, pg, {CheckpointFormat::kSharded});
  });
  for (const std::string& src : {full, sharded}) {
    const std::string out = dir.path() + (src == full ? "/from-full" : "/from-sharded") + ".safetensors";
    export_safetensors(src, out);
    auto r = run_program({FSDP_TEST_PYTHON, FSDP_TEST_SOURCE_DIR "/python/check_safetensors.py", out, full, "net"},
                         std::chrono::seconds(120));
    EXPECT_EQ(r.status, 0) << src << ":\n" << r.output;
    EXPECT_NE(r.output.find("check_safetensors: ok " + std::to_string(plain_state().size()) + " tensors"),
              std::string::npos)
        << r.output;
  }
}

}  // namespace
