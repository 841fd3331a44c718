// The C++ side of the interop tests with Python (tests/python/interop.py),
// at any world size (alone: world 1; under fsdp-run: its world):
//   interop_helper save DIR [full|sharded]
//       trains a small GPT (FSDP, transformer policy on GPTBlock, AdamW) for
//       3 steps, saves DIR/full.pt (full format, the default, "step" = 3) or
//       the DCP directory DIR/sharded (sharded format), trains 2 more;
//       rank 0 writes DIR/expected.json: {config, optimizer, step,
//       world_size, batches (steps 4-5, token lists), losses (steps 4-5),
//       history (steps 1-3: the tensor value "history" in the checkpoint,
//       float64)}.
//   interop_helper resume CKPT EXPECTED.json
//       builds the same model, loads CKPT (model, optimizer, step, history;
//       a full file or a sharded directory, whoever wrote it), trains on
//       EXPECTED's batches and exits 1 if a loss differs from EXPECTED's by
//       more than 1e-5 (or the step or history differs), naming what differs.
// Each step's global batch is split by rank; the loss is the mean over ranks.
#include <ATen/CPUGeneratorImpl.h>
#include <nlohmann/json.hpp>
#include <torch/optim/adamw.h>

#include <cmath>
#include <fstream>
#include <iomanip>
#include <iostream>

#include "fsdp/checkpoint/checkpoint_io.h"
#include "fsdp/error.h"
#include "fsdp/fsdp.h"
#include "fsdp/models/gpt.h"

using namespace fsdp;
using json = nlohmann::json;

namespace {

constexpr int kSavedStep = 3, kSteps = 5, kBatch = 4;
// Readers start from other weights than writers: only the checkpoint carries them.
constexpr uint64_t kSeed = 1234, kReaderSeed = 99;
constexpr double kTolerance = 1e-5;

struct Job {
  Unit<models::GPTImpl> model{nullptr};
  std::unique_ptr<torch::optim::AdamW> optimizer;
  dist::ProcessGroupPtr pg;

  Job(const dist::ProcessGroupPtr& group, const models::GPTConfig& config, double lr, double weight_decay,
      uint64_t seed)
      : pg(group) {
    torch::manual_seed(seed);
    FSDPOptions o;
    o.process_group(pg).use_orig_params(true).auto_wrap_policy(transformer_auto_wrap_policy<models::GPTBlockImpl>());
    model = FullyShardedDataParallel<models::GPTImpl>(std::make_shared<models::GPTImpl>(config), o);
    optimizer = std::make_unique<torch::optim::AdamW>(model->parameters(),
                                                      torch::optim::AdamWOptions(lr).weight_decay(weight_decay));
  }

  // [collective] One step on this rank's rows of the global batch `tokens`
  // [B, T + 1]; returns the mean loss over the ranks.
  double step(const at::Tensor& tokens) {
    const int64_t local = tokens.size(0) / pg->size();
    const auto mine = tokens.narrow(0, pg->rank() * local, local);
    optimizer->zero_grad();
    auto loss = models::gpt_loss(model(mine.narrow(1, 0, mine.size(1) - 1)), mine.narrow(1, 1, mine.size(1) - 1));
    loss.backward();
    optimizer->step();
    auto sum = loss.detach().to(at::kDouble).reshape({1});
    pg->all_reduce(sum).wait();
    return sum.item<double>() / pg->size();
  }

