// Watching fsdp-train: its loggers (TensorBoard by default, CSV and JSON
// lines by --logger), its profiler trace (--profile-steps: FSDP's phases of
// every unit, per rank), fsdp-bench's trace, the readable loss curve, and
// --overwrite removing the loggers' files but nothing else.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <regex>
#include <set>

#include "../support/errors.h"
#include "../support/subprocess.h"
#include "../support/tmpfs.h"
#include "../support/warnings.h"
#include "fsdp/error.h"
#include "fsdp/observability/profiler.h"
#include "fsdp/train/gpt_trainer.h"

using namespace fsdp;
using namespace fsdp::testing;
namespace fs = std::filesystem;

namespace {

// fsdp-train --preset tiny on `ranks` processes (fsdp-run) with `flags`.
RunResult run_train(int ranks, const std::string& out, const std::vector<std::string>& flags) {
  std::vector<std::string> argv{FSDP_RUN_PATH, "--nproc-per-node", std::to_string(ranks), "--", FSDP_TRAIN_PATH,
                                "--preset", "tiny", "--batch", "4", "--out", out};
  argv.insert(argv.end(), flags.begin(), flags.end());
  return run_program(argv, std::chrono::seconds(240));
}

std::vector<std::string> event_files(const std::string& dir) {
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0) files.push_back(e.path().string());
  }
  return files;
}

// A trace's user-annotation spans named "fsdp::...": name -> [ts, ts + dur].
std::multimap<std::string, std::pair<double, double>> fsdp_spans(const std::string& path) {
  const auto trace = nlohmann::json::parse(read_file(path));
  std::multimap<std::string, std::pair<double, double>> spans;
  for (const auto& e : trace.at("traceEvents")) {
    if (e.value("ph", "") != "X" || e.value("cat", "") != "user_annotation") continue;
    const std::string name = e.value("name", "");
    if (name.rfind("fsdp::", 0) != 0) continue;
    const double ts = e.at("ts").get<double>();
    spans.emplace(name, std::make_pair(ts, ts + e.at("dur").get<double>()));
  }
  return spans;
}

}  // namespace

#ifdef FSDP_TEST_TENSORBOARD
TEST(Observability, FsdpTrainLogsToTensorBoardAndAResumeReplacesTheStepsItRedoes) {
  TempDir tmp;
  const std::string out = tmp.path() + "/runs/gpt";
  auto r = run_train(2, out, {"--steps", "8", "--log-every", "2", "--eval-every", "4", "--save-every", "4"});
  ASSERT_EQ(r.exit_code(), 0) << r.output;
  ASSERT_EQ(event_files(out).size(), 1u);
  // Resume from step 4 (step 8's checkpoint removed): steps 5-8 are done
  // again, and TensorBoard must show each step once, with the new values.
  fs::remove_all(out + "/checkpoints/step-000008");
  r = run_train(2, out, {"--steps", "12", "--log-every", "2", "--eval-every", "4", "--save-every", "4", "--resume"});
  ASSERT_EQ(r.exit_code(), 0) << r.output;
  ASSERT_NE(r.output.find("resumed from"), std::string::npos) << r.output;
  ASSERT_EQ(event_files(out).size(), 2u);
  const std::vector<std::string> argv{FSDP_TEST_PYTHON, std::string(FSDP_TEST_SOURCE_DIR) + "/python/check_tensorboard.py",
                                      out, "--expect-steps", "2,4,6,8,10,12", "--expect-tags",
                                      "loss,eval_loss,lr,grad_norm,tokens_per_s,rss_mib,all_gather_wait_s,"
                                      "reduction_wait_s,all_gather_bytes,reduction_bytes",
                                      // TensorBoard's hparams plugin keeps a run's first
                                      // hyperparameters: the first job's --steps 8.
                                      "--hparams", "preset=tiny,world=2,batch=4,steps=8", "--serve"};
  const RunResult check = run_program(argv, std::chrono::seconds(240));
  EXPECT_EQ(check.exit_code(), 0) << check.output;
  EXPECT_NE(check.output.find("tensorboard server"), std::string::npos) << check.output;
}
#endif

