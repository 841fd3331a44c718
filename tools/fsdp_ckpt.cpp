// fsdp-ckpt: looks into fsdp-cpp checkpoints.
//   fsdp-ckpt inspect PATH            format, version, world size, values, tensors
//   fsdp-ckpt verify PATH             every checksum (the index's own, every zip record's, every chunk's),
//                                     chunks covering each tensor exactly, and an fsdp-train checkpoint's
//                                     model configuration against its tensors and its position (step,
//                                     world, samples) against each other; exit 0 sound, 1 damaged (listed)
//   fsdp-ckpt consolidate DIR OUT     sharded -> one full file (torch.load-able), one tensor in memory at a time
//   fsdp-ckpt export CKPT OUT [--format safetensors]
//                                     the model's weights as a safetensors file (Hugging Face's), one tensor at a time
//   fsdp-ckpt export CKPT OUT --format hf [--config DIR] [--max-shard-size 5GB] [--dtype bfloat16]
//                                     a Hugging Face model directory (config, generation config, tokenizer files
//                                     copied from DIR, size-capped safetensors and their index) that
//                                     transformers' from_pretrained loads
//   fsdp-ckpt convert SRC DST --format full|sharded
//                                     any checkpoint (fsdp-cpp's, DCP from PyTorch / Lightning) -> either format
// A full checkpoint is already PyTorch's format: torch.load(PATH) opens it.
#include <CLI/CLI.hpp>

#include <charconv>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <limits>
#include <optional>
#include <vector>

#include "fsdp/checkpoint/checkpoint_io.h"
#include "fsdp/error.h"
#include "fsdp/hf/export.h"
#include "fsdp/hf/hf_model.h"
#include "fsdp/train/gpt_trainer.h"

namespace {

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string human_bytes(int64_t b) {
  char buf[32];
  if (b >= (int64_t{1} << 30)) {
    std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(b) / (1 << 30));
  } else if (b >= (1 << 20)) {
    std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(b) / (1 << 20));
  } else if (b >= 1024) {
    std::snprintf(buf, sizeof buf, "%.1f KiB", static_cast<double>(b) / 1024);
  } else {
    std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(b));
  }
  return buf;
}

int inspect(const std::string& path) {
  auto info = fsdp::inspect_checkpoint(path);
  std::cout << "path:       " << path << "\n"
            << "format:     " << fsdp::to_string(info.format) << "\n"
            << "version:    " << info.version << "\n"
            << "world size: " << info.world_size << " (at save)\n";
  std::cout << "values:\n";
  for (const auto& [k, v] : info.values) std::cout << "  " << k << " = " << v << "\n";
  int64_t total = 0;
  size_t width = 6;
  for (const auto& t : info.tensors) width = std::max(width, t.key.size());
  std::printf("tensors: %zu\n  %-*s  %-9s  %-18s  %10s  %s\n", info.tensors.size(), static_cast<int>(width), "key",
              "dtype", "shape", "size", "chunks");
  for (const auto& t : info.tensors) {
    std::printf("  %-*s  %-9s  %-18s  %10s  %d\n", static_cast<int>(width), t.key.c_str(), t.dtype.c_str(),
                shape_text(t.shape).c_str(), human_bytes(t.nbytes).c_str(), t.chunks);
    total += t.nbytes;
  }
  std::cout << "total: " << human_bytes(total) << "\n";
  return 0;
}

