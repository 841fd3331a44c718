// Tests that need each rank to be a process of its own (run under fsdp-run by
// CTest), where every rank must draw from its own random generator: dropout
// at world 2, and empty_init's materialisation at setup.
#include <gtest/gtest.h>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <torch/version.h>

#include <atomic>
#include <cstdlib>

#include "fsdp/distributed/process_group.h"
#include "fsdp/error.h"
#include "fsdp/fsdp.h"
#include "fsdp/models/gpt.h"
#include "fsdp/strategy/strategy.h"
#include "../support/transformer_model.h"

namespace {

fsdp::dist::ProcessGroupPtr world() {
  static fsdp::dist::ProcessGroupPtr pg = fsdp::dist::init_process_group_from_env();
  return pg;
}

TEST(ActivationCheckpointingProcesses, DropoutAtWorldTwoGivesTheSameTraining) {
  if (std::getenv("RANK") == nullptr) GTEST_SKIP() << "run under fsdp-run";
  auto pg = world();
  ASSERT_EQ(pg->size(), 2);
  torch::Tensor data;
  {
    torch::manual_seed(22);
    data = torch::randint(0, fsdp::testing::kVocab, {3, 10, 4});
  }
  // Each rank draws its own dropout masks; the checkpointed run must replay them.
  auto plain = fsdp::testing::train_transformer(pg.get(), 0.1, false, data);
  auto ckpt = fsdp::testing::train_transformer(pg.get(), 0.1, true, data);
  for (auto& [name, t] : plain) EXPECT_TRUE(torch::equal(ckpt.at(name), t)) << name;
  // Dropout really acted: a run without it ends elsewhere.
  auto no_dropout = fsdp::testing::train_transformer(pg.get(), 0.0, false, data);
  double diff = 0;
  for (auto& [name, t] : plain) diff = std::max(diff, (t - no_dropout.at(name)).abs().max().item<double>());
  EXPECT_GT(diff, 1e-4);
}

// Under module_init_context(empty_init=true) each rank draws the values of
// its units at setup: ranks seeded alike draw the same ones, so the shards
// form the model a one-process materialisation of the same seed gives.
TEST(EmptyInitProcesses, RanksMaterialiseTheSameValues) {
  if (std::getenv("RANK") == nullptr) GTEST_SKIP() << "run under fsdp-run";
  auto pg = world();
  fsdp::models::GPTConfig c;
  c.context = 16;
  c.dim = 64;
  c.layers = 4;
  auto build = [&](bool empty_init, uint64_t seed) {
    torch::manual_seed(seed);
    fsdp::EmptyInitGuard guard(empty_init);
    return std::make_shared<fsdp::models::GPTImpl>(c);
  };
  auto reference = build(true, 8);
  fsdp::materialize(reference);
  fsdp::FSDPStrategy s(fsdp::FSDPStrategyOptions().world(pg).seed(8).auto_wrap_module_types<fsdp::models::GPTBlockImpl>());
  s.setup_environment();
  std::shared_ptr<fsdp::models::GPTImpl> net;
  {
    torch::manual_seed(8);
    auto init = s.module_init_context(true);
    net = std::make_shared<fsdp::models::GPTImpl>(c);
  }
  auto model = s.setup_module(net);
  auto want = reference->named_parameters();
  for (const auto& [name, t] : fsdp::full_parameters(model.ptr())) {
    ASSERT_TRUE(want.contains(name)) << name;
    EXPECT_TRUE(torch::equal(t, want[name])) << name;
  }
  // They are an eager build's from the same seed; another seed gives others.
  auto eager = build(false, 8);
  for (const auto& p : eager->named_parameters()) EXPECT_TRUE(torch::equal(p.value(), want[p.key()])) << p.key();
  auto other = build(false, 9);
  EXPECT_FALSE(torch::equal(other->named_parameters()["blocks.0.fc.weight"], want["blocks.0.fc.weight"]));
}

// Counts the bytes LibTorch's CPU allocator has handed out and not taken
// back, and their peak: every tensor's memory, the runtime's pool included.
class CountingAllocator : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* base) : base_(base) {}
#if TORCH_VERSION_MAJOR >= 2
  c10::DataPtr allocate(size_t n) override { return count(n); }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }
#else
  c10::DataPtr allocate(size_t n) const override { return const_cast<CountingAllocator*>(this)->count(n); }
#endif
  int64_t live() const { return live_; }
  int64_t peak() const { return peak_; }
  void reset_peak() { peak_ = live_.load(); }

 private:
  struct Ctx {
    CountingAllocator* self;
    c10::DataPtr inner;
    size_t n;
  };
  static void release(void* p) {
    std::unique_ptr<Ctx> ctx(static_cast<Ctx*>(p));
    ctx->self->live_ -= static_cast<int64_t>(ctx->n);
  }
  c10::DataPtr count(size_t n) {
    c10::DataPtr inner = base_->allocate(n);
    void* data = inner.get();
    const int64_t now = live_ += static_cast<int64_t>(n);
    for (int64_t p = peak_; now > p && !peak_.compare_exchange_weak(p, now);) {
    }
    return c10::DataPtr(data, new Ctx{this, std::move(inner), n}, &release, c10::Device(c10::kCPU));
  }
  c10::Allocator* base_;
  std::atomic<int64_t> live_{0}, peak_{0};
};

