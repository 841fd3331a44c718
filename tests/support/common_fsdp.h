// Ports of the helpers of PyTorch's torch/testing/_internal/common_fsdp.py
// and of the models of test_fsdp_state_dict.py (the seed), for the
// TestFSDPStateDict suite. Ranks are threads (run_ranks); every model is
// built under rng_mutex() from a fixed seed, so all ranks build the same one.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "fsdp/core/activation_checkpointing.h"
#include "fsdp/fsdp.h"
#include "fsdp/state_dict/state_dict.h"
#include "models.h"

namespace fsdp::testing::seed {

using torch::nn::Linear;
using torch::nn::LinearImpl;
using torch::nn::LinearOptions;

inline Linear linear_no_bias(int64_t in, int64_t out) { return Linear(LinearOptions(in, out).bias(false)); }

// A model with its forward (the holder that interposes the FSDP root, when
// there is one).
struct TestModel {
  std::shared_ptr<torch::nn::Module> module;
  std::function<torch::Tensor(torch::Tensor)> forward;
};

// ---- the seed's Model ------------------------------------------------------
// inner: Linear(4, 4), FSDP-wrapped when `wrap` is given (ignoring itself when
// ignore_inner); outer: Linear(4, 5). register_buffers adds "buffer" and a
// non-persistent "non_persistent_buffer" (5x5) to both.
struct SeedModelImpl : torch::nn::Module {
  SeedModelImpl(const FSDPOptions* wrap, bool register_buffers, bool ignore_inner = false) {
    Linear in(4, 4);
    if (register_buffers) {
      in->register_buffer("buffer", torch::randn({5, 5}));
      in->register_buffer("non_persistent_buffer", torch::randn({5, 5}));
      set_persistent(*in, "non_persistent_buffer", false);
    }
    if (wrap) {
      FSDPOptions o = *wrap;
      if (ignore_inner) o.ignored_modules({in.ptr()});
      inner = register_module("inner", FullyShardedDataParallel<LinearImpl>(in, o));
    } else {
      inner = register_module("inner", Unit<LinearImpl>(in));
    }
    outer = register_module("outer", Linear(4, 5));
    if (register_buffers) {
      outer->register_buffer("buffer", torch::randn({5, 5}));
      outer->register_buffer("non_persistent_buffer", torch::randn({5, 5}));
      set_persistent(*outer, "non_persistent_buffer", false);
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    // Forward twice.
    auto i = inner(x);
    auto j = inner(x);
    return outer(i + j);
  }
  Unit<LinearImpl> inner{nullptr};
  Linear outer{nullptr};
};

// ---- simple models ---------------------------------------------------------

// FSDP(Sequential(FSDP(lin1), lin2)), checkpoint-wrapping lin1, lin2 and the
// Sequential when asked; wrap=false: Sequential(lin1, lin2).
inline TestModel simple_nested_model(const FSDPOptions& o, bool wrap = true, bool checkpoint_wrap = false) {
  Linear lin1 = linear_no_bias(10, 10);
  Linear lin2 = linear_no_bias(10, 10);
  if (!wrap) {
    torch::nn::Sequential seq(lin1, lin2);
    return {seq.ptr(), [seq](torch::Tensor x) mutable { return seq->forward(x); }};
  }
  torch::nn::Sequential seq;
  if (checkpoint_wrap) {
    seq = torch::nn::Sequential(FullyShardedDataParallel<LinearImpl>(CheckpointWrapper<LinearImpl>(lin1), o),
                                CheckpointWrapper<LinearImpl>(lin2));
    CheckpointWrapper<torch::nn::SequentialImpl> ck(seq);
    FullyShardedDataParallel<torch::nn::SequentialImpl> model(ck, o);
    return {model.ptr(), [model](torch::Tensor x) mutable { return model(x); }};
  }
  seq = torch::nn::Sequential(FullyShardedDataParallel<LinearImpl>(lin1, o), lin2);
  FullyShardedDataParallel<torch::nn::SequentialImpl> model(seq, o);
  return {model.ptr(), [model](torch::Tensor x) mutable { return model(x); }};
}

// FSDP(Linear(10, 10, bias=False)), optionally FSDP(CheckpointWrapper(lin)).
inline TestModel simple_model(const FSDPOptions& o, bool checkpoint_wrap = false) {
  Linear lin = linear_no_bias(10, 10);
  if (checkpoint_wrap) {
    FullyShardedDataParallel<LinearImpl> model(CheckpointWrapper<LinearImpl>(lin), o);
    return {model.ptr(), [model](torch::Tensor x) mutable { return model(x); }};
  }
  FullyShardedDataParallel<LinearImpl> model(lin, o);
  return {model.ptr(), [model](torch::Tensor x) mutable { return model(x); }};
}

// The seed's FSDPContainer: a plain Linear, then two simple nested models
// (FSDP-wrapped or not): a non-FSDP root.
struct FSDPContainerImpl : torch::nn::Module {
  FSDPContainerImpl(const TestModel& a, const TestModel& b) : f1(a.forward), f2(b.forward) {
    non_fsdp_lin = register_module("non_fsdp_lin", linear_no_bias(10, 10));
    fsdp_1 = register_module("fsdp_1", a.module);
    fsdp_2 = register_module("fsdp_2", b.module);
  }
  torch::Tensor forward(torch::Tensor x) { return f2(f1(non_fsdp_lin(x))); }
  Linear non_fsdp_lin{nullptr};
  std::shared_ptr<torch::nn::Module> fsdp_1, fsdp_2;
  std::function<torch::Tensor(torch::Tensor)> f1, f2;
};

inline TestModel non_fsdp_root_module(const FSDPOptions& o, bool wrap = true) {
  auto a = simple_nested_model(o, wrap);
  auto b = simple_nested_model(o, wrap);
  auto c = std::make_shared<FSDPContainerImpl>(a, b);
  return {c, [c](torch::Tensor x) { return c->forward(x); }};
}

// ---- TransformerWithSharedParams (common_fsdp.py) -------------------------
// nn.Transformer(d_model=16, 2 encoder and 2 decoder layers, dim_feedforward
// 8, dropout 0.1) as LibTorch layers held in fsdp::Unit members (so that
// transformer_auto_wrap_policy and manual wrapping can interpose them), an
// embedding tied to the output projection, buffers vocab_bias and
// long_buffer, BatchNorm1d(2).
using EncoderLayerImpl = torch::nn::TransformerEncoderLayerImpl;
using DecoderLayerImpl = torch::nn::TransformerDecoderLayerImpl;

template <class Layer, class Options>
struct LayerStackImpl : torch::nn::Module {
  explicit LayerStackImpl(const Options& options) {
    layers = register_module("layers", torch::nn::ModuleList());
    for (int i = 0; i < 2; ++i) {
      auto layer = std::make_shared<Layer>(options);
      layers->push_back(layer);
      units.emplace_back(layer);
    }
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({16})));
  }
  torch::nn::ModuleList layers{nullptr};
  std::vector<Unit<Layer>> units;  // the same modules, called through their holders
  torch::nn::LayerNorm norm{nullptr};
};
using EncoderImpl = LayerStackImpl<EncoderLayerImpl, torch::nn::TransformerEncoderLayerOptions>;
using DecoderImpl = LayerStackImpl<DecoderLayerImpl, torch::nn::TransformerDecoderLayerOptions>;

