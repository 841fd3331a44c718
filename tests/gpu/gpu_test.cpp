// The CUDA path: NCCL groups, FSDP on CUDA parameters, float16 compute,
// activation checkpointing's CUDA RNG replay, checkpoints from CUDA shards,
// and the strategy's precisions. Built only against a CUDA LibTorch; every
// test skips (with a message) where no CUDA device is present. One GPU is
// enough: the groups here have one rank (NCCL refuses two ranks on one device;
// the multi-rank collective logic is the same code the CPU suites test).
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <filesystem>
#include <iostream>

#include "fsdp/core/activation_checkpointing.h"
#include "fsdp/checkpoint/checkpoint_io.h"
#include "fsdp/error.h"
#include "fsdp/fsdp.h"
#include "fsdp/models/gpt.h"
#include "fsdp/strategy/strategy.h"

using namespace fsdp;
namespace fs = std::filesystem;

namespace {

#define REQUIRE_CUDA()                                                       \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device here"

const at::Device kCuda(at::kCUDA, 0);

dist::ProcessGroupPtr nccl_world() {
  dist::InitOptions o;
  o.backend = launch::Backend::kNccl;
  o.local_rank = 0;
  return dist::init_process_group(o);
}

models::GPTConfig tiny(double dropout = 0.0) {
  models::GPTConfig c;
  c.context = 16;
  c.dim = 64;
  c.layers = 2;
  c.heads = 4;
  c.dropout = dropout;
  return c;
}

std::shared_ptr<models::GPTImpl> make_gpt(uint64_t seed, const models::GPTConfig& c) {
  torch::manual_seed(seed);
  return std::make_shared<models::GPTImpl>(c);
}

std::pair<at::Tensor, at::Tensor> batch(int64_t step, const models::GPTConfig& c) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(100 + static_cast<uint64_t>(step));
  at::Tensor t = at::randint(0, c.vocab_size, {4, c.context + 1}, gen, at::kLong).to(kCuda);
  return {t.narrow(1, 0, c.context), t.narrow(1, 1, c.context)};
}

std::map<std::string, at::Tensor> cpu_params(const std::vector<std::pair<std::string, at::Tensor>>& named) {
  std::map<std::string, at::Tensor> m;
  for (const auto& [k, v] : named) m[k] = v.detach().to(at::kCPU, at::kFloat).clone();
  return m;
}

void expect_close(const std::map<std::string, at::Tensor>& got, const std::map<std::string, at::Tensor>& want,
                  double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [k, v] : want) {
    ASSERT_TRUE(got.count(k)) << k;
    EXPECT_TRUE(torch::allclose(got.at(k), v, tol, tol)) << k << " max diff "
                                                          << (got.at(k) - v).abs().max().item<double>();
  }
}

}  // namespace

TEST(Gpu, NcclGroupIsOnCudaAndStagesHostTensors) {
  REQUIRE_CUDA();
  auto pg = nccl_world();
  EXPECT_EQ(pg->backend(), launch::Backend::kNccl);
  EXPECT_TRUE(pg->device().is_cuda());
  at::Tensor host = at::full({3}, 2.0);
  pg->all_reduce(host, dist::ReduceOp::kSum).wait();  // a CPU tensor travels through the device
  EXPECT_TRUE(torch::equal(host, at::full({3}, 2.0)));
  at::Tensor out = at::empty({8}, at::TensorOptions().device(kCuda));
  at::Tensor in = at::arange(8, at::TensorOptions().dtype(at::kFloat).device(kCuda));
  pg->all_gather(out, in).wait();
  EXPECT_TRUE(torch::equal(out.cpu(), in.cpu()));
  EXPECT_EQ(pg->broadcast_bytes("hello", 0), "hello");
  pg->barrier();
}

TEST(Gpu, CpuParametersUnderNcclAreNamed) {
  REQUIRE_CUDA();
  auto pg = nccl_world();
  FSDPOptions o;
  o.process_group(pg);
  try {
    FullyShardedDataParallel<models::GPTImpl> m(make_gpt(1, tiny()), o);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("device_id"), std::string::npos) << e.what();
  }
  o.device_id(kCuda);
  o.cpu_offload().offload_params = true;
  EXPECT_THROW((FullyShardedDataParallel<models::GPTImpl>(make_gpt(1, tiny()), o)), ConfigError);
}

