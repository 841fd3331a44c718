// fsdp-ckpt: looks into fsdp-cpp checkpoints.
//   fsdp-ckpt inspect PATH            format, version, world size, values, tensors
//   fsdp-ckpt verify PATH             every checksum (the index's own, every zip record's, every chunk's),
//                                     chunks covering each tensor exactly, and an fsdp-train checkpoint's
//                                     model configuration against its tensors; exit 0 sound, 1 damaged (listed)
//   fsdp-ckpt consolidate DIR OUT     sharded -> one full file (torch.load-able), one tensor in memory at a time
//   fsdp-ckpt export CKPT OUT [--format safetensors]
//                                     the model's weights as a safetensors file (Hugging Face's), one tensor at a time
//   fsdp-ckpt convert SRC DST --format full|sharded
//                                     any checkpoint (fsdp-cpp's, DCP from PyTorch / Lightning) -> either format
// A full checkpoint is already PyTorch's format: torch.load(PATH) opens it.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <iostream>

#include "fsdp/checkpoint/checkpoint_io.h"
#include "fsdp/error.h"
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

int verify(const std::string& path) {
  auto problems = fsdp::verify_checkpoint(path);
  if (problems.empty()) {  // an fsdp-train checkpoint: its model configuration against its tensors
    try {
      const fsdp::CheckpointInfo info = fsdp::inspect_checkpoint(path);
      bool trained = false;
      for (const auto& [name, value] : info.values) trained |= name.rfind("config.model.", 0) == 0;
      if (trained) fsdp::train::checkpoint_model_config(info, path);
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
  auto* exp = app.add_subcommand("export", "the model's weights as a file of another format (safetensors)");
  exp->add_option("ckpt", path, "checkpoint file or directory (either format)")->required();
  exp->add_option("out", out, "output file")->required();
  exp->add_option("--format", format, "output format (default: safetensors)")
      ->check(CLI::IsMember({"safetensors"}));
  auto* conv = app.add_subcommand("convert", "any checkpoint (also DCP from PyTorch or Lightning) -> full or sharded (DCP)");
  std::string conv_format;
  conv->add_option("src", path, "checkpoint file or directory")->required();
  conv->add_option("dst", out, "output file (full) or directory (sharded)")->required();
  conv->add_option("--format", conv_format, "full or sharded")->required()->check(CLI::IsMember({"full", "sharded"}));
  CLI11_PARSE(app, argc, argv);
  try {
    if (ins->parsed()) return inspect(path);
    if (ver->parsed()) return verify(path);
    if (exp->parsed()) {
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
