// The storage seams of one's own (fsdp/checkpoint/storage_registry.h,
// storage_writer.h): a registered format is found by detection, a path two
// formats claim or none claims is a named error, and a StorageWriter gets
// each piece once and commits on rank 0.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>

#include "../support/errors.h"
#include "../support/subprocess.h"
#include "../support/thread_ranks.h"
#include "../support/trainer.h"
#include "fsdp/checkpoint/checkpoint_io.h"
#include "fsdp/checkpoint/storage_registry.h"
#include "fsdp/checkpoint/storage_writer.h"

using namespace fsdp;
using namespace fsdp::testing;
namespace fs = std::filesystem;

namespace {

// A directory holding a file MINE whose line names another checkpoint:
// opened as that checkpoint's storage, under another location.
class Redirect : public StorageReader {
 public:
  explicit Redirect(std::unique_ptr<StorageReader> to) : to_(std::move(to)) {}
  const formats::Index& index() const override { return to_->index(); }
  std::string location() const override { return "redirected:" + to_->location(); }
  std::vector<StorageBox> chunks(const std::string& key) const override { return to_->chunks(key); }
  at::Tensor read_chunk(const std::string& key, size_t chunk) const override { return to_->read_chunk(key, chunk); }

 private:
  std::unique_ptr<StorageReader> to_;
};

class MineFormat : public StorageFormat {
 public:
  explicit MineFormat(std::string name = "mine", bool greedy = false) : name_(std::move(name)), greedy_(greedy) {}
  std::string name() const override { return name_; }
  bool claims(const std::string& path, const DetectOptions&) const override {
    std::error_code ec;
    if (greedy_) return fs::is_directory(path, ec);  // claims every directory: DCP's too
    return fs::is_regular_file(fs::path(path) / "MINE", ec);
  }
  std::unique_ptr<StorageReader> open(const std::string& path, const DetectOptions&) const override {
    ++opens;
    std::ifstream in(fs::path(path) / "MINE");
    std::string target;
    std::getline(in, target);
    return std::make_unique<Redirect>(open_checkpoint_storage(target));
  }
  mutable std::atomic<int> opens{0};

 private:
  std::string name_;
  bool greedy_;
};

// Registered for the scope of a test.
struct Registered {
  explicit Registered(std::shared_ptr<const StorageFormat> f) : name(f->name()) { register_storage_format(f); }
  ~Registered() { unregister_storage_format(name); }
  std::string name;
};

}  // namespace

TEST(StorageRegistry, ARegisteredFormatIsFoundByDetection) {
  TempDir dir;
  const std::string real = dir.path() + "/real", mine = dir.path() + "/mine";
  const auto batches = make_batches(4, 12, 4);
  auto format = std::make_shared<MineFormat>();
  Registered reg(format);
  EXPECT_EQ(storage_format_names().back(), "mine");
  run_ranks(2, [&](dist::ProcessGroup& pg) {
    Trainer a(pg, Opt::kAdamW, 1);
    a.train(pg, batches, 0, 2);
    save_checkpoint(real, CheckpointState().model("model", a.model.ptr()).optimizer("optimizer", *a.optimizer), pg);
    if (pg.rank() == 0) {
      fs::create_directories(mine);
      std::ofstream(fs::path(mine) / "MINE") << real << "\n";
    }
    pg.barrier();
    EXPECT_EQ(detect_storage_format(mine)->name(), "mine");
    EXPECT_EQ(detect_storage_format(real)->name(), "dcp");
    Trainer b(pg, Opt::kAdamW, 99);
    load_checkpoint(mine, CheckpointState().model("model", b.model.ptr()).optimizer("optimizer", *b.optimizer), pg);
    const auto got = b.snapshot(), want = a.snapshot();
    ASSERT_EQ(got.size(), want.size());
    for (const auto& [k, v] : want) EXPECT_TRUE(torch::equal(got.at(k), v)) << k;
  });
  EXPECT_EQ(format->opens.load(), 2);  // once per rank
  expect_config_error([&] { register_storage_format(std::make_shared<MineFormat>()); }, "already registered");
  expect_config_error([&] { unregister_storage_format("dcp"); }, "built-in");
}

