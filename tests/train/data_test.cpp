// fsdp-train's data (issue 37): a context the training text cannot hold, a
// --data file truncated under the run, a --data file changed between a
// checkpoint and its resume, a held-out set that does not depend on the
// world size, and --print-config that validates before it prints. Then
// token-id files (--data-format: raw uint16/uint32, llm.c's header), ids
// beyond the vocabulary, and `fsdp-train prepare` against Hugging Face's
// `tokenizers` (the venv's Python; skipped without it outside the wheel
// build).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
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
using Json = nlohmann::json;

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

// ---- Token-id files (--data-format) and `fsdp-train prepare` ----

namespace {

// `ids` as little-endian integers of `width` bytes.
std::string id_bytes(const std::vector<int64_t>& ids, int width) {
  std::string out;
  for (const int64_t id : ids) {
    for (int k = 0; k < width; ++k) out.push_back(static_cast<char>((id >> (8 * k)) & 0xFF));
  }
  return out;
}

// llm.c's file: the header (magic, version, `count`), then `ids`.
std::string llmc_file(const std::vector<int64_t>& ids, int version, int64_t count) {
  std::string header(1024, '\0');
  const int64_t fields[3] = {train::kLlmcMagic, version, count};
  for (int f = 0; f < 3; ++f) {
    for (int k = 0; k < 4; ++k) header[static_cast<size_t>(f * 4 + k)] = static_cast<char>((fields[f] >> (8 * k)) & 0xFF);
  }
  return header + id_bytes(ids, version == 1 ? 2 : 4);
}
std::string llmc_file(const std::vector<int64_t>& ids, int version) {
  return llmc_file(ids, version, static_cast<int64_t>(ids.size()));
}

// The rows of a batch (inputs with the last target appended), as ids.
std::vector<std::vector<int64_t>> id_rows(const train::Batch& b) {
  const at::Tensor full = at::cat({b.inputs, b.targets.narrow(1, b.targets.size(1) - 1, 1)}, 1).contiguous();
  std::vector<std::vector<int64_t>> rows;
  for (int64_t i = 0; i < full.size(0); ++i) {
    const int64_t* p = full[i].data_ptr<int64_t>();
    rows.emplace_back(p, p + full.size(1));
  }
  return rows;
}

// Seeded ids below `vocab`.
std::vector<int64_t> seeded_ids(size_t n, int64_t vocab, uint64_t seed) {
  std::vector<int64_t> ids(n);
  uint64_t x = seed;
  for (auto& id : ids) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    id = static_cast<int64_t>((x >> 33) % static_cast<uint64_t>(vocab));
  }
  return ids;
}

}  // namespace