TEST(Observability, TheLoggerFlagChoosesTheLoggers) {
  TempDir tmp;
  const std::string out = tmp.path() + "/run";
  auto r = run_train(1, out, {"--steps", "6", "--log-every", "3", "--logger", "csv"});
  ASSERT_EQ(r.exit_code(), 0) << r.output;
  EXPECT_TRUE(event_files(out).empty());
  EXPECT_FALSE(fs::exists(out + "/metrics.jsonl"));
  EXPECT_FALSE(fs::exists(out + "/loss.svg"));  // drawn from metrics.jsonl
  const std::string csv = read_file(out + "/csv/version_0/metrics.csv");
  EXPECT_EQ(csv.substr(0, csv.find('\r')),
            "all_gather_bytes,all_gather_wait_s,eval_loss,grad_norm,loss,lr,reduction_bytes,reduction_wait_s,rss_mib,"
            "step,tokens_per_s");
  // Rows at steps 3 and 6 (--log-every 3; 6 is also the last and evaluates).
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 3) << csv;
  EXPECT_NE(read_file(out + "/csv/version_0/hparams.yaml").find("preset: \"tiny\""), std::string::npos);

  r = run_train(1, tmp.path() + "/bad", {"--steps", "2", "--logger", "tensorboard,wandb"});
  EXPECT_NE(r.exit_code(), 0);
  EXPECT_NE(r.output.find("--logger 'tensorboard,wandb': unknown logger 'wandb'; expected a comma-separated list of "
                          "tensorboard, csv and jsonl, or none"),
            std::string::npos)
      << r.output;
}

TEST(Observability, ProfileStepsWriteATracePerRankWithEveryUnitsPhases) {
  TempDir tmp;
  const std::string out = tmp.path() + "/run";
  const auto r = run_train(2, out, {"--steps", "6", "--profile-steps", "3:4", "--logger", "none"});
  ASSERT_EQ(r.exit_code(), 0) << r.output;
  EXPECT_NE(r.output.find("fsdp-train: profiled steps 3-4: " + out + "/profile/rank_<r>.pt.trace.json"),
            std::string::npos)
      << r.output;
  for (int rank = 0; rank < 2; ++rank) {
    const std::string path = out + "/profile/rank_" + std::to_string(rank) + ".pt.trace.json";
    ASSERT_TRUE(fs::exists(path)) << path;
    const auto spans = fsdp_spans(path);
    // Exactly the profiled steps.
    EXPECT_EQ(spans.count("fsdp::step 3"), 1u) << path;
    EXPECT_EQ(spans.count("fsdp::step 4"), 1u) << path;
    EXPECT_EQ(spans.count("fsdp::step 2") + spans.count("fsdp::step 5"), 0u) << path;
    EXPECT_EQ(spans.count("fsdp::optimizer.step"), 2u) << path;
    // Every unit's phases, in each step: the tiny GPT has the root and two blocks.
    for (const std::string unit : {"(root)", "blocks.0", "blocks.1"}) {
      for (const std::string phase : {"forward", "backward", "all_gather.issue", "all_gather.wait",
                                      "reduce_scatter.issue", "reduce_scatter.wait"}) {
        EXPECT_GE(spans.count("fsdp::" + phase + " " + unit), 2u) << path << ": " << phase << " " << unit;
      }
    }
    EXPECT_GE(spans.count("fsdp::prefetch blocks.0") + spans.count("fsdp::prefetch blocks.1"), 2u) << path;
    // What the runtime guarantees: each unit's forward and backward lie
    // within a step, and a unit's all-gather is waited for within its forward.
    const auto steps = spans.equal_range("fsdp::step 3");
    const auto last = spans.equal_range("fsdp::step 4");
    const double begin = steps.first->second.first, end = last.first->second.second;
    for (const auto& [name, span] : spans) {
      if (name.rfind("fsdp::forward", 0) == 0 || name.rfind("fsdp::backward", 0) == 0) {
        EXPECT_GE(span.first, begin) << name;
        EXPECT_LE(span.second, end) << name;
      }
    }
  }
}

TEST(Observability, BadProfileStepsAreNamedBeforeTraining) {
  auto config = [](const std::string& steps) {
    train::TrainConfig c;
    c.preset = "tiny";
    c.model = train::preset("tiny");
    c.steps = 10;
    c.out = "/tmp/fsdp_obs_unused";
    c.profile_steps = steps;
    return c;
  };
  expect_config_error([&] { train::validate(config("3:11")); },
                      "--profile-steps '3:11': step 11 is past the run's last step (--steps 10); expected A:B with 1 "
                      "<= A <= B <= 10");
  expect_config_error([&] { train::validate(config("5:3")); },
                      "--profile-steps '5:3': the steps must satisfy 1 <= A <= B; expected A:B");
  expect_config_error([&] { train::validate(config("0:2")); }, "the steps must satisfy 1 <= A <= B");
  expect_config_error([&] { train::validate(config("three")); }, "--profile-steps 'three': no ':'");
  expect_config_error([&] { train::validate(config("2:x")); }, "'x' is not a step number");
  auto c = config("");
  c.loggers = "csv,,jsonl";
  expect_config_error([&] { train::validate(c); }, "unknown logger ''");
}