struct SeedTransformerImpl : torch::nn::Module {
  SeedTransformerImpl() {
    encoder = register_module(
        "encoder", std::make_shared<EncoderImpl>(torch::nn::TransformerEncoderLayerOptions(16, 8).dim_feedforward(8).dropout(0.1)));
    decoder = register_module(
        "decoder", std::make_shared<DecoderImpl>(torch::nn::TransformerDecoderLayerOptions(16, 8).dim_feedforward(8).dropout(0.1)));
    torch::NoGradGuard no_grad;
    for (auto& p : parameters()) {
      if (p.dim() > 1) torch::nn::init::xavier_uniform_(p);  // nn.Transformer._reset_parameters
    }
  }
  torch::Tensor forward(torch::Tensor src, torch::Tensor tgt) {
    auto memory = src;
    for (auto& l : encoder->units) memory = l(memory);
    memory = encoder->norm(memory);
    auto x = tgt;
    for (auto& l : decoder->units) x = l(x, memory);
    return decoder->norm(x);
  }
  std::shared_ptr<EncoderImpl> encoder;
  std::shared_ptr<DecoderImpl> decoder;
};

// Linear whose weight is another module's parameter.
struct TiedLinearImpl : torch::nn::Module {
  TiedLinearImpl(torch::Tensor w, int64_t out) {
    weight = register_parameter("weight", std::move(w));
    bias = register_parameter("bias", torch::zeros({out}));
  }
  torch::Tensor forward(torch::Tensor x) { return torch::nn::functional::linear(x, weight, bias); }
  torch::Tensor weight, bias;
};

