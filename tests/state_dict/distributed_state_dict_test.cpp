// torch.distributed.checkpoint.state_dict's API
// (fsdp/state_dict/distributed_state_dict.h) on FSDP2 (fully_shard) and
// FSDP1 models: the sharded form is each parameter's own rows, taken without
// a byte of communication; the full form is the unsharded model; both round
// trip, across world sizes and between the engines; cpu_offload,
// ignore_frozen_params, strict and broadcast_from_rank0 do what torch's do.
#include <gtest/gtest.h>

#include <map>
#include <mutex>

#include "../support/thread_ranks.h"
#include "../support/trainer.h"
#include "fsdp/error.h"
#include "fsdp/state_dict/distributed_state_dict.h"

using namespace fsdp;
using namespace fsdp::testing;

namespace {

constexpr int64_t kBatch = 12;
const StateDictOptions kFull = StateDictOptions().full_state_dict(true);

std::map<std::string, torch::Tensor> tensors_of(const StateDict& sd) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& [k, v] : sd) out[k] = std::get<torch::Tensor>(v);
  return out;
}

void expect_same(const std::map<std::string, torch::Tensor>& got, const std::map<std::string, torch::Tensor>& want,
                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (const auto& [k, v] : want) {
    ASSERT_TRUE(got.count(k)) << what << ": no " << k;
    EXPECT_TRUE(torch::equal(got.at(k), v)) << what << ": " << k;
  }
}

StateDict to_state(const std::map<std::string, torch::Tensor>& tensors) {
  StateDict out;
  for (const auto& [k, v] : tensors) out.insert(k, v);
  return out;
}

// The unsharded model's state, as plain LibTorch holds it.
std::map<std::string, torch::Tensor> plain_state(uint64_t seed) { return tensors_of(state_dict(make_net(seed))); }

FullyShard<NetImpl> fsdp2_net(std::shared_ptr<NetImpl> net, const Mesh& mesh) {
  return FullyShard<NetImpl>(std::move(net), FullyShardOptions(mesh), transformer_auto_wrap_policy<BlockImpl>());
}

// The parameter objects themselves (no copy).
std::map<std::string, torch::Tensor> param_objects(torch::nn::Module& m) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& p : m.named_parameters()) out[p.key()] = p.value();
  return out;
}

}  // namespace

TEST(DistributedStateDict, Fsdp2ShardedIsEachParametersOwnRowsWithoutCommunication) {
  const auto plain = plain_state(5);
  run_ranks(3, [&](dist::ProcessGroup& pg) {
    Trainer t(pg, Opt::kAdamW, 5, Engine::kFsdp2);
    const auto params = param_objects(*t.model.ptr());
    const uint64_t sent = pg.bytes_sent();
    const StateDict sd = get_model_state_dict(t.model.ptr());
    EXPECT_EQ(pg.bytes_sent(), sent);  // no byte moved
    ASSERT_EQ(sd.size(), plain.size());
    for (const auto& [key, value] : sd) {
      const torch::Tensor& whole = plain.at(key);
      if (!params.count(key)) {  // a buffer: whole on every rank
        EXPECT_TRUE(torch::equal(std::get<torch::Tensor>(value), whole)) << key;
        continue;
      }
      ASSERT_TRUE(std::holds_alternative<ShardedTensor>(value)) << key;
      const auto& st = std::get<ShardedTensor>(value);
      EXPECT_EQ(st.global_shape, whole.sizes().vec()) << key;
      // torch.chunk's rows: ceil(dim0 / 3) per rank, the last ranks fewer or none.
      const int64_t per = (whole.size(0) + 2) / 3, begin = std::min(whole.size(0), per * pg.rank());
      const int64_t rows = std::min(whole.size(0), begin + per) - begin;
      if (rows == 0) {
        EXPECT_TRUE(st.local_shards.empty()) << key;
        continue;
      }
      ASSERT_EQ(st.local_shards.size(), 1u) << key;
      const Shard& piece = st.local_shards.front();
      EXPECT_EQ(piece.offsets[0], begin) << key;
      EXPECT_TRUE(torch::equal(piece.tensor, whole.narrow(0, begin, rows))) << key;
      EXPECT_EQ(piece.tensor.data_ptr(), params.at(key).data_ptr()) << key << ": not the parameter's own memory";
    }
  });
}