// Issue 37 item 10: the position of the run that fsdp-train keeps in its
// checkpoints, checked as far as a checkpoint alone can tell. "step" is the
// steps done, "world" the world size of the job that saved, "samples" the
// sample stream's position (include/fsdp/train/batches.h: each step takes
// batch x world samples of the job that ran it), and the saving job's
// settings "config.run.batch" (per rank) and "config.run.steps". Before:
// `fsdp-ckpt verify` said ok to resealed indexes with samples = 9.2e18,
// world = 0, step = -3 and step = 1e12.
std::vector<std::string> run_position_problems(const fsdp::CheckpointInfo& info) {
  std::vector<std::string> problems;
  // An int value: its name under "config." or, in checkpoints before the
  // config nesting, without it; nullopt if absent or not an int (named).
  auto get = [&](const std::string& key, bool config) -> std::optional<int64_t> {
    std::string name;
    for (const std::string& n : config ? std::vector<std::string>{"config." + key, key} : std::vector<std::string>{key}) {
      if (info.values.count(n)) {
        name = n;
        break;
      }
    }
    if (name.empty()) return std::nullopt;
    const std::string& text = info.values.at(name);
    const auto t = info.value_types.find(name);
    const std::string type = t == info.value_types.end() ? "?" : t->second;
    int64_t v = 0;
    const char* end = text.data() + text.size();
    const auto [ptr, ec] = std::from_chars(text.data(), end, v);
    if (type != "int" || ec != std::errc() || ptr != end) {
      problems.push_back("the run's '" + name + "' is a " + type + " (" + text + "); expected an int");
      return std::nullopt;
    }
    return v;
  };
  const auto step = get("step", false), world = get("world", false), samples = get("samples", false);
  const auto batch = get("run.batch", true), steps = get("run.steps", true);
  auto text = [](int64_t v) { return std::to_string(v); };
  bool sound = true;  // the values the samples are checked against
  if (!step) {
    if (!info.values.count("step")) problems.push_back("an fsdp-train checkpoint without its 'step'");
    sound = false;
  } else if (*step < 0) {
    problems.push_back("the run's 'step' = " + text(*step) + " is negative: a checkpoint is saved after 0 or more steps");
    sound = false;
  } else if (steps && *step > *steps) {
    problems.push_back("the run's 'step' = " + text(*step) + " is beyond the steps of the job that saved it ('config.run.steps' = " +
                       text(*steps) + "): a job saves only at the steps it runs");
    sound = false;
  }
  if (world && (*world < 1 || *world > std::numeric_limits<int>::max())) {
    problems.push_back("the run's 'world' = " + text(*world) + " is out of range: a job has 1 to " +
                       text(std::numeric_limits<int>::max()) + " ranks");
    sound = false;
  }
  if (batch && *batch < 1) {
    problems.push_back("the run's 'config.run.batch' = " + text(*batch) + " is out of range: at least 1 sequence per rank");
    sound = false;
  }
  if (!samples) return problems;
  if (*samples < 0) {
    problems.push_back("the run's 'samples' = " + text(*samples) + " is negative: the sample stream's position starts at 0");
    return problems;
  }
  if (!sound || !step) return problems;
  if (*step == 0) {
    if (*samples != 0) {
      problems.push_back("the run's 'samples' = " + text(*samples) + " at 'step' = 0: no step has taken a sample yet");
    }
    return problems;
  }
  if (!world || !batch) return problems;  // checkpoints from before these were kept
  // The last step took batch x world samples (this job's); each of the steps
  // before it, at least 1 and at most batch x the largest world a job can
  // have (2^31 - 1 ranks): a resized run (docs/launching.md) ran them at
  // other world sizes, which the checkpoint does not record. At one world
  // size and batch, samples is exactly step x batch x world.
  using Wide = __int128;
  const Wide last = Wide{*batch} * *world;
  const Wide lo = last + (*step - 1), hi = last + Wide{*step - 1} * *batch * std::numeric_limits<int>::max();
  if (Wide{*samples} < lo || Wide{*samples} > hi) {
    auto wide = [](Wide v) {
      std::string out;
      const bool neg = v < 0;
      if (neg) v = -v;
      do {
        out.insert(out.begin(), static_cast<char>('0' + static_cast<int>(v % 10)));
        v /= 10;
      } while (v > 0);
      return (neg ? "-" : "") + out;
    };
    problems.push_back("the run's 'samples' = " + text(*samples) + " does not fit 'step' = " + text(*step) + ", 'world' = " +
                       text(*world) + " and 'config.run.batch' = " + text(*batch) + ": the last step took " + wide(last) +
                       " samples and each step before it at least 1 and at most " + wide(Wide{*batch} * std::numeric_limits<int>::max()) +
                       ", so it lies in [" + wide(lo) + ", " + wide(hi) + "] (at one world size exactly step x batch x world = " +
                       wide(Wide{*step} * *batch * *world) + ")");
  }
  return problems;
}

