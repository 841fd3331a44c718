// fsdp-train's run directory (issue 37): it follows no symbolic link
// beneath --out, removes only what it can prove is its own, checks before
// step 1 what its saves will need, range-checks what a resume reads from a
// checkpoint, and reports changed integer flags exactly.
//
// Each test's comment says what it showed on the commit before its fix.
// The runs are in-process (train() on one thread rank) with the tiny
// preset and 1 to 4 steps.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "../support/errors.h"
#include "../support/index_files.h"
#include "../support/models.h"
#include "../support/subprocess.h"
#include "../support/thread_ranks.h"
#include "../support/train_config.h"
#include "fsdp/checkpoint/checkpoint_io.h"
#include "fsdp/error.h"
#include "fsdp/text/bytes_json.h"
#include "fsdp/train/gpt_trainer.h"

using namespace fsdp;
using namespace fsdp::testing;
namespace fs = std::filesystem;

namespace {

train::TrainConfig tiny(const std::string& out, int64_t steps) {
  train::TrainConfig c = tiny_train_config(out, steps, 2);
  c.model.dim = 16;
  c.model.layers = 1;
  c.model.heads = 2;
  c.model.context = 16;
  c.eval_every = 0;
  return c;
}

void train_one_rank(const train::TrainConfig& c) {
  run_ranks(1, [&](dist::ProcessGroup& pg) { train::train(c, borrow(pg)); });
}

// train(c) on one rank throws a ConfigError that says `text`.
void expect_refused(const train::TrainConfig& c, const std::string& text) {
  run_ranks(1, [&](dist::ProcessGroup& pg) { expect_config_error([&] { train::train(c, borrow(pg)); }, text); });
}

}  // namespace

// Issue 37 item 1: a symbolic link beneath --out, wherever fsdp-train
// writes a file or keeps a folder, is refused by name before anything is
// written, and its target keeps its bytes (a folder's target stays empty).
// Before the fix: a .lock link made the run exit 0 with "host … pid …" in
// the target; a .write-test link left its target at 0 bytes; with
// --overwrite, train.log, metrics.jsonl and loss.svg links were "kept (not a
// regular file)" and then written through; a checkpoints/, csv/ or profile/
// link had the run write into the target folder.
TEST(RunDirectory, NoSymbolicLinkBeneathOutIsFollowed) {
  TempDir dir;
  struct Case {
    std::string name;
    bool folder;
  };
  const std::vector<Case> cases = {
      {".lock", false},          {".write-test", false},       {"run.json", false},
      {"run.json.tmp", false},   {"train.log", false},         {"metrics.jsonl", false},
      {"loss.svg", false},       {"checkpoints", true},        {"csv", true},
      {"profile", true},         {"csv/version_0/metrics.csv", false},
      {"csv/version_0/hparams.yaml", false},                   {"profile/rank_0.pt.trace.json", false},
      {"checkpoints/step-00000002", true}};
  int n = 0;
  for (const auto& k : cases) {
    for (const bool overwrite : {false, true}) {
      // A step-NNNNNNNN link makes checkpoints/ hold a run: a new run is refused for that first.
      if (!overwrite && k.name.rfind("checkpoints/", 0) == 0) continue;
      const std::string base = dir.path() + "/case" + std::to_string(n++), out = base + "/out";
      const std::string victim = base + "/victim";
      fs::create_directories(fs::path(out + "/" + k.name).parent_path());
      if (k.folder) {
        fs::create_directories(victim);
      } else {
        write_file(victim, "precious");
      }
      fs::create_symlink(victim, out + "/" + k.name);
      auto c = tiny(out, 2);
      c.overwrite = overwrite;
      c.loggers = "jsonl,csv";
      c.profile_steps = "1:1";
      expect_refused(c, out + "/" + k.name + " is a symbolic link (to " + victim + ")");
      if (k.folder) {
        EXPECT_TRUE(fs::is_empty(victim)) << k.name << ": written into the link's target folder";
      } else {
        EXPECT_EQ(read_file(victim), "precious") << k.name << ": written through the link";
      }
      EXPECT_TRUE(fs::is_symlink(out + "/" + k.name)) << k.name;
    }
  }
  // --out itself may be a link: the run trains through it.
  fs::create_directories(dir.path() + "/real");
  fs::create_symlink(dir.path() + "/real", dir.path() + "/link");
  EXPECT_NO_THROW(train_one_rank(tiny(dir.path() + "/link", 1)));
  EXPECT_TRUE(fs::exists(dir.path() + "/real/checkpoints/step-00000001"));
}

