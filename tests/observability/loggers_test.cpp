// The loggers (fsdp/observability/loggers.h): TensorBoard's event files framed and
// checksummed as TFRecord, Lightning's CSV layout, JSON lines, their
// versions, their errors (a log directory that cannot be written, a full
// disk), and FSDPStrategy::log from rank 0 only. TensorBoard's own reader
// checks the event files in loggers_python_test.cpp.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>

#include "fsdp/observability/json_lines.h"
#include "../../src/observability/tensorboard_events.h"
#include "../support/errors.h"
#include "../support/subprocess.h"
#include "../support/thread_ranks.h"
#include "../support/thread_strategy.h"
#include "../support/tmpfs.h"
#include "../support/warnings.h"
#include "../support/models.h"
#include "fsdp/error.h"
#include "fsdp/observability/loggers.h"
#include "fsdp/strategy/strategy.h"

using namespace fsdp;
using namespace fsdp::testing;
namespace fs = std::filesystem;
namespace tb = fsdp::detail::tensorboard;

namespace {

// The records of a TFRecord file, each checked: its length's and its data's
// masked CRC-32C. A torn last record ends the list (as TensorBoard reads).
struct Records {
  std::vector<std::string> data;
  bool torn_tail = false;
};
Records read_records(const std::string& path) {
  const std::string bytes = read_file(path);
  Records out;
  size_t pos = 0;
  while (pos < bytes.size()) {
    if (bytes.size() - pos < 12) {
      out.torn_tail = true;
      break;
    }
    uint64_t n = 0;
    uint32_t len_crc = 0, data_crc = 0;
    std::memcpy(&n, bytes.data() + pos, 8);
    std::memcpy(&len_crc, bytes.data() + pos + 8, 4);
    EXPECT_EQ(len_crc, tb::masked_crc32c(bytes.data() + pos, 8)) << path << " at byte " << pos;
    if (bytes.size() - pos < 16 + n) {
      out.torn_tail = true;
      break;
    }
    std::memcpy(&data_crc, bytes.data() + pos + 12 + n, 4);
    EXPECT_EQ(data_crc, tb::masked_crc32c(bytes.data() + pos + 12, n)) << path << " at byte " << pos;
    out.data.push_back(bytes.substr(pos + 12, n));
    pos += 16 + n;
  }
  return out;
}

std::vector<std::string> event_files(const std::string& dir) {
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0) files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

TEST(TensorBoardEvents, Crc32cAndTheRecordFramingMatchTFRecord) {
  // CRC-32C's check value, and RFC 3720's test vectors (iSCSI uses CRC-32C).
  EXPECT_EQ(tb::crc32c("123456789", 9), 0xe3069283u);
  EXPECT_EQ(tb::crc32c(std::string(32, '\0').data(), 32), 0x8a9136aau);
  EXPECT_EQ(tb::crc32c(std::string(32, '\xff').data(), 32), 0x62a8ab43u);
  // TFRecord's mask, from TensorFlow's crc32c.h: rotate right by 15, add 0xa282ead8.
  const uint32_t c = tb::crc32c("abc", 3);
  EXPECT_EQ(tb::masked_crc32c("abc", 3), ((c >> 15) | (c << 17)) + 0xa282ead8u);
  const std::string rec = tb::record("hello");
  ASSERT_EQ(rec.size(), 8u + 4 + 5 + 4);
  uint64_t n = 0;
  std::memcpy(&n, rec.data(), 8);
  EXPECT_EQ(n, 5u);
  EXPECT_EQ(rec.substr(12, 5), "hello");
  // The scalar event's bytes, as TensorBoard's checker decoded them
  // (tests/python/check_tensorboard.py reads such files back): Event{step 3,
  // summary{value{tag "loss", simple_value 3.1172}}} after the wall time.
  const std::string e = tb::scalar_event(0.0, 3, "loss", 3.1171701f);
  const std::string tail = e.substr(9);  // after wall_time (tag byte + 8 bytes)
  const unsigned char want[] = {0x10, 0x03, 0x2a, 0x0d, 0x0a, 0x0b, 0x0a, 0x04, 'l', 'o', 's', 's', 0x15};
  ASSERT_GE(tail.size(), sizeof want + 4);
  EXPECT_EQ(tail.substr(0, sizeof want), std::string(reinterpret_cast<const char*>(want), sizeof want));
  // A session START is Event.session_log (field 7), status 1.
  const std::string start = tb::session_start_event(0.0, 5);
  EXPECT_EQ(start.substr(9), std::string("\x10\x05\x3a\x02\x08\x01", 6));
}

TEST(TensorBoardLogger, WritesVersionedEventFilesOfCheckedRecords) {
  TempDir tmp;
  {
    TensorBoardLogger logger(tmp.path(), "gpt");
    EXPECT_EQ(logger.log_dir(), "");  // chosen at open
    logger.log_metrics({{"loss", 2.5}, {"lr", 0.001}}, 1);
    logger.log_metrics({{"loss", 2.25}}, 2);
    logger.log_hyperparams({{"lr", 0.001}, {"layers", int64_t{4}}, {"model", std::string("gpt")}, {"flag", true}});
    EXPECT_EQ(logger.log_dir(), tmp.path() + "/gpt/version_0");
    EXPECT_EQ(logger.version(), "version_0");
    logger.finalize("success");
  }
  TensorBoardLogger second(tmp.path(), "gpt");
  second.open();
  EXPECT_EQ(second.log_dir(), tmp.path() + "/gpt/version_1");  // Lightning's next version

  const auto files = event_files(tmp.path() + "/gpt/version_0");
  ASSERT_EQ(files.size(), 1u);
  EXPECT_TRUE(std::regex_match(fs::path(files[0]).filename().string(),
                               std::regex(R"(events\.out\.tfevents\.\d{10}\.[^.]+(\.[^.]+)*\.\d+\.\d+)")))
      << files[0];
  const Records r = read_records(files[0]);
  EXPECT_FALSE(r.torn_tail);
  // file_version, 3 scalars, hp_metric (Lightning's default), 3 hparams summaries.
  ASSERT_EQ(r.data.size(), 1u + 3 + 1 + 3);
  EXPECT_NE(r.data[0].find("brain.Event:2"), std::string::npos);
  EXPECT_NE(r.data[1].find("loss"), std::string::npos);
  EXPECT_NE(r.data[4].find("hp_metric"), std::string::npos);
  EXPECT_NE(r.data[5].find("_hparams_/experiment"), std::string::npos);
  EXPECT_NE(r.data[6].find("_hparams_/session_start_info"), std::string::npos);
  EXPECT_NE(r.data[7].find("_hparams_/session_end_info"), std::string::npos);
}

TEST(CSVLogger, WritesLightningsLayoutAndWidensTheHeaderForNewMetrics) {
  TempDir tmp;
  CSVLogger logger(tmp.path(), "exp", std::nullopt, /*flush_logs_every_n_steps=*/2);
  logger.log_metrics({{"loss", 1.5}}, 0);
  const std::string csv = tmp.path() + "/exp/version_0/metrics.csv";
  EXPECT_FALSE(fs::exists(csv));  // buffered until step 1 (every 2 steps)
  logger.log_metrics({{"loss", 1.25}}, 1);
  EXPECT_EQ(read_file(csv), "loss,step\r\n1.5,0\r\n1.25,1\r\n");
  // A new metric: the file is rewritten with the wider (sorted) header.
  logger.log_metrics({{"loss", 1.0}, {"val,acc", 0.5}}, 2);
  logger.log_metrics({{"loss", std::nan("")}}, 3);
  EXPECT_EQ(read_file(csv), "loss,step,\"val,acc\"\r\n1.5,0,\r\n1.25,1,\r\n1,2,0.5\r\nnan,3,\r\n");
  logger.log_hyperparams({{"lr", 0.001}, {"model", std::string("gpt \"small\"")}, {"layers", int64_t{4}},
                          {"tiny", 1e-5}, {"flag", false}});
  EXPECT_EQ(read_file(tmp.path() + "/exp/version_0/hparams.yaml"),
            "flag: false\nlayers: 4\nlr: 0.001\nmodel: \"gpt \\\"small\\\"\"\ntiny: 1.0e-05\n");
  CSVLogger next(tmp.path(), "exp");
  next.open();
  EXPECT_EQ(next.log_dir(), tmp.path() + "/exp/version_1");
  CSVLogger fixed(tmp.path(), "exp", std::string("mine"));
  fixed.log_metrics({{"a", 1}});
  fixed.flush();
  EXPECT_EQ(read_file(tmp.path() + "/exp/mine/metrics.csv"), "a,step\r\n1,0\r\n");
}

TEST(JsonLinesLogger, LinesReadBackNonFiniteAsStringsAndAResumeCutsLaterSteps) {
  TempDir tmp;
  const std::string path = tmp.path() + "/logs/metrics.jsonl";
  {
    JsonLinesLogger logger(path);
    logger.log_hyperparams({{"lr", 0.5}});
    for (int64_t s = 1; s <= 5; ++s) logger.log_metrics({{"loss", s == 3 ? std::nan("") : 1.0 / s}}, s);
    EXPECT_THROW(logger.log_line(6, "{\"a\":1}\n{\"b\":2}"), std::invalid_argument);
  }
  EXPECT_EQ(read_file(path),
            "{\"hparams\":{\"lr\":0.5}}\n{\"step\":1,\"loss\":1.0}\n{\"step\":2,\"loss\":0.5}\n"
            "{\"step\":3,\"loss\":\"nan\"}\n{\"step\":4,\"loss\":0.25}\n{\"step\":5,\"loss\":0.2}\n");
  const auto file = fsdp::detail::read_json_lines(path);
  ASSERT_EQ(file.lines.size(), 6u);
  EXPECT_TRUE(file.skipped.empty());
  // Resumed after step 3, with a torn line at the end: steps 4-5 and the
  // torn bytes are cut (named), step 3 stays.
  write_file(path, read_file(path) + "{\"step\":6,\"lo");
  CapturedWarnings warnings;
  {
    JsonLinesLogger resumed(path, 3);
    resumed.log_metrics({{"loss", 0.125}}, 4);
  }
  EXPECT_EQ(warnings.count("cut off a torn or damaged tail at byte offset"), 1u);
  const auto after = fsdp::detail::read_json_lines(path);
  ASSERT_EQ(after.lines.size(), 5u);
  EXPECT_EQ(after.lines.back().text, "{\"step\":4,\"loss\":0.125}");
  // Resumed after step 9 of a file that ends at step 4: 5-9 are a gap.
  {
    JsonLinesLogger resumed(path, 9);
    resumed.open();
  }
  EXPECT_EQ(fsdp::detail::read_json_lines(path).lines.back().text, "{\"gap\":[5,9]}");
}

TEST(Loggers, ALogDirectoryThatCannotBeWrittenIsNamedAtOpen) {
  TempDir tmp;
  write_file(tmp.path() + "/file", "not a directory");
  const std::string bad = tmp.path() + "/file/logs";
  expect_config_error([&] { TensorBoardLogger(bad, "x").open(); }, "TensorBoardLogger: cannot create the log directory '" + bad + "/x/version_0'");
  expect_config_error([&] { CSVLogger(bad, "x").open(); }, "CSVLogger: cannot create the log directory '" + bad + "/x/version_0'");
  expect_config_error([&] { JsonLinesLogger(bad + "/m.jsonl").open(); },
                      "JsonLinesLogger: cannot create the log directory '" + bad + "'");
  expect_config_error([&] { CSVLogger(tmp.path(), "x", std::nullopt, 0); }, "flush_logs_every_n_steps must be at least 1");
}

TEST(Loggers, AFullDiskIsAWarningAndTheFilesStayWhole) {
  TempDir tmp;
  SmallTmpfs disk(tmp.path() + "/disk", "size=64k");
  if (!disk.mounted()) GTEST_SKIP() << disk.why_not();
  TensorBoardLogger tbl(disk.path(), "", std::string());
  JsonLinesLogger jsonl(disk.path() + "/metrics.jsonl");
  tbl.open();
  jsonl.open();
  const std::string filler = disk.fill();
  CapturedWarnings warnings;
  for (int64_t s = 1; s <= 50; ++s) {
    tbl.log_metrics({{"loss", 1.0 / s}, {"lr", 0.1}}, s);
    jsonl.log_metrics({{"loss", 1.0 / s}}, s);
  }
  EXPECT_EQ(warnings.count("TensorBoardLogger: cannot write scalars to"), 1u);
  EXPECT_EQ(warnings.count("No space left on device"), 2u);
  fs::remove(filler);
  tbl.log_metrics({{"loss", 0.5}}, 51);
  jsonl.log_metrics({{"loss", 0.5}}, 51);
  EXPECT_EQ(warnings.count("is written again"), 2u);
  const Records r = read_records(tbl.file());
  EXPECT_FALSE(r.torn_tail);
  EXPECT_NE(r.data.back().find("loss"), std::string::npos);
  const auto lines = fsdp::detail::read_json_lines(jsonl.path());
  EXPECT_TRUE(lines.skipped.empty());
  ASSERT_GE(lines.lines.size(), 2u);
  EXPECT_TRUE(lines.lines[lines.lines.size() - 2].gap.has_value());
  EXPECT_EQ(lines.lines.back().step, 51);
}

TEST(StrategyLoggers, RankZeroLogsToEveryLoggerAndAnUnwritableOneStopsEveryRank) {
  TempDir tmp;
  run_ranks(2, [&](dist::ProcessGroup& group) {
    const std::string mine = tmp.path() + "/rank" + std::to_string(group.rank());
    auto tbl = std::make_shared<TensorBoardLogger>(mine, "tb");
    auto csv = std::make_shared<CSVLogger>(mine, "csv");
    FSDPStrategy strategy(FSDPStrategyOptions().world(borrow(group)).loggers({tbl, csv}));
    setup_thread_rank(strategy);
    EXPECT_EQ(strategy.logger(), tbl);
    EXPECT_EQ(strategy.loggers().size(), 2u);
    strategy.log("loss", 1.5, 1);
    strategy.log_dict({{"loss", 1.25}, {"lr", 0.1}}, 2);
    csv->flush();
  });
  // Rank 0 wrote (opened at setup_environment); rank 1 never touched the disk.
  EXPECT_EQ(read_file(tmp.path() + "/rank0/csv/version_0/metrics.csv"), "loss,lr,step\r\n1.5,,1\r\n1.25,0.1,2\r\n");
  EXPECT_EQ(event_files(tmp.path() + "/rank0/tb/version_0").size(), 1u);
  EXPECT_FALSE(fs::exists(tmp.path() + "/rank1"));

  write_file(tmp.path() + "/blocked", "a file where the log directory should be");
  run_ranks(2, [&](dist::ProcessGroup& group) {
    auto tbl = std::make_shared<TensorBoardLogger>(tmp.path() + "/blocked", "tb");
    FSDPStrategy strategy(FSDPStrategyOptions().world(borrow(group)).loggers({tbl}));
    expect_config_error([&] { strategy.setup_environment(); },
                        "cannot create the log directory '" + tmp.path() + "/blocked/tb/version_0'");
  });
}

// Issue 37 item 8: metrics.csv deleted during a run is made again at the
// next flush, header first, with the rows from then on, and said once (also
// when it is deleted again). Before the fix every later flush failed
// ("cannot write ...: No such file or directory": it was appended to without
// O_CREAT) and the rest of the run's rows were lost.
TEST(CSVLogger, AMetricsCsvDeletedDuringTheRunIsRecreatedWithItsHeader) {
  TempDir tmp;
  CapturedWarnings warnings;
  CSVLogger csv(tmp.path(), "exp", std::nullopt, /*flush_logs_every_n_steps=*/1);
  const std::string path = tmp.path() + "/exp/version_0/metrics.csv";
  csv.log_metrics({{"loss", 3}}, 1);
  csv.log_metrics({{"loss", 2}}, 2);
  ASSERT_EQ(read_file(path), "loss,step\r\n3,1\r\n2,2\r\n");
  fs::remove(path);
  csv.log_metrics({{"loss", 1.5}}, 3);
  csv.log_metrics({{"loss", 1}}, 4);
  EXPECT_EQ(read_file(path), "loss,step\r\n1.5,3\r\n1,4\r\n");
  fs::remove(path);
  csv.log_metrics({{"loss", 0.5}}, 5);
  EXPECT_EQ(read_file(path), "loss,step\r\n0.5,5\r\n");
  EXPECT_EQ(warnings.count(path + " was deleted during the run; it is written again from step 3 on, with its header"),
            1u);
  EXPECT_EQ(warnings.count("was deleted during the run"), 1u) << "said more than once";
  EXPECT_EQ(warnings.count("cannot write"), 0u);
}

namespace {

// This process's peak resident memory (VmHWM, KiB), and a reset of it to
// the current one (Linux's clear_refs "5"; false where it is refused).
long peak_kb() {
  const std::string status = read_file("/proc/self/status");
  const auto at = status.find("VmHWM:");
  return at == std::string::npos ? 0 : std::atol(status.c_str() + at + 6);
}
bool reset_peak() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
  f.flush();
  return static_cast<bool>(f);
}

}  // namespace

