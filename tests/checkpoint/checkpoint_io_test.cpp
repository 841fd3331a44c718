// Checkpoints on disk: round trips of both formats (model, SGD-momentum and
// AdamW state, user values), resharding N -> M for every pair in {1,2,3,4},
// full <-> sharded, unwrapped models, filters, Lightning's errors, and every
// kind of damaged file.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <tuple>

#include <nlohmann/json.hpp>

#include "fsdp/formats/dcp.h"
#include "fsdp/formats/format.h"
#include "fsdp/formats/torch_pickle.h"
#include "../support/errors.h"
#include "../support/index_files.h"
#include "../support/subprocess.h"
#include "../support/thread_ranks.h"
#include "fsdp/checkpoint/checkpoint_io.h"
#include "fsdp/error.h"
#include "fsdp/state_dict/optim_state_dict.h"
#include "fsdp/state_dict/state_dict.h"
#include "../support/trainer.h"

using namespace fsdp;
using namespace fsdp::testing;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kGlobalBatch = 12;

CheckpointState state_of(Trainer& t) {
  return CheckpointState().model("model", t.model.ptr()).optimizer("optimizer", *t.optimizer);
}

void expect_equal(const std::map<std::string, torch::Tensor>& got, const std::map<std::string, torch::Tensor>& want,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (const auto& [k, w] : want) {
    ASSERT_TRUE(got.count(k)) << what << ": missing " << k;
    EXPECT_TRUE(torch::equal(got.at(k), w)) << what << ": " << k;
  }
}


class CheckpointRoundTrip : public ::testing::TestWithParam<std::tuple<CheckpointFormat, Opt>> {};

TEST_P(CheckpointRoundTrip, ResumingGivesTheUninterruptedRunAndTheValues) {
  const auto [format, opt] = GetParam();
  TempDir dir;
  const std::string path = dir.path() + "/ckpt";
  const auto batches = make_batches(6, kGlobalBatch, 4);
  auto rng = torch::arange(10, torch::kLong);
  run_ranks(2, [&, format = format, opt = opt](dist::ProcessGroup& pg) {
    Trainer a(pg, opt, 1);
    a.train(pg, batches, 0, 3);
    CheckpointState s = state_of(a);
    s.value("step", int64_t{3}).value("lr", 0.25).value("done", false).value("tag", std::string("run \"x\"")).value("rng", rng);
    save_checkpoint(path, s, pg, {format});
    a.train(pg, batches, 3, 6);
    auto want = a.snapshot();

    Trainer b(pg, opt, 99);  // other weights: everything must come from the checkpoint
    CheckpointState t = state_of(b);
    t.value("step", int64_t{0}).value("tag", std::string());
    auto extra = load_checkpoint(path, t, pg);
    EXPECT_EQ(t.get<int64_t>("step"), 3);
    EXPECT_EQ(t.get<std::string>("tag"), "run \"x\"");
    ASSERT_EQ(extra.size(), 3u);  // lr, done, rng: not asked for, returned
    EXPECT_EQ(std::get<double>(extra.at("lr")), 0.25);
    EXPECT_EQ(std::get<bool>(extra.at("done")), false);
    EXPECT_TRUE(torch::equal(std::get<torch::Tensor>(extra.at("rng")), rng));
    b.train(pg, batches, 3, 6);
    expect_equal(b.snapshot(), want, "resumed");
  });
}

INSTANTIATE_TEST_SUITE_P(Formats, CheckpointRoundTrip,
                         ::testing::Combine(::testing::Values(CheckpointFormat::kFull, CheckpointFormat::kSharded),
                                            ::testing::Values(Opt::kSgd, Opt::kAdamW)),
                         [](const auto& info) {
                           return std::string(to_string(std::get<0>(info.param))) +
                                  (std::get<1>(info.param) == Opt::kSgd ? "_sgd" : "_adamw");
                         });

// Saved at world N, loaded at world M: the same parameters and optimizer state, exactly.
class CheckpointReshard : public ::testing::TestWithParam<std::tuple<CheckpointFormat, int, int>> {};

TEST_P(CheckpointReshard, LoadsExactlyAtAnyWorldSize) {
  const auto [format, n, m] = GetParam();
  TempDir dir;
  const std::string path = dir.path() + "/ckpt";
  const auto batches = make_batches(2, kGlobalBatch, 5);
  std::map<std::string, torch::Tensor> want;
  std::mutex mu;
  run_ranks(n, [&, format = format](dist::ProcessGroup& pg) {
    Trainer a(pg, Opt::kAdamW, 1, ShardingStrategy::kFullShard, pg.size() % 2 == 0);
    a.train(pg, batches, 0, 2);
    save_checkpoint(path, state_of(a), pg, {format});
    auto snap = a.snapshot();
    std::lock_guard<std::mutex> lock(mu);
    if (pg.rank() == 0) want = snap;
  });
  run_ranks(m, [&](dist::ProcessGroup& pg) {
    Trainer b(pg, Opt::kAdamW, 2, ShardingStrategy::kFullShard, pg.size() % 2 == 1);
    b.train(pg, batches, 0, 1);  // state of its own, to be replaced
    CheckpointState s = state_of(b);
    load_checkpoint(path, s, pg);
    expect_equal(b.snapshot(), want, "world " + std::to_string(pg.size()));
  });
}

INSTANTIATE_TEST_SUITE_P(AllPairs, CheckpointReshard,
                         ::testing::Combine(::testing::Values(CheckpointFormat::kFull, CheckpointFormat::kSharded),
                                            ::testing::Values(1, 2, 3, 4), ::testing::Values(1, 2, 3, 4)),
                         [](const auto& info) {
                           return std::string(to_string(std::get<0>(info.param))) + "_" + std::to_string(std::get<1>(info.param)) +
                                  "_to_" + std::to_string(std::get<2>(info.param));
                         });

// fully_shard (FSDP2) models save and load as FSDP1's do, and checkpoints
// cross between the engines both ways, at another world size: the same
// parameters and optimizer state, exactly. The sharded save of an FSDP2
// model writes each parameter's rows as one chunk.
class CheckpointEngines : public ::testing::TestWithParam<std::tuple<CheckpointFormat, Engine, Engine>> {};

TEST_P(CheckpointEngines, LoadExactlyAcrossEnginesAndWorldSizes) {
  const auto [format, from, to] = GetParam();
  TempDir dir;
  const std::string path = dir.path() + "/ckpt";
  const auto batches = make_batches(2, kGlobalBatch, 5);
  std::map<std::string, torch::Tensor> want;
  std::mutex mu;
  run_ranks(3, [&, format = format, from = from](dist::ProcessGroup& pg) {
    Trainer a(pg, Opt::kAdamW, 1, from);
    a.train(pg, batches, 0, 2);
    save_checkpoint(path, state_of(a), pg, {format});
    auto snap = a.snapshot();
    std::lock_guard<std::mutex> lock(mu);
    if (pg.rank() == 0) want = snap;
  });
  EXPECT_EQ(verify_checkpoint(path), std::vector<std::string>{});  // fsdp-ckpt verify: sound
  if (format == CheckpointFormat::kSharded && from == Engine::kFsdp2) {
    for (const auto& t : inspect_checkpoint(path).tensors) {
      const int64_t rows = t.shape.empty() ? 1 : t.shape[0];
      if (t.key.rfind("model/", 0) == 0 && t.key.find(".scale") == std::string::npos) {  // parameters, not buffers
        EXPECT_EQ(t.chunks, static_cast<int>(std::min<int64_t>(3, rows))) << t.key << ": one chunk per rank with rows";
      }
    }
  }
  run_ranks(2, [&, to = to](dist::ProcessGroup& pg) {
    Trainer b(pg, Opt::kAdamW, 2, to);
    b.train(pg, batches, 0, 1);  // state of its own, to be replaced
    CheckpointState s = state_of(b);
    load_checkpoint(path, s, pg);
    expect_equal(b.snapshot(), want, "world 3 -> 2");
  });
  if (format == CheckpointFormat::kSharded) {
    // fsdp-ckpt consolidate: the sharded save as one full file, which loads the same.
    const std::string file = dir.path() + "/consolidated.pt";
    consolidate_checkpoint(path, file);
    run_ranks(2, [&, to = to](dist::ProcessGroup& pg) {
      Trainer c(pg, Opt::kAdamW, 3, to);
      CheckpointState s = state_of(c);
      load_checkpoint(file, s, pg);
      expect_equal(c.snapshot(), want, "consolidated, world 3 -> 2");
    });
  }
}

