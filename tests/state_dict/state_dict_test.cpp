// TestFSDPStateDict: PyTorch's test/distributed/fsdp/test_fsdp_state_dict.py,
// ported test by test with the same parametrizations, on
// 2 ranks (threads). Where the seed compares against DDP, the reference is
// single-process training on the same data. Deviations, each forced by the
// CPU build or by C++:
//   - the mixed precision of test_save_and_load_after_forward_state_dict is
//     float16, as in the seed, where LibTorch has CPU float16 kernels (2.x);
//     1.13 has none, so there it runs in bfloat16 (fp16 storage, as in
//     test_basic_save_and_load_state_dict, runs as float16 on both);
//   - CUDA placement and cpu_offload are no-ops on CPU (cases kept);
//   - the seed's "delattr, wrap, setattr" to keep linear_skip out of FSDP is
//     ignored_modules here (the same effect: its parameters stay whole);
//   - rank0_only exists only in FullStateDictConfig (C++ cannot express it
//     for the other types): where the seed returns early for
//     "rank0_only_and_offload" with LOCAL or SHARDED, the case runs here with
//     offload_to_cpu alone (tensors checked to be on CPU, nothing broadcast);
//     every other case the seed skips as unsupported (use_orig_params with
//     LOCAL_STATE_DICT, offloaded SHARDED_STATE_DICT with manual checkpoint
//     wrappers) runs here too.
#include <gtest/gtest.h>

#include <tuple>

#include "../support/thread_ranks.h"
#include "../support/common_fsdp.h"
#include "fsdp/error.h"

using namespace fsdp;
using namespace fsdp::testing;
using namespace fsdp::testing::seed;

