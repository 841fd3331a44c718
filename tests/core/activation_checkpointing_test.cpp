// Activation checkpointing: the same gradients as without it (dropout
// included), re-run forwards, unchanged names, and every placement relative
// to FSDP wrapping.
#include <gtest/gtest.h>

#include <atomic>

#include "../support/subprocess.h"
#include "../support/thread_ranks.h"
#include "fsdp/core/activation_checkpointing.h"
#include "fsdp/error.h"
#include "../support/models.h"
#include "../support/transformer_model.h"

using namespace fsdp;
using namespace fsdp::testing;
using fsdp::testing::TempDir;

namespace {

std::atomic<int> g_forwards{0};

struct DropBlockImpl : torch::nn::Module {
  explicit DropBlockImpl(double p = 0.3) {
    fc1 = register_module("fc1", torch::nn::Linear(kDim, kHidden));
    fc2 = register_module("fc2", torch::nn::Linear(kHidden, kDim));
    drop = register_module("drop", torch::nn::Dropout(p));
    scale = register_buffer("scale", torch::full({kDim}, 0.5));
  }
  torch::Tensor forward(torch::Tensor x) {
    ++g_forwards;
    return x + fc2(drop(torch::tanh(fc1(x)))) * scale;
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::Dropout drop{nullptr};
  torch::Tensor scale;
};
TORCH_MODULE(DropBlock);

struct DropNetImpl : torch::nn::Module {
  explicit DropNetImpl(double p) {
    emb = register_module("emb", torch::nn::Embedding(kVocab, kDim));
    blocks = register_module("blocks", torch::nn::Sequential(DropBlock(p), DropBlock(p)));
    extra = register_module("extra", Unit<DropBlockImpl>(std::make_shared<DropBlockImpl>(p)));
    out = register_module("out", torch::nn::Linear(kDim, kVocab));
  }
  torch::Tensor forward(torch::Tensor tokens) { return out(extra(blocks->forward(emb(tokens).mean(1)))); }
  torch::nn::Embedding emb{nullptr};
  torch::nn::Sequential blocks{nullptr};
  Unit<DropBlockImpl> extra{nullptr};
  torch::nn::Linear out{nullptr};
};
TORCH_MODULE(DropNet);

std::shared_ptr<DropNetImpl> make_drop_net(uint64_t seed, double p) {
  std::lock_guard<std::mutex> lock(rng_mutex());
  torch::manual_seed(seed);
  return std::make_shared<DropNetImpl>(p);
}

// Loss and gradients of one forward/backward from RNG seed `seed`.
std::pair<torch::Tensor, std::map<std::string, torch::Tensor>> grads_of(DropNetImpl& net, const Batch& b,
                                                                       uint64_t seed) {
  torch::manual_seed(seed);
  net.zero_grad();
  auto loss = torch::nn::functional::cross_entropy(net.forward(b.tokens), b.target);
  loss.backward();
  std::map<std::string, torch::Tensor> g;
  for (auto& p : net.named_parameters()) g[p.key()] = p.value().grad().clone();
  return {loss.detach(), g};
}

TEST(ActivationCheckpointing, SameGradientsWithDropoutAndForwardsAreReRun) {
  auto batch = make_batches(1, 6, 4)[0];
  auto plain = make_drop_net(1, 0.3);
  auto ckpt = make_drop_net(1, 0.3);
  EXPECT_EQ(apply_activation_checkpointing(ckpt, checkpoint_module_types<DropBlockImpl>()), 3);
  EXPECT_TRUE(is_checkpointed(*ckpt->extra));
  EXPECT_FALSE(is_checkpointed(*plain->extra));
  g_forwards = 0;
  auto [loss_a, grads_a] = grads_of(*plain, batch, 77);
  EXPECT_EQ(g_forwards.load(), 3);
  g_forwards = 0;
  auto [loss_b, grads_b] = grads_of(*ckpt, batch, 77);
  const torch::Tensor after_checkpointed = torch::rand({3});
  EXPECT_EQ(g_forwards.load(), 6) << "each checkpointed block runs again in backward";
  EXPECT_TRUE(torch::equal(loss_a, loss_b));
  for (auto& [name, g] : grads_a) EXPECT_TRUE(torch::equal(g, grads_b.at(name))) << name;
  // The random stream after backward is where it would be without checkpointing.
  torch::manual_seed(77);
  plain->forward(batch.tokens);
  EXPECT_TRUE(torch::equal(after_checkpointed, torch::rand({3})));
}

TEST(ActivationCheckpointing, NamesAndSavedStateAreThoseOfThePlainModel) {
  auto plain = make_drop_net(1, 0.0);
  auto ckpt = make_drop_net(2, 0.0);
  apply_activation_checkpointing(ckpt, checkpoint_module_types<DropBlockImpl>());
  std::vector<std::string> a, b;
  for (auto& p : plain->named_parameters()) a.push_back(p.key());
  for (auto& p : ckpt->named_parameters()) b.push_back(p.key());
  EXPECT_EQ(a, b);
  EXPECT_EQ(plain->named_buffers().keys(), ckpt->named_buffers().keys());
  // Saved from the plain model, loaded into the checkpointed one, and back.
  TempDir dir;
  const std::string file = dir.path() + "/model.pt";
  DropNet plain_holder(plain), ckpt_holder(ckpt);
  torch::save(plain_holder, file);
  torch::load(ckpt_holder, file);
  for (auto& p : plain->named_parameters()) EXPECT_TRUE(torch::equal(p.value(), ckpt->named_parameters()[p.key()]));
  auto other = make_drop_net(3, 0.0);
  DropNet other_holder(other);
  torch::save(ckpt_holder, file);
  torch::load(other_holder, file);
  for (auto& p : plain->named_parameters()) EXPECT_TRUE(torch::equal(p.value(), other->named_parameters()[p.key()]));
  // Checkpointed to checkpointed (the seed's "both").
  auto both = make_drop_net(4, 0.0);
  apply_activation_checkpointing(both, checkpoint_module_types<DropBlockImpl>());
  DropNet both_holder(both);
  torch::load(both_holder, file);
  for (auto& p : plain->named_parameters()) EXPECT_TRUE(torch::equal(p.value(), both->named_parameters()[p.key()]));
}

// Several tensor arguments (one without gradient, one non-tensor) and a
// tuple result with a vector inside.
struct MultiImpl : torch::nn::Module {
  MultiImpl() {
    a = register_module("a", torch::nn::Linear(4, 4));
    b = register_module("b", torch::nn::Linear(4, 4));
  }
  std::tuple<torch::Tensor, std::vector<torch::Tensor>, int64_t> forward(torch::Tensor x, torch::Tensor mask,
                                                                          double scale) {
    auto h = torch::relu(a(x)) * mask;
    return {b(h) * scale, {h.sum(1), torch::sigmoid(h)}, h.size(0)};
  }
  torch::nn::Linear a{nullptr}, b{nullptr};
};

struct MultiNetImpl : torch::nn::Module {
  explicit MultiNetImpl(bool checkpoint) {
    auto m = std::make_shared<MultiImpl>();
    multi = checkpoint ? register_module("multi", CheckpointWrapper<MultiImpl>(m))
                       : register_module("multi", Unit<MultiImpl>(m));
  }
  torch::Tensor forward(torch::Tensor x) {
    auto [y, parts, n] = multi(x, (x > 0).to(torch::kFloat), 0.5);
    return y.sum() + parts[0].pow(2).sum() + parts[1].sum() * static_cast<double>(n);
  }
  Unit<MultiImpl> multi{nullptr};
};

TEST(ActivationCheckpointing, AnySignatureAndTupleResults) {
  std::map<std::string, torch::Tensor> grads[2];
  torch::Tensor x_grad[2];
  for (int ck = 0; ck < 2; ++ck) {
    torch::manual_seed(3);
    auto net = std::make_shared<MultiNetImpl>(ck == 1);
    auto x = torch::randn({5, 4}).requires_grad_(true);
    g_forwards = 0;
    net->forward(x).backward();
    for (auto& p : net->named_parameters()) grads[ck][p.key()] = p.value().grad().clone();
    x_grad[ck] = x.grad().clone();
  }
  EXPECT_TRUE(torch::equal(x_grad[0], x_grad[1]));
  for (auto& [name, g] : grads[0]) EXPECT_TRUE(torch::equal(g, grads[1].at(name))) << name;
}

TEST(ActivationCheckpointing, Misuse) {
  auto net = make_drop_net(1, 0.0);
  apply_activation_checkpointing(net, checkpoint_module_types<DropBlockImpl>());
  try {
    apply_activation_checkpointing(net, checkpoint_module_types<DropBlockImpl>());
    ADD_FAILURE();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("is already checkpointed"), std::string::npos) << e.what();
  }
  try {
    apply_activation_checkpointing(net, checkpoint_module_types<DropNetImpl>());
    ADD_FAILURE();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("check_fn selects the root module"), std::string::npos) << e.what();
  }
  auto block = std::make_shared<DropBlockImpl>();
  CheckpointWrapper<DropBlockImpl> once(block);
  EXPECT_THROW(CheckpointWrapper<DropBlockImpl> twice(block), ConfigError);
  // A plain member cannot be interposed.
  try {
    apply_activation_checkpointing(net, checkpoint_module_types<torch::nn::EmbeddingImpl>());
    ADD_FAILURE();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("selected module 'emb'"), std::string::npos) << e.what();
  }
}