int verify(const std::string& path) {
  auto problems = fsdp::verify_checkpoint(path);
  if (problems.empty()) {  // an fsdp-train checkpoint: its model configuration against its tensors, its position
    try {
      const fsdp::CheckpointInfo info = fsdp::inspect_checkpoint(path);
      bool trained = false;
      for (const auto& [name, value] : info.values) trained |= name.rfind("config.model.", 0) == 0;
      if (trained) {
        (void)fsdp::train::checkpoint_model(info, path);
        problems = run_position_problems(info);
      }
    } catch (const std::exception& e) {
      problems.push_back(e.what());
    }
  }
  if (problems.empty()) {
    std::cout << path << ": ok (every checksum matches)\n";
    return 0;
  }
  std::cout << path << ": DAMAGED (" << problems.size() << " problem" << (problems.size() > 1 ? "s" : "") << ")\n";
  for (const auto& p : problems) std::cout << "  " << p << "\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fsdp-ckpt: inspect, verify, consolidate, convert and export checkpoints"};
  app.require_subcommand(1);
  std::string path, out;
  auto* ins = app.add_subcommand("inspect", "format, version, world size, values and a table of tensors");
  ins->add_option("path", path, "checkpoint file or directory")->required();
  auto* ver = app.add_subcommand("verify", "check every checksum (exit 0: sound, 1: damaged)");
  ver->add_option("path", path, "checkpoint file or directory")->required();
  auto* con = app.add_subcommand("consolidate", "sharded directory -> one full file that torch.load opens");
  con->add_option("dir", path, "sharded checkpoint directory")->required();
  con->add_option("out", out, "output file")->required();
  std::string format = "safetensors";
  std::string hf_config, max_shard = "50GB", dtype;
  auto* exp = app.add_subcommand("export", "the model's weights in another format: a safetensors file, or a Hugging "
                                           "Face model directory (--format hf)");
  exp->add_option("ckpt", path, "checkpoint file or directory (either format)")->required();
  exp->add_option("out", out, "output file (safetensors) or new directory (hf)")->required();
  exp->add_option("--format", format, "output format: safetensors (default) or hf")
      ->check(CLI::IsMember({"safetensors", "hf"}));
  exp->add_option("--config", hf_config,
                  "hf: the model's directory (its config.json; generation_config.json and tokenizer files are copied); "
                  "default: what an fsdp-train checkpoint of a Llama records");
  exp->add_option("--max-shard-size", max_shard, "hf: the safetensors files' cap (default 50GB, as save_pretrained)");
  exp->add_option("--dtype", dtype, "hf: float32, bfloat16 or float16 (default: as saved)")
      ->check(CLI::IsMember({"float32", "bfloat16", "float16"}));
  auto* conv = app.add_subcommand("convert", "any checkpoint (also DCP from PyTorch or Lightning) -> full or sharded (DCP)");
  std::string conv_format;
  conv->add_option("src", path, "checkpoint file or directory")->required();
  conv->add_option("dst", out, "output file (full) or directory (sharded)")->required();
  conv->add_option("--format", conv_format, "full or sharded")->required()->check(CLI::IsMember({"full", "sharded"}));
  CLI11_PARSE(app, argc, argv);
  try {
    if (ins->parsed()) return inspect(path);
    if (ver->parsed()) return verify(path);
    if (exp->parsed() && format == "hf") {
      fsdp::hf::ExportOptions o;
      if (hf_config.empty()) {
        // An fsdp-train checkpoint of a Llama records its config.json (and
        // the hf: directory it came from, whose tokenizer files are copied).
        const fsdp::CheckpointInfo info = fsdp::inspect_checkpoint(path);
        if (!info.values.count("config.model.llama")) {
          throw fsdp::ConfigError("export --format hf needs --config DIR (the model's directory): " + path +
                                  " records no model config.json");
        }
        const fsdp::train::CheckpointModel held = fsdp::train::checkpoint_model(info, path);
        o.config = *held.llama;
        if (held.source.rfind("hf:", 0) == 0 && std::filesystem::is_directory(held.source.substr(3))) {
          o.source_dir = held.source.substr(3);
        }
      } else {
        o.config = fsdp::hf::read_config(hf_config);
        o.source_dir = hf_config;
      }
      o.max_shard_bytes = fsdp::hf::parse_shard_size(max_shard, "--max-shard-size");
      o.dtype = dtype;
      fsdp::hf::export_hf(path, out, o);
    } else if (exp->parsed()) {
      if (!hf_config.empty() || !dtype.empty()) {
        throw fsdp::ConfigError("export: --config and --dtype are options of --format hf");
      }
      fsdp::export_safetensors(path, out);
    } else if (conv->parsed()) {
      fsdp::convert_checkpoint(path, out,
                               conv_format == "full" ? fsdp::CheckpointFormat::kFull : fsdp::CheckpointFormat::kSharded);
      std::cout << "wrote " << out << "\n";
      return 0;
    } else {
      fsdp::consolidate_checkpoint(path, out);
    }
    std::cout << "wrote " << out << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "fsdp-ckpt: " << e.what() << "\n";
    return 2;
  }
}