// A raw uint16 file, a raw uint32 file and llm.c's files of both versions
// give, at every sample, the context + 1 ids that start at the token the
// sampler documents (sample_start, in tokens: the same starts a text of as
// many bytes has), and the held-out batches come from the last tokens.
TEST(TrainData, TokenFilesGiveTheIdsAtTheSampleStarts) {
  TempDir dir;
  const int64_t context = 32, n = 5000, vocab = 70000;
  const auto ids = seeded_ids(static_cast<size_t>(n), vocab, 3);
  auto small = ids;  // uint16's: below 65536
  for (auto& id : small) id %= 65536;
  struct Case {
    std::string name, bytes, format, layout;
    const std::vector<int64_t>* ids;
  };
  const std::vector<Case> cases{
      {"raw.u16", id_bytes(small, 2), "uint16", "uint16", &small},
      {"raw.u32", id_bytes(ids, 4), "uint32", "uint32", &ids},
      {"llmc1.bin", llmc_file(small, 1), "auto", "llm.c v1 (uint16)", &small},
      {"llmc2.bin", llmc_file(ids, 2), "auto", "llm.c v2 (uint32)", &ids},
  };
  const int64_t split = n - train::held_out_tokens(n, context);
  // The starts of a text of n bytes: the stream is the same in tokens.
  const train::BatchSampler text(train::Corpus::hold(std::string(static_cast<size_t>(n), 'a'), "t"), context, 1, 5, 0,
                                 1, at::kCPU);
  for (const auto& k : cases) {
    SCOPED_TRACE(k.name);
    const std::string path = dir.path() + "/" + k.name;
    write_file(path, k.bytes);
    EXPECT_EQ(train::read_data_layout(path, k.format).format, k.layout);
    auto sampler = [&](int64_t batch, int rank, int world) {
      return train::BatchSampler(train::Corpus::map_file(path, "--data", k.format), context, batch, 5, rank, world,
                                 at::kCPU, vocab);
    };
    const train::BatchSampler one = sampler(6, 0, 1);
    EXPECT_EQ(one.corpus().tokens(), n);
    EXPECT_EQ(one.corpus().layout().format, k.layout);
    for (int64_t first : {int64_t{0}, int64_t{6}, int64_t{987654}}) {
      const auto rows = id_rows(one.training(first));
      ASSERT_EQ(rows.size(), 6u);
      for (int64_t i = 0; i < 6; ++i) {
        const int64_t at = one.sample_start(first + i);
        EXPECT_EQ(at, text.sample_start(first + i));
        ASSERT_LT(at + context + 1, split + 1) << "sample " << first + i << " reaches into the held-out tail";
        const std::vector<int64_t> want(k.ids->begin() + at, k.ids->begin() + at + context + 1);
        EXPECT_EQ(rows[static_cast<size_t>(i)], want) << "sample " << first + i << " at token " << at;
      }
      // World 2 x batch 3 sees what world 1 x batch 6 sees.
      auto two = id_rows(sampler(3, 0, 2).training(first)), second = id_rows(sampler(3, 1, 2).training(first));
      two.insert(two.end(), second.begin(), second.end());
      EXPECT_EQ(two, rows);
    }
    // Held-out rows lie in the tail: each is a window of the ids after the split.
    const std::vector<int64_t> tail(k.ids->begin() + split, k.ids->end());
    for (const auto& row : id_rows(one.held_out(0))) {
      EXPECT_NE(std::search(tail.begin(), tail.end(), row.begin(), row.end()), tail.end());
    }
  }
}

// A text's bytes are its tokens: the text file, the same bytes written as
// uint16 ids and as llm.c's file give the same batches, and a run on each
// the same losses.
TEST(TrainData, ATextGivesTheBatchesOfItsBytesAsIds) {
  TempDir dir;
  const std::string text = train::generated_corpus(100000);
  const std::vector<int64_t> bytes(reinterpret_cast<const uint8_t*>(text.data()),
                                   reinterpret_cast<const uint8_t*>(text.data()) + text.size());
  write_file(dir.path() + "/data.txt", text);
  write_file(dir.path() + "/data.u16", id_bytes(bytes, 2));
  write_file(dir.path() + "/data.bin", llmc_file(bytes, 1));
  auto sampler = [&](const std::string& name, const std::string& format) {
    return train::BatchSampler(train::Corpus::map_file(dir.path() + "/" + name, "--data", format), 32, 4, 9, 1, 2,
                               at::kCPU);
  };
  const auto txt = sampler("data.txt", "auto"), u16 = sampler("data.u16", "uint16"), bin = sampler("data.bin", "auto");
  EXPECT_EQ(txt.corpus().layout().format, "text");
  for (int64_t p : {int64_t{0}, int64_t{8}, int64_t{123456}}) {
    const auto want = id_rows(txt.training(p));
    EXPECT_EQ(id_rows(u16.training(p)), want) << p;
    EXPECT_EQ(id_rows(bin.training(p)), want) << p;
  }
  for (int64_t i = 0; i < txt.held_out_rounds(); ++i) {
    EXPECT_EQ(id_rows(u16.held_out(i)), id_rows(txt.held_out(i))) << i;
    EXPECT_EQ(id_rows(bin.held_out(i)), id_rows(txt.held_out(i))) << i;
  }
  // Runs: the same losses, step for step (eval included).
  auto run = [&](const std::string& name, const std::string& format) {
    auto c = tiny(dir.path() + "/out-" + name, 3);
    c.data = dir.path() + "/" + name;
    c.data_format = format;
    c.eval_every = 3;
    double loss = 0;
    run_ranks(1, [&](dist::ProcessGroup& pg) { loss = train::train(c, borrow(pg)); });
    return std::make_pair(loss, inspect_checkpoint(c.out + "/checkpoints/step-00000003").values.at("data_format"));
  };
  const auto a = run("data.txt", "text"), b = run("data.u16", "uint16"), d = run("data.bin", "auto");
  EXPECT_EQ(a.first, b.first);
  EXPECT_EQ(a.first, d.first);
  EXPECT_EQ(a.second, "text");
  EXPECT_EQ(b.second, "uint16");
  EXPECT_EQ(d.second, "llm.c v1 (uint16)");
}