struct TransformerWithSharedParamsImpl : torch::nn::Module {
  TransformerWithSharedParamsImpl() {
    embed_tokens = register_module("embed_tokens", torch::nn::Embedding(23, 16));
    transformer = register_module("transformer", Unit<SeedTransformerImpl>(std::make_shared<SeedTransformerImpl>()));
    output_proj = register_module("output_proj", std::make_shared<TiedLinearImpl>(embed_tokens->weight, 23));
    vocab_bias = register_buffer("vocab_bias", torch::ones({16}));
    long_buffer = register_buffer("long_buffer", torch::zeros({16}, torch::kLong));
    bn = register_module("bn", torch::nn::BatchNorm1d(2));
  }
  // src, tgt: [time, batch=2] token ids.
  torch::Tensor forward(torch::Tensor src_ids, torch::Tensor tgt_ids) {
    auto src = embed_tokens(src_ids) + vocab_bias + long_buffer.to(torch::kFloat);
    auto tgt = bn(embed_tokens(tgt_ids));
    return output_proj->forward(transformer(src, tgt));
  }
  torch::nn::Embedding embed_tokens{nullptr};
  Unit<SeedTransformerImpl> transformer{nullptr};
  std::shared_ptr<TiedLinearImpl> output_proj;
  torch::Tensor vocab_bias, long_buffer;
  torch::nn::BatchNorm1d bn{nullptr};
};

// FSDPInitMode.NO_FSDP (options null) or RECURSIVE: the root wrapped with
// `options` (whose auto_wrap_policy defaults to the encoder and decoder layers).
inline std::shared_ptr<TransformerWithSharedParamsImpl> make_transformer(uint64_t seed) {
  std::lock_guard<std::mutex> lock(rng_mutex());
  torch::manual_seed(seed);
  return std::make_shared<TransformerWithSharedParamsImpl>();
}

inline std::shared_ptr<torch::nn::Module> transformer_recursive(uint64_t seed, FSDPOptions o) {
  if (!o.auto_wrap_policy()) o.auto_wrap_policy(transformer_auto_wrap_policy<EncoderLayerImpl, DecoderLayerImpl>());
  FullyShardedDataParallel<TransformerWithSharedParamsImpl> model(make_transformer(seed), o);
  return model.ptr();
}

// ---- SkipModel (common_fsdp.py) ---------------------------------------------
struct SkipModuleImpl : torch::nn::Module {
  SkipModuleImpl() { lin = register_module("lin", linear_no_bias(10, 10)); }
  torch::Tensor forward(torch::Tensor x) { return lin(x); }
  Linear lin{nullptr};
};

struct NestedLinearImpl : torch::nn::Module {
  explicit NestedLinearImpl(const FSDPOptions* wrap) {
    if (wrap) {
      nested_linear = register_module("nested_linear", FullyShardedDataParallel<LinearImpl>(linear_no_bias(10, 10), *wrap));
    } else {
      nested_linear = register_module("nested_linear", Unit<LinearImpl>(linear_no_bias(10, 10)));
    }
  }
  torch::Tensor forward(torch::Tensor x) { return nested_linear(x); }
  Unit<LinearImpl> nested_linear{nullptr};
};

