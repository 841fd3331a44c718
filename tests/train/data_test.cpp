// fsdp-train's data (issue 37): a context the training text cannot hold, a
// --data file truncated under the run, a --data file changed between a
// checkpoint and its resume, a held-out set that does not depend on the
// world size, and --print-config that validates before it prints.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "fsdp/fault_points/fault_points.h"
#include "../support/errors.h"
#include "../support/models.h"
#include "../support/subprocess.h"
#include "../support/thread_ranks.h"
#include "../support/train_config.h"
#include "fsdp/checkpoint/checkpoint_io.h"
#include "fsdp/error.h"
#include "fsdp/train/gpt_trainer.h"

using namespace fsdp;
using namespace fsdp::testing;
namespace fs = std::filesystem;

namespace {

train::TrainConfig tiny(const std::string& out, int64_t steps) {
  train::TrainConfig c = tiny_train_config(out, steps, 2);
  c.eval_every = 0;
  return c;
}

// The rows of a batch (inputs with the last target appended), as strings.
std::vector<std::string> rows_of(const train::Batch& b, int64_t rows) {
  std::vector<std::string> out;
  const at::Tensor in = b.inputs.to(at::kByte), last = b.targets.select(1, b.targets.size(1) - 1).to(at::kByte);
  for (int64_t r = 0; r < rows; ++r) {
    std::string row(static_cast<size_t>(in.size(1)), ' ');
    for (int64_t i = 0; i < in.size(1); ++i) row[static_cast<size_t>(i)] = static_cast<char>(in[r][i].item<uint8_t>());
    out.push_back(row + static_cast<char>(last[r].item<uint8_t>()));
  }
  return out;
}

// The fault hook of the truncation tests: at the first "optimizer-step"
// (step 1's, every rank still before step 2's batch), --data is cut to
// g_truncate_to bytes.
std::string g_truncate_path;
int64_t g_truncate_to = 0;
std::once_flag* g_truncate_once = nullptr;
void truncate_at_first_step(const char* point, int) {
  if (std::string(point) != "optimizer-step") return;
  std::call_once(*g_truncate_once, [] { EXPECT_EQ(::truncate(g_truncate_path.c_str(), g_truncate_to), 0); });
}

}  // namespace

// Issue 37 item 15: a --context that the training text cannot hold is a
// ConfigError naming the numbers, before anything runs. Before the fix,
// `--dim 8 --heads 1 --layers 1 --context 1048575 --steps 1` (the generated
// corpus) died of SIGFPE (a modulo by 0), and --context 1100000 of SIGSEGV
// (a copy from before the corpus).
TEST(TrainData, AContextTheTrainingTextCannotHoldIsRefusedNamingTheNumbers) {
  TempDir dir;
  for (int64_t context : {int64_t{1048575}, int64_t{1100000}}) {
    auto c = tiny(dir.path() + "/out", 1);
    c.model.context = context;
    expect_config_error([&] { train::validate(c); },
                        "--context " + std::to_string(context) +
                            ": the generated corpus (1048576 bytes; no --data) is too short: --context " +
                            std::to_string(context) + " needs at least " + std::to_string(context + 2) +
                            " bytes (a sample of " + std::to_string(context + 1) +
                            " and room to place it); expected --context at most 1048574");
  }
  auto c = tiny(dir.path() + "/out", 1);
  c.model.context = 1048574;  // the longest the generated corpus holds
  EXPECT_NO_THROW(train::validate(c));
  // The sampler refuses too (a corpus that is not what validate saw).
  expect_config_error(
      [] { train::BatchSampler(train::Corpus::hold(std::string(33, 'x'), "the text"), 32, 1, 0, 0, 1, at::kCPU); },
      "--context 32: the training text of the text (33 bytes) cannot hold a sample: --context 32 needs at least 34 "
      "bytes (a sample of 33 and room to place it); expected --context at most 31");
  EXPECT_NO_THROW(train::BatchSampler(train::Corpus::hold(std::string(34, 'x'), "the text"), 32, 1, 0, 0, 1, at::kCPU));
  // The command line of the report: an error and status 1, not a signal.
  const auto r = run_program({FSDP_TRAIN_PATH, "--dim", "8", "--heads", "1", "--layers", "1", "--context", "1048575",
                              "--steps", "1", "--out", dir.path() + "/cli"},
                             std::chrono::seconds(60));
  EXPECT_EQ(r.exit_code(), 1) << r.output;
  EXPECT_NE(r.output.find("fsdp-train: --context 1048575: the generated corpus (1048576 bytes; no --data) is too "
                          "short"),
            std::string::npos)
      << r.output;
}