INSTANTIATE_TEST_SUITE_P(
    Fsdp2, CheckpointEngines,
    ::testing::Values(std::make_tuple(CheckpointFormat::kSharded, Engine::kFsdp2, Engine::kFsdp2),
                      std::make_tuple(CheckpointFormat::kSharded, Engine::kFsdp1, Engine::kFsdp2),
                      std::make_tuple(CheckpointFormat::kSharded, Engine::kFsdp2, Engine::kFsdp1),
                      std::make_tuple(CheckpointFormat::kFull, Engine::kFsdp2, Engine::kFsdp2),
                      std::make_tuple(CheckpointFormat::kFull, Engine::kFsdp1, Engine::kFsdp2),
                      std::make_tuple(CheckpointFormat::kFull, Engine::kFsdp2, Engine::kFsdp1)),
    [](const auto& info) {
      auto name = [](Engine e) { return e == Engine::kFsdp1 ? std::string("fsdp1") : std::string("fsdp2"); };
      return std::string(to_string(std::get<0>(info.param))) + "_" + name(std::get<1>(info.param)) + "_to_" +
             name(std::get<2>(info.param));
    });

TEST(Checkpoint, AsyncSaveKeepsTheSnapshotAndCommitsAtWait) {
  TempDir dir;
  const auto batches = make_batches(4, kGlobalBatch, 8);
  for (auto format : {CheckpointFormat::kFull, CheckpointFormat::kSharded}) {
    const std::string path = dir.path() + "/" + to_string(format);
    run_ranks(2, [&](dist::ProcessGroup& pg) {
      Trainer a(pg, Opt::kAdamW, 1);
      a.train(pg, batches, 0, 1);
      save_checkpoint(path, state_of(a).value("step", int64_t{1}), pg, {format});
      a.train(pg, batches, 1, 2);
      auto want = a.snapshot();
      CheckpointOptions o{format};
      o.async_save(true);
      save_checkpoint(path, state_of(a).value("step", int64_t{2}), pg, o);
      EXPECT_TRUE(checkpoint_pending(pg));
      a.train(pg, batches, 2, 4);  // training goes on while the save is written
      if (format == CheckpointFormat::kSharded) {
        EXPECT_EQ(inspect_checkpoint(path).values.at("step"), "1");  // not committed yet
      }
      wait_for_checkpoint(pg);
      EXPECT_FALSE(checkpoint_pending(pg));
      Trainer b(pg, Opt::kAdamW, 5);
      CheckpointState s = state_of(b).value("step", int64_t{0});
      load_checkpoint(path, s, pg);
      EXPECT_EQ(s.get<int64_t>("step"), 2);
      expect_equal(b.snapshot(), want, std::string("async ") + to_string(format));  // the state at the save, not after
    });
  }
}

TEST(Checkpoint, HybridAndNoShardSaveEachPieceOnce) {
  TempDir dir;
  const auto batches = make_batches(1, kGlobalBatch, 6);
  std::map<std::string, torch::Tensor> want;
  std::mutex mu;
  for (auto s : {ShardingStrategy::kHybridShard, ShardingStrategy::kNoShard}) {
    const std::string path = dir.path() + "/" + to_string(s);
    run_ranks(4, [&](dist::ProcessGroup& pg) {
      Trainer a(pg, Opt::kSgd, 1, s);
      a.train(pg, batches, 0, 1);
      save_checkpoint(path, state_of(a), pg, {CheckpointFormat::kSharded});
      auto snap = a.snapshot();
      std::lock_guard<std::mutex> lock(mu);
      if (pg.rank() == 0) want = snap;
    });
    // Each piece once: the data files hold exactly the model and optimizer bytes.
    auto info = inspect_checkpoint(path);
    int64_t bytes = 0;
    for (const auto& t : info.tensors) bytes += t.nbytes;
    // Every byte of the data files is an item .metadata names, and the
    // items hold exactly the tensors' bytes plus one zip each.
    int64_t data = 0, items = 0, nitems = 0;
    for (const auto& f : fs::directory_iterator(path)) {
      if (f.path().extension() == ".distcp") data += static_cast<int64_t>(fs::file_size(f.path()));
    }
    const auto md = fsdp::formats::parse_dcp_metadata(fsdp::formats::read_range(path + "/.metadata", 0, fsdp::formats::file_size(path + "/.metadata")), ".metadata");
    for (const auto& it : md.items) {
      for (const auto& c : it.chunks) items += c.storage.length, ++nitems;
      if (it.is_bytes) items += it.bytes.length;
    }
    EXPECT_EQ(data, items) << to_string(s);
    EXPECT_GT(items, bytes);
    EXPECT_LT(items, bytes + nitems * 2048 + 64 * 1024) << to_string(s);  // a zip is ~1.3 KiB
    int64_t model_bytes = 0;
    for (const auto& [k, t] : want) {
      if (k.rfind("optim/", 0) != 0) model_bytes += t.numel() * t.element_size();
    }
    EXPECT_GE(bytes, model_bytes);
    EXPECT_LE(bytes, 2 * model_bytes + 1000);  // parameters + one momentum buffer each (+ buffers)
    run_ranks(2, [&](dist::ProcessGroup& pg) {
      Trainer b(pg, Opt::kSgd, 2);
      CheckpointState st = state_of(b);
      load_checkpoint(path, st, pg);
      expect_equal(b.snapshot(), want, to_string(s));
    });
  }
}

TEST(Checkpoint, LoadsIntoAnUnwrappedModelAndBack) {
  TempDir dir;
  std::map<std::string, torch::Tensor> want;
  std::mutex mu;
  for (auto format : {CheckpointFormat::kFull, CheckpointFormat::kSharded}) {
    const std::string path = dir.path() + "/" + to_string(format);
    run_ranks(3, [&](dist::ProcessGroup& pg) {
      Trainer a(pg, Opt::kSgd, 1);
      save_checkpoint(path, state_of(a), pg, {format});
      auto p = to_map(full_parameters(a.model.ptr()));
      std::lock_guard<std::mutex> lock(mu);
      if (pg.rank() == 0) want = p;
    });
    auto plain = make_net(7);
    run_ranks(1, [&](dist::ProcessGroup& pg) { load_checkpoint(path, plain, pg); });
    expect_equal(named_params(*plain), want, std::string("unwrapped from ") + to_string(format));
  }
}