TEST(Observability, FsdpBenchProfilesTheStepsItIsAskedTo) {
  TempDir tmp;
  const std::string trace = tmp.path() + "/bench";
  const auto r = run_program({FSDP_RUN_PATH, "--nproc-per-node", "2", "--", FSDP_BENCH_PATH, "--dim", "64", "--layers", "2",
                              "--heads", "4", "--ctx", "32", "--batch", "4", "--steps", "4", "--warmup", "1", "--profile-steps", "2:3", "--profile-dir", trace},
                             std::chrono::seconds(240));
  ASSERT_EQ(r.exit_code(), 0) << r.output;
  for (int rank = 0; rank < 2; ++rank) {
    const auto spans = fsdp_spans(trace + "/rank_" + std::to_string(rank) + ".pt.trace.json");
    EXPECT_EQ(spans.count("fsdp::step 2") + spans.count("fsdp::step 3"), 2u);
    EXPECT_GE(spans.count("fsdp::forward (root)"), 2u);
  }
  const auto bad = run_program({FSDP_BENCH_PATH, "--steps", "4", "--profile-steps", "4:9"},
                               std::chrono::seconds(60));
  EXPECT_NE(bad.exit_code(), 0);
  EXPECT_NE(bad.output.find("--profile-steps '4:9': step 9 is past"), std::string::npos) << bad.output;
}

TEST(Observability, TheLossCurveHasAxesWithValuesALegendAndATitle) {
  TempDir tmp;
  const std::string out = tmp.path() + "/run";
  const auto r = run_train(1, out, {"--steps", "20", "--eval-every", "5", "--logger", "jsonl"});
  ASSERT_EQ(r.exit_code(), 0) << r.output;
  const std::string svg = read_file(out + "/loss.svg");
  // The title names the run settings' rows marked for it, as their flags (run_settings.h).
  EXPECT_NE(svg.find(">fsdp-train --preset tiny --context 32 --dim 64 --layers 2 --lr 0.003 --batch 4 "
                     "--precision 32-true --sharding-strategy FULL_SHARD, world 1</text>"),
            std::string::npos)
      << svg;
  EXPECT_NE(svg.find(">step</text>"), std::string::npos);
  EXPECT_NE(svg.find(">loss (cross-entropy, nats per byte)</text>"), std::string::npos);
  EXPECT_NE(svg.find(">training loss</text>"), std::string::npos);
  EXPECT_NE(svg.find(">held-out loss</text>"), std::string::npos);
  // Tick labels: 0, 5, ..., 20 on x (steps 1-20), and numbers on y.
  for (const std::string tick : {">0</text>", ">5</text>", ">10</text>", ">15</text>", ">20</text>"}) {
    EXPECT_NE(svg.find(tick), std::string::npos) << tick;
  }
  const std::regex number_label(R"(text-anchor="end">[0-9]+(\.[0-9]+)?</text>)");
  EXPECT_GE(std::distance(std::sregex_iterator(svg.begin(), svg.end(), number_label), std::sregex_iterator()), 3);
  // Four held-out points (steps 5, 10, 15, 20).
  size_t circles = 0;
  for (size_t p = svg.find("<circle"); p != std::string::npos; p = svg.find("<circle", p + 1)) ++circles;
  EXPECT_EQ(circles, 4u + 1);  // and the legend's
}