// Issue 37 item 16: a --data file truncated while the run reads it. The
// samples are copied out with pread, so a sample past the new end is a
// ConfigError naming the file, the bytes and both sizes. Before the fix:
// SIGBUS (the copy went through the mapping).
TEST(TrainData, ATruncatedDataFileIsANamedErrorNotSigbus) {
  TempDir dir;
  const std::string data = dir.path() + "/data.txt";
  write_file(data, train::generated_corpus(100000));
  const train::BatchSampler sampler(train::Corpus::map_file(data), 32, 4, 0, 0, 1, at::kCPU);
  EXPECT_NO_THROW(sampler.training(0));
  ASSERT_EQ(::truncate(data.c_str(), 10), 0);
  expect_config_error([&] { sampler.training(0); }, "--data " + data + ": cannot read bytes [");
  expect_config_error([&] { sampler.training(0); },
                      "(it held 100000 bytes when the run started, 10 bytes now): it was truncated or rewritten while "
                      "the run reads it");
  expect_config_error([&] { sampler.held_out(0); }, "truncated or rewritten while the run reads it");
}

// Issue 37 item 16, in a run at world 1 and 2: --data is cut after step 1.
// Every rank stops with the named error through the normal error path (the
// ranks agree the failure each step: at world 2 the cut leaves rank 0's
// samples of step 2 whole and takes rank 1's, and rank 0 stops with rank
// 1's error instead of waiting in a collective). No checkpoint is written.
// Before the fix: SIGBUS on the rank that read past the end.
TEST(TrainData, DataTruncatedMidRunStopsEveryRankWithTheNamedError) {
  for (int world : {1, 2}) {
    SCOPED_TRACE("world " + std::to_string(world));
    TempDir dir;
    const std::string data = dir.path() + "/data.txt";
    const int64_t size = 100000;
    write_file(data, train::generated_corpus(static_cast<size_t>(size)));
    auto c = tiny(dir.path() + "/out", 3);
    c.data = data;
    // Where step 2's samples lie: a seed whose cut keeps rank 0's and takes rank 1's.
    int64_t cut = 0;
    for (uint64_t seed = 0; seed < 200 && cut == 0; ++seed) {
      const train::BatchSampler s(train::Corpus::map_file(data), c.model.context, c.batch, seed, 0, world, at::kCPU);
      auto end_of = [&](int rank) {
        int64_t most = 0;
        for (int64_t i = 0; i < c.batch; ++i) {
          most = std::max(most, s.sample_start(c.batch * world + rank * c.batch + i) + c.model.context + 1);
        }
        return most;
      };
      if (world == 1) cut = end_of(0) - 1;
      else if (end_of(1) > end_of(0)) cut = end_of(0);
      if (cut > 0) c.strategy.seed(seed);
    }
    ASSERT_GT(cut, 0);
    std::once_flag once;
    g_truncate_path = data;
    g_truncate_to = cut;
    g_truncate_once = &once;
    fsdp_set_fault_hook(&truncate_at_first_step);
    std::mutex mu;
    std::map<int, std::string> errors;
    run_ranks(world, [&](dist::ProcessGroup& pg) {
      try {
        train::train(c, borrow(pg));
      } catch (const ConfigError& e) {
        std::lock_guard<std::mutex> lock(mu);
        errors[pg.rank()] = e.what();
      } catch (const std::exception& e) {
        ADD_FAILURE() << "rank " << pg.rank() << ": not a ConfigError: " << e.what();
      }
    });
    fsdp_set_fault_hook(nullptr);
    ASSERT_EQ(errors.size(), static_cast<size_t>(world));
    for (const auto& [rank, what] : errors) {
      EXPECT_NE(what.find("--data " + data + ": cannot read bytes ["), std::string::npos) << what;
      EXPECT_NE(what.find("(it held " + std::to_string(size) + " bytes when the run started, " + std::to_string(cut) +
                          " bytes now)"),
                std::string::npos)
          << what;
    }
    if (world == 2) {
      EXPECT_NE(errors[0].find("step 2: reading --data failed on rank 1: "), std::string::npos) << errors[0];
    }
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(c.out + "/checkpoints", ec)) {
      ADD_FAILURE() << "saved after the error: " << e.path();
    }
  }
}