TEST(Checkpoint, FilterKeepsOnlySomeKeysInBothFormats) {
  TempDir dir;
  for (auto format : {CheckpointFormat::kFull, CheckpointFormat::kSharded}) {
    const std::string path = dir.path() + "/" + to_string(format);
    run_ranks(2, [&](dist::ProcessGroup& pg) {
      Trainer a(pg, Opt::kSgd, 1);
      CheckpointState s = state_of(a);
      s.value("step", int64_t{1}).value("secret", std::string("x"));
      CheckpointOptions o{format};
      o.filter([](const std::string& entry, const std::string& key) {
        if (entry == "secret") return false;
        return entry != "model" || key.rfind("blocks.", 0) == 0;
      });
      save_checkpoint(path, s, pg, o);
    });
    auto info = inspect_checkpoint(path);
    EXPECT_TRUE(info.values.count("step"));
    EXPECT_FALSE(info.values.count("secret"));
    for (const auto& t : info.tensors) {
      if (t.key.rfind("model/", 0) == 0) EXPECT_EQ(t.key.rfind("model/blocks.", 0), 0u) << t.key;
    }
    run_ranks(2, [&](dist::ProcessGroup& pg) {
      Trainer b(pg, Opt::kSgd, 2);
      CheckpointState s = state_of(b);
      EXPECT_THROW(load_checkpoint(path, s, pg, /*strict=*/true), Error);  // emb.weight etc. are missing
      CheckpointState model_only;
      model_only.model("model", b.model.ptr());
      load_checkpoint(path, model_only, pg, /*strict=*/false);
    });
  }
}

// CheckpointOptions: TORCH_ARG setters chain, the format converts
// implicitly, and the format's one name table parses back.
TEST(Checkpoint, OptionsChainAndFormatNamesParse) {
  const CheckpointOptions defaults;
  EXPECT_EQ(defaults.format(), CheckpointFormat::kSharded);
  EXPECT_FALSE(defaults.async_save());
  EXPECT_FALSE(static_cast<bool>(defaults.filter()));
  const CheckpointOptions o =
      CheckpointOptions(CheckpointFormat::kFull).async_save(true).filter([](const std::string&, const std::string&) {
        return false;
      });
  EXPECT_EQ(o.format(), CheckpointFormat::kFull);
  EXPECT_TRUE(o.async_save());
  EXPECT_FALSE(o.filter()("model", "w"));
  for (auto f : {CheckpointFormat::kFull, CheckpointFormat::kSharded}) EXPECT_EQ(parse_checkpoint_format(to_string(f)), f);
  EXPECT_EQ(parse_checkpoint_format("FULL"), CheckpointFormat::kFull);
  expect_config_error([] { parse_checkpoint_format("zip", "--format"); },
                      "Unknown --format: zip (expected one of \"full\", \"sharded\")");
}

TEST(Checkpoint, LightningsErrors) {
  TempDir dir;
  run_ranks(2, [&](dist::ProcessGroup& pg) {
    Trainer a(pg, Opt::kSgd, 1);
    auto expect_error = [](const std::function<void()>& f, const std::string& text) {
      try {
        f();
        ADD_FAILURE() << "no error, expected: " << text;
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
      }
    };
    CheckpointState none;
    none.value("step", int64_t{1});
    expect_error([&] { save_checkpoint(dir.path() + "/x", none, pg); }, "Could not find a FSDP model");
    expect_error([&] { save_checkpoint(dir.path() + "/x", none, pg); }, "before saving the checkpoint");
    // A model that is there but not sharded is named as such (before: the
    // message asked to pass the model the user had passed, and misspelt
    // "saveing").
    CheckpointState plain;
    plain.model("net", std::make_shared<torch::nn::LinearImpl>(2, 2));
    expect_error([&] { save_checkpoint(dir.path() + "/x", plain, pg, {CheckpointFormat::kFull}); },
                 "'net' is not sharded");
    Trainer other(pg, Opt::kSgd, 2);
    CheckpointState two = state_of(a);
    two.model("model2", other.model.ptr());
    expect_error([&] { save_checkpoint(dir.path() + "/x", two, pg); }, "Found multiple FSDP models");
    if (pg.rank() == 0) fs::create_directories(dir.path() + "/plain_dir");
    pg.barrier();
    expect_error([&] { save_checkpoint(dir.path() + "/plain_dir", state_of(a), pg, {CheckpointFormat::kFull}); },
                 "The checkpoint path exists and is a directory");
    CheckpointState s = state_of(a);
    expect_error([&] { load_checkpoint(dir.path() + "/nothing", s, pg); }, "does not point to a valid checkpoint");
    expect_error([&] { load_checkpoint(dir.path() + "/plain_dir", s, pg); }, "does not point to a valid checkpoint");
    CheckpointState empty;
    expect_error([&] { load_checkpoint(dir.path() + "/x", empty, pg); }, "at least a model");
    save_checkpoint(dir.path() + "/ok", state_of(a), pg, {CheckpointFormat::kSharded});
    CheckpointState more = state_of(a);
    more.value("epoch", int64_t{0});
    expect_error([&] { load_checkpoint(dir.path() + "/ok", more, pg, /*strict=*/true); },
                 "The requested state contains a key 'epoch' that does not exist in the loaded checkpoint");
    load_checkpoint(dir.path() + "/ok", more, pg, /*strict=*/false);
    EXPECT_EQ(more.get<int64_t>("epoch"), 0);  // untouched
    load_checkpoint(dir.path() + "/ok", s, pg);
  });
}

// Names with dots are nested dicts in Python ("config.model.dim" is
// ckpt["config"]["model"]["dim"]), so an entry cannot also hold another.
TEST(Checkpoint, EntryNamesThatWouldNestInEachOtherAreRefused) {
  CheckpointState s;
  s.value("config.model.dim", int64_t{4}).value("config.run.lr", 0.5);
  auto refused = [&](const std::function<void()>& f, const std::string& a, const std::string& b) {
    try {
      f();
      ADD_FAILURE() << "no error for " << a << " and " << b;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("entries '" + a + "' and '" + b + "' collide"), std::string::npos) << e.what();
    }
  };
  refused([&] { s.value("config", int64_t{1}); }, "config.model.dim", "config");
  refused([&] { s.value("config.model.dim.x", int64_t{1}); }, "config.model.dim", "config.model.dim.x");
  auto net = make_net(1);
  refused([&] { CheckpointState().model("model", net).value("model.dim", int64_t{1}); }, "model", "model.dim");
  s.value("configuration", int64_t{2}).value("config.model.heads", int64_t{2});  // a prefix of a name is not nesting
  EXPECT_EQ(s.entries().size(), 4u);
}

// A checkpoint of the other format at the same path is replaced, as
// Lightning does, but only once the new one is complete: it is saved beside
// the old one and swapped in, in one step; nothing is left beside it.
TEST(CheckpointIO, AnotherFormatAtThePathIsReplacedOnceTheNewOneIsComplete) {
  TempDir dir;
  const std::string path = dir.path() + "/ckpt";
  run_ranks(2, [&](dist::ProcessGroup& pg) {
    Trainer a(pg, Opt::kSgd, 1), c(pg, Opt::kSgd, 3);
    auto loaded_equals = [&](Trainer& want) {
      Trainer d(pg, Opt::kSgd, 4);
      CheckpointState s = state_of(d);
      load_checkpoint(path, s, pg);
      auto got = to_map(full_parameters(d.model.ptr())), expected = to_map(full_parameters(want.model.ptr()));
      for (auto& [k, v] : expected) EXPECT_TRUE(torch::equal(got.at(k), v)) << k;
    };
    save_checkpoint(path, state_of(a), pg, {CheckpointFormat::kSharded});
    save_checkpoint(path, state_of(c), pg, {CheckpointFormat::kFull});  // a directory becomes a file
    EXPECT_TRUE(fs::is_regular_file(path));
    loaded_equals(c);
    save_checkpoint(path, state_of(a), pg, {CheckpointFormat::kSharded});  // and back
    EXPECT_TRUE(fs::is_directory(path));
    loaded_equals(a);
    pg.barrier();
    for (const auto& e : fs::directory_iterator(dir.path())) {
      EXPECT_EQ(e.path().filename().string(), "ckpt") << "left beside the checkpoint";
    }
    // An async save would commit later: replacing the other format is synchronous only.
    CheckpointOptions async;
    async.format(CheckpointFormat::kFull);
    async.async_save(true);
    expect_config_error([&] { save_checkpoint(path, state_of(c), pg, async); }, "save with async_save=false");
    loaded_equals(a);
  });
}