// `wrap`: the options of PyTorch's enable_wrap context (wrap() is the
// identity without it).
struct SkipModelImpl : torch::nn::Module {
  SkipModelImpl(bool double_nest, const FSDPOptions* wrap) {
    linear = register_module("linear", linear_no_bias(10, 10));
    linear_skip = register_module("linear_skip", std::make_shared<SkipModuleImpl>());
    auto nested = std::make_shared<NestedLinearImpl>(double_nest ? wrap : nullptr);
    if (wrap) {
      nested_linear = register_module("nested_linear", FullyShardedDataParallel<NestedLinearImpl>(nested, *wrap));
    } else {
      nested_linear = register_module("nested_linear", Unit<NestedLinearImpl>(nested));
    }
  }
  torch::Tensor forward(torch::Tensor x) { return nested_linear(linear_skip->forward(linear(x))); }
  Linear linear{nullptr};
  std::shared_ptr<SkipModuleImpl> linear_skip;
  Unit<NestedLinearImpl> nested_linear{nullptr};
};

// ---- helpers -----------------------------------------------------------------

inline bool has_units(const std::shared_ptr<torch::nn::Module>& m) { return !fsdp_modules(m).empty(); }

// The model itself is an FSDP unit (PyTorch: isinstance(model, FSDP)).
inline bool is_fsdp_root(const std::shared_ptr<torch::nn::Module>& m) {
  auto units = fsdp_modules(m);
  return !units.empty() && units.front().first.empty();
}

inline std::vector<torch::Tensor> param_list(torch::nn::Module& m) {
  std::vector<torch::Tensor> out;
  for (auto& p : m.parameters()) out.push_back(p);
  return out;
}

// common_fsdp.get_full_params: the parameters, as copies, under summon_full_params.
inline std::vector<torch::Tensor> get_full_params(const std::shared_ptr<torch::nn::Module>& model) {
  std::optional<SummonFullParams> summon;
  if (has_units(model)) summon.emplace(model);
  std::vector<torch::Tensor> out;
  for (auto& p : model->parameters()) out.push_back(p.detach().clone());
  return out;
}

// common_fsdp._zero_model.
inline void zero_model(const std::shared_ptr<torch::nn::Module>& model, bool zero_buffers = false) {
  std::optional<SummonFullParams> summon;
  if (has_units(model)) summon.emplace(model);
  torch::NoGradGuard no_grad;
  for (auto& p : model->parameters()) p.zero_();
  if (zero_buffers) {
    for (auto& b : model->buffers()) b.zero_();
  }
}

inline bool all_equal(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].sizes() != b[i].sizes()) return false;
    if (!torch::allclose(a[i].to(torch::kDouble), b[i].to(torch::kDouble), 1.3e-6, 1e-5)) return false;
  }
  return true;
}

// TestFSDPStateDict._compare_models.
inline void compare_models(const std::shared_ptr<torch::nn::Module>& model,
                           const std::shared_ptr<torch::nn::Module>& model_new, bool expect_equal,
                           bool check_fp16 = false) {
  SummonFullParams s1(model);
  SummonFullParams s2(model_new);
  auto params = param_list(*model);
  auto params_new = param_list(*model_new);
  ASSERT_EQ(params.size(), params_new.size());
  EXPECT_EQ(all_equal(params, params_new), expect_equal);
  if (check_fp16) {
    for (auto& t : params_new) EXPECT_EQ(t.scalar_type(), torch::kHalf);
  }
}

inline StateDictConfig config_for(StateDictType type, bool rank0_and_offload) {
  switch (type) {
    case StateDictType::kFull: return FullStateDictConfig{rank0_and_offload, rank0_and_offload};
    case StateDictType::kLocal: return LocalStateDictConfig{rank0_and_offload};
    default: return ShardedStateDictConfig{rank0_and_offload};
  }
}

// TestFSDPStateDict._get_state_dict_mgr.
inline std::unique_ptr<StateDictTypeGuard> state_dict_mgr(const std::shared_ptr<torch::nn::Module>& model,
                                                          StateDictType type, bool rank0_and_offload) {
  return std::make_unique<StateDictTypeGuard>(model, type, config_for(type, rank0_and_offload));
}

