// fsdp-bench: trains the GPT decoder of fsdp/models/gpt.h with one sharding
// strategy (or unwrapped: --strategy local) and prints one JSON line from
// rank 0. Run it under fsdp-run; see docs/performance.md.
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <thread>

#include <cstdio>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <iomanip>
#include <iostream>
#include <optional>
#include <sstream>
#include <torch/torch.h>

#include "fsdp/core/activation_checkpointing.h"
#include "fsdp/checkpoint/checkpoint_io.h"
#include "fsdp/distributed/process_group.h"
#include "fsdp/error.h"
#include "fsdp/fsdp.h"
#include "fsdp/models/gpt.h"
#include "fsdp/observability/loggers.h"
#include "fsdp/observability/profiler.h"
#include "fsdp/strategy/engine.h"
#include "fsdp/core/trace_span.h"
#include "tensor_memory.h"

namespace {

double peak_rss_mb() {
  rusage r{};
  getrusage(RUSAGE_SELF, &r);
  return static_cast<double>(r.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB
}

// Samples this process's resident memory every few milliseconds while alive;
// peak() is the largest sample (ru_maxrss cannot be reset between phases).
class RssSampler {
 public:
  RssSampler() : thread_([this] {
    while (!stop_) {
      peak_ = std::max(peak_.load(), fsdp::resident_memory_mib());
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }) {}
  ~RssSampler() { stop(); }
  double stop() {
    if (thread_.joinable()) {
      stop_ = true;
      thread_.join();
    }
    return peak_;
  }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<double> peak_{0};
  std::thread thread_;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Writes `bytes` to `path` with plain buffered writes, then fsync: the disk's
// sequential write speed, for comparison.
void plain_write(const std::string& path, int64_t bytes) {
  std::vector<char> buf(8 << 20, 1);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw fsdp::Error("cannot create " + path);
  for (int64_t left = bytes; left > 0;) {
    const auto n = static_cast<size_t>(std::min<int64_t>(left, static_cast<int64_t>(buf.size())));
    if (::write(fd, buf.data(), n) != static_cast<ssize_t>(n)) throw fsdp::Error("write failed: " + path);
    left -= static_cast<int64_t>(n);
  }
  ::fsync(fd);
  ::close(fd);
}

int64_t dir_bytes(const std::string& path) {
  namespace fs = std::filesystem;
  if (fs::is_regular_file(path)) return static_cast<int64_t>(fs::file_size(path));
  int64_t n = 0;
  for (const auto& f : fs::directory_iterator(path)) n += static_cast<int64_t>(f.file_size());
  return n;
}

// --checkpoint: save and load the trained model and optimizer in both formats.
std::string checkpoint_bench(fsdp::dist::ProcessGroup& pg, const std::shared_ptr<torch::nn::Module>& model,
                             torch::optim::Optimizer& opt, const std::string& dir) {
  namespace fs = std::filesystem;
  const double train_peak = peak_rss_mb();
  const double largest_unit_mb = static_cast<double>(fsdp::memory_stats(model).largest_unit_bytes) / (1 << 20);  // 0: FSDP2
  fsdp::CheckpointState state;
  state.model("model", model).optimizer("optimizer", opt).value("step", int64_t{1});
  const std::string sharded = dir + "/sharded", full = dir + "/full.pt";
  if (pg.rank() == 0) fs::create_directories(dir);
  pg.barrier();
  auto timed = [&](const std::function<void()>& f) {
    pg.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    f();
    pg.barrier();
    return seconds_since(t0);
  };
  // The full save first, right after training: its peak is compared with training's.
  RssSampler sampler;
  const double save_full_s = timed([&] { fsdp::save_checkpoint(full, state, pg, {fsdp::CheckpointFormat::kFull}); });
  const double full_save_peak = sampler.stop();
  const double save_sharded_s = timed([&] { fsdp::save_checkpoint(sharded, state, pg, {fsdp::CheckpointFormat::kSharded}); });
  const int64_t bytes = dir_bytes(sharded);
  // The same bytes, split like the shards, written plainly by every rank at once.
  const double plain_s = timed([&] {
    plain_write(dir + "/plain-" + std::to_string(pg.rank()), bytes / pg.size());
  });
  fs::remove(dir + "/plain-" + std::to_string(pg.rank()));
  const double load_sharded_s = timed([&] { fsdp::load_checkpoint(sharded, state, pg); });
  const double load_full_s = timed([&] { fsdp::load_checkpoint(full, state, pg); });
  const double gb = static_cast<double>(bytes) / 1e9;
  std::ostringstream js;
  js << std::fixed << std::setprecision(3) << ",\"checkpoint\":{\"bytes\":" << bytes
     << ",\"disk_plain_write_gbps\":" << gb / plain_s << ",\"sharded_save_s\":" << save_sharded_s
     << ",\"sharded_save_gbps\":" << gb / save_sharded_s << ",\"sharded_save_vs_disk\":" << plain_s / save_sharded_s
     << ",\"sharded_load_s\":" << load_sharded_s << ",\"full_save_s\":" << save_full_s
     << ",\"full_save_gbps\":" << gb / save_full_s << ",\"full_load_s\":" << load_full_s
     << ",\"rank_peak_train_mb\":" << train_peak << ",\"rank_peak_full_save_mb\":" << full_save_peak
     << ",\"largest_unit_mb\":" << largest_unit_mb << ",\"full_save_extra_vs_unit\":"
     << (largest_unit_mb > 0 ? (full_save_peak - train_peak) / largest_unit_mb : 0.0) << "}";
  return js.str();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fsdp-bench: GPT training step time, throughput, memory and traffic per sharding strategy"};
  // The defaults of the FSDP settings are FSDPOptions' (fsdp/core/options.h), the only ones.
  const fsdp::FSDPOptions defaults;
  std::string strategy = fsdp::to_string(defaults.sharding_strategy());
  std::string engine = fsdp::to_string(fsdp::Engine::kFsdp1);
  fsdp::models::GPTConfig cfg;
  int64_t batch = 8;
  int steps = 5, warmup = 2;
  int reductions_in_flight = defaults.max_reductions_in_flight();
  bool eager_init = false;
  bool use_orig = defaults.use_orig_params(), forward_prefetch = defaults.forward_prefetch(), bf16 = false, trace_memory = false, checkpointing = false,
       tensor_memory = false;
  app.add_option("--strategy", strategy, "FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD or local")->capture_default_str();
  app.add_option("--engine", engine,
                 "fsdp1 (FullyShardedDataParallel) or fsdp2 (fully_shard per block and the root; FULL_SHARD, "
                 "SHARD_GRAD_OP: reshard_after_forward false, HYBRID_SHARD: a 2-D mesh)")
      ->capture_default_str();  // parsed by fsdp::parse_engine below: fsdp-train's error for a bad name
  app.add_option("--dim", cfg.dim, "model width")->capture_default_str();
  app.add_option("--layers", cfg.layers, "transformer blocks")->capture_default_str();
  app.add_option("--heads", cfg.heads, "attention heads")->capture_default_str();
  app.add_option("--ctx", cfg.context, "context length (tokens per sample)")->capture_default_str();
  app.add_option("--batch", batch, "samples per rank per step")->capture_default_str();
  app.add_option("--steps", steps, "timed steps")->capture_default_str();
  app.add_option("--warmup", warmup, "untimed steps first")->capture_default_str();
  app.add_flag("--use-orig-params", use_orig, "expose original parameters to the optimizer");
  app.add_option("--max-reductions-in-flight", reductions_in_flight,
                 "gradient reductions in flight at once (0: each waited where issued)")->capture_default_str();
  app.add_flag("--eager-init", eager_init, "build the whole model before sharding it (default: built sharded)");
  app.add_flag("--forward-prefetch,!--no-forward-prefetch", forward_prefetch,
               "prefetch the next unit in forward (default: on)");
  app.add_flag("--bf16", bf16, "mixed precision: bfloat16 compute and reduction");
  app.add_flag("--activation-checkpointing", checkpointing, "checkpoint every transformer block");
  app.add_flag("--trace-memory", trace_memory, "print each rank's resident memory after each phase to stderr");
  app.add_flag("--tensor-memory", tensor_memory,
               "count every CPU tensor allocation; print each rank's peak of live tensor bytes and the tensors "
               "live then, by size, to stderr (slower: measurement only)");
  std::string checkpoint_dir;
  app.add_option("--checkpoint", checkpoint_dir,
                 "after training, save and load the model and AdamW state in DIR in both formats and report speeds");
  std::string profile_steps, profile_dir = "profile", tensorboard_dir;
  app.add_option("--tensorboard", tensorboard_dir,
                 "rank 0 logs each step's loss, step time and communication counters to TensorBoard event files in DIR "
                 "(and reports the seconds that took)");
  app.add_option("--profile-steps", profile_steps,
                 "A:B: record steps A to B (1-based, warm-up steps included) with LibTorch's profiler");
  app.add_option("--profile-dir", profile_dir, "where --profile-steps writes rank_<r>.pt.trace.json")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  try {
    if (tensor_memory && !bench::kTensorMemory) throw fsdp::ConfigError("--tensor-memory needs LibTorch 2.4 or later");
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
    if (tensor_memory) bench::TensorMemory::install();
#endif
    fsdp::Engine engine_kind = fsdp::Engine::kFsdp1;
    try {
      engine_kind = fsdp::parse_engine(engine);  // the one name table (fsdp/strategy/engine.h)
    } catch (const fsdp::ConfigError& e) {
      throw fsdp::ConfigError(std::string("--engine: ") + e.what());  // as fsdp-train names it
    }
    const bool local = strategy == "local";
    auto trace = [&](const std::string& phase) {
      if (trace_memory) std::cerr << "memory: " << phase << ": " << fsdp::resident_memory_mib() << " MiB" << std::endl;
    };
    trace("start");
    fsdp::StepRange profiled;
    if (!profile_steps.empty()) {
      profiled = fsdp::parse_step_range(profile_steps, "--profile-steps");
      const int total = warmup + steps;
      if (profiled.last > total) {
        throw fsdp::ConfigError("--profile-steps '" + profile_steps + "': step " + std::to_string(profiled.last) +
                                " is past the last step (--warmup " + std::to_string(warmup) + " + --steps " +
                                std::to_string(steps) + " = " + std::to_string(total) +
                                "); expected A:B with 1 <= A <= B <= " + std::to_string(total));
      }
    }
    auto pg = fsdp::dist::init_process_group_from_env();
    if (local && pg->size() != 1) throw fsdp::ConfigError("--strategy local runs one process: use --nproc-per-node 1");
    torch::manual_seed(0);
    // Built sharded (empty_init): each block gets its memory when FSDP shards
    // it, so the whole model never exists on a rank.
    std::shared_ptr<fsdp::models::GPTImpl> gpt;
    {
      fsdp::EmptyInitGuard empty(!local && !eager_init);
      gpt = std::make_shared<fsdp::models::GPTImpl>(cfg);
    }
    int64_t params = 0;
    for (auto& p : gpt->parameters()) params += p.numel();

    std::vector<fsdp::dist::ProcessGroupPtr> groups{pg};
    std::shared_ptr<fsdp::Unit<fsdp::models::GPTImpl>> model;  // FullyShardedDataParallel or FullyShard
    const bool fsdp2 = engine_kind == fsdp::Engine::kFsdp2;
    std::function<at::Tensor(const at::Tensor&)> forward;
    std::vector<at::Tensor> trainable;
    if (local) {
      forward = [gpt](const at::Tensor& x) { return gpt->forward(x); };
      trainable = gpt->parameters();
    } else if (fsdp2) {
      const auto s = fsdp::parse_sharding_strategy(strategy);
      fsdp::Mesh mesh = fsdp::Mesh::of(pg);
      if (s == fsdp::ShardingStrategy::kHybridShard) {
        const int shard = pg->size() % 2 == 0 ? pg->size() / 2 : pg->size();
        const auto dm = fsdp::dist::init_device_mesh(pg, pg->size() / shard, shard);
        groups.push_back(dm.shard_group);
        groups.push_back(dm.replicate_group);
        mesh = fsdp::Mesh::hybrid(dm);
      } else if (s == fsdp::ShardingStrategy::kNoShard) {
        throw fsdp::ConfigError("--engine fsdp2: NO_SHARD has no fully_shard form (use FULL_SHARD, SHARD_GRAD_OP or "
                                "HYBRID_SHARD)");
      }
      fsdp::FullyShardOptions o(mesh);
      if (s == fsdp::ShardingStrategy::kShardGradOp) o.reshard_after_forward(false);
      if (bf16) o.mp_policy(fsdp::MixedPrecisionPolicy{torch::kBFloat16, torch::kBFloat16});
      model = std::make_shared<fsdp::FullyShard<fsdp::models::GPTImpl>>(
          gpt, o, fsdp::transformer_auto_wrap_policy<fsdp::models::GPTBlockImpl>());
      forward = [model](const at::Tensor& x) { return (*model)(x); };
      trainable = (*model)->parameters();
    } else {
      fsdp::FSDPOptions o;
      o.sharding_strategy(fsdp::parse_sharding_strategy(strategy));
      if (o.sharding_strategy() == fsdp::ShardingStrategy::kHybridShard) {
        const int shard = pg->size() % 2 == 0 ? pg->size() / 2 : pg->size();
        o.device_mesh(fsdp::dist::init_device_mesh(pg, pg->size() / shard, shard));
        groups.push_back(o.device_mesh()->shard_group);
        groups.push_back(o.device_mesh()->replicate_group);
      } else {
        o.process_group(pg);
      }
      o.auto_wrap_policy(fsdp::transformer_auto_wrap_policy<fsdp::models::GPTBlockImpl>());
      o.use_orig_params(use_orig);
      o.max_reductions_in_flight(reductions_in_flight);
      o.forward_prefetch(forward_prefetch);
      if (bf16) o.mixed_precision().param_dtype = torch::kBFloat16;
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
    fsdp::Profiler profiler;
    std::optional<fsdp::TensorBoardLogger> tensorboard;
    if (!tensorboard_dir.empty() && pg->rank() == 0) tensorboard.emplace(tensorboard_dir, "", std::string());
    if (tensorboard) tensorboard->open();
    double log_seconds = 0;
    uint64_t bytes_before = 0;
    double last_loss = 0;
    for (int step = 0; step < warmup + steps; ++step) {
      auto data = gen_batch(step);
      auto x = data.narrow(1, 0, cfg.context), y = data.narrow(1, 1, cfg.context);
      pg->barrier();
      if (step == warmup) bytes_before = comm_bytes();
      if (profiled.contains(step + 1) && !profiler.running()) profiler.start();
      const auto t0 = std::chrono::steady_clock::now();
      fsdp::detail::Span step_span;
      step_span.begin("step", std::to_string(step + 1));
      opt.zero_grad();
      auto loss = fsdp::models::gpt_loss(forward(x), y);
      loss.backward();
      {
        fsdp::detail::ScopedSpan optimizer_span("optimizer.step");
        opt.step();
      }
      step_span.end();
      const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (profiler.running() && step + 1 == profiled.last) {
        profiler.stop(profile_dir + "/rank_" + std::to_string(pg->rank()) + ".pt.trace.json");
      }
      last_loss = loss.item<double>();
      if (tensorboard) {
        const auto l0 = std::chrono::steady_clock::now();
        const fsdp::RuntimeStats now = local ? fsdp::RuntimeStats{} : fsdp::runtime_stats(model->ptr());
        tensorboard->log_metrics({{"loss", last_loss},
                                  {"step_s", dt},
                                  {"all_gather_wait_s", now.all_gather_wait_s},
                                  {"reduction_wait_s", now.reduction_wait_s},
                                  {"all_gather_bytes", static_cast<double>(now.all_gather_bytes)},
                                  {"reduction_bytes", static_cast<double>(now.reduction_bytes)}},
                                 step + 1);
        if (step >= warmup) log_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - l0).count();
      }
      if (step >= warmup) times.push_back(dt);
      trace("after step " + std::to_string(step));
    }
    const fsdp::RuntimeStats rt = local ? fsdp::RuntimeStats{} : fsdp::runtime_stats(model->ptr());
    const uint64_t bytes_per_step = steps > 0 ? (comm_bytes() - bytes_before) / static_cast<uint64_t>(steps) : 0;
    std::sort(times.begin(), times.end());
    const double median = times.empty() ? 0 : times[times.size() / 2];
    std::string checkpoint_json;
    if (!checkpoint_dir.empty()) {
      if (local) throw fsdp::ConfigError("--checkpoint needs an FSDP strategy, not local");
      checkpoint_json = checkpoint_bench(*pg, model->ptr(), opt, checkpoint_dir);
    }
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
    if (tensor_memory) std::cerr << "rank " << pg->rank() << ": " << bench::TensorMemory::install().report() << std::endl;
#endif
    // Every rank's peak RSS, gathered on all ranks.
    std::ostringstream mine;
    mine << std::fixed << std::setprecision(1) << peak_rss_mb();
    auto rss = pg->all_gather_bytes(mine.str());
    if (pg->rank() == 0) {
      std::ostringstream js;
      js << "{\"strategy\":\"" << (local ? "local" : fsdp::to_string(fsdp::parse_sharding_strategy(strategy)))
         << "\",\"engine\":\"" << (local ? "local" : fsdp::to_string(engine_kind)) << "\",\"world\":" << pg->size() << ",\"params\":" << params << ",\"dim\":" << cfg.dim
         << ",\"layers\":" << cfg.layers << ",\"heads\":" << cfg.heads << ",\"ctx\":" << cfg.context
         << ",\"batch_per_rank\":" << batch << ",\"bf16\":" << (bf16 ? "true" : "false")
         << ",\"activation_checkpointing\":" << (checkpointing ? "true" : "false")
         << ",\"step_s\":" << median;
      if (tensorboard) js << ",\"tensorboard_log_s_per_step\":" << log_seconds / std::max(1, steps);
      js << ",\"tokens_per_s\":"
         << (median > 0 ? static_cast<double>(batch * cfg.context * pg->size()) / median : 0)
         << ",\"peak_rss_mb\":[";
      for (size_t i = 0; i < rss.size(); ++i) js << (i ? "," : "") << rss[i];
      js << "],\"runtime\":{\"all_gathers\":" << rt.all_gathers << ",\"prefetches\":" << rt.prefetches
         << ",\"peak_all_gathers_in_flight\":" << rt.peak_all_gathers_in_flight
         << ",\"peak_units_unsharded\":" << rt.peak_units_unsharded << ",\"reductions\":" << rt.reductions
         << ",\"peak_reductions_in_flight\":" << rt.peak_reductions_in_flight
         << ",\"max_reductions_in_flight\":" << reductions_in_flight
         << ",\"forward_prefetch\":" << (forward_prefetch ? "true" : "false")
         << ",\"backward_prefetch\":\"" << fsdp::to_string(defaults.backward_prefetch()) << "\""
         << ",\"limit_all_gathers\":" << (defaults.limit_all_gathers() ? "true" : "false")
         << ",\"use_orig_params\":" << (use_orig ? "true" : "false")
         << ",\"all_gather_wait_s_per_step\":" << rt.all_gather_wait_s / std::max(1, warmup + steps)
         << ",\"reduction_wait_s_per_step\":" << rt.reduction_wait_s / std::max(1, warmup + steps) << "}";
      js << ",\"bytes_sent_per_step\":" << bytes_per_step << ",\"loss\":" << last_loss << checkpoint_json << "}";
      std::cout << js.str() << std::endl;
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "fsdp-bench: " << e.what() << std::endl;
    return 1;
  }
}
