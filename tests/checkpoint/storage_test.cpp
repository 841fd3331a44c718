// The storage/plan seam of load_checkpoint (fsdp/checkpoint/storage.h): a
// storage of one's own (here in memory) loads what was saved, and a custom
// planner sees the plan and what it returns is what is read and loaded.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <mutex>
#include <set>

#include "../support/subprocess.h"
#include "../support/thread_ranks.h"
#include "../support/trainer.h"
#include "fsdp/checkpoint/checkpoint_io.h"
#include "fsdp/checkpoint/storage.h"

using namespace fsdp;
using namespace fsdp::testing;
namespace fs = std::filesystem;

namespace {

// Every chunk of another storage, copied into memory: nothing on disk is
// read once it is built. Counts the chunks read.
class MemoryStorage : public StorageReader {
 public:
  explicit MemoryStorage(const StorageReader& from) : index_(from.index()) {
    for (auto& [key, t] : index_.tensors) {
      boxes_[key] = from.chunks(key);
      for (size_t i = 0; i < boxes_[key].size(); ++i) data_[key].push_back(from.read_chunk(key, i).clone());
      for (auto& c : t.chunks) c.file = "(memory)";
    }
  }
  const formats::Index& index() const override { return index_; }
  std::string location() const override { return "memory"; }
  std::vector<StorageBox> chunks(const std::string& key) const override { return boxes_.at(key); }
  at::Tensor read_chunk(const std::string& key, size_t chunk) const override {
    ++reads;
    return data_.at(key).at(chunk);
  }
  mutable std::atomic<int> reads{0};

 private:
  formats::Index index_;
  std::map<std::string, std::vector<StorageBox>> boxes_;
  std::map<std::string, std::vector<at::Tensor>> data_;
};

CheckpointState state_of(Trainer& t) {
  return CheckpointState().model("model", t.model.ptr()).optimizer("optimizer", *t.optimizer);
}

}  // namespace

TEST(CheckpointStorage, AStorageInMemoryLoadsWhatWasSaved) {
  TempDir dir;
  const std::string path = dir.path() + "/ckpt";
  const auto batches = make_batches(4, 12, 4);
  run_ranks(2, [&](dist::ProcessGroup& pg) {
    Trainer a(pg, Opt::kAdamW, 1);
    a.train(pg, batches, 0, 2);
    save_checkpoint(path, state_of(a).value("step", int64_t{2}), pg, {CheckpointFormat::kSharded});
    MemoryStorage memory(*open_checkpoint_storage(path));
    pg.barrier();
    if (pg.rank() == 0) fs::remove_all(path);  // from here on, only memory holds the checkpoint
    pg.barrier();

    Trainer b(pg, Opt::kAdamW, 99);
    CheckpointState s = state_of(b);
    s.value("step", int64_t{0});
    load_checkpoint(memory, s, pg);
    EXPECT_EQ(s.get<int64_t>("step"), 2);
    EXPECT_GT(memory.reads.load(), 0);
    const auto got = b.snapshot(), want = a.snapshot();
    ASSERT_EQ(got.size(), want.size());
    for (const auto& [k, v] : want) EXPECT_TRUE(torch::equal(got.at(k), v)) << k;

    Trainer c(pg, Opt::kSgd, 98);  // the module alone, through the same storage
    load_checkpoint(memory, c.model.ptr(), pg);
    const auto params = to_map(full_parameters(c.model.ptr()));
    for (const auto& [k, v] : params) EXPECT_TRUE(torch::equal(v, want.at(k))) << k;
  });
}

TEST(CheckpointStorage, ACustomPlannerSeesThePlanAndWhatItReturnsIsApplied) {
  TempDir dir;
  const std::string path = dir.path() + "/ckpt";
  run_ranks(2, [&](dist::ProcessGroup& pg) {
    Trainer a(pg, Opt::kSgd, 1);
    save_checkpoint(path, CheckpointState().model("model", a.model.ptr()), pg, {CheckpointFormat::kFull});
    const auto want = to_map(full_parameters(a.model.ptr()));
    MemoryStorage memory(*open_checkpoint_storage(path));

    Trainer b(pg, Opt::kSgd, 99);
    const auto before = to_map(full_parameters(b.model.ptr()));
    int calls = 0;
    std::string dropped, printed;
    std::set<std::pair<std::string, size_t>> planned_chunks;
    auto planner = [&](const StorageReader& reader, LoadPlan plan) {
      ++calls;
      EXPECT_EQ(reader.location(), "memory");
      EXPECT_FALSE(plan.reads.empty());
      printed = plan.to_string();
      dropped = plan.reads.front().key;  // leave one tensor out: it is not loaded
      plan.reads.erase(plan.reads.begin());
      for (const auto& r : plan.reads) {
        EXPECT_FALSE(r.whole) << r.key;
        for (const auto& box : r.boxes) {
          for (size_t c : box.chunks) planned_chunks.insert({r.key, c});
        }
      }
      return plan;
    };
    load_checkpoint(memory, b.model.ptr(), pg, /*strict=*/false, planner);
    EXPECT_EQ(calls, 1);
    EXPECT_NE(printed.find(dropped + ":"), std::string::npos) << printed;
    EXPECT_EQ(static_cast<size_t>(memory.reads.load()), planned_chunks.size());  // each planned chunk read once, nothing else
    const std::string name = dropped.substr(dropped.find('/') + 1);
    const auto got = to_map(full_parameters(b.model.ptr()));
    for (const auto& [k, v] : want) {
      if (k == name) {
        EXPECT_TRUE(torch::equal(got.at(k), before.at(k))) << k << " was left out of the plan";
      } else {
        EXPECT_TRUE(torch::equal(got.at(k), v)) << k;
      }
    }
    ASSERT_TRUE(want.count(name)) << dropped;  // a parameter's key
    // Strict, the same plan is a missing key.
    Trainer c(pg, Opt::kSgd, 98);
    EXPECT_THROW(load_checkpoint(memory, c.model.ptr(), pg, /*strict=*/true, planner), std::exception);
  });
}
