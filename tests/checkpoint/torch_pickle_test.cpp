// Raw module state dicts (Lightning's load_raw): torch.save(model.state_dict())
// files written by Python (tests/python/write_state_dict.py) and by LibTorch's
// torch::pickle_save load into wrapped models at any world size and into
// unwrapped ones, strictly, with named errors. The unpickler alone:
// tests/formats/torch_pickle_test.cpp.
#include <gtest/gtest.h>
#include <torch/serialize.h>

#include <time.h>

#include <chrono>
#include <filesystem>
#include <iostream>
#include <fstream>

#include "fsdp/formats/format.h"
#include "fsdp/formats/torch_pickle.h"
#include "../support/subprocess.h"
#include "../support/thread_ranks.h"
#include "fsdp/checkpoint/checkpoint_io.h"
#include "fsdp/error.h"
#include "fsdp/state_dict/optim_state_dict.h"
#include "fsdp/state_dict/state_dict.h"
#include "../support/raw_state.h"
#include "../support/trainer.h"

using namespace fsdp;
using namespace fsdp::testing;
namespace fs = std::filesystem;

namespace {

// The files of write_state_dict.py, written once for the suite.
constexpr char kWriteStateDict[] = "write_state_dict.py";
using RawStateDict = PythonWrittenFiles<kWriteStateDict>;

TEST_F(RawStateDict, PythonStateDictLoadsIntoAWrappedModelAtAnyWorldSize) {
  for (int world : {1, 2, 3}) {
    for (const char* name : {"raw.pt", "p4.pt", "param.pt"}) {
      run_ranks(world, [&](dist::ProcessGroup& pg) {
        Trainer t(pg, Opt::kSgd, 5);  // other values: everything must come from the file
        load_checkpoint(file(name), t.model.ptr(), pg);
        expect_written_values(full_state(t.model.ptr()), std::string(name) + " at world " + std::to_string(world));
      });
    }
  }
}

TEST_F(RawStateDict, PythonStateDictLoadsIntoAnUnwrappedModelAndConvertsDtypes) {
  for (const char* name : {"raw.pt", "bf16.pt"}) {
    auto plain = make_net(5);
    run_ranks(1, [&](dist::ProcessGroup& pg) { load_checkpoint(file(name), plain, pg); });
    auto state = plain_state();  // keys and order
    std::vector<std::pair<std::string, torch::Tensor>> got;
    for (const auto& [k, v] : state_dict(plain)) got.emplace_back(k, std::get<torch::Tensor>(v));
    EXPECT_EQ(got.front().second.scalar_type(), torch::kFloat32);  // the model's dtype stays
    expect_written_values(got, name);
  }
}

TEST_F(RawStateDict, AWrappedModelLoadedFromItTrainsLikeTheUnwrappedOne) {
  // After the raw load, FSDP at world 2 trains exactly like the plain model
  // given the same values: the loaded state is the model's own.
  const auto batches = make_batches(3, 8, 2);
  auto plain = make_net(5);
  run_ranks(1, [&](dist::ProcessGroup& pg) { load_checkpoint(file("raw.pt"), plain, pg); });
  torch::optim::SGD opt(plain->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  auto want = train_local(*plain, opt, batches);
  run_ranks(2, [&](dist::ProcessGroup& pg) {
    Trainer t(pg, Opt::kSgd, 9);
    load_checkpoint(file("raw.pt"), t.model.ptr(), pg);
    t.train(pg, batches, 0, 3);
    auto got = to_map(full_parameters(t.model.ptr()));
    for (const auto& [k, w] : want) EXPECT_TRUE(torch::allclose(got.at(k), w, 1e-5, 1e-6)) << k;
  });
}

TEST_F(RawStateDict, StrictAndNonStrictNameTheKeys) {
  const auto keys = plain_state();
  const std::string last = keys.back().first, first = keys.front().first;
  run_ranks(2, [&](dist::ProcessGroup& pg) {
    Trainer t(pg, Opt::kSgd, 5);
    expect_config_error([&] { load_checkpoint(file("missing.pt"), t.model.ptr(), pg); }, last);
    expect_config_error([&] { load_checkpoint(file("extra.pt"), t.model.ptr(), pg); }, "extra_key");
    expect_config_error([&] { load_checkpoint(file("shape.pt"), t.model.ptr(), pg); }, first);
    load_checkpoint(file("missing.pt"), t.model.ptr(), pg, /*strict=*/false);
    load_checkpoint(file("extra.pt"), t.model.ptr(), pg, /*strict=*/false);
    expect_written_values(full_state(t.model.ptr()), "non-strict");
  });
}

TEST_F(RawStateDict, FilesThatAreNotAStateDictAreNamed) {
  run_ranks(1, [&](dist::ProcessGroup& pg) {
    Trainer t(pg, Opt::kSgd, 5);
    auto m = t.model.ptr();
    expect_config_error([&] { load_checkpoint(file("nested.pt"), m, pg); },
                 "'model' is a dict of " + std::to_string(plain_state().size()) + ", not a tensor");
    expect_config_error([&] { load_checkpoint(file("object.pt"), m, pg); }, "the Python global argparse.Namespace");
    expect_config_error([&] { load_checkpoint(file("legacy.pt"), m, pg); }, "PyTorch's legacy format");
    expect_config_error([&] { load_checkpoint(file("script.pt"), m, pg); }, "is a TorchScript archive");
    CheckpointState s;
    s.model("model", m);
    expect_config_error([&] { load_checkpoint(file("raw.pt"), s, pg); }, "loads with load_checkpoint(path, module)");
  });
}

// Training checkpoints as plain PyTorch writes them (write_state_dict.py's
// adamw.pt: optimizer.state_dict() numbers the parameters 0, 1, ...) load
// into a wrapped model's CheckpointState at any world size and layout: the
// model, AdamW's state under the right names, the values, nested ones by
// their dotted names.
TEST_F(RawStateDict, PythonCheckpointLoadsModelOptimizerAndValues) {
  if (!fs::exists(file("adamw.pt"))) GTEST_SKIP() << "needs torch 2.x on the Python side";
  const auto plain = plain_state();
  auto net = make_net(1);
  std::set<std::string> params;
  for (const auto& p : net->named_parameters()) params.insert(p.key());
  for (int world : {1, 2}) {
    for (bool use_orig : {false, true}) {
      run_ranks(world, [&](dist::ProcessGroup& pg) {
        Trainer t(pg, Opt::kAdamW, 5, ShardingStrategy::kFullShard, use_orig);
        CheckpointState s;
        s.model("model", t.model.ptr()).optimizer("optimizer", *t.optimizer).value("step", int64_t{0});
        const auto extra = load_checkpoint(file("adamw.pt"), s, pg);
        const std::string where = "world " + std::to_string(world) + (use_orig ? " use_orig_params" : "");
        expect_written_values(full_state(t.model.ptr()), where);
        EXPECT_EQ(s.get<int64_t>("step"), 3) << where;
        ASSERT_EQ(extra.count("hp.lr"), 1u) << where;
        EXPECT_EQ(std::get<double>(extra.at("hp.lr")), 0.1);
        EXPECT_EQ(std::get<std::string>(extra.at("hp.name")), "x");
        StateDictTypeGuard guard(t.model.ptr(), StateDictType::kFull);
        const OptimStateDict osd = optim_state_dict(t.model.ptr(), *t.optimizer);
        EXPECT_DOUBLE_EQ(osd.param_groups.at(0).options.at("lr"), 0.1) << where;
        EXPECT_DOUBLE_EQ(osd.param_groups.at(0).options.at("weight_decay"), 0.0) << where;
        for (size_t j = 0; j < plain.size(); ++j) {
          const auto& [k, t0] = plain[j];
          if (!params.count(k)) continue;
          // One AdamW step from zero state with gradient g: exp_avg = 0.1 g, exp_avg_sq = 0.001 g^2.
          const auto g = expected_value(t0.sizes().vec(), static_cast<int64_t>(j)) / 100;
          EXPECT_TRUE(torch::allclose(std::get<torch::Tensor>(osd.state.at(k + ".exp_avg")), g * 0.1)) << where << k;
          EXPECT_TRUE(torch::allclose(std::get<torch::Tensor>(osd.state.at(k + ".exp_avg_sq")), g * g * 0.001))
              << where << k;
          EXPECT_EQ(std::get<torch::Tensor>(osd.state.at(k + ".step")).item<int64_t>(), 1) << where << k;
        }
      });
    }
  }
}

// What LibTorch's optimizer cannot do is refused by name, not ignored.
TEST_F(RawStateDict, PythonCheckpointOptionsLibTorchCannotHonourAreRefused) {
  if (!fs::exists(file("adamw.pt"))) GTEST_SKIP() << "needs torch 2.x on the Python side";
  run_ranks(2, [&](dist::ProcessGroup& pg) {
    Trainer t(pg, Opt::kAdamW, 5);
    CheckpointState s;
    s.model("model", t.model.ptr()).optimizer("optimizer", *t.optimizer);
    expect_config_error([&] { load_checkpoint(file("maximize.pt"), s, pg); }, "maximize=True has no equivalent in LibTorch's AdamW");
    expect_config_error([&] { load_checkpoint(file("adam.pt"), s, pg); }, "load it into torch::optim::Adam");
  });
}

TEST(RawStateDictLibTorch, PickleSaveOfADictLoadsAtAnyWorldSize) {
  TempDir dir;
  const std::string path = dir.path() + "/libtorch.pt";
  auto state = plain_state();
  c10::Dict<std::string, torch::Tensor> d;
  for (size_t j = 0; j < state.size(); ++j) {
    d.insert(state[j].first, expected_value(state[j].second.sizes().vec(), static_cast<int64_t>(j)));
  }
  const auto bytes = torch::pickle_save(d);
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  for (int world : {1, 3}) {
    run_ranks(world, [&](dist::ProcessGroup& pg) {
      Trainer t(pg, Opt::kSgd, 5);
      load_checkpoint(path, t.model.ptr(), pg);
      expect_written_values(full_state(t.model.ptr()), "world " + std::to_string(world));
    });
  }
}

}  // namespace