TEST(DistributedStateDict, Fsdp2FullIsTheUnshardedModelAndCpuOffloadGivesItToRank0Only) {
  const auto plain = plain_state(5);
  run_ranks(3, [&](dist::ProcessGroup& pg) {
    Trainer t(pg, Opt::kAdamW, 5, Engine::kFsdp2);
    expect_same(tensors_of(get_model_state_dict(t.model.ptr(), kFull)), plain, "full");
    const StateDict offloaded = get_model_state_dict(t.model.ptr(), StateDictOptions(kFull).cpu_offload(true));
    if (pg.rank() == 0) {
      expect_same(tensors_of(offloaded), plain, "full, cpu_offload, rank 0");
    } else {
      EXPECT_TRUE(offloaded.empty()) << "rank " << pg.rank();
    }
  });
}

// Model and optimizer, sharded and full, into a model that has other values
// and its own optimizer state: the same snapshot, and the same training after.
TEST(DistributedStateDict, Fsdp2RoundTripsInBothFormsAndAcrossWorldSizes) {
  const auto batches = make_batches(4, kBatch, 3);
  std::map<std::string, torch::Tensor> want, after;
  StateDict full_model;
  OptimStateDict full_optim;
  std::mutex mu;
  run_ranks(2, [&](dist::ProcessGroup& pg) {
    Trainer a(pg, Opt::kAdamW, 1, Engine::kFsdp2);
    a.train(pg, batches, 0, 2);
    const auto snap = a.snapshot();
    for (const bool full : {false, true}) {
      const auto o = StateDictOptions().full_state_dict(full);
      const StateDict model = get_model_state_dict(a.model.ptr(), o);
      const OptimStateDict optim = get_optimizer_state_dict(a.model.ptr(), *a.optimizer, o);
      Trainer b(pg, Opt::kAdamW, 9, Engine::kFsdp2);
      b.train(pg, batches, 3, 4);  // state of its own, to be replaced
      set_model_state_dict(b.model.ptr(), model, o);
      set_optimizer_state_dict(b.model.ptr(), *b.optimizer, optim, o);
      expect_same(b.snapshot(), snap, full ? "full" : "sharded");
      // torch's get_state_dict / set_state_dict: both at once.
      Trainer c(pg, Opt::kAdamW, 8, Engine::kFsdp2);
      c.train(pg, batches, 3, 4);
      const auto [both_model, both_optim] = get_state_dict(a.model.ptr(), *a.optimizer, o);
      set_state_dict(c.model.ptr(), *c.optimizer, both_model, both_optim, o);
      expect_same(c.snapshot(), snap, full ? "full, get_state_dict" : "sharded, get_state_dict");
      if (full && pg.rank() == 0) {
        std::lock_guard<std::mutex> lock(mu);
        full_model = map_tensors(model, [](const torch::Tensor& t) { return t.clone(); });
        full_optim = {map_tensors(optim.state, [](const torch::Tensor& t) { return t.clone(); }), optim.param_groups};
      }
    }
    a.train(pg, batches, 2, 4);
    const auto end = a.snapshot();
    std::lock_guard<std::mutex> lock(mu);
    if (pg.rank() == 0) want = snap, after = end;
  });
  // World 2's full state at world 3: the same state, and two more steps
  // agree with world 2's to float rounding (the reductions sum in other orders).
  run_ranks(3, [&](dist::ProcessGroup& pg) {
    Trainer c(pg, Opt::kAdamW, 9, Engine::kFsdp2);
    set_model_state_dict(c.model.ptr(), full_model, kFull);
    set_optimizer_state_dict(c.model.ptr(), *c.optimizer, full_optim, kFull);
    expect_same(c.snapshot(), want, "world 2 -> 3");
    c.train(pg, batches, 2, 4);
    for (const auto& [k, v] : c.snapshot()) EXPECT_TRUE(torch::allclose(v, after.at(k), 1e-5, 1e-6)) << k;
  });
}