namespace {

constexpr int kWorld = 2;

const StateDictType kUnflattened[] = {StateDictType::kFull, StateDictType::kSharded};
const StateDictType kAllTypes[] = {StateDictType::kFull, StateDictType::kLocal, StateDictType::kSharded};

std::string type_name(StateDictType t) {
  switch (t) {
    case StateDictType::kFull: return "state_dict";
    case StateDictType::kLocal: return "local_state_dict";
    default: return "sharded_state_dict";
  }
}

FSDPOptions base_options(dist::ProcessGroup& pg) {
  FSDPOptions o;
  o.process_group(borrow(pg));
  return o;
}

// Builds under the shared RNG lock from a fixed seed: every rank gets the same model.
template <class F>
auto seeded(uint64_t seed, F&& f) {
  std::lock_guard<std::mutex> lock(rng_mutex());
  torch::manual_seed(seed);
  return f();
}

torch::Tensor seeded_rand(uint64_t seed, std::vector<int64_t> shape, bool normal) {
  return seeded(seed, [&] { return normal ? torch::randn(shape) : torch::rand(shape); });
}

// _gather_state_dict(_get_state_dict(model, cpu_offload, half)).
StateDict get_state_dict(const std::shared_ptr<torch::nn::Module>& model, bool /*cpu_offload: CPU already*/,
                         bool half) {
  if (half) model->to(torch::kHalf);
  return state_dict(model);
}

// Applies the seed's apply_ac_to_linears: every Linear checkpointed.
void apply_ac_to_linears(const std::shared_ptr<torch::nn::Module>& model) {
  apply_activation_checkpointing(model, checkpoint_module_types<LinearImpl>());
}

// ===========================================================================
// test_fsdp_state_dict_with_activation_checkpoint
using AcParam = std::tuple<StateDictType, std::string, bool>;
class TestFSDPStateDictAc : public ::testing::TestWithParam<AcParam> {};

TEST_P(TestFSDPStateDictAc, FsdpStateDictWithActivationCheckpoint) {
  const auto [type, checkpoint_wrap, rank0_only_and_offload] = GetParam();
  run_ranks(kWorld, [&, type = type, checkpoint_wrap = checkpoint_wrap,
                     rank0 = rank0_only_and_offload](dist::ProcessGroup& pg) {
    const FSDPOptions o = base_options(pg);
    const bool ck_source = checkpoint_wrap == "source" || checkpoint_wrap == "both";
    const bool ck_dest = checkpoint_wrap == "dest" || checkpoint_wrap == "both";
    const bool after_wrap = checkpoint_wrap == "source_after_wrap" || checkpoint_wrap == "both_after_wrap";
    std::vector<std::function<TestModel(bool, uint64_t)>> model_calls = {
        [&](bool ck, uint64_t s) { return seeded(s, [&] { return simple_model(o, ck); }); },
        [&](bool ck, uint64_t s) { return seeded(s, [&] { return simple_nested_model(o, true, ck); }); },
    };
    uint64_t seed = 100;
    for (auto& model_call : model_calls) {
      TestModel model = model_call(ck_source, seed++);
      if (after_wrap) apply_ac_to_linears(model.module);
      auto mgr = state_dict_mgr(model.module, type, rank0);
      StateDict sd = gather_state_dict(state_dict(model.module), pg);
      TestModel model_new = model_call(ck_dest, seed++);
      if (checkpoint_wrap == "both_after_wrap") apply_ac_to_linears(model_new.module);
      zero_model(model_new.module);
      compare_models(model.module, model_new.module, false);
      if (rank0 && type == StateDictType::kFull) sd = broadcast_state_dict(pg, sd);
      // Would fail if the checkpoint wrapper changed any name.
      load_state_dict(model_new.module, sd, /*strict=*/true);
      compare_models(model.module, model_new.module, true);
    }
  });
}

INSTANTIATE_TEST_SUITE_P(
    TestFSDPStateDict, TestFSDPStateDictAc,
    ::testing::Combine(::testing::ValuesIn(kUnflattened),
                       ::testing::Values("source", "dest", "both", "source_after_wrap", "both_after_wrap"),
                       ::testing::Bool()),
    [](const auto& info) {
      return type_name(std::get<0>(info.param)) + "_" + std::get<1>(info.param) + "_rank0_" +
             (std::get<2>(info.param) ? "true" : "false");
    });

// ===========================================================================
// test_state_dict_with_manual_ac_wrapper
using ManualAcParam = std::tuple<StateDictType, bool>;
class TestFSDPStateDictManualAc : public ::testing::TestWithParam<ManualAcParam> {};

void manual_wrap_transformer(TransformerWithSharedParamsImpl& model, const FSDPOptions& o, bool checkpoint) {
  auto wrap_layer = [&](auto& unit) {
    using Impl = typename std::decay_t<decltype(unit)>::ContainedType;
    if (checkpoint) {
      FullyShardedDataParallel<Impl>(CheckpointWrapper<Impl>(unit.ptr()), o);
    } else {
      FullyShardedDataParallel<Impl>(unit.ptr(), o);
    }
  };
  for (auto& l : model.transformer->encoder->units) wrap_layer(l);
  for (auto& l : model.transformer->decoder->units) wrap_layer(l);
  FullyShardedDataParallel<SeedTransformerImpl>(model.transformer.ptr(), o);
}

TEST_P(TestFSDPStateDictManualAc, StateDictWithManualAcWrapper) {
  const auto [type, rank0_only_and_offload] = GetParam();
  run_ranks(kWorld, [&, type = type, rank0 = rank0_only_and_offload](dist::ProcessGroup& pg) {
    const FSDPOptions o = base_options(pg);
    // model_no_ac is a deep copy of model_ac: the same seed.
    auto model_ac = make_transformer(7);
    auto model_no_ac = make_transformer(7);
    manual_wrap_transformer(*model_no_ac, o, false);
    manual_wrap_transformer(*model_ac, o, true);
    EXPECT_TRUE(is_checkpointed(*model_ac->transformer->encoder->units[0]));
    EXPECT_EQ(fsdp_modules(model_ac).size(), 5u);

    StateDict sd_no_ac, sd_ac;
    {
      auto mgr = state_dict_mgr(model_no_ac, type, rank0);
      sd_no_ac = state_dict(model_no_ac);
    }
    {
      auto mgr = state_dict_mgr(model_ac, type, rank0);
      sd_ac = state_dict(model_ac);
    }
    EXPECT_EQ(sd_ac.keys(), sd_no_ac.keys());
    // Broadcasting from rank 0 makes sense for full state dicts only (a
    // sharded one holds each rank's own pieces; the seed skips the case).
    if (rank0 && type == StateDictType::kFull) {
      sd_no_ac = broadcast_state_dict(pg, sd_no_ac);
      sd_ac = broadcast_state_dict(pg, sd_ac);
    }
    {
      auto mgr = state_dict_mgr(model_no_ac, type, rank0);
      load_state_dict(model_no_ac, sd_no_ac);
    }
    {
      auto mgr = state_dict_mgr(model_ac, type, rank0);
      load_state_dict(model_ac, sd_ac);
    }
    compare_models(model_ac, model_no_ac, true);
  });
}

INSTANTIATE_TEST_SUITE_P(TestFSDPStateDict, TestFSDPStateDictManualAc,
                         ::testing::Combine(::testing::ValuesIn(kUnflattened), ::testing::Bool()),
                         [](const auto& info) {
                           return type_name(std::get<0>(info.param)) + "_rank0_" +
                                  (std::get<1>(info.param) ? "true" : "false");
                         });

// ===========================================================================
// test_state_dict_with_shared_parameters
class TestFSDPStateDictShared : public ::testing::TestWithParam<StateDictType> {};

TEST_P(TestFSDPStateDictShared, StateDictWithSharedParameters) {
  const StateDictType type = GetParam();
  run_ranks(kWorld, [&](dist::ProcessGroup& pg) {
    auto fsdp_model = transformer_recursive(3, base_options(pg));
    StateDict sd;
    {
      auto mgr = state_dict_mgr(fsdp_model, type, false);
      sd = state_dict(fsdp_model);
    }
    if (type != StateDictType::kLocal) {
      EXPECT_TRUE(sd.contains("embed_tokens.weight"));
      EXPECT_TRUE(sd.contains("output_proj.weight"));  // the tied parameter, under both names
    }
    auto new_model = transformer_recursive(4, base_options(pg));
    zero_model(new_model, /*zero_buffers=*/true);
    {
      auto mgr = state_dict_mgr(new_model, type, false);
      load_state_dict(new_model, sd);
    }
    // Not in the seed (it only loads): the loaded model equals the source.
    compare_models(fsdp_model, new_model, true);
    auto b1 = fsdp_model->named_buffers(), b2 = new_model->named_buffers();
    for (auto& b : b1) EXPECT_TRUE(torch::equal(b.value(), b2[b.key()])) << b.key();
  });
}

INSTANTIATE_TEST_SUITE_P(TestFSDPStateDict, TestFSDPStateDictShared, ::testing::ValuesIn(kAllTypes),
                         [](const auto& info) { return type_name(info.param); });

// ===========================================================================
// test_state_dict_rank0_offload_save_load_flow
class TestFSDPStateDictRank0Flow : public ::testing::TestWithParam<bool> {};

TEST_P(TestFSDPStateDictRank0Flow, StateDictRank0OffloadSaveLoadFlow) {
  const bool use_orig_params = GetParam();
  run_ranks(kWorld, [&](dist::ProcessGroup& pg) {
    FSDPOptions o = base_options(pg);
    o.use_orig_params(use_orig_params);
    auto fsdp_model = transformer_recursive(5, o);
    // Force model parameters and buffers to be nonzero.
    {
      SummonFullParams summon(fsdp_model);
      torch::NoGradGuard no_grad;
      for (auto& t : fsdp_model->parameters()) {
        if (torch::count_nonzero(t).item<int64_t>() == 0) t.add_(1);
      }
      for (auto& t : fsdp_model->buffers()) {
        if (torch::count_nonzero(t).item<int64_t>() == 0) t.add_(1);
      }
    }
    StateDict sd;
    {
      auto mgr = state_dict_mgr(fsdp_model, StateDictType::kFull, true);
      sd = state_dict(fsdp_model);
    }
    EXPECT_EQ(sd.empty(), pg.rank() != 0);
    // A non-wrapped model on all ranks; only rank 0 loads the checkpoint.
    auto new_model = make_transformer(6);
    zero_model(new_model, /*zero_buffers=*/true);
    if (pg.rank() == 0) load_state_dict(new_model, sd, /*strict=*/true);
    assert_module_states(*new_model, pg, /*expect_equal=*/false);
    // Broadcast the module states from rank 0 with sync_module_states.
    FSDPOptions o2 = base_options(pg);
    o2.auto_wrap_policy(transformer_auto_wrap_policy<EncoderLayerImpl, DecoderLayerImpl>());
    o2.sync_module_states(true);
    FullyShardedDataParallel<TransformerWithSharedParamsImpl> new_fsdp_model(new_model, o2);
    {
      SummonFullParams summon(new_fsdp_model.ptr());
      assert_module_states(*new_fsdp_model, pg, /*expect_equal=*/true);
    }
    compare_models(fsdp_model, new_fsdp_model.ptr(), true);
  });
}

INSTANTIATE_TEST_SUITE_P(TestFSDPStateDict, TestFSDPStateDictRank0Flow, ::testing::Bool(),
                         [](const auto& info) { return std::string("use_orig_params_") + (info.param ? "true" : "false"); });

// ===========================================================================
// test_basic_save_and_load_state_dict
using BasicParam = std::tuple<StateDictType, bool, bool, bool, bool>;  // type, cpu_offload, fp16, rank0, orig
class TestFSDPStateDictBasic : public ::testing::TestWithParam<BasicParam> {};

TEST_P(TestFSDPStateDictBasic, BasicSaveAndLoadStateDict) {
  const auto [type, offload_params, fp16, rank0, use_orig_params] = GetParam();
  run_ranks(kWorld, [&, type = type, offload_params = offload_params, fp16 = fp16, rank0 = rank0,
                     use_orig_params = use_orig_params](dist::ProcessGroup& pg) {
    FSDPOptions o = base_options(pg);
    o.cpu_offload().offload_params = offload_params;
    o.use_orig_params(use_orig_params);
    std::vector<std::function<TestModel()>> model_calls = {
        [&] { return seeded(11, [&] { return non_fsdp_root_module(o); }); },
        [&] { return seeded(12, [&] { return simple_nested_model(o); }); },
        [&] { return seeded(13, [&] { return simple_model(o); }); },
    };
    for (auto& model_call : model_calls) {
      TestModel model = model_call();
      const bool fsdp_root = is_fsdp_root(model.module);
      StateDict sd;
      {
        auto mgr = state_dict_mgr(model.module, type, rank0);
        sd = get_state_dict(model.module, offload_params, fp16);
      }
      std::vector<std::string> ignore_keys;
      for (const auto& k : sd.keys()) {
        if (k.find("non_fsdp_lin") != std::string::npos) ignore_keys.push_back(k);
      }
      validate_state_dict_contents(pg.rank(), fsdp_root, sd, type, rank0, ignore_keys);
      if (fp16) {
        for (const auto& [key, v] : sd) EXPECT_EQ(dtype_of(v), torch::kHalf) << key;
      }
      TestModel model_new = model_call();
      if (fp16) model_new.module->to(torch::kHalf);
      zero_model(model_new.module);
      compare_models(model.module, model_new.module, false);
      if (rank0 && type == StateDictType::kFull) sd = broadcast_state_dict(pg, sd);
      {
        StateDictTypeGuard guard(model_new.module, type);
        load_state_dict(model_new.module, sd, /*strict=*/true);
      }
      compare_models(model.module, model_new.module, true, /*check_fp16=*/fp16);
    }
  });
}

INSTANTIATE_TEST_SUITE_P(TestFSDPStateDict, TestFSDPStateDictBasic,
                         ::testing::Combine(::testing::ValuesIn(kAllTypes), ::testing::Bool(), ::testing::Bool(),
                                            ::testing::Bool(), ::testing::Bool()),
                         [](const auto& info) {
                           auto b = [](bool x) { return x ? std::string("true") : std::string("false"); };
                           return type_name(std::get<0>(info.param)) + "_offload_params_" + b(std::get<1>(info.param)) +
                                  "_fp16_" + b(std::get<2>(info.param)) + "_rank0_" + b(std::get<3>(info.param)) +
                                  "_use_orig_params_" + b(std::get<4>(info.param));
                         });

// ===========================================================================
// test_save_and_load_after_forward_state_dict
using AfterForwardParam = std::tuple<StateDictType, bool, bool>;  // type, mixed precision, rank0
class TestFSDPStateDictAfterForward : public ::testing::TestWithParam<AfterForwardParam> {};

TEST_P(TestFSDPStateDictAfterForward, SaveAndLoadAfterForwardStateDict) {
  const auto [type, mixed, rank0] = GetParam();
  run_ranks(kWorld, [&, type = type, mixed = mixed, rank0 = rank0](dist::ProcessGroup& pg) {
    FSDPOptions o = base_options(pg);
    const auto low = float16_compute_available(torch::kCPU) ? torch::kHalf : torch::kBFloat16;
    if (mixed) o.mixed_precision(MixedPrecision{low, low, low});
    TestModel model = seeded(21, [&] { return simple_nested_model(o); });
    torch::optim::SGD optim(model.module->parameters(), torch::optim::SGDOptions(0.1));
    auto initial_params = get_full_params(model.module);
    for (int i = 0; i < 6; ++i) {
      auto inp = seeded_rand(30 + static_cast<uint64_t>(i) * kWorld + static_cast<uint64_t>(pg.rank()), {1, 10}, true);
      auto output = model.forward(inp[0]);
      auto loss = output.sum();
      EXPECT_EQ(loss.scalar_type(), mixed ? low : torch::kFloat);
      loss.backward();
      optim.step();
    }
    auto trained_params = get_full_params(model.module);
    EXPECT_FALSE(all_equal(initial_params, trained_params));  // some training occurred
    StateDict sd;
    {
      auto mgr = state_dict_mgr(model.module, type, rank0);
      sd = map_tensors(state_dict(model.module), [](const torch::Tensor& t) { return t.clone(); });
    }
    validate_state_dict_contents(pg.rank(), true, sd, type, rank0);
    zero_model(model.module);
    // Checkpointed parameters have the full parameter dtype.
    for (const auto& [key, v] : sd) EXPECT_EQ(dtype_of(v), torch::kFloat) << key;
    if (rank0 && type == StateDictType::kFull) sd = broadcast_state_dict(pg, sd);
    {
      StateDictTypeGuard guard(model.module, type);
      load_state_dict(model.module, sd, /*strict=*/true);
    }
    EXPECT_TRUE(all_equal(get_full_params(model.module), trained_params));
  });
}

INSTANTIATE_TEST_SUITE_P(TestFSDPStateDict, TestFSDPStateDictAfterForward,
                         ::testing::Combine(::testing::ValuesIn(kAllTypes), ::testing::Bool(), ::testing::Bool()),
                         [](const auto& info) {
                           auto b = [](bool x) { return x ? std::string("true") : std::string("false"); };
                           return type_name(std::get<0>(info.param)) + "_mixed_precision_" + b(std::get<1>(info.param)) +
                                  "_rank0_" + b(std::get<2>(info.param));
                         });

// ===========================================================================
// _initialize_model, _dist_train, test_state_dict_save_load_flow

std::shared_ptr<SeedModelImpl> initialize_model(const FSDPOptions* wrap, bool register_buffers = false) {
  return seeded(0, [&] { return std::make_shared<SeedModelImpl>(wrap, register_buffers); });
}

TestModel initialize_fsdp_model(const FSDPOptions& o, bool register_buffers = false) {
  auto net = initialize_model(&o, register_buffers);
  FullyShardedDataParallel<SeedModelImpl> model(net, o);
  return {model.ptr(), [model](torch::Tensor x) mutable { return model(x); }};
}

std::vector<torch::Tensor> dist_train(dist::ProcessGroup* pg, StateDictType type, bool move_to_cpu) {
  auto in_data = seeded_rand(1, {64, 4}, false);
  if (pg) {
    const FSDPOptions o = base_options(*pg);
    TestModel model = initialize_fsdp_model(o);
    torch::optim::SGD optim(model.module->parameters(), torch::optim::SGDOptions(0.1));
    for (int i = 0; i < 3; ++i) {
      model.forward(in_data).sum().backward();
      optim.step();
      optim.zero_grad();
    }
    auto blank = seeded(2, [&] { return std::make_shared<SeedModelImpl>(&o, false); });
    FullyShardedDataParallel<SeedModelImpl> blank_model(blank, o);
    zero_model(blank_model.ptr());
    StateDict sd;
    {
      StateDictTypeGuard guard(model.module, type);
      sd = state_dict(model.module);
    }
    if (move_to_cpu) sd = map_tensors(sd, [](const torch::Tensor& t) { return t.cpu(); });
    {
      StateDictTypeGuard guard(blank_model.ptr(), type);
      load_state_dict(blank_model.ptr(), sd, /*strict=*/true);
    }
    return get_full_params(blank_model.ptr());
  }
  // The single-process reference (the seed's DDP run: every rank has the same data).
  auto model = initialize_model(nullptr);
  torch::optim::SGD optim(model->parameters(), torch::optim::SGDOptions(0.1));
  for (int i = 0; i < 3; ++i) {
    model->forward(in_data).sum().backward();
    optim.step();
    optim.zero_grad();
  }
  return param_list(*model);
}

class TestFSDPStateDictFlow : public ::testing::TestWithParam<StateDictType> {};

TEST_P(TestFSDPStateDictFlow, StateDictSaveLoadFlow) {
  const StateDictType type = GetParam();
  const auto ddp_params = dist_train(nullptr, type, false);
  for (bool move_to_cpu : {true, false}) {
    SCOPED_TRACE(move_to_cpu ? "move_to_cpu=true" : "move_to_cpu=false");
    run_ranks(kWorld, [&](dist::ProcessGroup& pg) {
      auto fsdp_params = dist_train(&pg, type, move_to_cpu);
      ASSERT_EQ(fsdp_params.size(), ddp_params.size());
      EXPECT_TRUE(all_equal(ddp_params, fsdp_params));
    });
  }
}

INSTANTIATE_TEST_SUITE_P(TestFSDPStateDict, TestFSDPStateDictFlow, ::testing::ValuesIn(kAllTypes),
                         [](const auto& info) { return type_name(info.param); });

// ===========================================================================
// test_fsdp_state_dict_keys
class TestFSDPStateDictKeys : public ::testing::TestWithParam<StateDictType> {};

TEST_P(TestFSDPStateDictKeys, FsdpStateDictKeys) {
  const StateDictType type = GetParam();
  run_ranks(kWorld, [&](dist::ProcessGroup& pg) {
    TestModel model = initialize_fsdp_model(base_options(pg));
    StateDict sd;
    {
      StateDictTypeGuard guard(model.module, type);
      sd = state_dict(model.module);
    }
    if (type == StateDictType::kLocal) {
      EXPECT_EQ(sd.keys(), (std::vector<std::string>{"flat_param", "inner.flat_param"}));
    } else {
      // Keys should match the local model's.
      auto local_model = initialize_model(nullptr);
      EXPECT_EQ(sd.keys(), state_dict(local_model).keys());
    }
  });
}

INSTANTIATE_TEST_SUITE_P(TestFSDPStateDict, TestFSDPStateDictKeys, ::testing::ValuesIn(kAllTypes),
                         [](const auto& info) { return type_name(info.param); });

// ===========================================================================
// test_state_dict_load_into_local_module
using IntoLocalParam = std::tuple<StateDictType, bool, bool>;  // type, rank0, fsdp_root
class TestFSDPStateDictIntoLocal : public ::testing::TestWithParam<IntoLocalParam> {};

TEST_P(TestFSDPStateDictIntoLocal, StateDictLoadIntoLocalModule) {
  const auto [type, rank0, fsdp_root] = GetParam();
  run_ranks(kWorld, [&, type = type, rank0 = rank0, fsdp_root = fsdp_root](dist::ProcessGroup& pg) {
    const FSDPOptions o = base_options(pg);
    TestModel model = fsdp_root ? initialize_fsdp_model(o, /*register_buffers=*/true)
                                : seeded(40, [&] { return non_fsdp_root_module(o); });
    torch::optim::SGD optim(model.module->parameters(), torch::optim::SGDOptions(0.1));
    auto in_data = fsdp_root ? seeded_rand(41, {64, 4}, false) : seeded_rand(42, {1, 10}, true);
    for (int i = 0; i < 3; ++i) {
      model.forward(in_data).sum().backward();
      optim.step();
      optim.zero_grad();
    }
    auto fsdp_params = get_full_params(model.module);
    StateDict sd;
    {
      auto mgr = state_dict_mgr(model.module, type, rank0);
      sd = state_dict(model.module);
    }
    std::vector<std::string> ignore_keys;
    for (const auto& k : sd.keys()) {
      if (k.find("non_fsdp_lin") != std::string::npos) ignore_keys.push_back(k);
    }
    validate_state_dict_contents(pg.rank(), fsdp_root, sd, type, rank0, ignore_keys);
    // A zeroed local model: nothing in it is FSDP.
    std::shared_ptr<torch::nn::Module> blank =
        fsdp_root ? std::static_pointer_cast<torch::nn::Module>(initialize_model(nullptr, true))
                  : seeded(43, [&] { return non_fsdp_root_module(o, /*wrap=*/false); }).module;
    EXPECT_TRUE(fsdp_modules(blank).empty());
    {
      torch::NoGradGuard no_grad;
      for (auto& p : blank->parameters()) p.zero_();
    }
    sd = gather_state_dict(sd, pg);
    if (rank0 && type == StateDictType::kFull) sd = broadcast_state_dict(pg, sd);
    load_state_dict(blank, sd, /*strict=*/true);
    auto local_params = param_list(*blank);
    ASSERT_EQ(local_params.size(), fsdp_params.size());
    EXPECT_TRUE(all_equal(fsdp_params, local_params));
  });
}

INSTANTIATE_TEST_SUITE_P(TestFSDPStateDict, TestFSDPStateDictIntoLocal,
                         ::testing::Combine(::testing::ValuesIn(kUnflattened), ::testing::Bool(), ::testing::Bool()),
                         [](const auto& info) {
                           auto b = [](bool x) { return x ? std::string("true") : std::string("false"); };
                           return type_name(std::get<0>(info.param)) + "_rank0_" + b(std::get<1>(info.param)) +
                                  "_fsdp_root_" + b(std::get<2>(info.param));
                         });

// ===========================================================================
// test_state_dict_skip_module
class TestFSDPStateDictSkip : public ::testing::TestWithParam<StateDictType> {};

// _create_module: SkipModel with linear_skip kept out of FSDP.
std::pair<TestModel, std::vector<std::string>> create_skip_module(const FSDPOptions& o, bool wrap_fsdp, uint64_t seed) {
  auto module = seeded(seed, [&] { return std::make_shared<SkipModelImpl>(/*double_nest=*/true, wrap_fsdp ? &o : nullptr); });
  std::vector<std::string> linear_skip_tensor_names;
  for (auto& p : module->named_parameters()) {
    if (p.key().find("linear_skip") != std::string::npos) linear_skip_tensor_names.push_back(p.key());
  }
  if (!wrap_fsdp) return {{module, [module](torch::Tensor x) { return module->forward(x); }}, linear_skip_tensor_names};
  FSDPOptions root = o;
  root.ignored_modules({module->linear_skip});
  FullyShardedDataParallel<SkipModelImpl> fsdp(module, root);
  return {{fsdp.ptr(), [fsdp](torch::Tensor x) mutable { return fsdp(x); }}, linear_skip_tensor_names};
}

TEST_P(TestFSDPStateDictSkip, StateDictSkipModule) {
  const StateDictType type = GetParam();
  run_ranks(kWorld, [&](dist::ProcessGroup& pg) {
    const FSDPOptions o = base_options(pg);
    auto [fsdp, skip_names] = create_skip_module(o, true, 50);
    EXPECT_EQ(skip_names, (std::vector<std::string>{"linear_skip.lin.weight"}));
    auto inp = seeded_rand(51, {1, 10}, true);
    fsdp.forward(inp).sum().backward();
    StateDict sd;
    {
      StateDictTypeGuard guard(fsdp.module, type);
      sd = state_dict(fsdp.module);
    }
    if (pg.rank() == 0 && type != StateDictType::kLocal) {
      auto keys = sd.keys();
      auto expected = state_dict(std::make_shared<SkipModelImpl>(false, nullptr)).keys();
      std::sort(keys.begin(), keys.end());
      std::sort(expected.begin(), expected.end());
      EXPECT_EQ(keys, expected);
      // The seed's TODO: parameters of linear_skip are not handled by FSDP:
      // they come back as the module's own tensors.
      EXPECT_EQ(sd.tensor("linear_skip.lin.weight").data_ptr(),
                std::static_pointer_cast<SkipModelImpl>(fsdp.module)->linear_skip->lin->weight.data_ptr());
    }
    // It can be loaded into FSDP.
    auto new_fsdp = create_skip_module(o, true, 52).first;
    zero_model(new_fsdp.module);
    auto p1 = param_list(*fsdp.module), p2 = param_list(*new_fsdp.module);
    ASSERT_EQ(p1.size(), p2.size());
    for (size_t i = 0; i < p1.size(); ++i) EXPECT_FALSE(torch::equal(p1[i], p2[i])) << i;
    {
      StateDictTypeGuard guard(new_fsdp.module, type);
      load_state_dict(new_fsdp.module, sd, /*strict=*/true);
    }
    p1 = param_list(*fsdp.module);
    p2 = param_list(*new_fsdp.module);
    for (size_t i = 0; i < p1.size(); ++i) EXPECT_TRUE(torch::equal(p1[i], p2[i])) << i;

    // And into a local model.
    auto local = create_skip_module(o, false, 53).first;
    {
      torch::NoGradGuard no_grad;
      for (auto& p : local.module->parameters()) p.zero_();
    }
    {
      SummonFullParams summon(fsdp.module);
      p1 = param_list(*fsdp.module);
      p2 = param_list(*local.module);
      ASSERT_EQ(p1.size(), p2.size());
      for (size_t i = 0; i < p1.size(); ++i) EXPECT_FALSE(torch::equal(p1[i], p2[i])) << i;
    }
    if (type == StateDictType::kLocal) return;
    sd = gather_state_dict(sd, pg);
    SummonFullParams summon(fsdp.module);
    if (pg.rank() == 0) {
      load_state_dict(local.module, sd, /*strict=*/true);
      p1 = param_list(*fsdp.module);
      p2 = param_list(*local.module);
      for (size_t i = 0; i < p1.size(); ++i) EXPECT_TRUE(torch::equal(p1[i], p2[i])) << i;
    }
  });
}

INSTANTIATE_TEST_SUITE_P(TestFSDPStateDict, TestFSDPStateDictSkip, ::testing::ValuesIn(kAllTypes),
                         [](const auto& info) { return type_name(info.param) + "_double_nest_true"; });

// ===========================================================================
// test_wrong_state_dict_config
TEST(TestFSDPStateDict, WrongStateDictConfig) {
  run_ranks(kWorld, [&](dist::ProcessGroup& pg) {
    TestModel model = initialize_fsdp_model(base_options(pg));
    try {
      StateDictTypeGuard guard(model.module, StateDictType::kFull, LocalStateDictConfig{});
      ADD_FAILURE() << "no error";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("Expected state_dict_config of type"), std::string::npos) << e.what();
    }
    // The failed guard changed nothing.
    for (auto& [path, m] : fsdp_modules(model.module)) EXPECT_EQ(state_dict_type_of(*m), StateDictType::kFull);
  });
}