// Issue 37 item 3: --overwrite keeps a user's directory that has a
// checkpoint's name, and so does every later save's pruning. Before the
// fix: "--overwrite kept … checkpoints/step-00000001", then the save at
// step 2 removed it (remove_all) as an incomplete checkpoint, notes.txt
// with it. What a killed save left (a data file's temporary) still goes.
TEST(RunDirectory, PruningRemovesOnlyWhatItProvesIsItsOwn) {
  TempDir dir;
  const std::string out = dir.path() + "/run", ck = out + "/checkpoints";
  train_one_rank(tiny(out, 1));
  fs::remove_all(ck + "/step-00000001");
  fs::create_directories(ck + "/step-00000001");
  write_file(ck + "/step-00000001/notes.txt", "mine");
  fs::create_directories(ck + "/step-00000003");  // hidden among a killed save's names, a user's file
  write_file(ck + "/step-00000003/__0_18c2f3a1b2c-abc.distcp.tmp-18c2f3a1b2c-abc", "x");
  write_file(ck + "/step-00000003/notes.tmp-1.txt", "mine too");
  fs::create_directories(ck + "/step-00000000");  // a sharded save killed before its commit
  write_file(ck + "/step-00000000/__0_18c2f3a1b2c-abc.distcp", "x");
  auto c = tiny(out, 4);
  c.overwrite = true;
  c.save_every = 2;
  c.keep = 1;
  ::testing::internal::CaptureStdout();
  train_one_rank(c);
  const std::string said = ::testing::internal::GetCapturedStdout();
  EXPECT_NE(said.find(ck + "/step-00000001"), std::string::npos) << said;
  EXPECT_EQ(read_file(ck + "/step-00000001/notes.txt"), "mine");
  EXPECT_EQ(read_file(ck + "/step-00000003/notes.tmp-1.txt"), "mine too");
  EXPECT_FALSE(fs::exists(ck + "/step-00000003/__0_18c2f3a1b2c-abc.distcp.tmp-18c2f3a1b2c-abc"));
  EXPECT_FALSE(fs::exists(ck + "/step-00000000")) << "a killed save's directory stayed";
  EXPECT_FALSE(fs::exists(ck + "/step-00000002"));  // --keep 1
  EXPECT_TRUE(verify_checkpoint(ck + "/step-00000004").empty());
}

// Issue 37 item 6: what a save needs is checked before step 1. Before the
// fix: with checkpoints a regular file, or a user's directory where a save
// goes, the run trained every step and then failed at its save (a full
// save cannot rename its file over a directory; a sharded one wrote into
// the user's directory). A train.log that is a directory was skipped with
// a warning.
TEST(RunDirectory, WhatTheSavesNeedIsCheckedBeforeStep1) {
  TempDir dir;
  const std::string out = dir.path() + "/run";
  fs::create_directories(out);
  write_file(out + "/checkpoints", "not a folder");
  auto c = tiny(out, 2);
  expect_refused(c, out + "/checkpoints is a regular file where fsdp-train keeps the run's checkpoints");
  EXPECT_FALSE(fs::exists(out + "/metrics.jsonl")) << "it trained before it refused";
  EXPECT_EQ(read_file(out + "/checkpoints"), "not a folder");
  fs::remove(out + "/checkpoints");
  // A user's folder and a user's file where the saves of steps 2 and 4 go.
  for (const std::string step : {"00000002", "00000004"}) {
    const std::string mine = out + "/checkpoints/step-" + step;
    fs::create_directories(out + "/checkpoints");
    if (step == "00000002") {
      fs::create_directories(mine);
      write_file(mine + "/notes.txt", "mine");
    } else {
      write_file(mine, "mine");
    }
    auto s = tiny(out, 4);
    s.save_every = 2;
    s.overwrite = true;
    expect_refused(s, mine + " is in the way of the save at step " + std::to_string(std::stoi(step)) +
                          ": it is not a checkpoint");
    EXPECT_FALSE(fs::exists(out + "/metrics.jsonl")) << "it trained before it refused";
    fs::remove_all(out + "/checkpoints");
  }
  fs::create_directories(out + "/train.log");
  expect_refused(tiny(out, 2), out + "/train.log is a directory where fsdp-train writes its log");
  fs::remove(out + "/train.log");
  if (::geteuid() != 0) {  // root writes anywhere
    fs::create_directories(out + "/checkpoints");
    fs::permissions(out + "/checkpoints", fs::perms::owner_read | fs::perms::owner_exec);
    expect_refused(tiny(out, 2), out + "/checkpoints, where fsdp-train writes the run's checkpoints (checkpoints/), "
                                       "cannot be written");
    fs::permissions(out + "/checkpoints", fs::perms::owner_all);
  }
}