// ---------------------------------------------------------------------------
// Damaged checkpoints: every problem is an error naming the file and tensor.

void save_small(const std::string& path, CheckpointFormat format, int64_t step = 5,
                const std::vector<float>& scale = {}) {
  const auto batches = make_batches(1, kGlobalBatch, 3);
  run_ranks(2, [&](dist::ProcessGroup& pg) {
    Trainer a(pg, Opt::kSgd, 1);
    a.train(pg, batches, 0, 1);  // optimizer state too
    CheckpointState s = state_of(a);
    s.value("step", step);
    if (!scale.empty()) s.value("scale", torch::tensor(scale));
    save_checkpoint(path, s, pg, {format});
  });
}

std::string load_error(const std::string& path) {
  std::string msg;
  run_ranks(2, [&](dist::ProcessGroup& pg) {
    Trainer b(pg, Opt::kSgd, 2);
    CheckpointState s = state_of(b);
    try {
      load_checkpoint(path, s, pg);
    } catch (const Error& e) {
      if (pg.rank() == 0) msg = e.what();
    }
  });
  return msg;
}

std::string first_data_file(const std::string& dir) {
  for (const auto& f : fs::directory_iterator(dir)) {
    const auto name = f.path().filename().string();
    if (f.path().extension() == ".distcp" && fs::file_size(f.path()) > 0) return f.path().string();
  }
  return "";
}
// The data file and offset of the first tensor chunk's raw bytes (fsdp_index.json).
std::pair<std::string, int64_t> first_chunk(const std::string& dir) {
  const auto ix = nlohmann::json::parse(read_file(dir + "/fsdp_index.json"));
  const auto& c = ix["tensors"].begin().value()["chunks"][0];
  return {dir + "/" + c["file"].get<std::string>(), c["offset"].get<int64_t>()};
}
void replace_in(const std::string& file, const std::string& from, const std::string& to) {
  std::string s = read_file(file);
  const auto at = s.find(from);
  ASSERT_NE(at, std::string::npos) << from;
  s.replace(at, from.size(), to);
  write_file(file, s);
}
// `file` with bit (i % 8) of byte i flipped.
std::string flipped(const std::string& bytes, size_t i) {
  std::string s = bytes;
  s[i] = static_cast<char>(s[i] ^ (1 << (i % 8)));
  return s;
}
// The checkpoint at `path` opens (inspect) and verifies.
bool opens_and_verifies(const std::string& path) {
  try {
    inspect_checkpoint(path);
  } catch (const ConfigError&) {
    return false;
  }
  return verify_checkpoint(path).empty();
}

TEST(CheckpointDamage, ShardedFilesAreCheckedAndNamed) {
  TempDir dir;
  const std::string good = dir.path() + "/good";
  save_small(good, CheckpointFormat::kSharded);
  EXPECT_TRUE(verify_checkpoint(good).empty());
  auto fresh = [&](const std::string& name) {
    const std::string p = dir.path() + "/" + name;
    fs::copy(good, p, fs::copy_options::recursive);
    return p;
  };
  {  // a flipped byte in a tensor's bytes
    auto p = fresh("flip");
    auto [f, at] = first_chunk(p);
    std::string s = read_file(f);
    s[static_cast<size_t>(at)] = static_cast<char>(s[static_cast<size_t>(at)] ^ 0x40);
    write_file(f, s);
    auto msg = load_error(p);
    EXPECT_NE(msg.find("checksum mismatch in " + f), std::string::npos) << msg;
    EXPECT_NE(msg.find("for tensor '"), std::string::npos) << msg;
    EXPECT_FALSE(verify_checkpoint(p).empty());
  }
  {  // truncated
    auto p = fresh("trunc");
    auto f = first_data_file(p);
    fs::resize_file(f, fs::file_size(f) / 2);
    auto msg = load_error(p);
    EXPECT_NE(msg.find(f + " is truncated"), std::string::npos) << msg;
  }
  {  // a missing shard file
    auto p = fresh("missing");
    auto f = first_data_file(p);
    fs::remove(f);
    auto msg = load_error(p);
    EXPECT_NE(msg.find("a data file of the checkpoint is missing"), std::string::npos) << msg;
    EXPECT_NE(verify_checkpoint(p).front().find("missing data file"), std::string::npos);
  }
  {  // a flipped byte in a bytes item's pickle: the load takes the index's values, verify checks every record
    auto p = fresh("flip-pickle");
    const auto md = formats::parse_dcp_metadata(formats::read_range(p + "/.metadata", 0, formats::file_size(p + "/.metadata")), "md");
    const formats::DcpStorage* item = nullptr;
    for (const auto& it : md.items) {
      if (it.is_bytes && !item) item = &it.bytes;
    }
    ASSERT_TRUE(item);
    const std::string f = p + "/" + item->file;
    const int64_t at = item->offset + formats::FullReader(f, item->offset, item->length).record_offset("data.pkl") + 2;
    std::string s = read_file(f);
    s[static_cast<size_t>(at)] = static_cast<char>(s[static_cast<size_t>(at)] ^ 0x01);
    write_file(f, s);
    auto problems = verify_checkpoint(p);
    ASSERT_FALSE(problems.empty());
    EXPECT_NE(problems.front().find("checksum mismatch in " + f), std::string::npos) << problems.front();
    EXPECT_NE(problems.front().find("record data.pkl"), std::string::npos) << problems.front();
  }
  {  // an index pointing outside the directory
    auto p = fresh("escape");
    auto name = fs::path(first_data_file(p)).filename().string();
    std::string s = read_file(p + "/fsdp_index.json");
    size_t at;
    while ((at = s.find("\"" + name + "\"")) != std::string::npos) s.replace(at, name.size() + 2, "\"../../etc/passwd\"");
    write_file(p + "/fsdp_index.json", s);
    EXPECT_NE(load_error(p).find("checksum mismatch"), std::string::npos) << load_error(p);
    reseal(p + "/fsdp_index.json");
    auto msg = load_error(p);
    EXPECT_NE(msg.find("is not a plain file name inside the checkpoint"), std::string::npos) << msg;
    EXPECT_NE(msg.find(p + "/fsdp_index.json"), std::string::npos) << msg;
  }
  {  // a version from the future
    auto p = fresh("future");
    replace_in(p + "/fsdp_index.json", "\"version\": 1", "\"version\": 7");
    reseal(p + "/fsdp_index.json");
    auto msg = load_error(p);
    EXPECT_NE(msg.find("written by a newer fsdp-cpp (format version 7"), std::string::npos) << msg;
  }
  {  // bytes that do not match dtype x shape
    auto p = fresh("bytes");
    std::string s = read_file(p + "/fsdp_index.json");
    const auto at = s.find("\"nbytes\": ");
    const auto end = s.find(',', at);
    s.replace(at, end - at, "\"nbytes\": 3");
    write_file(p + "/fsdp_index.json", s);
    reseal(p + "/fsdp_index.json");
    auto msg = load_error(p);
    EXPECT_NE(msg.find("does not match its sizes x dtype"), std::string::npos) << msg;
    EXPECT_NE(msg.find("tensor '"), std::string::npos) << msg;
  }
  {  // garbage index
    auto p = fresh("garbage");
    write_file(p + "/fsdp_index.json", "{\"format\": \"fsdp-cpp\", \"version\": [");
    auto msg = load_error(p);
    EXPECT_NE(msg.find("not valid JSON"), std::string::npos) << msg;
  }
  {  // an interrupted save: data files, no .metadata (the commit marker)
    auto p = fresh("interrupted");
    fs::remove(p + "/.metadata");
    auto msg = load_error(p);
    EXPECT_NE(msg.find("incomplete sharded checkpoint"), std::string::npos) << msg;
    EXPECT_NE(msg.find("no .metadata"), std::string::npos) << msg;
    EXPECT_FALSE(verify_checkpoint(p).empty());
  }
  {  // without fsdp_index.json (as PyTorch writes it): .metadata's index, the zips' CRC-32s
    auto p = fresh("no-index");
    fs::remove(p + "/fsdp_index.json");
    EXPECT_TRUE(verify_checkpoint(p).empty()) << verify_checkpoint(p).front();
    auto [f, at] = first_chunk(good);
    f = p + "/" + fs::path(f).filename().string();
    std::string s = read_file(f);
    s[static_cast<size_t>(at)] = static_cast<char>(s[static_cast<size_t>(at)] ^ 0x40);
    write_file(f, s);
    auto msg = load_error(p);
    EXPECT_NE(msg.find("checksum mismatch in " + f), std::string::npos) << msg;
    EXPECT_FALSE(verify_checkpoint(p).empty());
  }
  {  // fsdp-cpp's earlier layout (index.json, raw data files, no .metadata) keeps loading
    auto p = fresh("earlier");
    fs::rename(p + "/fsdp_index.json", p + "/index.json");
    fs::remove(p + "/.metadata");
    fs::remove(p + "/meta.pt");
    EXPECT_TRUE(load_error(p).empty()) << load_error(p);
    EXPECT_TRUE(verify_checkpoint(p).empty());
    EXPECT_EQ(inspect_checkpoint(p).format, CheckpointFormat::kSharded);
  }
}

