// State dict behaviour beyond the seed suite: sharded pieces at odd world
// sizes, strict-mode errors, loading at the wrong time or from another
// sharding, mixed-precision buffers, Module::to() on a wrapped model, and
// the box arithmetic behind ShardedTensor.
#include <gtest/gtest.h>

#include <random>
#include <set>

#include "../support/thread_ranks.h"
#include "fsdp/error.h"
#include "fsdp/state_dict/state_dict.h"
#include "../support/models.h"

using namespace fsdp;
using namespace fsdp::testing;

namespace {

FSDPOptions auto_wrapped(dist::ProcessGroup& pg, ShardingStrategy s = ShardingStrategy::kFullShard) {
  FSDPOptions o = options_for_strategy(pg, s);
  o.auto_wrap_policy(transformer_auto_wrap_policy<BlockImpl>());
  return o;
}

TEST(FlatRangeBoxes, CoverExactlyTheRangeInFlatOrder) {
  std::mt19937 gen(3);
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<int64_t> shape;
    const int nd = static_cast<int>(gen() % 4) + 1;
    for (int d = 0; d < nd; ++d) shape.push_back(static_cast<int64_t>(gen() % 5) + 1);
    int64_t numel = 1;
    for (auto s : shape) numel *= s;
    int64_t a = static_cast<int64_t>(gen() % static_cast<unsigned>(numel + 1));
    int64_t b = static_cast<int64_t>(gen() % static_cast<unsigned>(numel + 1));
    if (a > b) std::swap(a, b);
    auto boxes = flat_range_boxes(shape, a, b);
    EXPECT_LE(boxes.size(), static_cast<size_t>(2 * nd - 1));
    // Mark each box's elements in a numbered tensor; they must be a..b-1 in order.
    auto numbered = torch::arange(numel).view(shape);
    std::vector<int64_t> seen;
    for (auto& [offsets, sizes] : boxes) {
      auto t = numbered;
      for (int d = 0; d < nd; ++d) t = t.narrow(d, offsets[static_cast<size_t>(d)], sizes[static_cast<size_t>(d)]);
      auto flat = t.reshape({-1});
      for (int64_t i = 0; i < flat.numel(); ++i) seen.push_back(flat[i].item<int64_t>());
    }
    ASSERT_EQ(static_cast<int64_t>(seen.size()), b - a);
    for (int64_t i = 0; i < b - a; ++i) ASSERT_EQ(seen[static_cast<size_t>(i)], a + i);
  }
  EXPECT_EQ(flat_range_boxes({}, 0, 1).size(), 1u);  // a 0-dim tensor
}

TEST(ShardedStateDict, PiecesAtWorld3AreDisjointCoverTheModelAndNeedNoGather) {
  std::map<std::string, torch::Tensor> full;
  run_ranks(3, [&](dist::ProcessGroup& pg) {
    FullyShardedDataParallel<NetImpl> model(make_net(5), auto_wrapped(pg));
    StateDict sharded;
    const int64_t sent = pg.bytes_sent();
    {
      StateDictTypeGuard guard(model.ptr(), StateDictType::kSharded);
      sharded = state_dict(model.ptr());
    }
    EXPECT_EQ(pg.bytes_sent(), sent);  // produced without communication
    StateDict gathered = gather_state_dict(sharded, pg);
    StateDict whole = state_dict(model.ptr());  // FULL
    EXPECT_EQ(gathered.keys(), whole.keys());
    for (const auto& key : whole.keys()) EXPECT_TRUE(torch::equal(gathered.tensor(key), whole.tensor(key))) << key;
    // This rank's pieces are views of its shards: exactly its share of elements.
    int64_t local = 0, total = 0;
    for (const auto& [key, v] : sharded) {
      if (!std::holds_alternative<ShardedTensor>(v)) continue;
      const auto& st = std::get<ShardedTensor>(v);
      local += st.local_numel();
      total += st.global_numel();
      for (const auto& s : st.local_shards) EXPECT_EQ(s.offsets.size(), st.global_shape.size()) << key;
    }
    EXPECT_GE(local, total / 3 - 100);
    EXPECT_LE(local, total / 3 + 100);
  });
}