// ===========================================================================
// test_state_dict_with_ignored_modules
using IgnoredParam = std::tuple<StateDictType, bool, bool>;  // type, prefix, ignore_inner
class TestFSDPStateDictIgnored : public ::testing::TestWithParam<IgnoredParam> {};

TEST_P(TestFSDPStateDictIgnored, StateDictWithIgnoredModules) {
  const auto [type, prefix, ignore_inner] = GetParam();
  run_ranks(kWorld, [&, type = type, prefix = prefix, ignore_inner = ignore_inner](dist::ProcessGroup& pg) {
    FSDPOptions o = base_options(pg);
    auto model = seeded(60, [&] { return std::make_shared<SeedModelImpl>(&o, true, ignore_inner); });
    std::vector<std::pair<torch::Tensor, std::string>> ignored = {{model->outer->bias, "outer.bias"},
                                                                  {model->outer->weight, "outer.weight"}};
    if (ignore_inner) {
      ignored.push_back({model->inner->bias, "inner.bias"});
      ignored.push_back({model->inner->weight, "inner.weight"});
    }
    // When inner is not ignored this also checks that non-ignored buffers are not cloned.
    ignored.push_back({model->inner->named_buffers()["buffer"], "inner.buffer"});
    ignored.push_back({model->outer->named_buffers()["buffer"], "outer.buffer"});
    FSDPOptions root = o;
    root.ignored_modules({model->outer.ptr()});
    FullyShardedDataParallel<SeedModelImpl> fsdp_model(model, root);
    const std::string prefix_str = prefix ? "foo." : "";
    StateDict sd1;
    {
      StateDictTypeGuard guard(fsdp_model.ptr(), type);
      sd1 = gather_state_dict(state_dict(fsdp_model.ptr(), prefix_str), pg);
    }
    auto fsdp_params = get_full_params(fsdp_model.ptr());
    // The ignored parameters and all buffers are not cloned.
    for (const auto& [tensor, name] : ignored) {
      ASSERT_TRUE(sd1.contains(prefix_str + name)) << name;
      EXPECT_EQ(tensor.data_ptr(), sd1.tensor(prefix_str + name).data_ptr()) << prefix_str + name;
    }
    EXPECT_FALSE(sd1.contains(prefix_str + "inner.non_persistent_buffer"));
    // The state dict loads into a non-wrapped version of the model.
    auto nonwrapped = seeded(61, [&] { return std::make_shared<SeedModelImpl>(nullptr, true); });
    {
      torch::NoGradGuard no_grad;
      for (auto& p : nonwrapped->parameters()) p.zero_();
    }
    StateDict to_load;
    for (const auto& [key, v] : sd1) to_load.insert(key.substr(prefix_str.size()), v);
    load_state_dict(nonwrapped, to_load, /*strict=*/true);
    EXPECT_TRUE(all_equal(fsdp_params, param_list(*nonwrapped)));
    // Saved again, the ignored parameters and buffers keep their data pointers.
    StateDict sd2;
    {
      StateDictTypeGuard guard(fsdp_model.ptr(), type);
      sd2 = state_dict(fsdp_model.ptr(), prefix_str);
    }
    for (const auto& [tensor, name] : ignored) {
      ASSERT_TRUE(sd2.contains(prefix_str + name)) << name;
      EXPECT_EQ(tensor.data_ptr(), sd2.tensor(prefix_str + name).data_ptr());
      EXPECT_EQ(sd1.tensor(prefix_str + name).data_ptr(), sd2.tensor(prefix_str + name).data_ptr());
    }
  });
}