// FSDP on CUDA trains exactly like the plain model on CUDA, per strategy.
TEST(Gpu, ParityWithPlainTrainingOnCuda) {
  REQUIRE_CUDA();
  auto pg = nccl_world();
  const auto c = tiny();
  auto plain = make_gpt(7, c);
  plain->to(kCuda);
  torch::optim::AdamW popt(plain->parameters(), torch::optim::AdamWOptions(1e-3));
  for (int s = 0; s < 5; ++s) {
    auto [x, y] = batch(s, c);
    popt.zero_grad();
    models::gpt_loss(plain->forward(x), y).backward();
    popt.step();
  }
  const auto want = cpu_params(plain->named_parameters().pairs());
  for (auto strategy : {ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp, ShardingStrategy::kNoShard}) {
    for (bool orig : {false, true}) {
      SCOPED_TRACE(std::string(to_string(strategy)) + (orig ? " use_orig_params" : ""));
      FSDPOptions o;
      o.process_group(pg);
      o.sharding_strategy(strategy);
      o.use_orig_params(orig);
      o.device_id(kCuda);
      o.auto_wrap_policy(transformer_auto_wrap_policy<models::GPTBlockImpl>());
      FullyShardedDataParallel<models::GPTImpl> model(make_gpt(7, c), o);
      torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-3));
      for (int s = 0; s < 5; ++s) {
        auto [x, y] = batch(s, c);
        opt.zero_grad();
        models::gpt_loss(model(x), y).backward();
        opt.step();
      }
      expect_close(cpu_params(full_parameters(model.ptr())), want, 1e-5);
    }
  }
}

// float16 compute (no CPU kernels in LibTorch 1.13) runs on CUDA: the
// forward computes in float16 and training moves the loss.
TEST(Gpu, Float16MixedPrecisionComputes) {
  REQUIRE_CUDA();
  auto pg = nccl_world();
  const auto c = tiny();
  FSDPOptions o;
  o.process_group(pg);
  o.device_id(kCuda);
  o.mixed_precision().param_dtype = at::kHalf;
  o.mixed_precision().reduce_dtype = at::kHalf;
  o.auto_wrap_policy(transformer_auto_wrap_policy<models::GPTBlockImpl>());
  FullyShardedDataParallel<models::GPTImpl> model(make_gpt(3, c), o);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(3e-3));
  auto [x, y] = batch(0, c);
  EXPECT_EQ(model(x).scalar_type(), at::kHalf);
  double first = 0, last = 0;
  for (int s = 0; s < 30; ++s) {
    opt.zero_grad();
    auto loss = models::gpt_loss(model(x), y);
    loss.backward();
    opt.step();
    (s == 0 ? first : last) = loss.item<double>();
  }
  EXPECT_TRUE(std::isfinite(last));
  EXPECT_LT(last, first * 0.8) << "first " << first << " last " << last;
  for (const auto& p : model->parameters()) EXPECT_EQ(p.scalar_type(), at::kFloat);  // float32 masters
}

// Dropout on CUDA under activation checkpointing: the re-run draws what the
// first run drew (the CUDA generator is replayed), so gradients match.
TEST(Gpu, CheckpointingReplaysCudaDropout) {
  REQUIRE_CUDA();
  const auto c = tiny(/*dropout=*/0.3);
  auto grads = [&](bool checkpointed) {
    auto m = make_gpt(5, c);
    m->to(kCuda);
    if (checkpointed) apply_activation_checkpointing(m, checkpoint_module_types<models::GPTBlockImpl>());
    auto [x, y] = batch(0, c);
    torch::manual_seed(99);
    models::gpt_loss(m->forward(x), y).backward();
    std::map<std::string, at::Tensor> g;
    for (const auto& p : m->named_parameters()) g[p.key()] = p.value().grad().cpu();
    return g;
  };
  expect_close(grads(true), grads(false), 1e-5);
}