  CheckpointState state(int64_t step, const std::vector<double>& history) {
    CheckpointState s;
    s.model("model", model.ptr()).optimizer("optimizer", *optimizer).value("step", step);
    s.value("history", at::tensor(history, at::kDouble));
    return s;
  }
};

json config_json(const models::GPTConfig& c) {
  return {{"vocab_size", c.vocab_size}, {"context", c.context}, {"dim", c.dim}, {"layers", c.layers},
          {"heads", c.heads}};
}

models::GPTConfig config_of(const json& j) {
  models::GPTConfig c;
  c.vocab_size = j.at("vocab_size");
  c.context = j.at("context");
  c.dim = j.at("dim");
  c.layers = j.at("layers");
  c.heads = j.at("heads");
  return c;
}

at::Tensor tokens_of(const json& rows) {
  std::vector<int64_t> flat;
  for (const auto& row : rows) flat.insert(flat.end(), row.begin(), row.end());
  const auto n = static_cast<int64_t>(rows.size());
  return at::tensor(flat, at::kLong).reshape({n, static_cast<int64_t>(flat.size()) / n});
}

json rows_of(const at::Tensor& tokens) {
  json rows = json::array();
  for (int64_t i = 0; i < tokens.size(0); ++i) {
    const auto row = tokens[i].contiguous();
    rows.push_back(std::vector<int64_t>(row.data_ptr<int64_t>(), row.data_ptr<int64_t>() + row.numel()));
  }
  return rows;
}

int save(const std::string& dir, CheckpointFormat format) {
  auto pg = dist::init_process_group_from_env();
  models::GPTConfig config;
  config.vocab_size = 64;
  config.context = 16;
  config.dim = 32;
  config.layers = 2;
  config.heads = 4;
  const double lr = 1e-3, weight_decay = 0.01;
  Job job(pg, config, lr, weight_decay, kSeed);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(kSeed);
  json batches = json::array(), losses = json::array();
  std::vector<double> history;
  for (int step = 1; step <= kSteps; ++step) {
    const auto tokens = at::randint(config.vocab_size, {kBatch, config.context + 1}, gen, at::kLong);
    const double loss = job.step(tokens);
    if (step > kSavedStep) {
      batches.push_back(rows_of(tokens));
      losses.push_back(loss);
    } else {
      history.push_back(loss);
    }
    if (step == kSavedStep) {
      const std::string path = dir + (format == CheckpointFormat::kFull ? "/full.pt" : "/sharded");
      save_checkpoint(path, job.state(kSavedStep, history), *pg, CheckpointOptions().format(format));
    }
  }
  if (pg->rank() == 0) {
    const json expected = {{"config", config_json(config)},
                           {"optimizer", {{"lr", lr}, {"weight_decay", weight_decay}}},
                           {"step", kSavedStep},
                           {"world_size", pg->size()},
                           {"batches", batches},
                           {"losses", losses},
                           {"history", history}};
    std::ofstream(dir + "/expected.json") << expected.dump(1) << "\n";
  }
  return 0;
}

int resume(const std::string& checkpoint, const std::string& expected_path) {
  std::ifstream in(expected_path);
  if (!in) throw ConfigError("cannot open " + expected_path);
  const json expected = json::parse(in);
  auto pg = dist::init_process_group_from_env();
  const auto& opt = expected.at("optimizer");
  Job job(pg, config_of(expected.at("config")), opt.at("lr"), opt.at("weight_decay"), kReaderSeed);
  CheckpointState s = job.state(0, {});
  load_checkpoint(checkpoint, s, *pg);
  int failures = 0;
  const auto want_history = expected.at("history").get<std::vector<double>>();
  const at::Tensor history = s.get<at::Tensor>("history");
  if (history.scalar_type() != at::kDouble || !at::equal(history, at::tensor(want_history, at::kDouble))) {
    std::cerr << "interop_helper: " << checkpoint << " holds history " << history << ", expected "
              << at::tensor(want_history, at::kDouble) << " (float64)\n";
    ++failures;
  }
  const int64_t step = s.get<int64_t>("step"), expected_step = expected.at("step");
  if (step != expected_step) {
    std::cerr << "interop_helper: " << checkpoint << " holds step " << step << ", expected " << expected_step << "\n";
    ++failures;
  }
  const auto& batches = expected.at("batches");
  for (size_t i = 0; i < batches.size(); ++i) {
    const double loss = job.step(tokens_of(batches[i]));
    const double want = expected.at("losses").at(i);
    const bool ok = std::abs(loss - want) <= kTolerance;
    if (pg->rank() == 0 || !ok) {
      std::cout << "interop_helper: step " << expected_step + 1 + static_cast<int64_t>(i) << " loss "
                << std::setprecision(9) << loss << " expected " << want << (ok ? " ok" : " MISMATCH") << "\n";
    }
    failures += ok ? 0 : 1;
  }
  if (failures == 0 && pg->rank() == 0) std::cout << "interop_helper: resumed at world " << pg->size() << ": ok\n";
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "save" && (argc == 3 || argc == 4)) {
      return save(argv[2], argc == 4 ? parse_checkpoint_format(argv[3], "save's format") : CheckpointFormat::kFull);
    }
    if (mode == "resume" && argc == 4) return resume(argv[2], argv[3]);
    std::cerr << "usage: interop_helper save DIR [full|sharded] | resume CHECKPOINT EXPECTED.json\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "interop_helper: " << e.what() << "\n";
    return 1;
  }
}