// Issue 37 item 17: a resume over a big metrics.jsonl reads its tail only.
// A 200 MB file (sparse: a hole of NUL bytes between step 5's line and step
// 6's, as a crash on some filesystems leaves) resumes after step 8 within
// 32 MB more than the memory before, cutting steps 9-10, and a resume past
// its end records the gap. Before the fix the whole file was read and held
// (with a copy per line): hundreds of MB (2.5 GB RSS for a 1 GiB file).
TEST(JsonLinesLogger, AResumeOverABigFileReadsItsTailOnly) {
  TempDir tmp;
  const std::string path = tmp.path() + "/metrics.jsonl";
  auto line = [](int step) { return "{\"step\":" + std::to_string(step) + ",\"loss\":" + std::to_string(1.0 / step) + "}\n"; };
  {
    std::string head = "{\"hparams\":{\"lr\":0.5}}\n";
    for (int s = 1; s <= 5; ++s) head += line(s);
    write_file(path, head);
    ASSERT_EQ(::truncate(path.c_str(), 200 << 20), 0);
    std::ofstream f(path, std::ios::app | std::ios::binary);
    for (int s = 6; s <= 10; ++s) f << line(s);
  }
  const auto size = static_cast<int64_t>(fs::file_size(path));
  const std::string nine = "{\"step\":9,\"loss\":0.01}\n";  // what the resumed logger writes
  const long before = resident_kb(::getpid());
  const bool reset = reset_peak();
  CapturedWarnings warnings;
  {
    JsonLinesLogger resumed(path, 8);
    resumed.log_metrics({{"loss", 0.01}}, 9);
  }
  const long grown_kb = peak_kb() - (reset ? before : 0);
  if (reset) {
    EXPECT_LT(grown_kb, 32 << 10) << "KiB more at the peak, for a " << size << "-byte file";
  }
  const int64_t cut = size - static_cast<int64_t>(line(9).size() + line(10).size());
  const int64_t kept = cut + static_cast<int64_t>(nine.size());
  EXPECT_EQ(static_cast<int64_t>(fs::file_size(path)), kept);
  std::string end(static_cast<size_t>(fs::file_size(path) - (cut - static_cast<int64_t>(line(8).size()))), '\0');
  {
    std::ifstream in(path, std::ios::binary);
    in.seekg(cut - static_cast<int64_t>(line(8).size()));
    in.read(end.data(), static_cast<std::streamsize>(end.size()));
  }
  EXPECT_EQ(end, line(8) + nine);
  // Whole lines of later steps are cut without a word (the damaged line of
  // step 6 lies before the kept ones: a tail read does not reach it).
  EXPECT_EQ(warnings.count("cut off a torn or damaged tail"), 0u);
  // Past the end, with a torn last line: cut, named, and the steps missing are a gap.
  {
    std::ofstream f(path, std::ios::app | std::ios::binary);
    f << "{\"step\":10,\"lo";
  }
  {
    JsonLinesLogger resumed(path, 12);
    resumed.open();
  }
  EXPECT_EQ(warnings.count("cut off a torn or damaged tail at byte offset " + std::to_string(kept)), 1u);
  std::ifstream in(path, std::ios::binary);
  in.seekg(kept);
  std::string last;
  std::getline(in, last);
  EXPECT_EQ(last, "{\"gap\":[10,12]}");
}