// Issue 37 item 10: a resume range-checks the step, the world size and the
// sample position its checkpoint records (here edited, and the index
// resealed so that it verifies), naming the checkpoint, the value and the
// range. Before the fix: samples 9.2e18 trained silently; world 0 restarted
// the sample stream; step -3 ran "step -2"; step 1e12 exited 0 without
// training and wrote a gap to 1e12 into metrics.jsonl.
TEST(RunDirectory, AResumeRangeChecksTheValuesItReads) {
  TempDir dir;
  const std::string out = dir.path() + "/run";
  train_one_rank(tiny(out, 2));
  const std::string good = out + "/checkpoints/step-00000002", keep = dir.path() + "/good";
  fs::copy(good, keep, fs::copy_options::recursive);
  struct Case {
    std::string name, type;
    nlohmann::ordered_json value;
    std::string says;
  };
  const std::vector<Case> cases = {
      {"samples", "int", int64_t{9200000000000000000}, "its 'samples' = 9200000000000000000 is out of range for this run: expected 2 to"},
      {"samples", "int", -1, "its 'samples' = -1 is out of range"},
      {"world", "int", 0, "its 'world' = 0 is out of range for this run: expected 1 to 2147483647"},
      {"world", "str", "2", "its 'world' is not an integer"},
      {"step", "int", -3, "its 'step' = -3 is out of range for this run: expected 0 to --steps 4"},
      {"step", "int", int64_t{1000000000000}, "its 'step' = 1000000000000 is out of range for this run: expected 0 to --steps 4 "
                                              "(pass --steps 1000000000000 or more to go on from it)"},
  };
  for (const auto& k : cases) {
    fs::remove_all(good);
    fs::copy(keep, good, fs::copy_options::recursive);
    auto j = nlohmann::ordered_json::parse(read_file(good + "/fsdp_index.json"));
    bool found = false;
    for (auto& e : j["entries"]) {
      if (e["name"] != k.name) continue;
      e["type"] = k.type;
      e["value"] = k.value;
      found = true;
    }
    ASSERT_TRUE(found) << k.name;
    write_file(good + "/fsdp_index.json", j.dump(1));
    reseal(good + "/fsdp_index.json");
    fs::remove(good + "/meta.pt");  // Lightning's copy of the values, which would disagree first
    const std::string metrics_before = read_file(out + "/metrics.jsonl");
    auto r = tiny(out, 4);
    r.resume = true;
    expect_refused(r, "--resume: " + good + ": " + k.says);
    EXPECT_EQ(read_file(out + "/metrics.jsonl"), metrics_before) << k.name << " " << k.value.dump();
  }
}

// Issue 37 (smaller): integer flags are compared and printed exactly on a
// resume. Before the fix: the same --seed 18446744073709551615 was reported
// as changed, "--seed -1 -> 1.84467e+19".
TEST(RunDirectory, ChangedIntegerFlagsArePrintedExactly) {
  TempDir dir;
  const std::string out = dir.path() + "/run";
  auto c = tiny(out, 2);
  c.strategy.seed(std::numeric_limits<uint64_t>::max());
  train_one_rank(c);
  auto same = tiny(out, 3);
  same.strategy.seed(std::numeric_limits<uint64_t>::max());
  same.resume = true;
  ::testing::internal::CaptureStdout();
  train_one_rank(same);
  std::string said = ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(said.find("--seed"), std::string::npos) << said;
  EXPECT_NE(said.find("--steps 2 -> 3"), std::string::npos) << said;
  auto other = tiny(out, 4);
  other.strategy.seed(5);
  other.resume = true;
  ::testing::internal::CaptureStdout();
  train_one_rank(other);
  said = ::testing::internal::GetCapturedStdout();
  EXPECT_NE(said.find("--seed 18446744073709551615 -> 5"), std::string::npos) << said;
}