// An id at or beyond the model's vocabulary is named with the file, its
// index in it, the id and the vocabulary size, at the first batch that
// holds it (the file is never scanned whole); a run stops with it.
TEST(TrainData, IdsBeyondTheVocabularyAreNamed) {
  TempDir dir;
  const int64_t context = 32, vocab = 1000;
  auto ids = seeded_ids(5000, vocab, 11);
  const train::BatchSampler probe(train::Corpus::hold(std::string(ids.size(), 'a'), "t"), context, 1, 0, 0, 1,
                                  at::kCPU);
  const int64_t bad = probe.sample_start(1) + 5;  // in sample 1, not in sample 0 (unless they overlap)
  const bool overlap = bad >= probe.sample_start(0) && bad <= probe.sample_start(0) + context;
  ids[static_cast<size_t>(bad)] = 65000;
  for (const std::string name : {"raw.u16", "llmc.bin"}) {
    SCOPED_TRACE(name);
    const std::string path = dir.path() + "/" + name;
    write_file(path, name == "raw.u16" ? id_bytes(ids, 2) : llmc_file(ids, 1));
    const std::string format = name == "raw.u16" ? "uint16" : "auto";
    const train::BatchSampler s(train::Corpus::map_file(path, "--data", format), context, 1, 0, 0, 1, at::kCPU, vocab);
    if (!overlap) EXPECT_NO_THROW(s.training(0));
    expect_config_error([&] { s.training(1); },
                        "--data " + path + ": token " + std::to_string(bad) + " of the file (counting from 0" +
                            (name == "raw.u16" ? "" : ", after llm.c's header") + ", read as " +
                            (name == "raw.u16" ? "uint16" : "llm.c v1 (uint16)") +
                            ") is id 65000, at or beyond the model's vocabulary size 1000: expected ids from 0 to 999");
    // With a vocabulary that covers it, the same batch trains.
    const train::BatchSampler wide(train::Corpus::map_file(path, "--data", format), context, 1, 0, 0, 1, at::kCPU,
                                   65001);
    EXPECT_NO_THROW(wide.training(1));
  }
  // A byte-level run (vocab 256) on ids up to 999: stopped at step 1, naming them.
  auto c = tiny(dir.path() + "/out", 2);
  c.data = dir.path() + "/raw.u16";
  c.data_format = "uint16";
  run_ranks(1, [&](dist::ProcessGroup& pg) {
    expect_config_error([&] { train::train(c, borrow(pg)); }, "at or beyond the model's vocabulary size 256");
  });
  // --vocab covers them: it trains.
  c.model.vocab_size = 65001;
  c.out = dir.path() + "/out-wide";
  run_ranks(1, [&](dist::ProcessGroup& pg) { EXPECT_TRUE(std::isfinite(train::train(c, borrow(pg)))); });
}

