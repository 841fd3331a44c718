#include "run_directory.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "fsdp/error.h"
#include "../fsdp/rank_errors.h"

namespace fsdp::train {

namespace fs = std::filesystem;

RunDirectory::RunDirectory(std::string root) : root_(std::move(root)) {}

std::string RunDirectory::metrics_path() const { return (fs::path(root_) / "metrics.jsonl").string(); }

std::string RunDirectory::log_path() const { return (fs::path(root_) / "train.log").string(); }

std::string RunDirectory::checkpoint_path(int64_t step) const {
  std::ostringstream name;
  name << "step-" << std::setw(8) << std::setfill('0') << step;
  return (fs::path(root_) / "checkpoints" / name.str()).string();
}

std::vector<std::pair<int64_t, std::string>> RunDirectory::checkpoints() const {
  std::vector<std::pair<int64_t, std::string>> out;
  const fs::path dir = fs::path(root_) / "checkpoints";
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() != 13 || name.rfind("step-", 0) != 0) continue;
    try {
      out.emplace_back(std::stoll(name.substr(5)), e.path().string());
    } catch (const std::exception&) {
    }
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

namespace {

// "--resume: <path> holds a model of another shape: dim 64 (checkpoint) vs 32;", or "" for the same shape.
std::string shape_mismatch(const models::GPTConfig& saved, const models::GPTConfig& wanted, const std::string& path) {
  std::string diff;
  auto cmp = [&](const char* what, int64_t a, int64_t b) {
    if (a != b) diff += std::string(" ") + what + " " + std::to_string(a) + " (checkpoint) vs " + std::to_string(b) + ";";
  };
  cmp("context", saved.context, wanted.context);
  cmp("dim", saved.dim, wanted.dim);
  cmp("layers", saved.layers, wanted.layers);
  cmp("heads", saved.heads, wanted.heads);
  return diff.empty() ? diff : "--resume: " + path + " holds a model of another shape:" + diff;
}

}  // namespace

std::string RunDirectory::resume_checkpoint(const TrainConfig& c) const {
  for (const auto& [step, path] : checkpoints()) {
    CheckpointInfo info;
    models::GPTConfig saved;
    try {
      info = inspect_checkpoint(path);
      saved = config_of(info, path);
    } catch (const ConfigError&) {
      std::cerr << "fsdp-train: skipping incomplete or damaged checkpoint " << path << std::endl;
      continue;
    }
    if (const std::string mismatch = shape_mismatch(saved, c.model, path); !mismatch.empty()) {
      throw ConfigError(mismatch);
    }
    const auto over = overridden_flags(info, c);
    if (!over.empty()) {
      std::string msg = "fsdp-train: --resume: these flags differ from the checkpoint's run and apply from its step on:";
      for (size_t i = 0; i < over.size(); ++i) msg += (i ? "; " : " ") + over[i];
      std::cout << msg << std::endl;
    }
    return path;
  }
  return "";
}

std::string RunDirectory::resume(const FSDPStrategy& strategy, const TrainConfig& c, CheckpointState& state) const {
  std::string chosen;
  const auto failure = detail::capture([&] {
    if (strategy.global_rank() == 0) chosen = resume_checkpoint(c);
  });
  // [collective] One broadcast: rank 0's choice, or its failure.
  const std::string agreed = strategy.broadcast(detail::outcome(chosen, failure), 0);
  if (detail::outcome_failed(agreed)) detail::rethrow(detail::outcome_failure(agreed));
  chosen = detail::outcome_payload(agreed);
  if (!chosen.empty()) strategy.load_checkpoint(chosen, state);
  return chosen;
}

void RunDirectory::save(const FSDPStrategy& strategy, const CheckpointState& state, int64_t step, int keep) const {
  const std::string path = checkpoint_path(step);
  if (strategy.global_rank() == 0) fs::create_directories(fs::path(path).parent_path());
  strategy.barrier();
  strategy.save_checkpoint(path, state);
  if (strategy.global_rank() == 0) {
    const auto all = checkpoints();
    for (size_t i = static_cast<size_t>(keep); i < all.size(); ++i) fs::remove_all(all[i].second);
  }
  strategy.barrier();
}

void put_config(CheckpointState& s, const TrainConfig& run) {
  const models::GPTConfig& c = run.model;
  auto put = [&](const std::string& key, CheckpointValue v) { s.value("config." + key, std::move(v)); };
  put("model.vocab", c.vocab_size);
  put("model.context", c.context);
  put("model.dim", c.dim);
  put("model.layers", c.layers);
  put("model.heads", c.heads);
  put("run.lr", run.lr);
  put("run.min_lr", min_learning_rate(run));
  put("run.warmup_steps", warmup_steps(run));
  put("run.steps", run.steps);
  put("run.batch", run.batch);
  put("run.seed", static_cast<int64_t>(run.seed));
}

namespace {

// A configuration value: "config.<key>" (nested under "config" in Python),
// or "<key>" as checkpoints before issue 18 named it; null if absent.
const std::string* config_value(const CheckpointInfo& info, const std::string& key) {
  for (const std::string& name : {"config." + key, key}) {
    auto it = info.values.find(name);
    if (it != info.values.end()) return &it->second;
  }
  return nullptr;
}

}  // namespace

models::GPTConfig config_of(const CheckpointInfo& info, const std::string& path) {
  models::GPTConfig c;
  auto get = [&](const char* key) {
    const std::string* v = config_value(info, key);
    if (!v) throw ConfigError(path + " was not written by fsdp-train: it has no 'config." + key + "'");
    return std::stoll(*v);
  };
  c.vocab_size = get("model.vocab");
  c.context = get("model.context");
  c.dim = get("model.dim");
  c.layers = get("model.layers");
  c.heads = get("model.heads");
  return c;
}

std::vector<std::string> overridden_flags(const CheckpointInfo& info, const TrainConfig& c) {
  std::vector<std::string> out;
  auto check = [&](const char* key, const char* flag, double now) {
    const std::string* v = config_value(info, key);
    if (!v) return;
    const double was = std::strtod(v->c_str(), nullptr);
    if (std::abs(was - now) > 1e-9 * std::max(1.0, std::abs(now))) {
      std::ostringstream os;
      os << flag << " " << was << " -> " << now;
      out.push_back(os.str());
    }
  };
  check("run.lr", "--lr", c.lr);
  check("run.min_lr", "--min-lr", min_learning_rate(c));
  check("run.warmup_steps", "--warmup-steps", static_cast<double>(warmup_steps(c)));
  check("run.steps", "--steps", static_cast<double>(c.steps));
  check("run.batch", "--batch", static_cast<double>(c.batch));
  check("run.seed", "--seed", static_cast<double>(c.seed));
  return out;
}

}  // namespace fsdp::train
