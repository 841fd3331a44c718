// Every collective, for world sizes 1-4, sizes that do not divide by the world
// size, and float32 / bfloat16 / float16 / int64, against a direct reference
// computed on each rank from all ranks' (deterministic) inputs.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/version.h>

#include <tuple>

#include "../support/thread_ranks.h"
#include "fsdp/error.h"

using fsdp::dist::chunk_range;
using fsdp::dist::ProcessGroup;
using fsdp::dist::ReduceOp;
using fsdp::testing::run_ranks;

namespace {

const std::vector<int64_t> kSizes = {1, 2, 5, 7, 13, 64, 1001};

// Rank `rank`'s input of `numel` elements: small multiples of 0.25 (integers
// for int64), exact in every dtype here, so sums are exact too.
at::Tensor input_of(int rank, int64_t numel, at::ScalarType dtype, int salt = 0) {
  at::Tensor ints = (at::arange(numel, at::kLong) * 7 + rank * 13 + salt * 5) % 17 - 8;
  if (!at::isFloatingType(dtype)) return ints.to(dtype);
  return (ints.to(at::kFloat) * 0.25).to(dtype);
}

// Reference reduction over all ranks' inputs, computed in float64.
at::Tensor reference(int world, int64_t numel, at::ScalarType dtype, ReduceOp op, int salt = 0) {
  std::vector<at::Tensor> all;
  for (int r = 0; r < world; ++r) all.push_back(input_of(r, numel, dtype, salt).to(at::kDouble));
  at::Tensor stacked = at::stack(all);
  at::Tensor out = op == ReduceOp::kMax ? std::get<0>(stacked.max(0)) : stacked.sum(0);
  if (op == ReduceOp::kAvg) out = out / world;
  return out.to(dtype);
}

void expect_same(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  ASSERT_EQ(got.scalar_type(), want.scalar_type()) << what;
  ASSERT_EQ(got.numel(), want.numel()) << what;
  EXPECT_TRUE(at::equal(got.reshape({-1}), want.reshape({-1}))) << what << "\ngot\n" << got << "\nwant\n" << want;
}

std::vector<ReduceOp> ops_for(at::ScalarType dtype) {
  if (at::isFloatingType(dtype)) return {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax};
  return {ReduceOp::kSum, ReduceOp::kMax};
}


class Collectives : public ::testing::TestWithParam<std::tuple<int, at::ScalarType>> {};

TEST_P(Collectives, AllGather) {
  auto [world, dtype] = GetParam();
  run_ranks(world, [&, world = world, dtype = dtype](ProcessGroup& pg) {
    for (int64_t n : kSizes) {
      at::Tensor full = input_of(99, n, dtype);
      auto mine = chunk_range(n, world, pg.rank());
      at::Tensor out = at::full({n}, -1, at::TensorOptions().dtype(dtype));
      pg.all_gather(out, full.narrow(0, mine.offset, mine.numel).clone()).wait();
      expect_same(out, full, "all_gather n=" + std::to_string(n) + " rank " + std::to_string(pg.rank()));
    }
    // Output shaped [world, k]: every rank's k elements in rank order.
    at::Tensor out = at::empty({world, 3}, at::TensorOptions().dtype(dtype));
    pg.all_gather(out, input_of(pg.rank(), 3, dtype)).wait();
    for (int r = 0; r < world; ++r) expect_same(out[r], input_of(r, 3, dtype), "all_gather rows");
  });
}

TEST_P(Collectives, ReduceScatter) {
  auto [world, dtype] = GetParam();
  run_ranks(world, [&, world = world, dtype = dtype](ProcessGroup& pg) {
    for (ReduceOp op : ops_for(dtype)) {
      for (int64_t n : kSizes) {
        auto mine = chunk_range(n, world, pg.rank());
        at::Tensor out = at::empty({mine.numel}, at::TensorOptions().dtype(dtype));
        pg.reduce_scatter(out, input_of(pg.rank(), n, dtype), op).wait();
        expect_same(out, reference(world, n, dtype, op).narrow(0, mine.offset, mine.numel),
                    std::string("reduce_scatter ") + to_string(op) + " n=" + std::to_string(n));
      }
    }
  });
}

TEST_P(Collectives, AllReduce) {
  auto [world, dtype] = GetParam();
  run_ranks(world, [&, world = world, dtype = dtype](ProcessGroup& pg) {
    for (ReduceOp op : ops_for(dtype)) {
      for (int64_t n : kSizes) {
        at::Tensor t = input_of(pg.rank(), n, dtype, 1);
        pg.all_reduce(t, op).wait();
        expect_same(t, reference(world, n, dtype, op, 1), std::string("all_reduce ") + to_string(op) + " n=" + std::to_string(n));
      }
    }
  });
}

TEST_P(Collectives, Broadcast) {
  auto [world, dtype] = GetParam();
  run_ranks(world, [&, world = world, dtype = dtype](ProcessGroup& pg) {
    for (int root = 0; root < world; ++root) {
      at::Tensor t = input_of(pg.rank(), 13, dtype);
      pg.broadcast(t, root).wait();
      expect_same(t, input_of(root, 13, dtype), "broadcast root " + std::to_string(root));
    }
  });
}

TEST_P(Collectives, AsyncOperationsOverlap) {
  // Several collectives in flight at once, waited for in reverse order.
  auto [world, dtype] = GetParam();
  run_ranks(world, [&, world = world, dtype = dtype](ProcessGroup& pg) {
    std::vector<at::Tensor> ts;
    std::vector<fsdp::dist::Work> works;
    for (int i = 0; i < 4; ++i) {
      ts.push_back(input_of(pg.rank(), 257, dtype, i));
      works.push_back(pg.all_reduce(ts.back()));
    }
    for (int i = 3; i >= 0; --i) works[static_cast<size_t>(i)].wait();
    for (int i = 0; i < 4; ++i) expect_same(ts[static_cast<size_t>(i)], reference(world, 257, dtype, ReduceOp::kSum, i), "async");
  });
}

INSTANTIATE_TEST_SUITE_P(WorldAndDtype, Collectives,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4),
                                            ::testing::Values(at::kFloat, at::kBFloat16, at::kHalf, at::kLong)),
                         [](const auto& info) {
                           return "world" + std::to_string(std::get<0>(info.param)) + "_" +
                                  std::string(c10::toString(std::get<1>(info.param)));
                         });