// What is wrong with a token file is named: a header whose count is not
// its size's, another version, a cut header, a width that does not divide
// the size, llm.c's file read as raw ids, an unknown --data-format.
TEST(TrainData, BadTokenFilesAreRefusedNamingWhatIsWrong) {
  TempDir dir;
  const auto ids = seeded_ids(1000, 500, 4);
  auto refused = [&](const std::string& name, const std::string& bytes, const std::string& format,
                     const std::string& error) {
    SCOPED_TRACE(name);
    const std::string path = dir.path() + "/" + name;
    write_file(path, bytes);
    // The message starts with the file and names what is wrong.
    const std::string header = error.rfind("header[", 0) == 0 || error.rfind("the file holds", 0) == 0
                                   ? "llm.c's header (it starts with llm.c's magic 20240520): "
                                   : "";
    const std::string want = "--data " + path + ": " + header + error;
    expect_config_error([&] { train::read_data_layout(path, format); }, want);
    expect_config_error([&] { train::Corpus::map_file(path, "--data", format); }, want);
    auto c = tiny(dir.path() + "/out", 1);
    c.data = path;
    c.data_format = format;
    expect_config_error([&] { train::validate(c); }, want);
  };
  refused("lies.bin", llmc_file(ids, 1, 999), "auto",
          "header[2] (the number of tokens) is 999, but the "
          "2000 bytes after the header hold 1000 uint16 tokens (version 1): expected header[2] = 1000, the uint16 "
          "tokens its size holds");
  refused("odd.bin", llmc_file(ids, 2) + "x", "auto",
          "header[2] (the number of tokens) is 1000, but the 4001 bytes after the header hold no whole number of "
          "uint32 tokens (version 2): expected a file of 1024 + 4 x header[2] = 5024 bytes");
  std::string v3 = llmc_file(ids, 1);
  v3[4] = 3;
  refused("v3.bin", v3, "auto", "header[1] (the version) is 3: expected 1 (uint16 tokens) or 2 (uint32 tokens)");
  refused("cut.bin", llmc_file(ids, 1).substr(0, 600), "auto",
          "the file holds 600 bytes, fewer than the header's 1024 (256 int32)");
  refused("odd.u16", id_bytes(ids, 2) + "x", "uint16",
          "its 2001 bytes are not a whole number of uint16 ids (2 bytes each): expected a file of little-endian "
          "uint16 ids without a header, its size a multiple of 2");
  refused("odd.u32", id_bytes(ids, 4) + "xx", "uint32", "its 4002 bytes are not a whole number of uint32 ids");
  refused("header.u16", llmc_file(ids, 1), "uint16",
          "it starts with llm.c's header (magic 20240520, version 1, header[2] = 1000 tokens), which --data-format "
          "uint16 would read as token ids: expected --data-format auto");
  refused("header.u32", llmc_file(ids, 2), "uint32", "it starts with llm.c's header (magic 20240520, version 2");
  // Issue 50 item 10: a header whose count lies (n + 1000) is llm.c's header
  // all the same. Before the fix: it trained under --data-format uint16, the
  // 1 KiB header read as 512 token ids.
  refused("lying.u16", llmc_file(ids, 1, 2000), "uint16",
          "it starts with llm.c's header (magic 20240520, version 1, header[2] = 2000 tokens, which the file's size "
          "does not hold), which --data-format uint16 would read as token ids: expected --data-format auto");
  refused("lying.u32", llmc_file(ids, 2, -5), "uint32",
          "it starts with llm.c's header (magic 20240520, version 2, header[2] = -5 tokens, which the file's size");
  {  // Raw ids that begin with the magic but no version of llm.c's stay raw ids.
    std::string raw = llmc_file(ids, 1);
    raw[4] = 7;
    write_file(dir.path() + "/magic-only.u16", raw);
    EXPECT_EQ(train::read_data_layout(dir.path() + "/magic-only.u16", "uint16").tokens, (1024 + 2000) / 2);
  }
  // As text, llm.c's file is its bytes (on purpose).
  write_file(dir.path() + "/as-text.bin", llmc_file(ids, 1));
  EXPECT_EQ(train::read_data_layout(dir.path() + "/as-text.bin", "text").tokens, 1024 + 2000);
  // Too few tokens for a sample: counted in tokens.
  const std::string few = dir.path() + "/few.u16";
  write_file(few, id_bytes(std::vector<int64_t>(33, 7), 2));
  auto c = tiny(dir.path() + "/out", 1);
  c.data = few;
  c.data_format = "uint16";
  expect_config_error([&] { train::validate(c); },
                      "--data " + few + ": 33 tokens (uint16) is too short: --context 32 needs at least 34 tokens");
  // An unknown format, in code and on the command line; a raw format without --data.
  c.data_format = "int8";
  expect_config_error([&] { train::validate(c); }, "--data-format 'int8': expected text, uint16, uint32 or auto");
  const auto r = run_program({FSDP_TRAIN_PATH, "--print-config", "--data-format", "int8"}, std::chrono::seconds(60));
  EXPECT_EQ(r.exit_code(), 1) << r.output;
  EXPECT_NE(r.output.find("fsdp-train: --data-format 'int8': expected text, uint16, uint32 or auto"), std::string::npos)
      << r.output;
  c.data.clear();
  c.data_format = "uint32";
  expect_config_error([&] { train::validate(c); }, "--data-format uint32 without --data: the generated corpus is text");
}