// Checkpoints written from CUDA shards load back into CUDA shards, in both formats.
TEST(Gpu, CheckpointsRoundTripFromCuda) {
  REQUIRE_CUDA();
  auto pg = nccl_world();
  const auto c = tiny();
  const fs::path dir = fs::temp_directory_path() / "fsdp_gpu_ckpt";
  fs::remove_all(dir);
  for (auto format : {CheckpointFormat::kSharded, CheckpointFormat::kFull}) {
    FSDPOptions o;
    o.process_group(pg);
    o.device_id(kCuda);
    o.auto_wrap_policy(transformer_auto_wrap_policy<models::GPTBlockImpl>());
    FullyShardedDataParallel<models::GPTImpl> a(make_gpt(11, c), o);
    FullyShardedDataParallel<models::GPTImpl> b(make_gpt(12, c), o);
    const std::string path = (dir / (format == CheckpointFormat::kFull ? "full.pt" : "sharded")).string();
    std::cerr << "saving and loading " << path << std::endl;
    CheckpointState sa;
    sa.model("model", a.ptr());
    CheckpointOptions co;
    co.format(format);
    save_checkpoint(path, sa, *pg, co);
    CheckpointState sb;
    sb.model("model", b.ptr());
    std::cerr << "saved; loading" << std::endl;
    load_checkpoint(path, sb, *pg);
    std::cerr << "loaded" << std::endl;
    expect_close(cpu_params(full_parameters(b.ptr())), cpu_params(full_parameters(a.ptr())), 0);
  }
  fs::remove_all(dir);
}

// Each precision name trains through the strategy on CUDA ("16-mixed" with its
// gradient scaler), and saves and reloads a checkpoint.
TEST(Gpu, StrategyTrainsInEveryPrecision) {
  REQUIRE_CUDA();
  auto pg = nccl_world();
  const auto c = tiny();
  for (const std::string precision : {"32-true", "bf16-mixed", "16-mixed", "bf16-true", "16-true"}) {
    SCOPED_TRACE(precision);
    FSDPStrategy strategy(FSDPStrategyOptions()
                              .world(pg)
                              .precision(precision)
                              .auto_wrap_module_types<models::GPTBlockImpl>()
                              .activation_checkpointing_module_types<models::GPTBlockImpl>());
    strategy.setup_environment();
    EXPECT_TRUE(strategy.root_device().is_cuda());
    auto model = strategy.setup_module(make_gpt(21, c));
    torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(3e-3).eps(1e-4));
    strategy.setup_optimizer(opt);
    auto [x, y] = batch(0, c);
    double first = 0, last = 0;
    for (int s = 0; s < 30; ++s) {
      opt.zero_grad();
      auto loss = models::gpt_loss(model(x), y);
      EXPECT_EQ(strategy.grad_scaler() != nullptr, precision == "16-mixed");
      strategy.backward(loss);
      strategy.clip_gradients_norm(model.ptr(), opt, 1.0);
      strategy.optimizer_step(opt);
      (s == 0 ? first : last) = strategy.all_reduce(loss.detach().to(at::kFloat)).item<double>();
    }
    EXPECT_TRUE(std::isfinite(last));
    EXPECT_LT(last, first * 0.9) << "first " << first << " last " << last;
    const std::string path = (fs::temp_directory_path() / ("fsdp_gpu_strategy_" + precision)).string();
    fs::remove_all(path);
    CheckpointState state;
    state.model("model", model.ptr()).optimizer("optimizer", opt);
    strategy.save_checkpoint(path, state);
    strategy.load_checkpoint(path, state);
    fs::remove_all(path);
  }
}

// A model built under EmptyInitGuard (module_init_context(empty_init=true))
// is materialised unit by unit straight onto the GPU, with the values a
// CPU materialisation of the same seed gives.
TEST(Gpu, EmptyInitMaterialisesOnCuda) {
  REQUIRE_CUDA();
  auto pg = nccl_world();
  const auto c = tiny();
  auto build_deferred = [&] {
    torch::manual_seed(31);
    EmptyInitGuard guard;
    return std::make_shared<models::GPTImpl>(c);
  };
  auto reference = build_deferred();
  materialize(reference);
  const auto want = cpu_params(reference->named_parameters().pairs());
  FSDPOptions o;
  o.process_group(pg);
  o.device_id(kCuda);
  o.auto_wrap_policy(transformer_auto_wrap_policy<models::GPTBlockImpl>());
  FullyShardedDataParallel<models::GPTImpl> model(build_deferred(), o);
  expect_close(cpu_params(full_parameters(model.ptr())), want, 0);
  auto [x, y] = batch(0, c);
  EXPECT_TRUE(std::isfinite(models::gpt_loss(model(x), y).item<double>()));
}