// Issue 37 item 11: each checkpoint keeps a fingerprint of --data (its size
// and a hash of sampled pages); a resume on the same path whose contents
// changed is refused naming both fingerprints, and --allow-data-change
// accepts it on purpose, saying so. Before the fix: only the path was
// compared, and the run resumed on the changed text without a word.
TEST(TrainData, AResumeOnChangedDataIsRefusedUnlessAllowed) {
  TempDir dir;
  const std::string data = dir.path() + "/data.txt", out = dir.path() + "/out";
  std::string text = train::generated_corpus(100000);
  write_file(data, text);
  const std::string before = train::Corpus::map_file(data).fingerprint();
  auto c = tiny(out, 2);
  c.data = data;
  run_ranks(1, [&](dist::ProcessGroup& pg) { train::train(c, borrow(pg)); });
  const CheckpointInfo info = inspect_checkpoint(out + "/checkpoints/step-00000002");
  ASSERT_TRUE(info.values.count("data_fingerprint"));
  EXPECT_EQ(info.values.at("data_fingerprint"), before);
  // The same contents resume (also after a rewrite of the same bytes).
  write_file(data, text);
  auto r = c;
  r.steps = 3;
  r.resume = true;
  run_ranks(1, [&](dist::ProcessGroup& pg) { train::train(r, borrow(pg)); });
  // One byte changed in place, the size kept: a sampled page (the first) differs.
  text[100] = text[100] == 'x' ? 'y' : 'x';
  write_file(data, text);
  const std::string after = train::Corpus::map_file(data).fingerprint();
  ASSERT_NE(after, before);
  ASSERT_EQ(after.substr(0, after.find(':')), "100000");
  r.steps = 4;
  run_ranks(1, [&](dist::ProcessGroup& pg) {
    expect_config_error([&] { train::train(r, borrow(pg)); },
                        "--data " + data + " changed since " + out + "/checkpoints/step-00000003 was saved: its "
                        "fingerprint (size:hash of sampled pages) was " + before + ", it is " + after +
                        ". The run would continue on other text than it trained on; expected the same file, or "
                        "--allow-data-change");
  });
  // A shorter file: the size alone tells.
  write_file(data, text.substr(0, 90000));
  run_ranks(1, [&](dist::ProcessGroup& pg) {
    expect_config_error([&] { train::train(r, borrow(pg)); }, "was " + before + ", it is 90000:fnv1a64:");
  });
  write_file(data, text);
  r.allow_data_change = true;
  ::testing::internal::CaptureStderr();
  run_ranks(1, [&](dist::ProcessGroup& pg) { train::train(r, borrow(pg)); });
  const std::string said = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(said.find("fsdp-train: WARNING: --data " + data + " changed since"), std::string::npos) << said;
  EXPECT_NE(said.find("resuming on it (--allow-data-change)"), std::string::npos) << said;
  EXPECT_EQ(inspect_checkpoint(out + "/checkpoints/step-00000004").values.at("data_fingerprint"), after);
  // The flag is fsdp-train's, in its --help.
  const auto help = run_program({FSDP_TRAIN_PATH, "--help"}, std::chrono::seconds(60));
  EXPECT_NE(help.output.find("--allow-data-change"), std::string::npos) << help.output;
}

