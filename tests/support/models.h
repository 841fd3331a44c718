// Test models for FSDP: a small language-model-shaped net with a Sequential
// of blocks (auto-wrappable with no change), a fsdp::Unit member, a buffer,
// and an embedding tied to the output projection. Sizes are odd on purpose
// so that nothing divides by the world size.
#pragma once

#include <torch/torch.h>

#include <map>
#include <mutex>

#include <gtest/gtest.h>

#include "fsdp/fsdp.h"
#include "thread_ranks.h"  // borrow

namespace fsdp::testing {

constexpr int64_t kVocab = 11;
constexpr int64_t kDim = 7;
constexpr int64_t kHidden = 13;

struct BlockImpl : torch::nn::Module {
  BlockImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(kDim, kHidden));
    fc2 = register_module("fc2", torch::nn::Linear(kHidden, kDim));
    scale = register_buffer("scale", torch::full({kDim}, 0.5));
  }
  torch::Tensor forward(torch::Tensor x) { return x + fc2(torch::tanh(fc1(x))) * scale; }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::Tensor scale;
};
TORCH_MODULE(Block);

// The output projection shares the embedding's weight (not registered here).
struct TiedHeadImpl : torch::nn::Module {
  explicit TiedHeadImpl(torch::Tensor w) : weight(std::move(w)) {
    bias = register_parameter("bias", torch::zeros({kVocab}));
  }
  torch::Tensor forward(torch::Tensor h) { return torch::nn::functional::linear(h, weight, bias); }
  torch::Tensor weight, bias;
};
TORCH_MODULE(TiedHead);

struct NetImpl : torch::nn::Module {
  // `inner_options`: when set, `extra` is wrapped manually (nested FSDP).
  explicit NetImpl(const FSDPOptions* inner_options = nullptr) {
    emb = register_module("emb", torch::nn::Embedding(kVocab, kDim));
    blocks = register_module("blocks", torch::nn::Sequential(Block(), Block()));
    if (inner_options != nullptr) {
      extra = register_module("extra", FullyShardedDataParallel<BlockImpl>(std::make_shared<BlockImpl>(), *inner_options));
    } else {
      extra = register_module("extra", Unit<BlockImpl>(std::make_shared<BlockImpl>()));
    }
    head = register_module("head", TiedHead(emb->weight));
  }
  torch::Tensor forward(torch::Tensor tokens) {
    auto h = emb(tokens).mean(1);
    h = blocks->forward(h);
    h = extra(h);
    return head(h);
  }
  torch::nn::Embedding emb{nullptr};
  torch::nn::Sequential blocks{nullptr};
  Unit<BlockImpl> extra{nullptr};
  TiedHead head{nullptr};
};
TORCH_MODULE(Net);

// LibTorch's default generator is global: ranks that are threads take turns
// seeding and drawing from it, so that each draw sequence is reproducible.
inline std::mutex& rng_mutex() {
  static std::mutex mu;
  return mu;
}

// Models built in several threads must draw the same initial weights.
inline std::shared_ptr<NetImpl> make_net(uint64_t seed, const FSDPOptions* inner = nullptr) {
  std::lock_guard<std::mutex> lock(rng_mutex());
  torch::manual_seed(seed);
  return std::make_shared<NetImpl>(inner);
}

struct Batch {
  torch::Tensor tokens;  // [B, 3] int64
  torch::Tensor target;  // [B] int64
};

inline std::vector<Batch> make_batches(int steps, int64_t batch, uint64_t seed) {
  std::lock_guard<std::mutex> lock(rng_mutex());
  torch::manual_seed(seed);
  std::vector<Batch> out;
  for (int i = 0; i < steps; ++i) {
    out.push_back({torch::randint(0, kVocab, {batch, 3}), torch::randint(0, kVocab, {batch})});
  }
  return out;
}

inline std::map<std::string, torch::Tensor> to_map(const std::vector<std::pair<std::string, torch::Tensor>>& v) {
  return {v.begin(), v.end()};
}

// The key of `p`'s state in opt.state(): a printed address in LibTorch 1.x,
// the address itself (void*) from 2.2 on.
template <class Optimizer>
auto optimizer_state_key(Optimizer& opt, const torch::Tensor& p) {
  using Key = typename std::decay_t<decltype(opt.state())>::key_type;
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream key;
    key << static_cast<const void*>(p.unsafeGetTensorImpl());
    return Key(key.str());
  } else {
    return static_cast<Key>(p.unsafeGetTensorImpl());
  }
}

inline std::map<std::string, torch::Tensor> named_params(torch::nn::Module& m) {
  std::map<std::string, torch::Tensor> out;
  for (auto& p : m.named_parameters()) out[p.key()] = p.value().detach().clone();
  return out;
}

// The single-process reference: trains `net` with `opt` on whole batches
// (cross-entropy), calling `after_backward` before each step, and returns the
// parameters by name.
inline std::map<std::string, torch::Tensor> train_local(NetImpl& net, torch::optim::Optimizer& opt,
                                                        const std::vector<Batch>& batches,
                                                        const std::function<void()>& after_backward = nullptr) {
  for (const auto& b : batches) {
    opt.zero_grad();
    torch::nn::functional::cross_entropy(net.forward(b.tokens), b.target).backward();
    if (after_backward) after_backward();
    opt.step();
  }
  return named_params(net);
}

// Options for `strategy` over `pg`; HYBRID_SHARD gets a (2, size/2) mesh.
inline FSDPOptions options_for_strategy(dist::ProcessGroup& pg, ShardingStrategy strategy) {
  FSDPOptions o;
  o.sharding_strategy(strategy);
  if (strategy == ShardingStrategy::kHybridShard) {
    o.device_mesh(dist::init_device_mesh(borrow(pg), 2, pg.size() / 2));
  } else {
    o.process_group(borrow(pg));
  }
  return o;
}

// Every tensor of `want` is in `got`, of the same shape, within `tol`.
inline void expect_close(const std::map<std::string, torch::Tensor>& got,
                         const std::map<std::string, torch::Tensor>& want, double tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (const auto& [name, w] : want) {
    auto it = got.find(name);
    ASSERT_NE(it, got.end()) << what << ": missing " << name;
    ASSERT_EQ(it->second.sizes(), w.sizes()) << what << ": " << name;
    const double diff = (it->second - w).abs().max().item<double>();
    EXPECT_LE(diff, tol) << what << ": " << name << " differs by " << diff;
  }
}

}  // namespace fsdp::testing
