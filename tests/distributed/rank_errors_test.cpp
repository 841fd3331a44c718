// Failures agreed across ranks keep their kind (include/fsdp/distributed/rank_errors.h): a
// ConfigError on one rank is a ConfigError on every rank, and so are the
// checkpoint loaders' and savers' errors built on it.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "fsdp/distributed/rank_errors.h"
#include "../support/subprocess.h"
#include "../support/thread_ranks.h"
#include "fsdp/checkpoint/checkpoint_io.h"
#include "fsdp/error.h"
#include "../support/trainer.h"

using namespace fsdp;
using namespace fsdp::testing;
namespace fs = std::filesystem;

namespace {

// What `f` threw: its kind ("ConfigError", "CollectiveError", "Error", or
// "none") and its message.
std::pair<std::string, std::string> thrown(const std::function<void()>& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return {"ConfigError", e.what()};
  } catch (const CollectiveError& e) {
    return {"CollectiveError:" + e.collective(), e.what()};
  } catch (const Error& e) {
    return {"Error", e.what()};
  }
  return {"none", ""};
}

TEST(RankErrors, EveryRankThrowsTheFailedRanksErrorOfItsKind) {
  run_ranks(3, [](dist::ProcessGroup& pg) {
    const int r = pg.rank();
    auto fail_on = [&](int who, const std::function<void()>& f) {
      return fsdp::dist::capture([&] {
        if (r == who) f();
      });
    };
    // A ConfigError on rank 1 (and a later one on rank 2): rank 1's, on every rank.
    auto e = thrown([&] {
      fsdp::dist::agree(pg, fsdp::dist::capture([&] {
                      if (r >= 1) throw ConfigError("bad value " + std::to_string(r));
                    }),
                    "step");
    });
    EXPECT_EQ(e.first, "ConfigError");
    EXPECT_EQ(e.second, r == 1 ? "bad value 1" : "step failed on rank 1: bad value 1");

    e = thrown([&] { fsdp::dist::agree(pg, fail_on(2, [] { throw CollectiveError("timed out", "all_gather"); }), "x"); });
    EXPECT_EQ(e.first, "CollectiveError:all_gather");

    e = thrown([&] { fsdp::dist::agree(pg, fail_on(0, [] { throw std::runtime_error("disk"); }), "x"); });
    EXPECT_EQ(e.first, "Error");
    EXPECT_EQ(e.second, r == 0 ? "disk" : "x failed on rank 0: disk");

    EXPECT_EQ(thrown([&] { fsdp::dist::agree(pg, "", "x"); }).first, "none");

    // Payloads when every rank succeeds; the failure (prefixed everywhere) otherwise.
    auto all = fsdp::dist::gather_agreed(pg, "p" + std::to_string(r), "", "g");
    EXPECT_EQ(all, (std::vector<std::string>{"p0", "p1", "p2"}));
    e = thrown([&] { fsdp::dist::gather_agreed(pg, "p", fail_on(1, [] { throw ConfigError("no"); }), "g"); });
    EXPECT_EQ(e.first, "ConfigError");
    EXPECT_EQ(e.second, "g failed on rank 1: no");

    e = thrown([&] { fsdp::dist::agree_from(pg, 0, fail_on(0, [] { throw ConfigError("root says no"); }), "pre: "); });
    EXPECT_EQ(e.first, "ConfigError");
    EXPECT_EQ(e.second, "pre: root says no");

    // Gathered, not thrown: the payloads, and the lowest failed rank's failure
    // ("rank <r>: " before it, its kind kept) for a step still to come.
    fsdp::dist::Failure first;
    all = fsdp::dist::gather_outcomes(pg, "p" + std::to_string(r), "", first);
    EXPECT_EQ(all, (std::vector<std::string>{"p0", "p1", "p2"}));
    EXPECT_TRUE(first.empty());
    all = fsdp::dist::gather_outcomes(pg, "p" + std::to_string(r),
                                        fail_on(2, [] { throw CollectiveError("gone", "broadcast"); }), first);
    EXPECT_EQ(all, (std::vector<std::string>{"p0", "p1", ""}));
    e = thrown([&] { fsdp::dist::rethrow(first, "saving: "); });
    EXPECT_EQ(e.first, "CollectiveError:broadcast");
    EXPECT_EQ(e.second, "saving: rank 2: gone");
  });
}

// The checkpoint functions' errors, which go through those agreements,
// are ConfigErrors on every rank (they were plain Errors before).
TEST(RankErrors, CheckpointErrorsAreConfigErrorsOnEveryRank) {
  TempDir dir;
  run_ranks(2, [&](dist::ProcessGroup& pg) {
    Trainer t(pg, Opt::kSgd, 1);
    CheckpointState s;
    s.model("model", t.model.ptr());
    EXPECT_EQ(thrown([&] { load_checkpoint(dir.path() + "/none", s, pg); }).first, "ConfigError");
    EXPECT_EQ(thrown([&] { load_checkpoint(dir.path() + "/none", t.model.ptr(), pg); }).first, "ConfigError");
    // A file only rank 1 finds damaged: rank 0 gets rank 1's ConfigError.
    save_checkpoint(dir.path() + "/ckpt", s, pg, {CheckpointFormat::kSharded});
    if (pg.rank() == 0) {
      for (const auto& f : fs::directory_iterator(dir.path() + "/ckpt")) {
        if (f.path().filename().string().rfind("__1_", 0) == 0) fs::resize_file(f.path(), 8);
      }
    }
    pg.barrier();
    auto e = thrown([&] { load_checkpoint(dir.path() + "/ckpt", s, pg); });
    EXPECT_EQ(e.first, "ConfigError") << e.second;
    EXPECT_NE(e.second.find("__1_"), std::string::npos) << e.second;
  });
}

}  // namespace