// The same functions on FSDP1 models, and between the engines both ways.
TEST(DistributedStateDict, SameFunctionsOnFsdp1AndBetweenTheEngines) {
  const auto batches = make_batches(2, kBatch, 4);
  for (const Engine from : {Engine::kFsdp1, Engine::kFsdp2}) {
    const Engine to = from == Engine::kFsdp1 ? Engine::kFsdp2 : Engine::kFsdp1;
    const std::string what = from == Engine::kFsdp1 ? "FSDP1 -> FSDP2" : "FSDP2 -> FSDP1";
    std::map<std::string, torch::Tensor> want;
    StateDict model;
    OptimStateDict optim;
    std::mutex mu;
    run_ranks(2, [&](dist::ProcessGroup& pg) {
      Trainer a(pg, Opt::kAdamW, 1, from);
      a.train(pg, batches, 0, 2);
      auto m = get_model_state_dict(a.model.ptr(), kFull);
      auto o = get_optimizer_state_dict(a.model.ptr(), *a.optimizer, kFull);
      const auto snap = a.snapshot();
      // Sharded, into a model of the same engine and world.
      Trainer same(pg, Opt::kAdamW, 9, from);
      set_model_state_dict(same.model.ptr(), get_model_state_dict(a.model.ptr()));
      set_optimizer_state_dict(same.model.ptr(), *same.optimizer, get_optimizer_state_dict(a.model.ptr(), *a.optimizer));
      expect_same(same.snapshot(), snap, what + ": sharded, same engine");
      std::lock_guard<std::mutex> lock(mu);
      if (pg.rank() == 0) want = snap, model = std::move(m), optim = std::move(o);
    });
    run_ranks(3, [&](dist::ProcessGroup& pg) {
      Trainer b(pg, Opt::kAdamW, 9, to);
      set_model_state_dict(b.model.ptr(), model, kFull);
      set_optimizer_state_dict(b.model.ptr(), *b.optimizer, optim, kFull);
      expect_same(b.snapshot(), want, what);
    });
  }
}

// FULL lists an optimizer's state in the optimizer's order, as SHARDED does
// (torch's: its param_groups' order), also where a parameter is outside every
// fully_shard group and comes first.
TEST(DistributedStateDict, FullAndShardedOptimizerStateListKeysInTheOptimizersOrder) {
  const auto batches = make_batches(1, kBatch, 3);
  run_ranks(2, [&](dist::ProcessGroup& pg) {
    auto net = make_net(3);
    FullyShardOptions o(Mesh::of(borrow(pg)));
    o.ignored_params({net->emb->weight});  // whole on every rank (the head shares it)
    auto model = FullyShard<NetImpl>(net, o, transformer_auto_wrap_policy<BlockImpl>());
    auto optimizer = make_optimizer(Opt::kAdamW, model->parameters());
    const int64_t local = kBatch / pg.size();
    torch::nn::functional::cross_entropy(model(batches[0].tokens.narrow(0, pg.rank() * local, local)),
                                         batches[0].target.narrow(0, pg.rank() * local, local))
        .backward();
    optimizer->step();
    const auto sharded = get_optimizer_state_dict(model.ptr(), *optimizer).state.keys();
    const auto full = get_optimizer_state_dict(model.ptr(), *optimizer, kFull).state.keys();
    EXPECT_EQ(full, sharded);
    ASSERT_FALSE(full.empty());
    EXPECT_EQ(full.front().rfind("emb.weight.", 0), 0u) << full.front();
  });
}

TEST(DistributedStateDict, IgnoreFrozenParamsLeavesThemOutAndDoesNotGatherThem) {
  const auto plain = plain_state(5);
  run_ranks(2, [&](dist::ProcessGroup& pg) {
    auto net = make_net(5);
    net->emb->weight.set_requires_grad(false);  // frozen (the head shares it)
    auto model = fsdp2_net(net, Mesh::of(borrow(pg)));
    for (const bool full : {false, true}) {
      const auto o = StateDictOptions().full_state_dict(full);
      uint64_t sent = pg.bytes_sent();
      const StateDict all = get_model_state_dict(model.ptr(), o);
      const uint64_t all_bytes = pg.bytes_sent() - sent;
      sent = pg.bytes_sent();
      const StateDict trainable = get_model_state_dict(model.ptr(), StateDictOptions(o).ignore_frozen_params(true));
      const uint64_t trainable_bytes = pg.bytes_sent() - sent;
      EXPECT_TRUE(all.contains("emb.weight"));
      EXPECT_FALSE(trainable.contains("emb.weight"));
      EXPECT_EQ(trainable.size() + 1, all.size());
      if (full) {
        EXPECT_LT(trainable_bytes, all_bytes);  // the frozen weight was not gathered
        EXPECT_TRUE(torch::equal(trainable.tensor("head.bias"), plain.at("head.bias")));
      }
    }
  });
}

