// fsdp-bench: trains the GPT decoder of fsdp/models/gpt.h with one sharding
// strategy (or unwrapped: --strategy local) and prints one JSON line from
// rank 0. Run it under fsdp-run; see docs/performance.md.
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <torch/torch.h>

#include "fsdp/checkpoint.h"
#include "fsdp/dist/process_group.h"
#include "fsdp/error.h"
#include "fsdp/fsdp.h"
#include "fsdp/models/gpt.h"

namespace {

double peak_rss_mb() {
  rusage r{};
  getrusage(RUSAGE_SELF, &r);
  return static_cast<double>(r.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB
}

// Resident memory now, in MiB (from /proc/self/statm).
double rss_now_mb() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  long pages = 0, resident = 0;
  if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
  std::fclose(f);
  return static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE)) / (1024.0 * 1024.0);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fsdp-bench: GPT training step time, throughput, memory and traffic per sharding strategy"};
  std::string strategy = "FULL_SHARD";
  fsdp::models::GPTConfig cfg;
  int64_t batch = 8;
  int steps = 5, warmup = 2;
  bool use_orig = false, forward_prefetch = false, bf16 = false, trace_memory = false, checkpointing = false;
  app.add_option("--strategy", strategy, "FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD or local")->capture_default_str();
  app.add_option("--dim", cfg.dim, "model width")->capture_default_str();
  app.add_option("--layers", cfg.layers, "transformer blocks")->capture_default_str();
  app.add_option("--heads", cfg.heads, "attention heads")->capture_default_str();
  app.add_option("--ctx", cfg.context, "context length (tokens per sample)")->capture_default_str();
  app.add_option("--batch", batch, "samples per rank per step")->capture_default_str();
  app.add_option("--steps", steps, "timed steps")->capture_default_str();
  app.add_option("--warmup", warmup, "untimed steps first")->capture_default_str();
  app.add_flag("--use-orig-params", use_orig, "expose original parameters to the optimizer");
  app.add_flag("--forward-prefetch", forward_prefetch, "prefetch the next unit in forward");
  app.add_flag("--bf16", bf16, "mixed precision: bfloat16 compute and reduction");
  app.add_flag("--activation-checkpointing", checkpointing, "checkpoint every transformer block");
  app.add_flag("--trace-memory", trace_memory, "print each rank's resident memory after each phase to stderr");
  CLI11_PARSE(app, argc, argv);

  try {
    const bool local = strategy == "local";
    auto trace = [&](const std::string& phase) {
      if (trace_memory) std::cerr << "memory: " << phase << ": " << rss_now_mb() << " MiB" << std::endl;
    };
    trace("start");
    auto pg = fsdp::dist::init_process_group_from_env();
    if (local && pg->size() != 1) throw fsdp::ConfigError("--strategy local runs one process: use --nproc-per-node 1");
    torch::manual_seed(0);
    auto gpt = std::make_shared<fsdp::models::GPTImpl>(cfg);
    int64_t params = 0;
    for (auto& p : gpt->parameters()) params += p.numel();

    std::vector<fsdp::dist::ProcessGroupPtr> groups{pg};
    std::shared_ptr<fsdp::FullyShardedDataParallel<fsdp::models::GPTImpl>> model;
    std::function<at::Tensor(const at::Tensor&)> forward;
    std::vector<at::Tensor> trainable;
    if (local) {
      forward = [gpt](const at::Tensor& x) { return gpt->forward(x); };
      trainable = gpt->parameters();
    } else {
      fsdp::FSDPOptions o;
      o.sharding_strategy = fsdp::parse_sharding_strategy(strategy);
      if (o.sharding_strategy == fsdp::ShardingStrategy::kHybridShard) {
        const int shard = pg->size() % 2 == 0 ? pg->size() / 2 : pg->size();
        o.device_mesh = fsdp::dist::init_device_mesh(pg, pg->size() / shard, shard);
        groups.push_back(o.device_mesh->shard_group);
        groups.push_back(o.device_mesh->replicate_group);
      } else {
        o.process_group = pg;
      }
      o.auto_wrap_policy = fsdp::transformer_auto_wrap_policy<fsdp::models::GPTBlockImpl>();
      o.use_orig_params = use_orig;
      o.forward_prefetch = forward_prefetch;
      if (bf16) o.mixed_precision.param_dtype = torch::kBFloat16;
      model = std::make_shared<fsdp::FullyShardedDataParallel<fsdp::models::GPTImpl>>(gpt, o);
      forward = [model](const at::Tensor& x) { return (*model)(x); };
      trainable = (*model)->parameters();
    }
    if (checkpointing) {
      fsdp::apply_activation_checkpointing(local ? std::static_pointer_cast<torch::nn::Module>(gpt) : model->ptr(),
                                           fsdp::checkpoint_module_types<fsdp::models::GPTBlockImpl>());
    }
    trace("model ready");
    torch::optim::AdamW opt(trainable, torch::optim::AdamWOptions(3e-4));
    // Random bytes: the step time does not depend on the data.
    auto gen_batch = [&](int step) {
      torch::manual_seed(1000 + step * 131 + pg->rank());
      return torch::randint(0, cfg.vocab_size, {batch, cfg.context + 1});
    };
    auto comm_bytes = [&] {
      uint64_t b = 0;
      for (auto& g : groups) b += g ? g->bytes_sent() : 0;
      return b;
    };
    std::vector<double> times;
    uint64_t bytes_before = 0;
    double last_loss = 0;
    for (int step = 0; step < warmup + steps; ++step) {
      auto data = gen_batch(step);
      auto x = data.narrow(1, 0, cfg.context), y = data.narrow(1, 1, cfg.context);
      pg->barrier();
      if (step == warmup) bytes_before = comm_bytes();
      const auto t0 = std::chrono::steady_clock::now();
      opt.zero_grad();
      auto loss = fsdp::models::gpt_loss(forward(x), y);
      loss.backward();
      opt.step();
      const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      last_loss = loss.item<double>();
      if (step >= warmup) times.push_back(dt);
      trace("after step " + std::to_string(step));
    }
    const uint64_t bytes_per_step = steps > 0 ? (comm_bytes() - bytes_before) / static_cast<uint64_t>(steps) : 0;
    std::sort(times.begin(), times.end());
    const double median = times.empty() ? 0 : times[times.size() / 2];
    // Every rank's peak RSS, gathered on all ranks.
    std::ostringstream mine;
    mine << std::fixed << std::setprecision(1) << peak_rss_mb();
    auto rss = pg->all_gather_bytes(mine.str());
    if (pg->rank() == 0) {
      std::ostringstream js;
      js << "{\"strategy\":\"" << (local ? "local" : fsdp::to_string(fsdp::parse_sharding_strategy(strategy)))
         << "\",\"world\":" << pg->size() << ",\"params\":" << params << ",\"dim\":" << cfg.dim
         << ",\"layers\":" << cfg.layers << ",\"heads\":" << cfg.heads << ",\"ctx\":" << cfg.context
         << ",\"batch_per_rank\":" << batch << ",\"bf16\":" << (bf16 ? "true" : "false")
         << ",\"activation_checkpointing\":" << (checkpointing ? "true" : "false")
         << ",\"step_s\":" << median << ",\"tokens_per_s\":"
         << (median > 0 ? static_cast<double>(batch * cfg.context * pg->size()) / median : 0)
         << ",\"peak_rss_mb\":[";
      for (size_t i = 0; i < rss.size(); ++i) js << (i ? "," : "") << rss[i];
      js << "],\"bytes_sent_per_step\":" << bytes_per_step << ",\"loss\":" << last_loss << "}";
      std::cout << js.str() << std::endl;
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "fsdp-bench: " << e.what() << std::endl;
    return 1;
  }
}