TEST(LoadStateDict, StrictReportsEveryProblemAtOnceAndNonStrictOnlyShapes) {
  auto net = make_net(1);
  StateDict sd = state_dict(net);
  sd.erase("blocks.0.fc1.bias");
  sd.erase("extra.scale");
  sd.insert("not.a.key", torch::zeros({1}));
  sd.set("emb.weight", torch::zeros({3, 3}));
  try {
    load_state_dict(net, sd, /*strict=*/true);
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("Missing key(s) in state_dict: \"blocks.0.fc1.bias\", \"extra.scale\""), std::string::npos) << m;
    EXPECT_NE(m.find("Unexpected key(s) in state_dict: \"not.a.key\""), std::string::npos) << m;
    EXPECT_NE(m.find("size mismatch for emb.weight: copying a param with shape [3, 3] from checkpoint, the shape in "
                     "current model is [11, 7]"),
              std::string::npos)
        << m;
  }
  EXPECT_THROW(load_state_dict(net, sd, /*strict=*/false), ConfigError);  // the shape is still wrong
  sd.set("emb.weight", torch::ones({kVocab, kDim}));
  load_state_dict(net, sd, /*strict=*/false);
  EXPECT_TRUE(torch::equal(net->emb->weight, torch::ones({kVocab, kDim})));
}

TEST(LoadStateDict, BetweenForwardAndBackwardIsAnError) {
  const auto batch = make_batches(1, 4, 2)[0];
  run_ranks(2, [&](dist::ProcessGroup& pg) {
    FullyShardedDataParallel<NetImpl> model(make_net(5), auto_wrapped(pg, ShardingStrategy::kShardGradOp));
    StateDict sd = state_dict(model.ptr());
    auto loss = torch::nn::functional::cross_entropy(model(batch.tokens.narrow(0, pg.rank() * 2, 2)),
                                                     batch.target.narrow(0, pg.rank() * 2, 2));
    try {
      load_state_dict(model.ptr(), sd);
      ADD_FAILURE() << "no error";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("waiting for its backward"), std::string::npos) << e.what();
    }
    loss.backward();
    load_state_dict(model.ptr(), sd);  // fine now
    {
      torch::NoGradGuard no_grad;
      model(batch.tokens.narrow(0, pg.rank() * 2, 2));
    }
    load_state_dict(model.ptr(), sd);  // a forward without gradients waits for nothing
    SummonFullParams summon(model.ptr());
    EXPECT_THROW(load_state_dict(model.ptr(), sd), ConfigError);
  });
}

TEST(LoadStateDict, ShardedFromAnotherShardingIsRefusedByName) {
  StateDict saved;
  std::mutex mu;
  run_ranks(2, [&](dist::ProcessGroup& pg) {
    FullyShardedDataParallel<NetImpl> model(make_net(5), auto_wrapped(pg));
    StateDictTypeGuard guard(model.ptr(), StateDictType::kSharded);
    auto sd = state_dict(model.ptr());
    std::lock_guard<std::mutex> lock(mu);
    if (pg.rank() == 0) saved = sd;
  });
  run_ranks(3, [&](dist::ProcessGroup& pg) {
    FullyShardedDataParallel<NetImpl> model(make_net(6), auto_wrapped(pg));
    StateDictTypeGuard guard(model.ptr(), StateDictType::kSharded);
    if (pg.rank() != 0) {  // rank 0 of 3 needs a prefix that rank 0 of 2 may hold
      try {
        load_state_dict(model.ptr(), saved);
        ADD_FAILURE() << "no error on rank " << pg.rank();
      } catch (const ConfigError& e) {
        EXPECT_NE(std::string(e.what()).find("does not hold the elements"), std::string::npos) << e.what();
      }
    }
    pg.barrier();  // no rank leaves (and closes its connections) while another still sets up
  });
}

int sharded_entries(const StateDict& sd) {
  int n = 0;
  for (const auto& [key, v] : sd) n += std::holds_alternative<ShardedTensor>(v) ? 1 : 0;
  return n;
}