// A checkpoint records how --data was read ("data_format", and the flag as
// config.run.data_format); a resume that reads the same file otherwise is
// refused (its bytes would be other tokens) unless --allow-data-change.
TEST(TrainData, AResumeThatReadsTheDataAsAnotherFormatIsRefused) {
  TempDir dir;
  const std::string data = dir.path() + "/data.txt", out = dir.path() + "/out";
  write_file(data, train::generated_corpus(100000));
  auto c = tiny(out, 1);
  c.data = data;
  run_ranks(1, [&](dist::ProcessGroup& pg) { train::train(c, borrow(pg)); });
  const CheckpointInfo info = inspect_checkpoint(out + "/checkpoints/step-00000001");
  EXPECT_EQ(info.values.at("data_format"), "text");
  EXPECT_EQ(info.values.at("config.run.data_format"), "auto");
  auto r = c;
  r.steps = 2;
  r.resume = true;
  r.data_format = "uint16";
  r.model.vocab_size = 65536;
  run_ranks(1, [&](dist::ProcessGroup& pg) {
    expect_config_error([&] { train::train(r, borrow(pg)); }, "holds a model of another shape: vocab 256 (checkpoint) vs 65536;");
  });
  r.model.vocab_size = 256;
  run_ranks(1, [&](dist::ProcessGroup& pg) {
    expect_config_error([&] { train::train(r, borrow(pg)); },
                        "--data " + data + " is read as uint16 now (--data-format uint16); the run that saved " + out +
                            "/checkpoints/step-00000001 read it as text, so its bytes are other tokens now. The run "
                            "would continue on other text than it trained on; expected the file read as the run read "
                            "it (--data-format), or --allow-data-change");
  });
  r.data_format = "text";  // the same reading: resumes
  run_ranks(1, [&](dist::ProcessGroup& pg) { EXPECT_NO_THROW(train::train(r, borrow(pg))); });
}

namespace {

// Why the prepare test's Python reference cannot run, or "".
std::string tokenizers_python_missing() {
  if (::access(FSDP_TEST_PYTHON, X_OK) != 0) return std::string("no ") + FSDP_TEST_PYTHON;
  const auto r = run_program({FSDP_TEST_PYTHON, "-c", "import tokenizers, sentencepiece"}, std::chrono::seconds(60));
  if (r.exit_code() != 0) return std::string(FSDP_TEST_PYTHON) + " lacks tokenizers or sentencepiece: " + r.output;
  return "";
}

#ifdef FSDP_TRAIN_TOKENIZERS_REQUIRE_PYTHON
#define SKIP_OR_FAIL_WITHOUT_TOKENIZERS(why) FAIL() << (why) << " (the wheel build's venv must have them: scripts/deps.sh)"
#else
#define SKIP_OR_FAIL_WITHOUT_TOKENIZERS(why) GTEST_SKIP() << (why) << ": no reference to compare with"
#endif

// Makes, in `dir`, tests/python/make_tokenizers.py's llama3 tokenizer
// (llama3/), two text files (in0.txt: its test corpus and seeded random
// lines, with runs of newlines, \r\n, tabs, trailing spaces, CJK and emoji;
// in1.txt: its training lines) and expected.json: Hugging Face's
// `tokenizers` encoding of each file whole (no special tokens), the EOS id
// and the vocabulary size.
const char* const kPrepareReference = R"PY(
import json, os, sys
sys.path.insert(0, sys.argv[1])
import make_tokenizers as m
from tokenizers import Tokenizer
out = sys.argv[2]
os.makedirs(os.path.join(out, "llama3"), exist_ok=True)
with open(os.path.join(out, "llama3", "tokenizer.json"), "w", encoding="utf-8") as f:
    json.dump(m.make_llama3(), f, ensure_ascii=False)
with open(os.path.join(out, "llama3", "tokenizer_config.json"), "w", encoding="utf-8") as f:
    json.dump({"bos_token": "<|begin_of_text|>", "eos_token": {"content": "<|eot_id|>"}}, f)
texts = ["\n".join(m.CORPUS + m.random_lines(200, seed=7)) + "\n", "\n".join(m.TRAIN * 3)]
for i, t in enumerate(texts):
    with open(os.path.join(out, "in%d.txt" % i), "wb") as f:
        f.write(t.encode("utf-8"))
tok = Tokenizer.from_file(os.path.join(out, "llama3", "tokenizer.json"))
with open(os.path.join(out, "expected.json"), "w") as f:
    json.dump({"ids": [tok.encode(t, add_special_tokens=False).ids for t in texts],
               "eos": tok.token_to_id("<|eot_id|>"), "vocab": tok.get_vocab_size()}, f)
)PY";