TEST(StorageRegistry, AnAmbiguousOrUnknownPathIsANamedError) {
  TempDir dir;
  const std::string real = dir.path() + "/real", empty = dir.path() + "/empty";
  fs::create_directories(empty);
  run_ranks(1, [&](dist::ProcessGroup& pg) {
    Trainer a(pg, Opt::kSgd, 1);
    save_checkpoint(real, CheckpointState().model("model", a.model.ptr()), pg);
  });
  EXPECT_EQ(detect_storage_format(real)->name(), "dcp");
  {
    Registered greedy(std::make_shared<MineFormat>("greedy", /*greedy=*/true));
    const std::string e = config_error([&] { open_checkpoint_storage(real); });
    EXPECT_NE(e.find("is claimed by several storage formats: 'dcp' and 'greedy'"), std::string::npos) << e;
  }
  EXPECT_EQ(open_checkpoint_storage(real)->location(), real + "/fsdp_index.json");  // unregistered again
  const std::string e = config_error([&] { open_checkpoint_storage(empty); });
  EXPECT_NE(e.find("does not point to a valid checkpoint"), std::string::npos) << e;
  EXPECT_NE(e.find("(a directory without .metadata or index.json)"), std::string::npos) << e;
}

namespace {

// Keeps every rank's items in memory; rank 0's finish sees every result.
struct MemoryWriter : StorageWriter {
  struct Shared {
    std::mutex mu;
    std::map<std::string, int64_t> elements;  // per tensor key, over every rank's items
    std::vector<std::string> finished;        // the results finish got
    std::atomic<int> aborts{0};
  };
  MemoryWriter(std::shared_ptr<Shared> s, int fail_rank) : shared(std::move(s)), fail_rank(fail_rank) {}
  std::string location() const override { return "memory"; }
  std::string write_data(const SavePlan& plan) override {
    if (plan.rank == fail_rank) throw Error("memory is full");
    std::lock_guard<std::mutex> lock(shared->mu);
    for (const auto& item : plan.items) shared->elements[item.key] += item.tensor.numel();
    return "rank " + std::to_string(plan.rank) + ": " + std::to_string(plan.items.size()) + " items";
  }
  void finish(const SavePlan& plan, const std::vector<std::string>& results) override {
    EXPECT_EQ(plan.rank, 0);
    std::lock_guard<std::mutex> lock(shared->mu);
    shared->finished = results;
  }
  void abort(const SavePlan&) noexcept override { ++shared->aborts; }
  std::shared_ptr<Shared> shared;
  int fail_rank;
};

}  // namespace

TEST(StorageWriterSeam, AWriterOfOnesOwnGetsEachPieceOnceAndCommitsOnRankZero) {
  auto shared = std::make_shared<MemoryWriter::Shared>(), failing = std::make_shared<MemoryWriter::Shared>();
  std::map<std::string, int64_t> numel;
  run_ranks(2, [&](dist::ProcessGroup& pg) {
    Trainer a(pg, Opt::kSgd, 1);
    const auto state = CheckpointState().model("model", a.model.ptr()).value("step", int64_t{3});
    save_checkpoint(std::make_shared<MemoryWriter>(shared, -1), state, pg);
    const auto params = to_map(full_parameters(a.model.ptr()));  // [collective]
    if (pg.rank() == 0) {
      for (const auto& [k, v] : params) numel["model/" + k] = v.numel();
    }
    std::string e = "(no error)";
    try {
      save_checkpoint(std::make_shared<MemoryWriter>(failing, 1), state, pg);
    } catch (const Error& x) {
      e = x.what();
    }
    EXPECT_NE(e.find("save_checkpoint: saving memory failed (the previous checkpoint there is intact)"),
              std::string::npos) << e;  // on every rank, the same
    EXPECT_NE(e.find("memory is full"), std::string::npos) << e;
  });
  ASSERT_EQ(shared->finished.size(), 2u);
  EXPECT_EQ(shared->finished[0].rfind("rank 0: ", 0), 0u);
  EXPECT_EQ(shared->finished[1].rfind("rank 1: ", 0), 0u);
  ASSERT_FALSE(numel.empty());
  for (const auto& [k, n] : numel) EXPECT_EQ(shared->elements[k], n) << k;  // every element written once
  EXPECT_EQ(shared->aborts.load(), 0);
  EXPECT_TRUE(failing->finished.empty());  // never committed
  EXPECT_EQ(failing->aborts.load(), 2);    // and aborted on both ranks
}
