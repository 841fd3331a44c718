// TensorBoard's own reader on TensorBoardLogger's files: EventAccumulator
// reads every scalar back equal to what was logged (JsonLinesLogger's copy
// is the reference), the hparams plugin finds the hyperparameters, the real
// `tensorboard` server serves the scalars, and a file cut inside its last
// record still reads up to the record before (tests/python/check_tensorboard.py).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <regex>

#include "../support/subprocess.h"
#include "fsdp/observability/loggers.h"

using namespace fsdp;
using namespace fsdp::testing;
namespace fs = std::filesystem;

namespace {

RunResult check_tensorboard(const std::vector<std::string>& args) {
  std::vector<std::string> argv{FSDP_TEST_PYTHON, std::string(FSDP_TEST_SOURCE_DIR) + "/python/check_tensorboard.py"};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_program(argv, std::chrono::seconds(240));
}

}  // namespace

TEST(TensorBoardReader, ReadsEveryScalarHyperparameterAndTornFileAsLogged) {
  char tmpl[] = "/tmp/fsdp_tb_XXXXXX";
  const std::string root = ::mkdtemp(tmpl);
  const std::string out = root + "/runs/exp";
  {
    TensorBoardLogger tbl(out, "", std::string(), /*default_hp_metric=*/false);
    JsonLinesLogger jsonl(out + "/metrics.jsonl");
    tbl.log_restart(1);
    tbl.log_hyperparams({{"lr", 0.001}, {"layers", int64_t{4}}, {"model", std::string("gpt")}, {"flag", true}},
                        {"loss"});
    for (int64_t s = 1; s <= 40; ++s) {
      Metrics m{{"loss", 5.0 / s + 0.1 * std::sin(s)}, {"lr", 1e-3 * s}, {"tokens_per_s", 12345.678 * s}};
      if (s == 17) m["loss"] = std::numeric_limits<double>::quiet_NaN();
      if (s == 18) m["grad_norm"] = std::numeric_limits<double>::infinity();
      if (s % 10 == 0) m["eval_loss"] = 4.0 / s;
      tbl.log_metrics(m, s);
      jsonl.log_metrics(m, s);
    }
    tbl.finalize("success");
  }
  std::vector<std::string> steps;
  std::string expect;
  for (int s = 1; s <= 40; ++s) expect += (s > 1 ? "," : "") + std::to_string(s);
  const RunResult r = check_tensorboard({out, "--expect-tags", "loss,lr,tokens_per_s,eval_loss,grad_norm",
                                         "--expect-steps", expect, "--hparams", "lr=0.001,layers=4,model=gpt,flag=true",
                                         "--truncate-check", "--serve"});
  EXPECT_EQ(r.exit_code(), 0) << r.output;
  EXPECT_NE(r.output.find("scalars equal to metrics.jsonl"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("tensorboard server"), std::string::npos) << r.output;

  // The reader is not fooled: one value changed by one float32 step fails.
  const std::string jsonl = read_file(out + "/metrics.jsonl");
  const std::string changed = std::regex_replace(jsonl, std::regex("\"lr\":0\\.002,"), "\"lr\":0.0020001,");
  ASSERT_NE(changed, jsonl);
  write_file(out + "/metrics.jsonl", changed);
  const RunResult bad = check_tensorboard({out});
  EXPECT_NE(bad.exit_code(), 0) << bad.output;
  EXPECT_NE(bad.output.find("tag 'lr' step 2"), std::string::npos) << bad.output;
  fs::remove_all(root);
}