// Only rank 0 holds the state; every rank ends with it. FSDP2 at world 3 and
// on a 2x2 mesh (HSDP: the tensors cross both groups), FSDP1 at world 3.
TEST(DistributedStateDict, BroadcastFromRank0LoadsRank0sStateEverywhere) {
  const auto plain = plain_state(5);
  const auto batches = make_batches(2, kBatch, 6);
  std::map<std::string, torch::Tensor> want;
  StateDict model;
  OptimStateDict optim;
  std::mutex mu;
  run_ranks(2, [&](dist::ProcessGroup& pg) {
    Trainer a(pg, Opt::kAdamW, 1, Engine::kFsdp2);
    a.train(pg, batches, 0, 2);
    auto m = get_model_state_dict(a.model.ptr(), kFull);
    auto o = get_optimizer_state_dict(a.model.ptr(), *a.optimizer, kFull);
    auto snap = a.snapshot();
    std::lock_guard<std::mutex> lock(mu);
    if (pg.rank() == 0) want = std::move(snap), model = std::move(m), optim = std::move(o);
  });
  const auto bcast = StateDictOptions(kFull).broadcast_from_rank0(true);
  for (const Engine engine : {Engine::kFsdp2, Engine::kFsdp1}) {
    run_ranks(3, [&](dist::ProcessGroup& pg) {
      Trainer b(pg, Opt::kAdamW, 9, engine);
      const uint64_t sent = pg.bytes_sent();
      set_model_state_dict(b.model.ptr(), pg.rank() == 0 ? model : StateDict(), bcast);
      set_optimizer_state_dict(b.model.ptr(), *b.optimizer, pg.rank() == 0 ? optim : OptimStateDict(), bcast);
      if (pg.rank() == 0) EXPECT_GT(pg.bytes_sent(), sent);
      expect_same(b.snapshot(), want, engine == Engine::kFsdp2 ? "FSDP2" : "FSDP1");
    });
  }
  run_ranks(4, [&](dist::ProcessGroup& pg) {
    auto model2 = fsdp2_net(make_net(9), Mesh::hybrid(dist::init_device_mesh(borrow(pg), 2, 2)));
    set_model_state_dict(model2.ptr(), pg.rank() == 0 ? to_state(plain) : StateDict(), bcast);
    expect_same(tensors_of(get_model_state_dict(model2.ptr(), kFull)), plain, "HSDP 2x2, rank " + std::to_string(pg.rank()));
  });
}

TEST(DistributedStateDict, RefusesWhatTorchRefusesNamingIt) {
  run_ranks(2, [&](dist::ProcessGroup& pg) {
    Trainer t(pg, Opt::kAdamW, 5, Engine::kFsdp2);
    StateDict sd = get_model_state_dict(t.model.ptr());
    sd.erase("head.bias");
    sd.insert("head.nope", torch::zeros({1}));
    try {
      set_model_state_dict(t.model.ptr(), sd);
      ADD_FAILURE() << "strict load of a state dict with a missing and an unexpected key";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("head.bias"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("head.nope"), std::string::npos) << e.what();
    }
    sd.erase("head.nope");
    EXPECT_NO_THROW(set_model_state_dict(t.model.ptr(), sd, StateDictOptions().strict(false)));
    EXPECT_THROW(
        {
          try {
            set_model_state_dict(t.model.ptr(), sd, StateDictOptions().broadcast_from_rank0(true));
          } catch (const ConfigError& e) {
            EXPECT_NE(std::string(e.what()).find("full_state_dict must be True"), std::string::npos) << e.what();
            throw;
          }
        },
        ConfigError);
    {
      StateDictTypeGuard guard(t.model.ptr(), StateDictType::kLocal);
      try {
        state_dict(t.model.ptr());
        ADD_FAILURE() << "LOCAL_STATE_DICT of a fully_shard model";
      } catch (const ConfigError& e) {
        EXPECT_NE(std::string(e.what()).find("LOCAL_STATE_DICT"), std::string::npos) << e.what();
      }
    }
    // A plain (unsharded) model: nothing to broadcast over.
    auto plain = make_net(5);
    EXPECT_THROW(set_model_state_dict(plain, StateDict(), StateDictOptions(kFull).broadcast_from_rank0(true)),
                 ConfigError);
  });
}