enum class Placement { kNone, kBeforeWrap, kAfterWrap };

std::map<std::string, torch::Tensor> train_fsdp(dist::ProcessGroup& pg, Placement placement, ShardingStrategy s,
                                                bool bf16, double dropout, const std::vector<Batch>& batches) {
  FSDPOptions o = options_for_strategy(pg, s);
  o.auto_wrap_policy(transformer_auto_wrap_policy<DropBlockImpl>());
  if (bf16) {
    o.mixed_precision().param_dtype = torch::kBFloat16;
    o.mixed_precision().buffer_dtype = torch::kBFloat16;
  }
  auto net = make_drop_net(11, dropout);
  if (placement == Placement::kBeforeWrap) apply_activation_checkpointing(net, checkpoint_module_types<DropBlockImpl>());
  FullyShardedDataParallel<DropNetImpl> model(net, o);
  if (placement == Placement::kAfterWrap) {
    apply_activation_checkpointing(model.ptr(), checkpoint_module_types<DropBlockImpl>());
  }
  // Every rank has built its model before any trains: a checkpointed
  // backward restores the (process-wide) RNG state, which would disturb a
  // rank thread still drawing initial weights. NO_SHARD's forward has no
  // collective to hold a fast rank back.
  pg.barrier();
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(0.01));
  const int64_t local = 12 / pg.size();
  int step = 0;
  for (const auto& b : batches) {
    opt.zero_grad();
    if (dropout > 0) torch::manual_seed(500 + step++);  // only with one rank thread
    auto logits = model(b.tokens.narrow(0, pg.rank() * local, local));
    torch::nn::functional::cross_entropy(logits.to(torch::kFloat), b.target.narrow(0, pg.rank() * local, local))
        .backward();
    opt.step();
  }
  return to_map(full_parameters(model.ptr()));
}