// Issue 19 item 1: one flipped bit anywhere in fsdp_index.json or .metadata
// is caught before anything in them is trusted (inspect and verify fail),
// unless the flipped JSON means the same (an exponent's 'e' as 'E').
TEST(CheckpointDamage, EveryBitFlipOfAShardedIndexIsCaught) {
  TempDir dir;
  const std::string good = dir.path() + "/good";
  save_small(good, CheckpointFormat::kSharded);
  const std::string p = dir.path() + "/flip";
  fs::copy(good, p, fs::copy_options::recursive);
  for (const char* name : {"fsdp_index.json", ".metadata"}) {
    const std::string file = p + "/" + name, original = read_file(good + "/" + name);
    ASSERT_FALSE(original.empty());
    const size_t stride = std::max<size_t>(1, original.size() / 3000);
    int passed = 0, tried = 0;
    for (size_t i = 0; i < original.size(); i += stride, ++tried) {
      const std::string bad = flipped(original, i);
      write_file(file, bad);
      if (!opens_and_verifies(p)) continue;
      if (std::string(name) == "fsdp_index.json") {
        bool same = false;
        try {
          same = nlohmann::ordered_json::parse(bad) == nlohmann::ordered_json::parse(original);
        } catch (const std::exception&) {
        }
        if (same) continue;
      }
      ++passed;
      ADD_FAILURE() << name << ": the flip of bit " << i % 8 << " of byte " << i << " passed inspect and verify";
      if (passed > 5) break;
    }
    write_file(file, original);
    EXPECT_GT(tried, 1000) << name;
  }
  EXPECT_TRUE(opens_and_verifies(p));
}

TEST(CheckpointDamage, AnIndexWhoseEntriesAndTensorsDisagreeIsRefusedByName) {
  TempDir dir;
  const std::string p = dir.path() + "/ckpt";
  save_small(p, CheckpointFormat::kSharded);
  auto j = nlohmann::ordered_json::parse(read_file(p + "/fsdp_index.json"));
  const std::string key = j["tensors"].begin().key();
  j["tensors"].erase(key);
  write_file(p + "/fsdp_index.json", j.dump(1));
  reseal(p + "/fsdp_index.json");
  auto msg = load_error(p);
  EXPECT_NE(msg.find("entry key '" + key + "' has no tensor"), std::string::npos) << msg;
  EXPECT_FALSE(verify_checkpoint(p).empty());
  EXPECT_THROW(consolidate_checkpoint(p, dir.path() + "/out.pt"), ConfigError);  // not map::at
  // An unknown field (a field name with a flipped bit) is refused even with a matching checksum.
  j = nlohmann::ordered_json::parse(read_file(p + "/fsdp_index.json"));
  fs::remove_all(p);
  save_small(p, CheckpointFormat::kSharded);
  replace_in(p + "/fsdp_index.json", "\"world_size\"", "\"world_sizE\"");
  reseal(p + "/fsdp_index.json");
  msg = load_error(p);
  EXPECT_NE(msg.find("unknown field 'world_sizE'"), std::string::npos) << msg;
}

// Issue 28 item 6: Lightning's fabric.load reads the values from meta.pt,
// fsdp-cpp from its index (or .metadata). Step 3's meta.pt copied into step
// 6's checkpoint (every CRC still matches: the index records none for it)
// fails verify and the load, naming the value and both sides; so does a
// tensor value whose elements differ.
TEST(CheckpointDamage, AMetaPtThatDisagreesWithTheIndexFailsVerifyAndLoad) {
  TempDir dir;
  const std::string step3 = dir.path() + "/step-3", step6 = dir.path() + "/step-6";
  save_small(step3, CheckpointFormat::kSharded, 3, {1.0f, 2.0f});
  save_small(step6, CheckpointFormat::kSharded, 6, {1.0f, 2.5f});
  EXPECT_TRUE(verify_checkpoint(step6).empty());
  fs::copy_file(step3 + "/meta.pt", step6 + "/meta.pt", fs::copy_options::overwrite_existing);
  const auto problems = verify_checkpoint(step6);
  ASSERT_FALSE(problems.empty());
  for (const std::string& text : {step6 + "/meta.pt disagrees with " + step6 + "/fsdp_index.json on the value 'step'",
                                  "the int 6 in " + step6 + "/fsdp_index.json", "the int 3 in " + step6 + "/meta.pt"}) {
    EXPECT_NE(problems.front().find(text), std::string::npos) << problems.front();
  }
  std::string msg;
  run_ranks(2, [&](dist::ProcessGroup& pg) {
    Trainer b(pg, Opt::kSgd, 2);
    CheckpointState s = state_of(b);
    s.value("step", int64_t{0}).value("scale", torch::zeros({2}));
    try {
      load_checkpoint(step6, s, pg);
    } catch (const ConfigError& e) {
      if (pg.rank() == 0) msg = e.what();
    }
  });
  EXPECT_NE(msg.find("on the value 'step': the int 6"), std::string::npos) << msg;
  const auto r = run_program({FSDP_CKPT_PATH, "verify", step6}, std::chrono::seconds(60));
  EXPECT_EQ(r.exit_code(), 1) << r.output;
  EXPECT_NE(r.output.find("disagrees with"), std::string::npos) << r.output;
  // The same step, another tensor value.
  const std::string other = dir.path() + "/other";
  save_small(other, CheckpointFormat::kSharded, 6, {1.0f, 2.0f});
  fs::copy_file(other + "/meta.pt", step6 + "/meta.pt", fs::copy_options::overwrite_existing);
  const auto tensors = verify_checkpoint(step6);
  ASSERT_FALSE(tensors.empty());
  EXPECT_NE(tensors.front().find("on the value 'scale': tensors of the same dtype and shape but different elements"),
            std::string::npos)
      << tensors.front();
}