TEST(LoadStateDict, ARefusedLoadWritesNothing) {
  // Loading checks everything it will copy before it copies anything: a
  // value that does not hold this rank's part, even at the last key, leaves
  // the whole model as it was.
  run_ranks(2, [&](dist::ProcessGroup& pg) {
    FullyShardedDataParallel<NetImpl> model(make_net(5), auto_wrapped(pg));
    FullyShardedDataParallel<NetImpl> other(make_net(6), auto_wrapped(pg));
    StateDict before = map_tensors(state_dict(model.ptr()), [](const at::Tensor& t) { return t.clone(); });
    StateDict incoming = state_dict(other.ptr());
    // The last key of which this rank holds a part (loading writes it last).
    std::string first_held, last_param;
    {
      StateDictTypeGuard guard(model.ptr(), StateDictType::kSharded);
      for (const auto& [key, v] : state_dict(model.ptr())) {
        if (!std::holds_alternative<ShardedTensor>(v) || std::get<ShardedTensor>(v).local_numel() == 0) continue;
        if (first_held.empty()) first_held = key;
        last_param = key;
      }
    }
    ASSERT_NE(first_held, last_param);  // an earlier key would be written first
    ShardedTensor nothing;  // the right shape, no piece of it
    nothing.global_shape = incoming.tensor(last_param).sizes().vec();
    incoming.set(last_param, nothing);
    try {
      load_state_dict(model.ptr(), incoming);
      ADD_FAILURE() << "no error on rank " << pg.rank();
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("'" + last_param + "' does not hold the elements"), std::string::npos)
          << e.what();
    }
    StateDict after = state_dict(model.ptr());
    ASSERT_EQ(after.keys(), before.keys());
    for (const auto& key : before.keys()) EXPECT_TRUE(torch::equal(after.tensor(key), before.tensor(key))) << key;
  });
}

TEST(StateDictTypeGuard, GuardsNestPerModelAndRestoreTheOuterSetting) {
  run_ranks(2, [&](dist::ProcessGroup& pg) {
    FullyShardedDataParallel<NetImpl> a(make_net(5), auto_wrapped(pg));
    FullyShardedDataParallel<NetImpl> b(make_net(6), auto_wrapped(pg));
    auto type_of = [](const std::shared_ptr<torch::nn::Module>& m) {
      std::set<StateDictType> types;
      for (auto& [path, unit] : fsdp_modules(m)) types.insert(state_dict_type_of(*unit));
      EXPECT_EQ(types.size(), 1u);
      return *types.begin();
    };
    {
      StateDictTypeGuard outer(a.ptr(), StateDictType::kSharded);
      EXPECT_EQ(type_of(a.ptr()), StateDictType::kSharded);
      EXPECT_EQ(type_of(b.ptr()), StateDictType::kFull);  // another model keeps its own
      {
        StateDictTypeGuard inner(a.ptr(), StateDictType::kLocal, LocalStateDictConfig{true});
        EXPECT_EQ(type_of(a.ptr()), StateDictType::kLocal);
        auto local = state_dict(a.ptr());
        for (const auto& [key, v] : local) {
          if (!std::holds_alternative<ShardedTensor>(v)) continue;
          for (const auto& s : std::get<ShardedTensor>(v).local_shards) EXPECT_TRUE(s.tensor.device().is_cpu());
        }
      }
      EXPECT_EQ(type_of(a.ptr()), StateDictType::kSharded);
      EXPECT_GT(sharded_entries(state_dict(a.ptr())), 0);
    }
    EXPECT_EQ(type_of(a.ptr()), StateDictType::kFull);
    EXPECT_EQ(sharded_entries(state_dict(a.ptr())), 0);
  });
}