struct AcCase {
  ShardingStrategy strategy;
  int world;
  bool bf16;
};

class CheckpointUnderFSDP : public ::testing::TestWithParam<AcCase> {};

TEST_P(CheckpointUnderFSDP, SameTrainingAsWithoutCheckpointing) {
  const AcCase c = GetParam();
  const auto batches = make_batches(3, 12, 8);
  run_ranks(c.world, [&](dist::ProcessGroup& pg) {
    auto plain = train_fsdp(pg, Placement::kNone, c.strategy, c.bf16, 0.0, batches);
    for (auto placement : {Placement::kBeforeWrap, Placement::kAfterWrap}) {
      auto got = train_fsdp(pg, placement, c.strategy, c.bf16, 0.0, batches);
      for (auto& [name, t] : plain) {
        EXPECT_TRUE(torch::equal(got.at(name), t))
            << name << (placement == Placement::kBeforeWrap ? " checkpointed before wrapping" : " after wrapping");
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Cases, CheckpointUnderFSDP,
                         ::testing::Values(AcCase{ShardingStrategy::kFullShard, 2, false},
                                           AcCase{ShardingStrategy::kFullShard, 2, true},
                                           AcCase{ShardingStrategy::kShardGradOp, 2, false},
                                           AcCase{ShardingStrategy::kNoShard, 2, false},
                                           AcCase{ShardingStrategy::kHybridShard, 4, false}),
                         [](const auto& info) {
                           return std::string(to_string(info.param.strategy)) + "_world" +
                                  std::to_string(info.param.world) + (info.param.bf16 ? "_bf16" : "");
                         });

TEST(ActivationCheckpointing, DropoutUnderFSDPReplaysTheSameMasks) {
  // One rank: the only thread drawing random numbers, so runs are repeatable.
  const auto batches = make_batches(3, 12, 9);
  run_ranks(1, [&](dist::ProcessGroup& pg) {
    auto plain = train_fsdp(pg, Placement::kNone, ShardingStrategy::kFullShard, false, 0.3, batches);
    for (auto placement : {Placement::kBeforeWrap, Placement::kAfterWrap}) {
      auto got = train_fsdp(pg, placement, ShardingStrategy::kFullShard, false, 0.3, batches);
      for (auto& [name, t] : plain) EXPECT_TRUE(torch::equal(got.at(name), t)) << name;
    }
  });
}

// PyTorch's FSDP(CheckpointWrapper(layer)) and Sequential(FSDP(lin1), lin2)
// patterns: units wrapped by hand before the outer wrap, some checkpointed.
struct ManualImpl : torch::nn::Module {
  explicit ManualImpl(const FSDPOptions& o, bool checkpoint) {
    if (checkpoint) {
      layer = register_module(
          "layer", FullyShardedDataParallel<DropBlockImpl>(CheckpointWrapper<DropBlockImpl>(DropBlock(0.0)), o));
    } else {
      layer = register_module("layer", FullyShardedDataParallel<DropBlockImpl>(DropBlock(0.0), o));
    }
    // One statement per module: the order of initialisation must be fixed.
    torch::nn::Linear lin1(kDim, kDim);
    torch::nn::Linear lin2(kDim, 3);
    seq = register_module("seq", torch::nn::Sequential(FullyShardedDataParallel<torch::nn::LinearImpl>(lin1, o), lin2));
  }
  torch::Tensor forward(torch::Tensor x) { return seq->forward(layer(x)); }
  Unit<DropBlockImpl> layer{nullptr};
  torch::nn::Sequential seq{nullptr};
};

TEST(ActivationCheckpointing, ManualNestingAndSequentialOfWrappedUnits) {
  torch::Tensor x, y;
  {
    std::lock_guard<std::mutex> lock(rng_mutex());
    torch::manual_seed(4);
    x = torch::randn({3, 4, kDim});
    y = torch::randn({3, 4, 3});
  }
  run_ranks(2, [&](dist::ProcessGroup& pg) {
    FSDPOptions o;
    o.process_group(borrow(pg));
    std::map<std::string, torch::Tensor> results[2];
    for (int ck = 0; ck < 2; ++ck) {
      std::shared_ptr<ManualImpl> net;
      {
        std::lock_guard<std::mutex> lock(rng_mutex());
        torch::manual_seed(5);
        net = std::make_shared<ManualImpl>(o, ck == 1);
      }
      FullyShardedDataParallel<ManualImpl> model(net, o);
      EXPECT_EQ(fsdp_modules(model.ptr()).size(), 3u);
      EXPECT_EQ(is_checkpointed(*net->layer), ck == 1);
      torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
      for (int s = 0; s < 3; ++s) {
        opt.zero_grad();
        torch::mse_loss(model(x[s].narrow(0, pg.rank() * 2, 2)), y[s].narrow(0, pg.rank() * 2, 2)).backward();
        opt.step();
      }
      results[ck] = to_map(full_parameters(model.ptr()));
    }
    // Single-process reference for the same model, unwrapped.
    auto ref_net = [&] {
      std::lock_guard<std::mutex> lock(rng_mutex());
      torch::manual_seed(5);
      torch::nn::Sequential seq;
      seq->push_back(DropBlock(0.0));
      seq->push_back(torch::nn::Linear(kDim, kDim));
      seq->push_back(torch::nn::Linear(kDim, 3));
      return seq;
    }();
    torch::optim::SGD opt(ref_net->parameters(), torch::optim::SGDOptions(0.1));
    for (int s = 0; s < 3; ++s) {
      opt.zero_grad();
      torch::mse_loss(ref_net->forward(x[s]), y[s]).backward();
      opt.step();
    }
    std::vector<torch::Tensor> ref;
    for (auto& p : ref_net->parameters()) ref.push_back(p);
    const std::vector<std::string> names = {"layer.fc1.weight", "layer.fc1.bias", "layer.fc2.weight",
                                            "layer.fc2.bias",   "seq.0.weight",   "seq.0.bias",
                                            "seq.1.weight",     "seq.1.bias"};
    for (size_t i = 0; i < names.size(); ++i) {
      for (int ck = 0; ck < 2; ++ck) {
        ASSERT_TRUE(results[ck].count(names[i])) << names[i];
        EXPECT_LE((results[ck].at(names[i]) - ref[i]).abs().max().item<double>(), 1e-5) << names[i] << " ckpt " << ck;
      }
    }
  });
}

}  // namespace

namespace {

TEST(ActivationCheckpointing, TransformerLayersFSDPOfCheckpointWrapper) {
  torch::Tensor data;
  {
    std::lock_guard<std::mutex> lock(rng_mutex());
    torch::manual_seed(22);
    data = torch::randint(0, kVocab, {3, 10, 4});  // 3 steps, 10 tokens, batch 4
  }
  // Single process, with dropout: checkpointed == plain, bit for bit.
  auto plain = train_transformer(nullptr, 0.1, false, data);
  auto ckpt = train_transformer(nullptr, 0.1, true, data);
  for (auto& [name, t] : plain) EXPECT_TRUE(torch::equal(ckpt.at(name), t)) << name;
  // FSDP world 1 with dropout (one thread draws), world 2 without.
  run_ranks(1, [&](dist::ProcessGroup& pg) {
    auto a = train_transformer(&pg, 0.1, false, data);
    auto b = train_transformer(&pg, 0.1, true, data);
    for (auto& [name, t] : a) EXPECT_TRUE(torch::equal(b.at(name), t)) << name;
  });
  auto reference = train_transformer(nullptr, 0.0, false, data);
  run_ranks(2, [&](dist::ProcessGroup& pg) {
    auto a = train_transformer(&pg, 0.0, false, data);
    auto b = train_transformer(&pg, 0.0, true, data);
    for (auto& [name, t] : a) {
      EXPECT_TRUE(torch::equal(b.at(name), t)) << name;
      EXPECT_LE((t - reference.at(name)).abs().max().item<double>(), 1e-5) << name;
    }
  });
}

}  // namespace
