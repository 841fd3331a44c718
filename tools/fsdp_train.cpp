// fsdp-train: trains a byte-level GPT with fsdp-cpp (run it under fsdp-run),
// or generates text from one of its checkpoints.
//   fsdp-run --nproc-per-node 2 -- fsdp-train --preset tiny --steps 100 --out runs/tiny
//   fsdp-run --nproc-per-node 1 -- fsdp-train generate --checkpoint runs/tiny/checkpoints/step-00000100 --prompt "the"
#include <CLI/CLI.hpp>
#include <c10/util/Exception.h>

#include <charconv>
#include <cstdlib>
#include <limits>
#include <iostream>
#include <string>

#include "fsdp/error.h"
#include "fsdp/train/gpt_trainer.h"

namespace {

// Prints "fsdp-train: <what>" to stderr in one write, so that the lines of
// ranks sharing one output (mpirun's, a terminal) never interleave; status 1.
int fail(const std::string& what) {
  const std::string line = "fsdp-train: " + what + "\n";
  std::cerr.write(line.data(), static_cast<std::streamsize>(line.size()));
  std::cerr.flush();
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fsdp-train: a byte-level GPT trained with Fully Sharded Data Parallel"};
  fsdp::train::TrainConfig c;
  int64_t dim = 0, layers = 0, heads = 0, context = 0;
  app.add_option("--preset", c.preset, "model size: tiny, default, 100m")->capture_default_str();
  app.add_option("--dim", dim, "model width (overrides the preset)");
  app.add_option("--layers", layers, "transformer blocks (overrides the preset)");
  app.add_option("--heads", heads, "attention heads (overrides the preset)");
  app.add_option("--context", context, "tokens per sample (overrides the preset)");
  app.add_option("--steps", c.steps, "training steps")->capture_default_str();
  app.add_option("--batch", c.batch, "sequences per rank per step")->capture_default_str();
  app.add_option("--lr", c.lr, "AdamW's peak learning rate (on --resume: applies from the resumed step)")
      ->capture_default_str();
  app.add_option("--warmup-steps", c.warmup_steps, "steps of linear warm-up to --lr; default (-1): a fifth of --steps");
  app.add_option("--min-lr", c.min_lr, "learning rate at the last step (cosine decay from --lr); default (-1): a tenth of --lr");
  app.add_option("--out", c.out, "run directory (metrics.jsonl, checkpoints/)")->capture_default_str();
  app.add_option("--data", c.data, "text file to train on (default: a generated corpus)");
  app.add_option("--save-every", c.save_every, "checkpoint every N steps (0: at the end only)")->capture_default_str();
  app.add_option("--keep", c.keep, "checkpoints to keep")->capture_default_str();
  auto* resume = app.add_flag("--resume", c.resume,
                              "continue the run in --out from its newest checkpoint that verifies (a damaged one is "
                              "moved aside; automatic after an fsdp-run --max-restarts restart)");
  app.add_option("--resume-from", c.resume_from,
                 "continue from this checkpoint (any run's); after a restart, the run's own newest checkpoint once "
                 "it has one");
  app.add_flag("--overwrite", c.overwrite,
               "start a new run in an --out that holds one: removes its run.json, metrics.jsonl, train.log, "
               "loss.svg and the checkpoints of its run; anything else there stays, named (a new run into a used "
               "--out is refused otherwise)")
      ->excludes(resume);
  app.add_flag("--allow-data-change", c.allow_data_change,
               "resume although the --data file's contents changed since the checkpoint (same path, other size or "
               "sampled pages); without it such a resume is refused");
  // The strategy's settings: read into these (their defaults are the
  // strategy's, c.strategy's), and set on c.strategy below, enums parsed and
  // named in errors there.
  fsdp::FSDPStrategyOptions& so = c.strategy;
  std::string state_dict_type = fsdp::to_string(so.state_dict_type()), sharding = fsdp::to_string(so.sharding_strategy()),
              backward_prefetch = fsdp::to_string(so.backward_prefetch()), precision = so.precision(), mesh;
  bool checkpointing = fsdp::train::activation_checkpointing(so), cpu_offload = so.cpu_offload().offload_params,
       forward_prefetch = so.forward_prefetch(), no_limit = !so.limit_all_gathers();
  uint64_t seed = so.seed();
  app.add_option("--state-dict-type", state_dict_type, "checkpoint format: full or sharded")->capture_default_str();
  app.add_option("--sharding-strategy", sharding, "FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD")
      ->capture_default_str();
  app.add_option("--precision", precision,
                 "32-true, bf16-mixed, bf16-true, 16-mixed, 16-true (16-*: made for CUDA; on CPU only with "
                 "LibTorch 2.x, with a warning)")
      ->capture_default_str();
  std::string on_nonfinite = fsdp::train::to_string(c.on_nonfinite_loss);
  app.add_option("--on-nonfinite-loss", on_nonfinite,
                 "a step whose loss is NaN or inf: stop (before updating the weights; --resume continues from the "
                 "last checkpoint) or skip its optimizer step and go on")
      ->capture_default_str();
  app.add_flag("--activation-checkpointing", checkpointing, "recompute each block's activations in backward");
  app.add_flag("--cpu-offload", cpu_offload, "keep shards on CPU (no-op on CPU builds)");
  app.add_option("--seed", seed, "data and initialisation seed")->capture_default_str();
  bool eager_init = false;
  app.add_flag("--eager-init", eager_init,
               "build the whole model on every rank before sharding (default: each block gets its memory when "
               "sharded; the same initial values)");
  app.add_option("--log-every", c.log_every, "steps between log lines (when not on a terminal)")->capture_default_str();
  app.add_option("--eval-every", c.eval_every, "held-out loss every N steps (0: never)")->capture_default_str();
  app.add_option("--logger", c.loggers,
                 "loggers, comma-separated: tensorboard (event files in --out), csv (--out/csv/version_N/metrics.csv), "
                 "jsonl (--out/metrics.jsonl, every step; the loss curve reads it), or none")
      ->capture_default_str();
  app.add_option("--profile-steps", c.profile_steps,
                 "A:B: record steps A to B with LibTorch's profiler; a Chrome trace per rank in "
                 "--out/profile/rank_<r>.pt.trace.json");
  app.add_option("--mesh", mesh, "R,S: HYBRID_SHARD over R replicas of S-rank shard groups (R*S = world)");
  app.add_flag("--forward-prefetch,!--no-forward-prefetch", forward_prefetch,
               "gather the next unit while this one computes (default: on)");
  app.add_option("--backward-prefetch", backward_prefetch, "pre, post or none")->capture_default_str();
  app.add_flag("--no-limit-all-gathers", no_limit, "let prefetching gather more than two units at once");
  bool print_config = false;
  app.add_flag("--print-config", print_config,
               "print the configuration these flags make (JSON: the run's settings and the strategy's) and exit");

  auto* gen = app.add_subcommand("generate", "continue a prompt with a trained checkpoint");
  std::string checkpoint, prompt = "the ";
  fsdp::train::GenerateOptions go;
  gen->add_option("--checkpoint", checkpoint, "checkpoint file or directory")->required();
  gen->add_option("--prompt", prompt, "text to continue")->capture_default_str();
  // As text, parsed below: CLI11 saturates an integer beyond 64 bits instead of refusing it.
  std::string tokens = std::to_string(go.tokens);
  gen->add_option("--tokens", tokens, "bytes to generate (printed as they are drawn)")->capture_default_str();
  gen->add_option("--temperature", go.temperature, "sampling temperature; 0: greedy")->capture_default_str();
  gen->add_option("--top-k", go.top_k, "sample among the k most likely bytes; 0: all")->capture_default_str();
  gen->add_option("--seed", go.seed, "sampling seed")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    if (gen->parsed()) {
      auto world = fsdp::dist::init_process_group_from_env();
      {
        const char* end = tokens.data() + tokens.size();
        const auto [ptr, ec] = std::from_chars(tokens.data(), end, go.tokens);
        if (ec != std::errc() || ptr != end || go.tokens < 0) {
          throw fsdp::ConfigError("generate: --tokens " + tokens + " is not a count of bytes: expected an integer from 0 to " +
                                  std::to_string(std::numeric_limits<int64_t>::max()));
        }
      }
      // Rank 0 prints the text as it grows: the prompt once the checkpoint
      // loaded, then each byte as it is drawn.
      const bool printer = world->rank() == 0;
      fsdp::train::generate_stream(checkpoint, prompt, go, world, [&](char ch) {
        if (printer) std::cout << ch << std::flush;
      });
      if (printer) std::cout << std::endl;
      return 0;
    }
    // A restart (by fsdp-run --max-restarts, or torchrun's) continues the run
    // it restarts from its newest checkpoint, --overwrite applying to the
    // job's first start only: train() tells a restart by proof
    // (fsdp::train::job_token), never by TORCHELASTIC_RESTART_COUNT alone.
    // A bad name is an error naming its flag.
    auto named = [](const char* flag, const auto& parse) {
      try {
        return parse();
      } catch (const fsdp::ConfigError& e) {
        throw fsdp::ConfigError(std::string(flag) + ": " + e.what());
      }
    };
    so.state_dict_type(named("--state-dict-type", [&] { return fsdp::parse_checkpoint_format(state_dict_type); }));
    so.sharding_strategy(named("--sharding-strategy", [&] { return fsdp::parse_sharding_strategy(sharding); }));
    so.backward_prefetch(named("--backward-prefetch", [&] { return fsdp::parse_backward_prefetch(backward_prefetch); }));
    named("--precision", [&] { return &so.precision(precision); });
    if (!mesh.empty()) {
      const auto [replicate, shard] = fsdp::train::parse_mesh(mesh);  // names --mesh in its error
      so.sharding_strategy(fsdp::ShardingStrategy::kHybridShard).device_mesh(replicate, shard);
    }
    if (checkpointing) so.activation_checkpointing_module_types<fsdp::models::GPTBlockImpl>();
    so.cpu_offload(cpu_offload).seed(seed).forward_prefetch(forward_prefetch).limit_all_gathers(!no_limit);
    c.on_nonfinite_loss = named("--on-nonfinite-loss", [&] { return fsdp::train::parse_nonfinite_loss(on_nonfinite); });
    c.empty_init = !eager_init;
    c.model = fsdp::train::preset(c.preset);
    if (dim) c.model.dim = dim;
    if (layers) c.model.layers = layers;
    if (heads) c.model.heads = heads;
    if (context) c.model.context = context;
    if (print_config) {
      fsdp::train::validate_settings(c);  // the errors a run gives; nothing is written
      std::cout << fsdp::train::config_json(c) << std::endl;
      return 0;
    }
    fsdp::train::train(c, fsdp::dist::init_process_group_from_env());
    return 0;
  } catch (const c10::Error& e) {
    return fail(e.what_without_backtrace());  // no LibTorch stack trace
  } catch (const std::exception& e) {
    return fail(e.what());
  }
}