// Issue 28 item 5: a pickle that expands far beyond its size (the `.metadata`
// bombs: 10 M one-tuples of None in 20 MB, 10 M empty dicts in 10 MB) ends
// `fsdp-ckpt verify` with a named error within 5 s (of CPU time) of a tiny file's
// refusal (about 1 s on CI's 2 cores, where a 1 s bound failed once by 0.05 s), its peak RSS above that run's by at most the parse's budget and
// the file's bytes, and under 1 GiB (before the budget: 6.9 GB over 21 s,
// and 3.7 GB; now about 730 MB and 280 MB).
TEST(CheckpointDamage, PickleBombsEndInANamedErrorQuicklyWithBoundedMemory) {
  TempDir dir;
  auto verify = [&](const std::string& name, const std::string& metadata) {
    const std::string p = dir.path() + "/" + name;
    fs::create_directories(p);
    write_file(p + "/.metadata", metadata);
    return run_program({FSDP_CKPT_PATH, "verify", p}, std::chrono::seconds(30));
  };
  const RunResult tiny = verify("tiny", std::string("\x80\x02N.", 4));
  EXPECT_NE(tiny.output.find("expected a Metadata object, found None"), std::string::npos) << tiny.output;
  std::string tuples("\x80\x02", 2);
  for (int i = 0; i < 10'000'000; ++i) tuples.append("N\x85", 2);
  tuples += ".";
  const std::string dicts = std::string("\x80\x02]", 3) + "(" + std::string(10'000'000, '}') + "e.";
  for (const auto& [name, bomb] : {std::pair{"tuples", tuples}, std::pair{"dicts", dicts}}) {
    const RunResult r = verify(name, bomb);
    EXPECT_EQ(r.exit_code(), 1) << name << ": " << r.output;
    EXPECT_NE(r.output.find(dir.path() + "/" + name + "/.metadata: the pickle at byte "), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("expands beyond what its size allows"), std::string::npos) << r.output;
    // CPU time, not wall time: other builds and tests share the machine. The
    // unbounded parser took 21 s; the bounded one about 1 s, so 5 s has room
    // for a slow machine and still fails on the old behaviour.
    EXPECT_LT(r.cpu_seconds - tiny.cpu_seconds, 5.0) << name << " (wall: " << r.seconds << " s, " << tiny.seconds << " s)";
    // At most the budget and the file's bytes (read whole), and far below the 6.9 GB of before.
    const long bound_kb = static_cast<long>((fsdp::formats::pickle::parse_budget(bomb.size()) + bomb.size()) / 1024);
    EXPECT_LT(r.max_rss_kb - tiny.max_rss_kb, std::min(bound_kb, 1024L * 1024))
        << name << ": peak RSS " << r.max_rss_kb / 1024 << " MB, " << tiny.max_rss_kb / 1024 << " MB for the tiny file";
  }
}

// Issue 28 item 5: an index whose JSON would expand beyond its size's budget
// (a value every 3 bytes) or nest deeper than a header does is refused by
// name before its DOM is built.
TEST(CheckpointDamage, AnIndexJsonBombIsRefusedByName) {
  std::string bomb = "{\"entries\":[";
  for (int i = 0; i < 2'000'000; ++i) bomb += "{},";
  bomb += "{}]}";
  expect_config_error([&] { fsdp::formats::parse_index(bomb, "bomb/index.json"); },
                      "bomb/index.json: the index expands beyond what its size allows");
  expect_config_error([&] { fsdp::formats::parse_index(std::string(100, '[') + std::string(100, ']'), "deep/index.json"); },
                      "deep/index.json: the index nests arrays and objects more than 64 deep at byte 64");
  TempDir dir;
  const std::string p = dir.path() + "/ckpt";
  save_small(p, CheckpointFormat::kSharded);
  write_file(p + "/fsdp_index.json", bomb);
  EXPECT_NE(load_error(p).find("expands beyond what its size allows"), std::string::npos);
}

// Issue 19 item 1: in the full format every zip record is checked against the
// zip's CRC-32 (LibTorch's reader does not): a flipped bit in the index record
// or in data.pkl fails inspect or verify, and the load.
TEST(CheckpointDamage, EveryBitFlipInAFullCheckpointsRecordsIsCaught) {
  TempDir dir;
  const std::string good = dir.path() + "/good.pt", p = dir.path() + "/flip.pt";
  save_small(good, CheckpointFormat::kFull);
  const std::string original = read_file(good);
  std::vector<std::string> records;  // every record but the tensors' (LibTorch 1.13 writes no byteorder)
  for (const auto& r : formats::FullReader(good).records()) {
    if (r.rfind("data/", 0) != 0) records.push_back(r);
  }
  ASSERT_NE(std::find(records.begin(), records.end(), "fsdp/index.json"), records.end());
  ASSERT_NE(std::find(records.begin(), records.end(), "data.pkl"), records.end());
  for (const auto& record : records) {
    formats::FullReader zip(good);
    const int64_t at = zip.record_offset(record), n = static_cast<int64_t>(zip.read(record).size());
    ASSERT_GT(n, 0) << record;
    const int64_t stride = std::max<int64_t>(1, n / 400);
    int passed = 0;
    for (int64_t i = 0; i < n; i += stride) {
      write_file(p, flipped(original, static_cast<size_t>(at + i)));
      if (!opens_and_verifies(p)) continue;
      ++passed;
      ADD_FAILURE() << record << ": the flip of byte " << i << " passed inspect and verify";
      if (passed > 5) break;
    }
  }
  write_file(p, flipped(original, static_cast<size_t>(formats::FullReader(good).record_offset("fsdp/index.json") + 3)));
  auto msg = load_error(p);
  EXPECT_NE(msg.find("checksum mismatch in " + p + " (record fsdp/index.json)"), std::string::npos) << msg;
}

TEST(CheckpointDamage, FullFilesAreCheckedAndNamed) {
  TempDir dir;
  const std::string good = dir.path() + "/good.pt";
  save_small(good, CheckpointFormat::kFull);
  EXPECT_TRUE(verify_checkpoint(good).empty());
  auto fresh = [&](const std::string& name) {
    const std::string p = dir.path() + "/" + name;
    fs::copy_file(good, p);
    return p;
  };
  {  // a flipped byte inside tensor data (records are stored uncompressed)
    auto p = fresh("flip.pt");
    std::string s = read_file(p);
    // Record data/0 (the first tensor): its bytes follow its zip local header.
    const auto name = s.find("archive/data/0");
    ASSERT_NE(name, std::string::npos);
    const size_t header = name - 30;
    ASSERT_EQ(s.substr(header, 4), std::string("PK\x03\x04"));
    auto u16 = [&](size_t at) { return static_cast<size_t>(static_cast<unsigned char>(s[at])) |
                                       static_cast<size_t>(static_cast<unsigned char>(s[at + 1])) << 8; };
    const size_t data = header + 30 + u16(header + 26) + u16(header + 28);
    s[data + 5] = static_cast<char>(s[data + 5] ^ 0x01);
    write_file(p, s);
    EXPECT_FALSE(verify_checkpoint(p).empty());
    auto msg = load_error(p);
    EXPECT_NE(msg.find(p), std::string::npos) << msg;
  }
  {  // truncated
    auto p = fresh("trunc.pt");
    fs::resize_file(p, fs::file_size(p) / 2);
    auto msg = load_error(p);
    EXPECT_NE(msg.find("does not point to a valid checkpoint"), std::string::npos) << msg;
    EXPECT_NE(msg.find(p), std::string::npos) << msg;
  }
  {  // not a zip at all
    auto p = dir.path() + "/text.pt";
    write_file(p, "hello");
    auto msg = load_error(p);
    EXPECT_NE(msg.find("does not point to a valid checkpoint"), std::string::npos) << msg;
  }
}

