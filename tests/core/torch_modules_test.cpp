// fsdp::Unit over LibTorch's own modules (which reach torch::nn::Module as a
// virtual base through Cloneable): each compiles, runs unwrapped, and trains
// as an FSDP unit exactly as the plain model does, built eagerly or under
// EmptyInitGuard.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <mutex>

#include "../support/thread_ranks.h"
#include "fsdp/error.h"
#include "fsdp/fsdp.h"
#include "../support/models.h"

using namespace fsdp;
using namespace fsdp::testing;

namespace {

constexpr int64_t kZooVocab = 10, kZooWidth = 8;

struct ZooImpl : torch::nn::Module {
  ZooImpl() {
    emb = register_module("emb", Unit<torch::nn::EmbeddingImpl>(kZooVocab, kZooWidth));
    lin = register_module("lin", Unit<torch::nn::LinearImpl>(torch::nn::LinearOptions(kZooWidth, kZooWidth)));
    conv = register_module("conv", Unit<torch::nn::Conv1dImpl>(torch::nn::Conv1dOptions(kZooWidth, kZooWidth, 3).padding(1)));
    norm = register_module("norm", Unit<torch::nn::LayerNormImpl>(torch::nn::LayerNormOptions({kZooWidth})));
    bn = register_module("bn", Unit<torch::nn::BatchNorm1dImpl>(kZooWidth));
    gru = register_module("gru", Unit<torch::nn::GRUImpl>(torch::nn::GRUOptions(kZooWidth, kZooWidth).batch_first(true)));
    seq = register_module("seq", Unit<torch::nn::SequentialImpl>(torch::nn::Linear(kZooWidth, kZooWidth), torch::nn::ReLU(),
                                                                 torch::nn::Linear(kZooWidth, kZooVocab)));
  }
  at::Tensor forward(const at::Tensor& tokens) {
    const auto b = tokens.size(0), t = tokens.size(1);
    auto x = lin(emb(tokens));
    x = conv(x.transpose(1, 2)).transpose(1, 2);
    x = bn(norm(x).reshape({b * t, kZooWidth})).reshape({b, t, kZooWidth});
    x = std::get<0>(gru(x));
    return seq(x);
  }
  Unit<torch::nn::EmbeddingImpl> emb{nullptr};
  Unit<torch::nn::LinearImpl> lin{nullptr};
  Unit<torch::nn::Conv1dImpl> conv{nullptr};
  Unit<torch::nn::LayerNormImpl> norm{nullptr};
  Unit<torch::nn::BatchNorm1dImpl> bn{nullptr};
  Unit<torch::nn::GRUImpl> gru{nullptr};
  Unit<torch::nn::SequentialImpl> seq{nullptr};
};
TORCH_MODULE(Zoo);

AutoWrapPolicy zoo_policy() {
  return transformer_auto_wrap_policy<torch::nn::EmbeddingImpl, torch::nn::LinearImpl, torch::nn::Conv1dImpl,
                                      torch::nn::LayerNormImpl, torch::nn::BatchNorm1dImpl, torch::nn::GRUImpl,
                                      torch::nn::SequentialImpl>();
}

// Batch norm in eval mode: with batch statistics a rank's half batch would
// not match the whole batch (data parallelism needs SyncBatchNorm for that).
Zoo build(uint64_t seed, bool empty_init) {
  std::lock_guard<std::mutex> lock(rng_mutex());
  torch::manual_seed(seed);
  EmptyInitGuard guard(empty_init);
  Zoo zoo;
  zoo->bn->eval();
  return zoo;
}

// One SGD step on a fixed batch (the same global batch split over ranks).
std::pair<at::Tensor, at::Tensor> batch(int rank, int world) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  auto tokens = at::randint(0, kZooVocab, {4, 5}, gen, at::kLong);
  auto target = at::randint(0, kZooVocab, {4, 5}, gen, at::kLong);
  const int64_t per = 4 / world;
  return {tokens.narrow(0, rank * per, per), target.narrow(0, rank * per, per)};
}

}  // namespace

TEST(TorchModuleUnits, RunUnwrappedAndRefuseUseBeforeMaterialisation) {
  auto zoo = build(3, false);
  auto [x, y] = batch(0, 1);
  EXPECT_EQ(zoo(x).sizes(), (std::vector<int64_t>{4, 5, kZooVocab}));
  EXPECT_FALSE(zoo->lin.is_fsdp_unit());
  auto deferred = build(3, true);
  EXPECT_THROW(deferred->lin(torch::zeros({1, kZooWidth})), ConfigError);
  materialize(deferred.ptr());
  auto want = named_params(*zoo);
  for (const auto& [name, t] : named_params(*deferred)) EXPECT_TRUE(torch::equal(t, want.at(name))) << name;
}

TEST(TorchModuleUnits, TrainAsUnitsLikeThePlainModelEagerAndUnderEmptyInit) {
  constexpr int kWorld = 2;
  auto plain = build(5, false);
  torch::optim::SGD plain_opt(plain->parameters(), 0.1);
  {
    auto [x, y] = batch(0, 1);
    torch::nn::functional::cross_entropy(plain(x).reshape({-1, kZooVocab}), y.reshape(-1)).backward();
    plain_opt.step();
  }
  const auto want = named_params(*plain);
  for (const bool empty_init : {false, true}) {
    run_ranks(kWorld, [&](dist::ProcessGroup& pg) {
      auto net = build(5, empty_init);
      pg.barrier();  // no rank wraps (replaying the shared generator) while another builds
      FSDPOptions o;
      o.process_group(borrow(pg));
      o.auto_wrap_policy(zoo_policy());
      o.use_orig_params(true);
      FullyShardedDataParallel<ZooImpl> model(net, o);
      EXPECT_TRUE(model->lin.is_fsdp_unit());
      EXPECT_TRUE(model->gru.is_fsdp_unit());
      EXPECT_TRUE(model->seq.is_fsdp_unit());
      torch::optim::SGD opt(model->parameters(), 0.1);
      auto [x, y] = batch(pg.rank(), kWorld);
      // The mean over the global batch: each rank's mean, averaged by FSDP.
      torch::nn::functional::cross_entropy(model(x).reshape({-1, kZooVocab}), y.reshape(-1)).backward();
      opt.step();
      expect_close(to_map(full_parameters(model.ptr())), want, 1e-5,
                   std::string(empty_init ? "empty_init" : "eager") + ", rank " + std::to_string(pg.rank()));
    });
  }
}