// LibTorch 2.15's Gloo has its own one-tensor all-gather and reduce-scatter,
// and the group uses them (the Collectives cases above, with sizes that
// divide by the world, check their results); 1.13's has neither, and the
// fallbacks carry every case.
TEST(CollectivesNative, GlooUsesItsOwnOneTensorCollectivesWhereLibTorchHasThem) {
  run_ranks(2, [](ProcessGroup& pg) {
    ASSERT_EQ(pg.backend(), fsdp::launch::Backend::kGloo);
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 15)
    EXPECT_TRUE(pg.native_all_gather());
    EXPECT_TRUE(pg.native_reduce_scatter());
#elif TORCH_VERSION_MAJOR < 2
    EXPECT_FALSE(pg.native_all_gather());
    EXPECT_FALSE(pg.native_reduce_scatter());
#else
    GTEST_SKIP() << "LibTorch " << TORCH_VERSION << ": not checked which Gloo collectives it has";
#endif
  });
}

TEST(CollectivesBytes, BroadcastAndAllGatherRawBytes) {
  run_ranks(3, [](ProcessGroup& pg) {
    const std::string binary("a\0b\xff\n", 5);
    std::string got = pg.broadcast_bytes(pg.rank() == 2 ? binary : "ignored", 2);
    EXPECT_EQ(got, binary);
    EXPECT_EQ(pg.broadcast_bytes(pg.rank() == 0 ? "" : "x", 0), "");
    std::string mine = pg.rank() == 1 ? std::string() : std::string(static_cast<size_t>(pg.rank() + 1) * 1000, char('a' + pg.rank()));
    auto all = pg.all_gather_bytes(mine);
    ASSERT_EQ(all.size(), 3u);
    EXPECT_EQ(all[0], std::string(1000, 'a'));
    EXPECT_EQ(all[1], "");
    EXPECT_EQ(all[2], std::string(3000, 'c'));
    auto empty = pg.all_gather_bytes("");
    EXPECT_EQ(empty, std::vector<std::string>(3));
    pg.barrier();
  });
}

TEST(CollectivesArgs, BadArgumentsAreRejectedBeforeAnyTraffic) {
  run_ranks(2, [](ProcessGroup& pg) {
    auto expect_error = [](const std::function<void()>& f, const std::string& part) {
      try {
        f();
        ADD_FAILURE() << "expected ConfigError containing: " << part;
      } catch (const fsdp::ConfigError& e) {
        EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
      }
    };
    expect_error([&] { pg.all_gather(at::empty({10}), at::empty({4})); },
                 "all_gather: input has 4 elements, expected 5 (rank " + std::to_string(pg.rank()) +
                     "'s chunk of an output of 10 over 2 ranks)");
    expect_error([&] { pg.reduce_scatter(at::empty({3}), at::empty({10})); }, "reduce_scatter: output has 3 elements, expected 5");
    expect_error([&] { pg.all_reduce(at::ones({2}, at::kLong), ReduceOp::kAvg); },
                 "all_reduce: ReduceOp::kAvg needs a floating-point tensor, got Long");
    expect_error([&] { pg.all_gather(at::empty({4}, at::kDouble), at::empty({2})); },
                 "all_gather: output dtype Double differs from input dtype Float");
    expect_error([&] { pg.all_reduce(at::empty({4, 4}).t()); }, "all_reduce: tensor must be contiguous");
    expect_error([&] { pg.broadcast(at::empty({4}), 2); }, "broadcast: root=2 is out of range: expected 0 <= root < 2");
    expect_error([&] { pg.all_reduce(at::empty({2}, at::kComplexFloat)); }, "has unsupported dtype");
    // The group still works afterwards: nothing was sent.
    at::Tensor t = at::ones({3});
    pg.all_reduce(t).wait();
    EXPECT_TRUE(at::equal(t, at::full({3}, 2.0f)));
  });
}

TEST(ChunkRange, MatchesTorchChunk) {
  // torch.chunk(arange(5), 4) -> sizes 2, 2, 1, and an empty fourth chunk.
  EXPECT_EQ(chunk_range(5, 4, 0).numel, 2);
  EXPECT_EQ(chunk_range(5, 4, 2).offset, 4);
  EXPECT_EQ(chunk_range(5, 4, 2).numel, 1);
  EXPECT_EQ(chunk_range(5, 4, 3).numel, 0);
  EXPECT_EQ(chunk_range(0, 3, 1).numel, 0);
  int64_t total = 0;
  for (int r = 0; r < 7; ++r) total += chunk_range(100, 7, r).numel;
  EXPECT_EQ(total, 100);
}

}  // namespace