TEST(StateDict, MixedPrecisionGivesMasterParametersAndOriginalBufferDtypes) {
  const auto batch = make_batches(1, 4, 2)[0];
  run_ranks(2, [&](dist::ProcessGroup& pg) {
    FSDPOptions o = auto_wrapped(pg);
    o.mixed_precision(MixedPrecision{torch::kBFloat16, torch::kFloat, torch::kBFloat16});
    FullyShardedDataParallel<NetImpl> model(make_net(5), o);
    torch::nn::functional::cross_entropy(model(batch.tokens.narrow(0, pg.rank() * 2, 2)).to(torch::kFloat),
                                         batch.target.narrow(0, pg.rank() * 2, 2))
        .backward();
    EXPECT_EQ(model->extra->scale.scalar_type(), torch::kBFloat16);  // cast for compute
    for (auto type : {StateDictType::kFull, StateDictType::kSharded}) {
      StateDictTypeGuard guard(model.ptr(), type);
      StateDict sd = state_dict(model.ptr());
      for (const auto& [key, v] : sd) {
        const auto dtype = std::holds_alternative<torch::Tensor>(v) ? std::get<torch::Tensor>(v).scalar_type()
                                                                   : std::get<ShardedTensor>(v).dtype;
        EXPECT_EQ(dtype, torch::kFloat) << key;
      }
    }
  });
}

TEST(StateDict, ModuleToOnAWrappedModelChangesItsDtype) {
  const auto batches = make_batches(2, 4, 3);
  // Reference: the plain model in float64.
  auto ref = make_net(8);
  ref->to(torch::kDouble);
  torch::optim::SGD ref_opt(ref->parameters(), torch::optim::SGDOptions(0.1));
  auto want = train_local(*ref, ref_opt, batches);
  for (bool use_orig : {false, true}) {
    run_ranks(2, [&](dist::ProcessGroup& pg) {
      FSDPOptions o = auto_wrapped(pg);
      o.use_orig_params(use_orig);
      FullyShardedDataParallel<NetImpl> model(make_net(8), o);
      model->to(torch::kDouble);
      torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
      for (const auto& b : batches) {
        opt.zero_grad();
        auto logits = model(b.tokens.narrow(0, pg.rank() * 2, 2));
        EXPECT_EQ(logits.scalar_type(), torch::kDouble);
        torch::nn::functional::cross_entropy(logits, b.target.narrow(0, pg.rank() * 2, 2)).backward();
        opt.step();
      }
      auto got = to_map(full_parameters(model.ptr()));
      for (auto& [k, v] : got) EXPECT_EQ(v.scalar_type(), torch::kDouble) << k;
      expect_close(got, want, 1e-10, use_orig ? "use_orig_params" : "flat");
    });
  }
}

TEST(StateDict, SummonRegistersTheOriginalParametersUnderTheirNames) {
  run_ranks(2, [&](dist::ProcessGroup& pg) {
    FullyShardedDataParallel<NetImpl> model(make_net(5), auto_wrapped(pg));
    std::vector<std::string> outside, inside, plain;
    for (auto& p : model->named_parameters()) outside.push_back(p.key());
    {
      SummonFullParams summon(model.ptr());
      for (auto& p : model->named_parameters()) inside.push_back(p.key());
    }
    for (auto& p : make_net(5)->named_parameters()) plain.push_back(p.key());
    EXPECT_EQ(inside, plain);
    std::vector<std::string> after;
    for (auto& p : model->named_parameters()) after.push_back(p.key());
    EXPECT_EQ(after, outside);
    EXPECT_NE(std::find(outside.begin(), outside.end(), "flat_param"), outside.end());
  });
}

TEST(StateDict, NonPersistentBuffersAreLeftOut) {
  auto net = make_net(1);
  EXPECT_TRUE(state_dict(net).contains("extra.scale"));
  set_persistent(*net->extra, "scale", false);
  EXPECT_FALSE(is_persistent(*net->extra, "scale"));
  EXPECT_FALSE(state_dict(net).contains("extra.scale"));
  EXPECT_TRUE(state_dict(net).contains("blocks.0.scale"));
  EXPECT_THROW(set_persistent(*net, "nope", false), ConfigError);
  set_persistent(*net->extra, "scale", true);
  EXPECT_TRUE(state_dict(net).contains("extra.scale"));
}

}  // namespace