// Issue 37 item 5: the escape that holds bytes in JSON (Python's
// surrogateescape) round-trips any bytes through nlohmann::json, keeps
// valid UTF-8 (a surrogate pair, U+FDD0 itself) as it was, and writes an
// invalid byte as "\udcXX".
TEST(RunDirectory, BytesRoundTripThroughJson) {
  std::vector<std::string> samples = {"plain/path.txt", "caf\xc3\xa9", std::string("a\xff" "b\x80\xc3", 6),
                                      "\xed\xb2\x80", "\xef\xb7\x90--\xef\xb7\x90" "8f", "\xf0\x9f\x92\x80",
                                      "\\udc80 \"quoted\""};
  std::string all;
  for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
  samples.push_back(all);
  for (const auto& bytes : samples) {
    nlohmann::json j;
    j["path"] = text::escape_bytes(bytes);
    const std::string written = text::json_text(j.dump());
    const auto back = nlohmann::json::parse(text::json_input(written));
    EXPECT_EQ(text::unescape_bytes(back.at("path").get<std::string>()), bytes) << written;
  }
  nlohmann::json j;
  j["p"] = text::escape_bytes(std::string("r/\xff.txt"));
  EXPECT_EQ(text::json_text(j.dump()), "{\"p\":\"r/\\udcff.txt\"}");
  j["p"] = text::escape_bytes("\xf0\x9f\x92\x80 caf\xc3\xa9");  // valid UTF-8 is itself
  EXPECT_EQ(text::json_text(j.dump()), "{\"p\":\"\xf0\x9f\x92\x80 caf\xc3\xa9\"}");
  // A surrogate pair escaped in the text is one character, not a byte.
  EXPECT_EQ(nlohmann::json::parse(text::json_input("\"\\ud83d\\udc80\"")).get<std::string>(), "\xf0\x9f\x92\x80");
}

// Issue 37 item 5: a --data path that is not UTF-8 trains, saves and
// resumes in both formats, with the CSV logger and with --print-config; the
// checkpoint's index and --print-config hold it as Python's
// surrogateescape, so that os.fsencode of the JSON string gives the bytes
// back. Before the fix: every save failed with "[json.exception.type_error.316]
// invalid UTF-8 byte" (the full format lost all its steps; the sharded run
// died at step 2 leaving an empty step-00000002), and --logger csv and
// --print-config failed with an unnamed json error.
TEST(RunDirectory, ANonUtf8DataPathIsKeptLosslessly) {
  TempDir dir;
  const std::string data = dir.path() + "/d\xff\xfe-\xc3\xa9.txt";
  write_file(data, train::generated_corpus(4096));
  for (const auto format : {CheckpointFormat::kSharded, CheckpointFormat::kFull}) {
    const std::string out = dir.path() + "/run-" + to_string(format);
    auto c = tiny(out, 2);
    c.data = data;
    c.loggers = "jsonl,csv";
    c.strategy.state_dict_type(format);
    ASSERT_NO_THROW(train_one_rank(c));
    const std::string ckpt = out + "/checkpoints/step-00000002";
    EXPECT_TRUE(verify_checkpoint(ckpt).empty());
    EXPECT_EQ(inspect_checkpoint(ckpt).values.at("config.run.data"), data);
    auto r = tiny(out, 3);
    r.data = data;
    r.resume = true;
    r.strategy.state_dict_type(format);
    ::testing::internal::CaptureStdout();
    ASSERT_NO_THROW(train_one_rank(r));
    const std::string said = ::testing::internal::GetCapturedStdout();
    EXPECT_NE(said.find("resumed from " + ckpt + " at step 2"), std::string::npos) << said;
    EXPECT_EQ(said.find("--data "), std::string::npos) << "the same path taken for a change: " << said;
    if (format == CheckpointFormat::kSharded) {
      // From Python: the index's string is the path's bytes under os.fsencode.
      const std::string script = dir.path() + "/check.py";
      write_file(script,
                 "import json, os, sys\n"
                 "ix = json.load(open(sys.argv[1], encoding='utf-8'))\n"
                 "v = [e['value'] for e in ix['entries'] if e['name'] == 'config.run.data'][0]\n"
                 "assert os.fsencode(v) == os.fsencode(sys.argv[2]), (v, sys.argv[2])\n"
                 "cfg = json.loads(open(sys.argv[3], encoding='utf-8').read())\n"
                 "assert os.fsencode(cfg['data']) == os.fsencode(sys.argv[2]), cfg['data']\n"
                 "print('ok')\n");
      const auto p = run_program({FSDP_TRAIN_PATH, "--preset", "tiny", "--data", data, "--out", out, "--print-config"},
                                 std::chrono::seconds(60));
      ASSERT_EQ(p.exit_code(), 0) << p.output;
      write_file(dir.path() + "/config.json", p.output);
      const auto py = run_program({FSDP_TEST_PYTHON, script, ckpt + "/fsdp_index.json", data, dir.path() + "/config.json"},
                                  std::chrono::seconds(60));
      EXPECT_EQ(py.exit_code(), 0) << py.output;
      EXPECT_NE(py.output.find("ok"), std::string::npos) << py.output;
    }
  }
}