// llm.c's file at `path`: (version, ids); the header checked.
std::pair<int, std::vector<int64_t>> read_llmc(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto le = [&](size_t at, int width) {
    int64_t v = 0;
    for (int k = 0; k < width; ++k) v |= int64_t{static_cast<uint8_t>(bytes[at + static_cast<size_t>(k)])} << (8 * k);
    return v;
  };
  EXPECT_GE(bytes.size(), 1024u);
  if (bytes.size() < 1024) return {0, {}};
  EXPECT_EQ(le(0, 4), train::kLlmcMagic);
  const int version = static_cast<int>(le(4, 4));
  const int width = version == 1 ? 2 : 4;
  const int64_t count = le(8, 4);
  EXPECT_EQ(static_cast<int64_t>(bytes.size()), 1024 + count * width);
  std::vector<int64_t> ids;
  for (size_t at = 1024; at + static_cast<size_t>(width) <= bytes.size(); at += static_cast<size_t>(width)) {
    ids.push_back(le(at, width));
  }
  return {version, ids};
}

}  // namespace

// `fsdp-train prepare` writes llm.c's file of the ids Hugging Face's
// `tokenizers` gives each file encoded whole, however small the pieces it
// encodes them in (--chunk-bytes 64 cuts the first file at hundreds of line
// breaks); --append-eos puts the EOS after each file; an existing file at
// --out is replaced only whole. Then fsdp-train trains on it at world 2 with
// a --vocab that covers the tokenizer's, its loss finite, and is refused
// with the byte-level vocabulary, naming an id.
TEST(TrainData, PrepareWritesTheTokenizersIdsAndTrainsOnThem) {
#ifndef FSDP_TRAIN_HAS_TOKENIZERS
  {
    // fsdp-train without the tokenizers (FSDP_TOKENIZERS=OFF, or Debian's LibTorch) refuses, saying why.
    TempDir none;
    const auto r = run_program({FSDP_TRAIN_PATH, "prepare", "--tokenizer", none.path(), "--out", none.path() + "/x.bin",
                                none.path() + "/in.txt"},
                               std::chrono::seconds(60));
    EXPECT_EQ(r.exit_code(), 1) << r.output;
    EXPECT_NE(r.output.find("fsdp-train: prepare: this fsdp-train is built"), std::string::npos) << r.output;
    EXPECT_FALSE(fs::exists(none.path() + "/x.bin"));
    GTEST_SKIP() << "fsdp-train has no fsdp::tokenizers in this build: prepare refuses (checked)";
  }
#endif
  if (std::string why = tokenizers_python_missing(); !why.empty()) SKIP_OR_FAIL_WITHOUT_TOKENIZERS(why);
  TempDir dir;
  const std::string d = dir.path();
  const auto made = run_program({FSDP_TEST_PYTHON, "-c", kPrepareReference, FSDP_TEST_SOURCE_DIR "/python", d},
                                std::chrono::seconds(120));
  ASSERT_EQ(made.exit_code(), 0) << made.output;
  std::ifstream in(d + "/expected.json");
  const Json expected = Json::parse(in);
  const auto want0 = expected["ids"][0].get<std::vector<int64_t>>(), want1 = expected["ids"][1].get<std::vector<int64_t>>();
  const int64_t eos = expected["eos"].get<int64_t>(), vocab = expected["vocab"].get<int64_t>();
  ASSERT_GT(vocab, 256);
  auto prepare = [&](std::vector<std::string> args) {
    std::vector<std::string> argv{FSDP_TRAIN_PATH, "prepare", "--tokenizer", d + "/llama3"};
    argv.insert(argv.end(), args.begin(), args.end());
    return run_program(argv, std::chrono::seconds(120));
  };
  for (const std::string chunk : {"64", "1048576"}) {
    SCOPED_TRACE("--chunk-bytes " + chunk);
    const auto r = prepare({"--out", d + "/one.bin", "--chunk-bytes", chunk, d + "/in0.txt"});
    ASSERT_EQ(r.exit_code(), 0) << r.output;
    EXPECT_NE(r.output.find("fsdp-train prepare: wrote " + d + "/one.bin: " + std::to_string(want0.size()) +
                            " tokens of a vocabulary of " + std::to_string(vocab) + " (llm.c version 1, uint16 ids)"),
              std::string::npos)
        << r.output;
    const auto [version, got] = read_llmc(d + "/one.bin");
    EXPECT_EQ(version, 1);
    ASSERT_EQ(got.size(), want0.size());
    for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want0[i]) << "token " << i;
  }
  // Two files, each followed by the EOS; the file written before is replaced.
  const auto two = prepare({"--append-eos", "--out", d + "/one.bin", "--chunk-bytes", "100", d + "/in0.txt", d + "/in1.txt"});
  ASSERT_EQ(two.exit_code(), 0) << two.output;
  std::vector<int64_t> want = want0;
  want.push_back(eos);
  want.insert(want.end(), want1.begin(), want1.end());
  want.push_back(eos);
  EXPECT_EQ(read_llmc(d + "/one.bin").second, want);
  // Errors name the file; nothing is written at --out.
  write_file(d + "/bad.txt", "fine\nnot \xff utf-8\n");
  const auto bad = prepare({"--out", d + "/bad.bin", d + "/bad.txt"});
  EXPECT_EQ(bad.exit_code(), 1) << bad.output;
  EXPECT_NE(bad.output.find("fsdp-train: prepare: " + d + "/bad.txt (bytes 0 to 17): "), std::string::npos) << bad.output;
  const auto missing = prepare({"--out", d + "/bad.bin", d + "/none.txt"});
  EXPECT_NE(missing.output.find("fsdp-train: prepare: " + d + "/none.txt: no such file"), std::string::npos)
      << missing.output;
  EXPECT_FALSE(fs::exists(d + "/bad.bin"));
  for (const auto& e : fs::directory_iterator(d)) {
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << "left behind: " << e.path();
  }
  // Training on it: world 2, --vocab covering the tokenizer's, a finite loss.
  const std::string out = d + "/run";
  const auto run = run_program({FSDP_RUN_PATH, "--nproc-per-node", "2", "--", FSDP_TRAIN_PATH, "--preset", "tiny",
                                "--steps", "3", "--batch", "2", "--eval-every", "3", "--logger", "jsonl", "--vocab",
                                std::to_string(vocab), "--data", d + "/one.bin", "--out", out},
                               std::chrono::seconds(240));
  ASSERT_EQ(run.exit_code(), 0) << run.output;
  std::ifstream metrics(out + "/metrics.jsonl");
  std::string line;
  int steps = 0;
  while (std::getline(metrics, line)) {
    const Json m = Json::parse(line);
    if (!m.contains("loss")) continue;
    ++steps;
    EXPECT_TRUE(std::isfinite(m["loss"].get<double>())) << line;
    if (m.contains("eval_loss")) EXPECT_TRUE(std::isfinite(m["eval_loss"].get<double>())) << line;
  }
  EXPECT_EQ(steps, 3);
  const CheckpointInfo info = inspect_checkpoint(out + "/checkpoints/step-00000003");
  EXPECT_EQ(info.values.at("data_format"), "llm.c v1 (uint16)");
  EXPECT_EQ(info.values.at("config.model.vocab"), std::to_string(vocab));
  // The byte-level model: refused at the first batch, naming an id beyond 255.
  const auto bytes = run_program({FSDP_RUN_PATH, "--nproc-per-node", "1", "--", FSDP_TRAIN_PATH, "--preset", "tiny",
                                  "--steps", "1", "--data", d + "/one.bin", "--out", d + "/run-bytes"},
                                 std::chrono::seconds(120));
  EXPECT_EQ(bytes.exit_code(), 1) << bytes.output;
  EXPECT_NE(bytes.output.find("--data " + d + "/one.bin: token "), std::string::npos) << bytes.output;
  EXPECT_NE(bytes.output.find(", at or beyond the model's vocabulary size 256: expected ids from 0 to 255"),
            std::string::npos)
      << bytes.output;
}