TEST(FsdpCkptTool, InspectVerifyConsolidate) {
  TempDir dir;
  const std::string sharded = dir.path() + "/sharded", full = dir.path() + "/full.pt";
  save_small(sharded, CheckpointFormat::kSharded);
  auto r = run_program({FSDP_CKPT_PATH, "inspect", sharded}, std::chrono::seconds(60));
  EXPECT_EQ(r.exit_code(), 0) << r.output;
  for (const char* text : {"format:     sharded", "world size: 2", "step = 5", "model/emb.weight", "float32", "[11, 7]",
                           "optimizer/emb.weight.momentum_buffer"}) {
    EXPECT_NE(r.output.find(text), std::string::npos) << text << "\n" << r.output;
  }
  r = run_program({FSDP_CKPT_PATH, "verify", sharded}, std::chrono::seconds(60));
  EXPECT_EQ(r.exit_code(), 0) << r.output;
  r = run_program({FSDP_CKPT_PATH, "consolidate", sharded, full}, std::chrono::seconds(60));
  ASSERT_EQ(r.exit_code(), 0) << r.output;
  EXPECT_EQ(inspect_checkpoint(full).format, CheckpointFormat::kFull);
  // The consolidated file loads to the same model as the directory.
  auto a = make_net(1), b = make_net(2);
  run_ranks(1, [&](dist::ProcessGroup& pg) {
    load_checkpoint(sharded, a, pg);
    load_checkpoint(full, b, pg);
  });
  expect_equal(named_params(*b), named_params(*a), "consolidated");
  // Damage is reported with exit status 1 and the entry named.
  auto [f, at] = first_chunk(sharded);
  std::string bytes = read_file(f);
  bytes[static_cast<size_t>(at)] = static_cast<char>(bytes[static_cast<size_t>(at)] ^ 0x10);
  write_file(f, bytes);
  r = run_program({FSDP_CKPT_PATH, "verify", sharded}, std::chrono::seconds(60));
  EXPECT_EQ(r.exit_code(), 1) << r.output;
  EXPECT_NE(r.output.find("DAMAGED"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("checksum mismatch in " + f), std::string::npos) << r.output;
  r = run_program({FSDP_CKPT_PATH, "inspect", dir.path() + "/nope"}, std::chrono::seconds(60));
  EXPECT_EQ(r.exit_code(), 2) << r.output;
  EXPECT_NE(r.output.find("does not point to a valid checkpoint"), std::string::npos) << r.output;
}

TEST(FsdpCkptTool, ConvertBetweenFormatsAndLayouts) {
  TempDir dir;
  const std::string sharded = dir.path() + "/sharded", earlier = dir.path() + "/earlier";
  save_small(sharded, CheckpointFormat::kSharded);
  fs::copy(sharded, earlier, fs::copy_options::recursive);  // fsdp-cpp's earlier layout: index.json, raw data files
  fs::rename(earlier + "/fsdp_index.json", earlier + "/index.json");
  fs::remove(earlier + "/.metadata");
  auto want = make_net(1);
  run_ranks(1, [&](dist::ProcessGroup& pg) { load_checkpoint(sharded, want, pg); });
  const std::vector<std::tuple<std::string, std::string, std::string>> cases = {
      {sharded, dir.path() + "/to_full.pt", "full"},
      {sharded, dir.path() + "/to_sharded", "sharded"},
      {dir.path() + "/to_full.pt", dir.path() + "/full_to_sharded", "sharded"},
      {earlier, dir.path() + "/earlier_to_dcp", "sharded"}};
  for (const auto& c : cases) {
    const std::string src = std::get<0>(c), dst = std::get<1>(c), format = std::get<2>(c);  // (lambdas capture them)
    auto r = run_program({FSDP_CKPT_PATH, "convert", src, dst, "--format", format}, std::chrono::seconds(60));
    ASSERT_EQ(r.exit_code(), 0) << r.output;
    EXPECT_EQ(inspect_checkpoint(dst).format, format == "full" ? CheckpointFormat::kFull : CheckpointFormat::kSharded);
    EXPECT_TRUE(verify_checkpoint(dst).empty()) << dst << ": " << verify_checkpoint(dst).front();
    EXPECT_EQ(fs::exists(dst + "/.metadata"), format == "sharded") << dst;
    auto got = make_net(2);
    run_ranks(2, [&](dist::ProcessGroup& pg) {
      Trainer t(pg, Opt::kSgd, 2);
      CheckpointState s = state_of(t);
      s.value("step", int64_t{0});
      load_checkpoint(dst, s, pg);  // model, optimizer and values
      EXPECT_EQ(s.get<int64_t>("step"), 5);
    });
    run_ranks(1, [&](dist::ProcessGroup& pg) { load_checkpoint(dst, got, pg); });
    expect_equal(named_params(*got), named_params(*want), dst);
  }
  auto r = run_program({FSDP_CKPT_PATH, "convert", sharded, sharded + "/inner", "--format", "sharded"},
                       std::chrono::seconds(60));
  EXPECT_EQ(r.exit_code(), 2) << r.output;
  EXPECT_NE(r.output.find("is inside the checkpoint"), std::string::npos) << r.output;
}

// Issue 19 item 4: no tool writes its output into its own input (the
// checkpoint is left as it was, and still verifies).
TEST(FsdpCkptTool, NoToolWritesInsideItsInput) {
  TempDir dir;
  const std::string sharded = dir.path() + "/sharded", full = dir.path() + "/full.pt";
  save_small(sharded, CheckpointFormat::kSharded);
  save_small(full, CheckpointFormat::kFull);
  fs::create_symlink(sharded, dir.path() + "/link");
  const std::vector<std::vector<std::string>> commands = {
      {"consolidate", sharded, sharded + "/fsdp_index.json"},
      {"consolidate", sharded, sharded + "/sub/out.pt"},
      {"consolidate", sharded, dir.path() + "/link/out.pt"},
      {"convert", full, full, "--format", "full"},
      {"convert", sharded, sharded, "--format", "sharded"},
      {"export", full, full},
      {"export", sharded, sharded + "/model.safetensors"},
  };
  const std::string before = read_file(sharded + "/fsdp_index.json"), before_full = read_file(full);
  for (const auto& c : commands) {
    std::vector<std::string> argv{FSDP_CKPT_PATH};
    argv.insert(argv.end(), c.begin(), c.end());
    const auto r = run_program(argv, std::chrono::seconds(60));
    EXPECT_EQ(r.exit_code(), 2) << c[0] << " " << c[2] << "\n" << r.output;
    EXPECT_NE(r.output.find("write it elsewhere"), std::string::npos) << c[0] << " " << c[2] << "\n" << r.output;
  }
  EXPECT_EQ(read_file(sharded + "/fsdp_index.json"), before);
  EXPECT_EQ(read_file(full), before_full);
  EXPECT_FALSE(fs::exists(sharded + "/sub"));
  EXPECT_TRUE(verify_checkpoint(sharded).empty());
  EXPECT_TRUE(verify_checkpoint(full).empty());
}

// An index as fsdp-cpp has always written it (docs/checkpoint-format.md)
// decodes into typed records and encodes back byte for byte: checkpoints
// saved before the records were typed load, and consolidate as they did.
TEST(CheckpointIndex, DecodesIntoTypedRecordsAndEncodesBackByteForByte) {
  const std::string text = R"({
 "format": "fsdp-cpp",
 "kind": "full",
 "version": 1,
 "world_size": 2,
 "save_id": "1a23342746f-634a0b",
 "entries": [
  {
   "name": "model",
   "type": "model",
   "keys": [
    "emb.weight"
   ]
  },
  {
   "name": "optimizer",
   "type": "optimizer",
   "keys": [
    "emb.weight.step"
   ],
   "param_groups": [
    {
     "params": [
      "emb.weight"
     ],
     "options": {
      "amsgrad": 0.0,
      "lr": 0.001
     }
    }
   ]
  },
  {
   "name": "step",
   "type": "int",
   "value": 7
  },
  {
   "name": "lr",
   "type": "float",
   "value": 0.25
  },
  {
   "name": "loss",
   "type": "float",
   "value": "nan"
  },
  {
   "name": "ok",
   "type": "bool",
   "value": true
  },
  {
   "name": "tag",
   "type": "str",
   "value": "run \"x\""
  },
  {
   "name": "rng",
   "type": "tensor"
  }
 ],
 "tensors": {
  "model/emb.weight": {
   "dtype": "float32",
   "shape": [
    2,
    3
   ],
   "chunks": [
    {
     "file": "data/0",
     "offset": 0,
     "nbytes": 24,
     "offsets": [
      0,
      0
     ],
     "sizes": [
      2,
      3
     ],
     "crc32": 4294967295
    }
   ]
  },
  "optimizer/emb.weight.step": {
   "dtype": "float32",
   "shape": [],
   "chunks": [
    {
     "file": "data/1",
     "offset": 0,
     "nbytes": 4,
     "offsets": [],
     "sizes": [],
     "crc32": 7
    }
   ]
  },
  "rng": {
   "dtype": "int64",
   "shape": [
    2
   ],
   "chunks": [
    {
     "file": "data/2",
     "offset": 0,
     "nbytes": 16,
     "offsets": [
      0
     ],
     "sizes": [
      2
     ],
     "crc32": 9
    }
   ]
  }
 }
})";
  const formats::Index ix = formats::parse_index(text, "index.json");
  EXPECT_FALSE(ix.checksummed);  // written before issue 19: no checksum of its own
  // Encoded back: the same bytes, then the checksum of the other fields (issue 19).
  const std::string sealed = formats::to_json(ix);
  const std::string body = text.substr(0, text.size() - 2);  // up to the closing "\n}"
  ASSERT_EQ(sealed.substr(0, body.size()), body);
  const std::string tail = sealed.substr(body.size());
  EXPECT_EQ(tail.substr(0, 22), ",\n \"checksum\": \"crc32:") << tail;
  EXPECT_EQ(tail.size(), 22u + 8u + 3u) << tail;  // 8 hex digits, "\"\n}"
  EXPECT_TRUE(formats::parse_index(sealed, "index.json").checksummed);
  EXPECT_EQ(formats::to_json(formats::parse_index(sealed, "index.json")), sealed);
  ASSERT_EQ(ix.entries.size(), 8u);
  EXPECT_EQ(ix.entries[1].type, formats::EntryType::kOptimizer);
  ASSERT_EQ(ix.entries[1].param_groups.size(), 1u);
  EXPECT_EQ(ix.entries[1].param_groups[0].params, std::vector<std::string>{"emb.weight"});
  EXPECT_EQ(ix.entries[1].param_groups[0].options.at("lr"), 0.001);
  EXPECT_EQ(std::get<int64_t>(ix.entries[2].value), 7);
  EXPECT_TRUE(std::isnan(std::get<double>(ix.entries[4].value)));
  EXPECT_EQ(formats::value_text(ix.entries[4]), "\"nan\"");
  EXPECT_EQ(formats::value_text(ix.entries[6]), "run \"x\"");
  EXPECT_EQ(ix.tensors.at("model/emb.weight").chunks.at(0).crc, 4294967295u);
}

