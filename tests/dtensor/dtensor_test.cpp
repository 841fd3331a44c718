// fsdp::Mesh, placements and DTensor (fsdp/dtensor/): which chunk a rank
// holds, against torch's own _compute_local_shape_and_global_offset over a
// table of shapes, meshes and placements (tests/python/dtensor_chunks.py);
// meshes built by init_device_mesh as torch lays them out (row-major);
// full_tensor and redistribute over rank threads, bitwise against the tensor
// they were cut from; boxes (FSDP1's views) put back together.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <mutex>
#include <sstream>

#include "../support/subprocess.h"
#include "../support/thread_ranks.h"
#include "fsdp/dtensor/dtensor.h"
#include "fsdp/error.h"

using namespace fsdp;
using namespace fsdp::testing;
using placement::Partial;
using placement::Placement;
using placement::Replicate;
using Sh = placement::Shard;

namespace {

std::vector<int64_t> nums(const std::string& s) {
  std::vector<int64_t> out;
  std::stringstream in(s);
  std::string x;
  while (std::getline(in, x, ',')) out.push_back(std::stoll(x));
  return out;
}

std::vector<Placement> parse_placements(const std::string& s) {
  std::vector<Placement> out;
  std::stringstream in(s);
  std::string x;
  while (std::getline(in, x, ',')) {
    if (x == "R") out.push_back(Replicate{});
    else if (x == "P") out.push_back(Partial{});
    else out.push_back(Sh{std::stoll(x.substr(1))});
  }
  return out;
}

// "G=5,3" -> "5,3"
std::string field(const std::string& line, const std::string& key) {
  const size_t at = line.find(key + "=");
  const size_t end = line.find(' ', at);
  return line.substr(at + key.size() + 1, end == std::string::npos ? std::string::npos : end - at - key.size() - 1);
}

// 0, 1.25, 2.5, ... in `shape`: every element distinct and exact in float32.
at::Tensor arange_like(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return torch::arange(n, torch::kFloat).mul(1.25).reshape(shape);
}

}  // namespace

#ifdef FSDP_TEST_TORCH_ORACLE
// Before: fsdp-cpp had no answer of its own (FSDP2 computed rows, FSDP1 flat
// ranges); the table holds nested cuts (S0,S0), empty chunks (at the global
// size, as torch puts them) and Partial.
TEST(DTensorTorch, LocalChunkIsTorchsForEveryCase) {
  auto r = run_program({FSDP_TEST_PYTHON, FSDP_TEST_SOURCE_DIR "/python/dtensor_chunks.py"}, std::chrono::seconds(120));
  ASSERT_EQ(r.exit_code(), 0) << r.output;
  std::stringstream in(r.output);
  std::string line;
  int cases = 0;
  while (std::getline(in, line)) {
    if (line.rfind("G=", 0) != 0) continue;
    const LocalChunk c = local_chunk(nums(field(line, "G")), nums(field(line, "M")), nums(field(line, "C")),
                                     parse_placements(field(line, "P")));
    EXPECT_EQ(c.shape, nums(field(line, "L"))) << line;
    EXPECT_EQ(c.offset, nums(field(line, "O"))) << line;
    ++cases;
  }
  EXPECT_GT(cases, 1000);
}
#else
TEST(DTensorTorch, NeedsTheWheelBuild) {
  GTEST_SKIP() << "torch.distributed.tensor is in the wheel build's Python (torch 2.x), not Debian's 1.13";
}
#endif