// TestFSDPStateDict._broadcast_state_dict: rank 0's (full) state dict on every rank.
inline StateDict broadcast_state_dict(dist::ProcessGroup& pg, const StateDict& sd) {
  std::string meta;
  auto put = [&](int64_t v) { meta.append(reinterpret_cast<const char*>(&v), sizeof v); };
  if (pg.rank() == 0) {
    put(static_cast<int64_t>(sd.size()));
    for (const auto& [key, v] : sd) {
      const auto& t = std::get<torch::Tensor>(v);
      put(static_cast<int64_t>(key.size()));
      meta += key;
      put(static_cast<int64_t>(t.scalar_type()));
      put(t.dim());
      for (auto s : t.sizes()) put(s);
    }
  }
  meta = pg.broadcast_bytes(meta, 0);
  size_t pos = 0;
  auto get = [&] {
    int64_t v;
    std::memcpy(&v, meta.data() + pos, sizeof v);
    pos += sizeof v;
    return v;
  };
  StateDict out;
  const int64_t n = get();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t len = get();
    std::string key = meta.substr(pos, static_cast<size_t>(len));
    pos += static_cast<size_t>(len);
    auto dtype = static_cast<torch::ScalarType>(get());
    std::vector<int64_t> shape(static_cast<size_t>(get()));
    for (auto& s : shape) s = get();
    torch::Tensor t = pg.rank() == 0 ? sd.tensor(key).detach().clone().contiguous() : torch::empty(shape, dtype);
    if (t.numel() > 0) pg.broadcast(t, 0).wait();
    out.insert(key, t);
  }
  return out;
}

// TestFSDPStateDict._validate_state_dict_contents. For LOCAL and SHARDED
// (no rank0_only), every rank's tensors must be on CPU when offloading.
inline void validate_state_dict_contents(int rank, bool fsdp_root, const StateDict& sd, StateDictType type,
                                         bool rank0_and_offload, const std::vector<std::string>& ignore_keys = {}) {
  if (!rank0_and_offload) return;
  auto on_cpu = [](const StateValue& v) {
    if (std::holds_alternative<torch::Tensor>(v)) return std::get<torch::Tensor>(v).device().is_cpu();
    for (const auto& s : std::get<ShardedTensor>(v).local_shards) {
      if (!s.tensor.device().is_cpu()) return false;
    }
    return true;
  };
  if (rank == 0 || type != StateDictType::kFull) {
    EXPECT_FALSE(sd.empty());
    for (const auto& [key, v] : sd) {
      if (std::find(ignore_keys.begin(), ignore_keys.end(), key) != ignore_keys.end()) continue;
      EXPECT_TRUE(on_cpu(v)) << key << " is unexpectedly not on CPU";
    }
  } else if (fsdp_root) {
    EXPECT_TRUE(sd.empty());
  }
}

// common_fsdp._assert_module_states: rank 0's parameters and buffers against
// every other rank's (equal or, for expect_equal=false, not all equal).
inline void assert_module_states(torch::nn::Module& model, dist::ProcessGroup& pg, bool expect_equal) {
  std::vector<torch::Tensor> states;
  for (auto& p : model.named_parameters()) states.push_back(p.value().detach());
  for (auto& b : model.named_buffers()) states.push_back(b.value().detach());
  bool all_same = true;
  for (auto& t : states) {
    torch::Tensor mine = t.contiguous().to(torch::kDouble);
    torch::Tensor all = torch::empty({pg.size() * mine.numel()}, mine.options());
    if (mine.numel() == 0) continue;
    pg.all_gather(all, mine.reshape({-1})).wait();
    auto rows = all.view({pg.size(), -1});
    for (int r = 1; r < pg.size(); ++r) all_same = all_same && torch::equal(rows[0], rows[r]);
  }
  EXPECT_EQ(all_same, expect_equal);
}

inline at::ScalarType dtype_of(const StateValue& v) {
  if (std::holds_alternative<torch::Tensor>(v)) return std::get<torch::Tensor>(v).scalar_type();
  return std::get<ShardedTensor>(v).dtype;
}

}  // namespace fsdp::testing::seed
