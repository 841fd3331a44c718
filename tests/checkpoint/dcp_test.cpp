// Sharded checkpoints as torch.distributed.checkpoint (DCP), both ways
// (issue 18): DCP checkpoints that PyTorch's dcp.save wrote load into
// wrapped models at any world size (tests/python/dcp_peer.py writes them and
// checks what fsdp-cpp loaded), and damage in DCP directories is caught.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <set>

#include "../support/subprocess.h"
#include "../support/thread_ranks.h"
#include "fsdp/checkpoint/checkpoint_io.h"
#include "fsdp/error.h"
#include "fsdp/state_dict/state_dict.h"
#include "../support/trainer.h"

using namespace fsdp;
using namespace fsdp::testing;
namespace fs = std::filesystem;

namespace {

// The C++ model's state as dcp_peer.py's SPEC.json: [[key, sizes, is_buffer], ...].
std::string write_spec(const std::string& dir) {
  nlohmann::json spec = nlohmann::json::array();
  auto net = make_net(1);
  std::set<std::string> buffers;
  for (const auto& b : net->named_buffers()) buffers.insert(b.key());
  for (const auto& [k, v] : state_dict(net)) {
    spec.push_back({k, std::get<torch::Tensor>(v).sizes().vec(), buffers.count(k) > 0});
  }
  const std::string path = dir + "/spec.json";
  std::ofstream(path) << spec.dump();
  return path;
}

// Runs dcp_peer.py MODE (under the venv's torchrun at world > 1).
void peer(const std::string& mode, const std::string& dir, int world = 1) {
  std::vector<std::string> cmd;
  if (world > 1) {
    const std::string torchrun = fs::path(FSDP_TEST_PYTHON).parent_path() / "torchrun";
    cmd = {torchrun, "--standalone", "--nproc-per-node", std::to_string(world)};
  } else {
    cmd = {FSDP_TEST_PYTHON};
  }
  for (const std::string& a : {std::string(FSDP_TEST_SOURCE_DIR "/python/dcp_peer.py"), mode, dir + "/spec.json", dir}) {
    cmd.push_back(a);
  }
  auto r = run_program(cmd, std::chrono::seconds(280));
  ASSERT_EQ(r.status, 0) << mode << " at world " << world << ":\n" << r.output;
}

CheckpointState state_of(Trainer& t) {
  CheckpointState s;
  s.model("model", t.model.ptr()).optimizer("optimizer", *t.optimizer).value("step", int64_t{0}).value("tag", std::string());
  return s;
}

// Python's dcp.save at `py_world` ranks -> fsdp-cpp's load at `worlds`
// (FSDP1 or FSDP2 models): the loaded state, saved again in the full format,
// is exactly Python's.
void python_dcp_loads(int py_world, const std::string& mode = "save", Engine engine = Engine::kFsdp1,
                      std::vector<int> worlds = {1, 2}) {
  TempDir dir;
  write_spec(dir.path());
  peer(mode, dir.path(), py_world);
  for (int world : worlds) {
    run_ranks(world, [&](dist::ProcessGroup& pg) {
      Trainer t(pg, Opt::kAdamW, 9, engine);  // other values: everything must come from the checkpoint
      CheckpointState s = state_of(t);
      load_checkpoint(dir.path() + "/py_dcp", s, pg);
      EXPECT_EQ(std::get<int64_t>(s.values().at("step")), 5);
      EXPECT_EQ(std::get<std::string>(s.values().at("tag")), "py");
      save_checkpoint(dir.path() + "/cpp_full.pt", s, pg, {CheckpointFormat::kFull});
    });
    peer("check-full", dir.path());
  }
}

}  // namespace

TEST(DcpFromPython, World1SaveLoadsAtWorld1And2) { python_dcp_loads(1); }

TEST(DcpFromPython, World2Fsdp2SaveLoadsAtWorld1And2) { python_dcp_loads(2); }

// PyTorch's fully_shard + dcp.save at world 2 -> fsdp-cpp's fully_shard
// model at world 3 (uneven rows).
TEST(DcpFromPython, World2Fsdp2SaveLoadsIntoFullyShardAtWorld3) { python_dcp_loads(2, "save", Engine::kFsdp2, {3}); }

// Lightning's sharded checkpoint (FSDP1 under Fabric, world 1): its values come from meta.pt.
TEST(DcpFromPython, LightningShardedLoadsAtWorld1And2) { python_dcp_loads(1, "lightning-save"); }

// fsdp-cpp's sharded save (a DCP checkpoint) at worlds 1 and 2 ->
// PyTorch's dcp.load at world 1 and at world 2 (FSDP2 under torchrun), into
// the model's state dict and get_state_dict's optimizer layout: every tensor
// equals what fsdp-cpp's full save of the same state holds.
// The same from fsdp-cpp's fully_shard model at world 3.
TEST(DcpToPython, ShardedSavesLoadWithDcpLoadAtWorld1And2) {
  for (const auto& [world, engine] : {std::make_pair(1, Engine::kFsdp1), std::make_pair(2, Engine::kFsdp1),
                                      std::make_pair(3, Engine::kFsdp2)}) {
    TempDir dir;
    write_spec(dir.path());
    const auto batches = make_batches(2, 6, 1);
    run_ranks(world, [&, engine = engine](dist::ProcessGroup& pg) {
      Trainer t(pg, Opt::kAdamW, 3, engine);
      t.train(pg, batches, 0, 2);
      CheckpointState s = state_of(t);
      s.value("step", int64_t{7}).value("tag", std::string("cpp"));
      save_checkpoint(dir.path() + "/cpp_dcp", s, pg, {CheckpointFormat::kSharded});
      save_checkpoint(dir.path() + "/cpp_full.pt", s, pg, {CheckpointFormat::kFull});
    });
    EXPECT_TRUE(fs::exists(dir.path() + "/cpp_dcp/.metadata"));
    peer("load", dir.path(), 1);
    peer("load", dir.path(), 2);
    // fsdp-cpp reads its own DCP save back through its index (CRC-32s).
    run_ranks(world, [&, engine = engine](dist::ProcessGroup& pg) {
      Trainer t(pg, Opt::kAdamW, 9, engine);
      CheckpointState s = state_of(t);
      load_checkpoint(dir.path() + "/cpp_dcp", s, pg);
      EXPECT_EQ(std::get<int64_t>(s.values().at("step")), 7);
    });
  }
}