TEST(DTensor, BadPlacementsAreRefusedByName) {
  try {
    local_chunk({4, 2}, {2}, {0}, {Sh{2}});
    FAIL() << "Shard(2) of a 2-D tensor was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("Shard(dim=2) on mesh dimension 0 cuts a tensor of 2 dimensions [4, 2]"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(local_chunk({4}, {2, 2}, {0, 0}, {Sh{0}}), ConfigError);
}

// init_device_mesh lays ranks out row-major as torch does: on a (2, 3) mesh
// rank 4 is at (1, 1); its "dp" group holds ranks 1 and 4, its "tp" group
// 3, 4 and 5 (checked by all-reducing the world ranks over each group).
TEST(DeviceMesh, RanksAreRowMajorAndDimensionsAreNamed) {
  std::mutex mu;
  std::vector<std::string> wrong;
  run_ranks(6, [&](dist::ProcessGroup& pg) {
    Mesh mesh = init_device_mesh(borrow(pg), {2, 3}, {"dp", "tp"});
    const std::vector<int64_t> want = {pg.rank() / 3, pg.rank() % 3};
    auto members = [&](const Mesh& m) {
      at::Tensor t = at::zeros({6}, at::kLong);
      t[pg.rank()] = 1;
      m.groups[0]->all_reduce(t).wait();
      return t.nonzero().reshape({-1});
    };
    at::Tensor dp = members(mesh["dp"]), tp = members(mesh["tp"]);
    std::lock_guard<std::mutex> lock(mu);
    if (mesh.coordinate() != want || mesh.shape() != std::vector<int64_t>{2, 3} || mesh.size() != 6 ||
        !dp.equal(torch::tensor({pg.rank() % 3, pg.rank() % 3 + 3})) ||
        !tp.equal(torch::arange(pg.rank() / 3 * 3, pg.rank() / 3 * 3 + 3))) {
      wrong.push_back("rank " + std::to_string(pg.rank()));
    }
    try {
      mesh["pp"];
      wrong.push_back("mesh[\"pp\"] was accepted");
    } catch (const ConfigError& e) {
      if (std::string(e.what()).find("no dimension is named 'pp' (the mesh's dimensions: 'dp', 'tp')") ==
          std::string::npos) {
        wrong.push_back(e.what());
      }
    }
  });
  for (const auto& w : wrong) ADD_FAILURE() << w;
  run_ranks(2, [&](dist::ProcessGroup& pg) { EXPECT_THROW(init_device_mesh(borrow(pg), {3}, {"dp"}), ConfigError); });
}

// Every placement on a (2, 2) mesh, cut from one tensor: full_tensor gives
// it back bit for bit, and redistribute to any other placements gives what
// cutting the tensor that way gives. Partial: each rank holds a quarter of
// the values (exact in float32), and the whole is their sum.
TEST(DTensor, FullTensorAndRedistributeGiveTheTensorBack) {
  const std::vector<std::vector<Placement>> layouts = {
      {Sh{0}, Sh{1}}, {Sh{0}, Sh{0}}, {Sh{1}, Sh{0}}, {Replicate{}, Sh{1}}, {Sh{1}, Replicate{}}, {Replicate{}, Replicate{}}};
  std::mutex mu;
  std::vector<std::string> wrong;
  run_ranks(4, [&](dist::ProcessGroup& pg) {
    Mesh mesh = init_device_mesh(borrow(pg), {2, 2}, {"dp", "tp"});
    for (const auto& shape : std::vector<std::vector<int64_t>>{{5, 3}, {3, 7}, {2, 1}}) {
      const at::Tensor full = arange_like(shape);
      for (const auto& from : layouts) {
        const DTensor d = DTensor::from_full(full, mesh, from);
        std::string what = "shape " + std::to_string(shape[0]) + "x" + std::to_string(shape[1]) + " from " +
                           placement::to_string(from[0]) + "," + placement::to_string(from[1]);
        if (!d.full_tensor().equal(full)) {
          std::lock_guard<std::mutex> lock(mu);
          wrong.push_back(what + ": full_tensor");
        }
        for (const auto& to : layouts) {
          const DTensor r = d.redistribute(to);
          const DTensor want = DTensor::from_full(full, mesh, to);
          if (!r.to_local().equal(want.to_local()) || r.local_shards().size() != want.local_shards().size() ||
              (!want.local_shards().empty() && r.local_shards()[0].offsets != want.local_shards()[0].offsets)) {
            std::lock_guard<std::mutex> lock(mu);
            wrong.push_back(what + " to " + placement::to_string(to[0]) + "," + placement::to_string(to[1]));
          }
        }
      }
      const DTensor part = DTensor::from_local(full * 0.25, mesh, {Partial{}, Partial{}}, shape);
      const DTensor summed = part.redistribute({Replicate{}, Sh{0}});
      if (!summed.to_local().equal(DTensor::from_full(full, mesh, {Replicate{}, Sh{0}}).to_local())) {
        std::lock_guard<std::mutex> lock(mu);
        wrong.push_back("Partial,Partial to Replicate,Shard(0)");
      }
    }
  });
  for (const auto& w : wrong) ADD_FAILURE() << w;
}

// FSDP1's view of a parameter: a rank's range of its flat elements, as the
// boxes flat_range_boxes cuts; full_tensor puts the ranks' boxes together.
TEST(DTensor, BoxesOfFlatRangesMakeTheWholeTensor) {
  std::mutex mu;
  std::vector<std::string> wrong;
  run_ranks(3, [&](dist::ProcessGroup& pg) {
    const std::vector<int64_t> shape = {4, 5, 3};
    const at::Tensor full = arange_like(shape);
    const auto range = dist::chunk_range(full.numel(), pg.size(), pg.rank());
    std::vector<Shard> boxes;
    for (const auto& [offsets, sizes] : flat_range_boxes(shape, range.offset, range.offset + range.numel)) {
      at::Tensor box = full;
      for (size_t d = 0; d < shape.size(); ++d) box = box.narrow(d, offsets[d], sizes[d]);
      boxes.push_back(Shard{offsets, box});
    }
    const DTensor d = DTensor::from_boxes(Mesh::of(borrow(pg)), shape, at::kFloat, boxes);
    const bool ok = !d.has_placements() && d.local_shards().size() == boxes.size() && d.full_tensor().equal(full) &&
                    d.sharded().local_numel() == range.numel;
    std::lock_guard<std::mutex> lock(mu);
    if (!ok) wrong.push_back("rank " + std::to_string(pg.rank()));
  });
  for (const auto& w : wrong) ADD_FAILURE() << w;
}