// A stack of wide linear layers: model state dominates, activations are
// a few KiB (batch 2).
struct WideImpl : torch::nn::Module {
  explicit WideImpl(int64_t width) { fc = register_module("fc", torch::nn::Linear(width, width)); }
  torch::Tensor forward(torch::Tensor x) { return torch::tanh(fc(x)); }
  torch::nn::Linear fc{nullptr};
};

// FULL_SHARD's memory at world 2, counted by the allocator: the peak a rank
// holds while training with AdamW is its sharded state (parameters,
// gradients, the two moments) plus at most 7 + 1.5 * max_reductions_in_flight
// unit-sized buffers. Measured (docs/performance.md): 4 without any
// prefetch or reduction in flight (the computing unit's full parameters and
// full gradient, the reduce-scatter's staging inside LibTorch's Gloo, the
// optimizer's temporaries), 2.5 more for prefetching (the next unit's
// parameters and the all-gather's staging), and 1.5 per reduction in flight
// (its full-gradient input, and its output shard, which exists before the
// gradient it becomes would otherwise). Where LibTorch's Gloo lacks its own
// one-tensor collectives (1.13), fsdp-cpp's fallbacks stage one more
// unit-sized buffer per collective: 9 + 2.5 per reduction in flight.
int64_t peak_over_state_in_units(fsdp::dist::ProcessGroupPtr pg, CountingAllocator& counting, int in_flight,
                                 double* units_out) {
  torch::nn::Sequential seq;
  {
    torch::manual_seed(1);
    fsdp::EmptyInitGuard empty;  // the whole model never exists on a rank
    for (int i = 0; i < 8; ++i) seq->push_back(fsdp::Unit<WideImpl>(int64_t{384}));
  }
  fsdp::FSDPOptions o;
  o.process_group(pg);
  o.auto_wrap_policy(fsdp::transformer_auto_wrap_policy<WideImpl>());
  o.forward_prefetch(true);
  o.max_reductions_in_flight(in_flight);
  fsdp::FullyShardedDataParallel<torch::nn::SequentialImpl> model(seq, o);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-3));
  const auto stats = fsdp::memory_stats(model.ptr());
  const int64_t unit = stats.largest_unit_bytes;
  const int64_t state = 4 * stats.sharded_param_bytes;  // shard, its gradient, AdamW's two moments
  const int64_t before = counting.live();
  counting.reset_peak();
  for (int step = 0; step < 4; ++step) {
    opt.zero_grad();
    model(torch::full({2, 384}, 0.01 * (step + 1))).pow(2).sum().backward();
    opt.step();
  }
  const int64_t peak = counting.peak() - before + stats.sharded_param_bytes;  // the shards were there before
  *units_out = static_cast<double>(peak - state) / static_cast<double>(unit);
  std::cout << "rank " << pg->rank() << ", max_reductions_in_flight " << in_flight << ": peak " << peak
            << " B = sharded state " << state << " B + " << *units_out << " units of " << unit << " B" << std::endl;
  // The runtime really sharded: a rank never held more than two full units at once.
  EXPECT_LE(fsdp::runtime_stats(model.ptr()).peak_units_unsharded, 2);
  // Not trivially true: the unsharded model with its AdamW state is far larger.
  EXPECT_GT(8 * unit * 4, state + (9 + 5 * in_flight / 2) * unit);
  return unit;
}

TEST(MemoryProcesses, PeakIsTheShardedStatePlusAFewUnits) {
  if (std::getenv("RANK") == nullptr) GTEST_SKIP() << "run under fsdp-run";
  auto pg = world();
  ASSERT_EQ(pg->size(), 2);
  static CountingAllocator counting(c10::GetCPUAllocator());
  c10::SetAllocator(c10::kCPU, &counting, /*priority=*/100);
  const double slack = 0.25;  // activations, the loss, small temporaries: well under a quarter unit here
  double waited = 0, overlapped = 0;
  peak_over_state_in_units(pg, counting, 0, &waited);
  peak_over_state_in_units(pg, counting, 2, &overlapped);
  const bool native = pg->native_all_gather() && pg->native_reduce_scatter();
  const double fixed = native ? 7 : 9, per_reduction = native ? 1.5 : 2.5;
  EXPECT_LE(waited, fixed + slack);
  EXPECT_LE(overlapped, fixed + per_reduction * 2 + slack);
}

// Two strategies in one process: the second uses the world group the first
// joined (Lightning reuses the initialised default group) instead of failing
// to serve the store's port again; an environment that disagrees is refused.
TEST(StrategyProcesses, ASecondStrategyReusesTheWorldGroup) {
  if (std::getenv("RANK") == nullptr) GTEST_SKIP() << "run under fsdp-run";
  fsdp::FSDPStrategy first;
  first.setup_environment();
  fsdp::FSDPStrategy second;
  second.setup_environment();
  EXPECT_EQ(&first.group(), &second.group());
  EXPECT_EQ(second.world_size(), 2);
  EXPECT_EQ(second.all_reduce(torch::ones({1}), "sum").item<float>(), 2.0f);
  const std::string world_size = std::getenv("WORLD_SIZE");
  ::setenv("WORLD_SIZE", "3", 1);
  fsdp::FSDPStrategy third;
  try {
    third.setup_environment();
    ADD_FAILURE() << "no error";
  } catch (const fsdp::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("already joined the world group as rank"), std::string::npos) << e.what();
  }
  ::setenv("WORLD_SIZE", world_size.c_str(), 1);
  first.barrier();
}

}  // namespace