TEST(Observability, OverwriteRemovesTheLoggersFilesButKeepsForeignOnes) {
  TempDir tmp;
  const std::string out = tmp.path() + "/run";
  auto r = run_train(1, out, {"--steps", "2", "--logger", "tensorboard,csv,jsonl", "--profile-steps", "1:1"});
  ASSERT_EQ(r.exit_code(), 0) << r.output;
  ASSERT_EQ(event_files(out).size(), 1u);
  ASSERT_TRUE(fs::exists(out + "/profile/rank_0.pt.trace.json"));
  write_file(out + "/csv/version_0/notes.txt", "mine");
  write_file(out + "/profile/mine.json", "{}");
  r = run_train(1, out, {"--steps", "2", "--logger", "jsonl", "--overwrite"});
  ASSERT_EQ(r.exit_code(), 0) << r.output;
  EXPECT_TRUE(event_files(out).empty());
  EXPECT_FALSE(fs::exists(out + "/csv/version_0/metrics.csv"));
  EXPECT_FALSE(fs::exists(out + "/profile/rank_0.pt.trace.json"));
  EXPECT_EQ(read_file(out + "/csv/version_0/notes.txt"), "mine");
  EXPECT_EQ(read_file(out + "/profile/mine.json"), "{}");
  EXPECT_NE(r.output.find(out + "/csv/version_0/notes.txt"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(out + "/profile/mine.json"), std::string::npos) << r.output;
}

// Issue 37 item 7: a trace that cannot be written is a warning, and the run
// goes on (the loggers' rule): Profiler::stop says why and returns false.
// Its directory a regular file: before the fix, "Profiler::stop: cannot
// create .../profile" ended the run after the profiled steps. (fsdp-train
// now also refuses a `profile` file before step 1; this is the profiler's
// own rule, for a directory that goes away during the run.)
TEST(Observability, ATraceThatCannotBeWrittenIsAWarning) {
  TempDir tmp;
  write_file(tmp.path() + "/profile", "a file where the traces' directory belongs");
  CapturedWarnings warnings;
  Profiler profiler;
  profiler.start();
  (void)at::ones({8, 8}).matmul(at::ones({8, 8}));
  const std::string path = tmp.path() + "/profile/rank_0.pt.trace.json";
  EXPECT_FALSE(profiler.stop(path));
  EXPECT_FALSE(profiler.running());
  EXPECT_EQ(warnings.count("Profiler: the trace " + path + " cannot be written: cannot create the directory " +
                           tmp.path() + "/profile"),
            1u);
  EXPECT_EQ(warnings.count("the profile is lost, and training goes on"), 1u);
  EXPECT_EQ(read_file(tmp.path() + "/profile"), "a file where the traces' directory belongs");
  EXPECT_THROW(profiler.stop(path), Error);  // not running: a misuse stays an error
}

// Issue 37 item 7: a resumed job that profiles again keeps the earlier
// job's trace and writes its own beside it (rank_<r>.1.pt.trace.json), and
// says so. Before the fix, the second job's trace silently replaced the
// first's.
TEST(Observability, AResumedJobsTraceKeepsTheEarlierJobs) {
  TempDir tmp;
  const std::string out = tmp.path() + "/run";
  auto r = run_train(1, out, {"--steps", "3", "--save-every", "1", "--profile-steps", "3:3", "--logger", "none"});
  ASSERT_EQ(r.exit_code(), 0) << r.output;
  const std::string first = read_file(out + "/profile/rank_0.pt.trace.json");
  ASSERT_FALSE(first.empty());
  fs::remove_all(out + "/checkpoints/step-00000003");  // the next job redoes step 3
  r = run_train(1, out, {"--steps", "3", "--save-every", "1", "--profile-steps", "3:3", "--logger", "none", "--resume"});
  ASSERT_EQ(r.exit_code(), 0) << r.output;
  EXPECT_EQ(read_file(out + "/profile/rank_0.pt.trace.json"), first);
  const std::string second = out + "/profile/rank_0.1.pt.trace.json";
  ASSERT_TRUE(fs::exists(second));
  EXPECT_EQ(fsdp_spans(second).count("fsdp::step 3"), 1u);
  EXPECT_NE(r.output.find("fsdp-train: profiled steps 3-3: " + out + "/profile/rank_<r>.1.pt.trace.json (an earlier "
                          "job's " + out + "/profile/rank_<r>.pt.trace.json is kept)"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(unused_trace_path(out + "/profile/rank_0.pt.trace.json"), out + "/profile/rank_0.2.pt.trace.json");
  EXPECT_EQ(unused_trace_path(out + "/profile/rank_1.pt.trace.json"), out + "/profile/rank_1.pt.trace.json");
}

// Issue 37 item 7: a full disk at the trace (a tmpfs with no room left) is
// a warning and false, and no partial trace is left. Before the fix:
// Error "LibTorch wrote no trace" (the run ended). Needs root for the tmpfs.
TEST(Observability, AFullDiskAtTheTraceIsAWarning) {
  TempDir tmp;
  SmallTmpfs disk(tmp.path() + "/disk", "size=64k");
  if (!disk.mounted()) GTEST_SKIP() << disk.why_not();
  fs::create_directories(disk.path() + "/profile");
  disk.fill();
  CapturedWarnings warnings;
  Profiler profiler;
  profiler.start();
  for (int i = 0; i < 200; ++i) (void)at::ones({8, 8}).matmul(at::ones({8, 8}));
  const std::string path = disk.path() + "/profile/rank_0.pt.trace.json";
  EXPECT_FALSE(profiler.stop(path));
  EXPECT_FALSE(profiler.running());
  EXPECT_EQ(warnings.count("Profiler: the trace " + path + " cannot be written"), 1u);
  EXPECT_FALSE(fs::exists(path)) << "a partial trace was left";
}

// Issue 37 item 14: the loss curve of extreme losses finishes, small. Losses
// near 1e17 (1e17 + 5 == 1e17: the old tick loop stopped advancing and wrote
// until a 20 MB tmpfs was full), all equal, 1e-300 apart, spanning the
// doubles (±1e308), and 200 000 steps. Before the fix the first never
// returned.
TEST(Observability, TheLossCurveOfExtremeLossesFinishesAndStaysSmall) {
  TempDir tmp;
  auto curve = [&](const std::vector<double>& losses) {
    SCOPED_TRACE("losses " + std::to_string(losses.front()) + ", ... (" + std::to_string(losses.size()) + ")");
    const std::string out = tmp.path() + "/run";
    fs::create_directories(out);
    std::string lines;
    for (size_t i = 0; i < losses.size(); ++i) {
      nlohmann::json j{{"step", i + 1}, {"loss", losses[i]}};
      if (i % 7 == 0) j["eval_loss"] = losses[i];
      lines += j.dump() + "\n";
    }
    write_file(out + "/metrics.jsonl", lines);
    const auto t0 = std::chrono::steady_clock::now();
    const std::string path = train::write_loss_curve(out, "extreme");
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 20.0);
    const std::string svg = read_file(path);
    EXPECT_LT(svg.size(), 256u << 10) << svg.size() << " bytes";
    EXPECT_NE(svg.find("</svg>"), std::string::npos);
    EXPECT_EQ(svg.find("nan"), std::string::npos) << "a coordinate that is not a number:\n" << svg.substr(0, 3000);
    EXPECT_EQ(svg.find("inf"), std::string::npos) << "an infinite coordinate:\n" << svg.substr(0, 3000);
    return svg;
  };
  curve({1e17, 1e17 + 16, 1e17, 1e17 + 32});
  curve({1e17, 1e17, 1e17});
  curve({2.5, 2.5});
  curve({1.0, 1.0 + 4.4e-16});  // adjacent doubles
  curve({1e308, -1e308, 1.7e308});
  curve({1e-300, 2e-300, 3e-300});
  std::vector<double> many(200000);
  for (size_t i = 0; i < many.size(); ++i) many[i] = 3.0 / std::sqrt(1.0 + static_cast<double>(i));
  many[123456] = 50;  // a spike stays visible when the points are thinned
  const std::string svg = curve(many);
  EXPECT_NE(svg.find(">200000</text>"), std::string::npos);
  EXPECT_NE(svg.find(">50</text>"), std::string::npos) << "the spike's height sets the axis";
  const std::string line = svg.substr(svg.find("<polyline"), svg.find("\"/>", svg.find("<polyline")) - svg.find("<polyline"));
  EXPECT_NE(line.find(",44.0 "), std::string::npos) << "the spike (at the plot's top, y 44) was thinned away";
}

// Issue 37 item 14 (and item 1): loss.svg is written to a file of the
// run's own, never through a symlink; what cannot be written is an Error
// naming it, which fsdp-train reports as a warning. Before the fix the
// symlink's target was replaced by the drawing.
TEST(Observability, ALossCurveIsNeverWrittenThroughASymlink) {
  TempDir tmp;
  const std::string out = tmp.path() + "/run";
  fs::create_directories(out);
  write_file(out + "/metrics.jsonl", "{\"step\":1,\"loss\":2.5}\n");
  write_file(tmp.path() + "/victim", "mine");
  fs::create_symlink(tmp.path() + "/victim", out + "/loss.svg");
  try {
    train::write_loss_curve(out);
    ADD_FAILURE() << "wrote through the symlink";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot write " + out + "/loss.svg: "), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("(a symlink; it is not followed)"), std::string::npos) << e.what();
  }
  EXPECT_EQ(read_file(tmp.path() + "/victim"), "mine");
}