// The pieces the ranks of a sharded save exchange use the index's encoding,
// and are checked as its chunks are.
TEST(CheckpointIndex, PiecesRoundTripAndBadOnesAreNamed) {
  formats::PieceRecord p{"model/w", at::kBFloat16, {4, 6}, {"data-x-00001.bin", 96, 24, {2, 0}, {2, 6}, 12345}};
  const auto back = formats::decode_pieces(formats::encode_pieces({p, p}), "rank 1's pieces");
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[1].key, "model/w");
  EXPECT_EQ(back[1].dtype, at::kBFloat16);
  EXPECT_EQ(back[1].shape, (std::vector<int64_t>{4, 6}));
  EXPECT_EQ(back[1].chunk.file, "data-x-00001.bin");
  EXPECT_EQ(back[1].chunk.offset, 96);
  EXPECT_EQ(back[1].chunk.offsets, (std::vector<int64_t>{2, 0}));
  EXPECT_EQ(back[1].chunk.crc, 12345u);
  p.chunk.offsets = {3, 0};  // rows 3..4 of a tensor of 4
  expect_config_error([&] { formats::decode_pieces(formats::encode_pieces({p}), "rank 1's pieces"); },
                      "rank 1's pieces, tensor 'model/w': a chunk lies outside the tensor's shape");
  formats::Index ix;
  formats::add_piece(ix, back[0]);
  formats::add_piece(ix, back[1]);
  EXPECT_EQ(ix.tensor_order, std::vector<std::string>{"model/w"});
  EXPECT_EQ(ix.tensors.at("model/w").chunks.size(), 2u);
}

}  // namespace

// DCP's .metadata as fsdp-cpp writes it reads back into the same records
// (tensors with their chunks and items, bytes items, int path elements, the
// save id), and the unpickler's DCP mode accepts only DCP's classes.
TEST(DcpMetadata, RoundTripsAndRefusesOtherGlobals) {
  formats::DcpMetadata md;
  md.save_id = "abc-1";
  formats::DcpItem t;
  t.key = "model.w";
  t.path = {"model", "w"};
  t.path_is_int = {false, false};
  t.dtype = at::kBFloat16;
  t.shape = {5, 4};
  t.chunks = {{{0, 0}, {3, 4}, {"__0_x.distcp", 1261, 1577}}, {{3, 0}, {2, 4}, {"__1_x.distcp", 0, int64_t{1} << 33}}};
  formats::DcpItem b;
  b.key = "optimizer.param_groups.0.lr";
  b.path = {"optimizer", "param_groups", "0", "lr"};
  b.path_is_int = {false, false, true, false};
  b.is_bytes = true;
  b.bytes = {"__0_x.distcp", 0, 1261};
  md.items = {t, b};
  const formats::DcpMetadata back = formats::parse_dcp_metadata(formats::dcp_metadata_bytes(md), "md");
  EXPECT_EQ(back.save_id, "abc-1");
  ASSERT_EQ(back.items.size(), 2u);
  EXPECT_EQ(back.items[0].key, "model.w");
  EXPECT_EQ(back.items[0].dtype, at::kBFloat16);
  EXPECT_EQ(back.items[0].shape, t.shape);
  ASSERT_EQ(back.items[0].chunks.size(), 2u);
  EXPECT_EQ(back.items[0].chunks[1].offsets, (std::vector<int64_t>{3, 0}));
  EXPECT_EQ(back.items[0].chunks[1].storage.file, "__1_x.distcp");
  EXPECT_EQ(back.items[0].chunks[1].storage.length, int64_t{1} << 33);
  EXPECT_TRUE(back.items[1].is_bytes);
  EXPECT_EQ(back.items[1].path, b.path);
  EXPECT_EQ(back.items[1].path_is_int, b.path_is_int);
  EXPECT_EQ(back.items[1].bytes.offset, 0);
  auto refused = [](const std::string& pkl, const std::string& text) {
    try {
      formats::parse_dcp_metadata(pkl, "md");
      ADD_FAILURE() << "accepted, expected: " << text;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  const std::string ls("X\x02\x00\x00\x00ls", 7), x("X\x01\x00\x00\x00x", 6);
  refused("\x80\x02" "cos\nsystem\n" + ls + "\x85R.", "the Python global os.system");
  refused("\x80\x02" "cbuiltins\ngetattr\n" "cos\npath\n" + x + "\x86R.", "the Python global os.path");
  refused("\x80\x02}.", "expected a Metadata object");
  // A data file name outside the directory is refused.
  const std::string good = formats::dcp_metadata_bytes(md);
  const auto at = good.find("relative_path");
  std::string escaped = good;
  escaped.replace(good.find("__0_x.distcp", at), 12, "../x.distcp_");
  refused(escaped, "is not a plain name inside the directory");
}