INSTANTIATE_TEST_SUITE_P(TestFSDPStateDict, TestFSDPStateDictIgnored,
                         ::testing::Combine(::testing::ValuesIn(kUnflattened), ::testing::Bool(), ::testing::Bool()),
                         [](const auto& info) {
                           auto b = [](bool x) { return x ? std::string("true") : std::string("false"); };
                           return type_name(std::get<0>(info.param)) + "_prefix_" + b(std::get<1>(info.param)) +
                                  "_ignore_inner_" + b(std::get<2>(info.param));
                         });

// ===========================================================================
// test_state_dict_type
TEST(TestFSDPStateDict, StateDictType) {
  run_ranks(kWorld, [&](dist::ProcessGroup& pg) {
    const FSDPOptions o = base_options(pg);
    auto module = seeded(70, [&] { return std::make_shared<SkipModelImpl>(true, &o); });
    FullyShardedDataParallel<SkipModelImpl> fsdp(module, o);
    ASSERT_EQ(fsdp_modules(fsdp.ptr()).size(), 3u);
    {
      StateDictTypeGuard guard(fsdp.ptr(), StateDictType::kLocal);
      for (auto& [path, m] : fsdp_modules(fsdp.ptr())) EXPECT_EQ(state_dict_type_of(*m), StateDictType::kLocal);
    }
    for (auto& [path, m] : fsdp_modules(fsdp.ptr())) EXPECT_EQ(state_dict_type_of(*m), StateDictType::kFull);
  });
}

}  // namespace