// The fingerprint reads 64 pages spread over the file: the first and the
// last byte count, and so does the size.
TEST(TrainData, TheFingerprintSeesTheEndsAndTheSize) {
  const std::string text = train::generated_corpus(1 << 20);
  const std::string fp = train::Corpus::hold(text, "t").fingerprint();
  std::string first = text, last = text;
  first.front() ^= 1;
  last.back() ^= 1;
  EXPECT_NE(train::Corpus::hold(first, "t").fingerprint(), fp);
  EXPECT_NE(train::Corpus::hold(last, "t").fingerprint(), fp);
  EXPECT_NE(train::Corpus::hold(text + " ", "t").fingerprint(), fp);
  EXPECT_EQ(train::Corpus::hold(text, "other name").fingerprint(), fp);
}

// Issue 37 (smaller): the held-out set is kHeldOutSamples samples whatever
// the world size and batch, so an elastic resize evaluates on the same set.
// Before the fix it was 4 * batch * world samples (16 at world 1 x batch 4,
// 32 at world 2), and the held-out curve jumped at a resize.
TEST(TrainData, TheHeldOutSetIsTheSameAtAnyWorldSize) {
  const std::string text = train::generated_corpus(100000);
  auto held_out_set = [&](int64_t batch, int world) {
    std::multiset<std::string> rows;
    for (int rank = 0; rank < world; ++rank) {
      const train::BatchSampler s(train::Corpus::hold(text, "t"), 32, batch, 5, rank, world, at::kCPU);
      EXPECT_EQ(s.held_out_rounds(), (train::kHeldOutSamples + batch * world - 1) / (batch * world));
      for (int64_t i = 0; i < s.held_out_rounds(); ++i) {
        const auto got = rows_of(s.held_out(i), s.held_out_rows(i));
        rows.insert(got.begin(), got.end());
      }
    }
    return rows;
  };
  const auto one = held_out_set(4, 1);
  EXPECT_EQ(one.size(), static_cast<size_t>(train::kHeldOutSamples));
  EXPECT_EQ(held_out_set(4, 2), one);
  EXPECT_EQ(held_out_set(3, 5), one);  // rounds that end in padding rows
  EXPECT_EQ(held_out_set(8, 16), one);  // more rows than samples: some ranks' rounds are all padding
}

// Issue 37 (smaller): --print-config validates first, with the errors a run
// gives, and writes nothing. Before the fix it printed "lr": null, steps -5
// and logger "bogus", and exited 0.
TEST(TrainData, PrintConfigRefusesWhatARunRefuses) {
  TempDir dir;
  const std::string out = dir.path() + "/never-made";
  auto print = [&](std::vector<std::string> flags) {
    std::vector<std::string> argv{FSDP_TRAIN_PATH, "--print-config", "--out", out};
    argv.insert(argv.end(), flags.begin(), flags.end());
    return run_program(argv, std::chrono::seconds(60));
  };
  const std::map<std::vector<std::string>, std::string> bad{
      {{"--lr", "nan"}, "--lr must be a positive number, got nan"},
      {{"--steps", "-5"}, "--steps must be positive, got -5"},
      {{"--logger", "bogus"}, "--logger 'bogus': unknown logger 'bogus'"},
      {{"--context", "1048575"}, "--context 1048575: the generated corpus"}};
  for (const auto& [flags, error] : bad) {
    const auto r = print(flags);
    EXPECT_EQ(r.exit_code(), 1) << flags[0] << ": " << r.output;
    EXPECT_NE(r.output.find("fsdp-train: " + error), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("\"lr\""), std::string::npos) << "printed a configuration:\n" << r.output;
  }
  const auto r = print({"--lr", "0.01", "--allow-data-change"});
  EXPECT_EQ(r.exit_code(), 0) << r.output;
  EXPECT_NE(r.output.find("\"lr\":0.01"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\"allow_data_change\":true"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(out)) << "--print-config made --out";
}
