// fsdp-train's run settings, one row each (fsdp/train/run_settings.h), and
// what is printed from the rows alone: --print-config, the
// hyperparameters, the loss curve's title.
#include "fsdp/train/run_settings.h"

#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <limits>
#include <sstream>
#include <string>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "fsdp/error.h"
#include "fsdp/text/bytes_json.h"
#include "fsdp/train/batches.h"  // check_data_format

namespace fsdp::train {

namespace {

// The flag's text as an integer of type T; ConfigError naming the flag otherwise.
template <class T>
T whole(const char* flag, const std::string& text) {
  T v{};
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec != std::errc() || ptr != end) {
    throw ConfigError(std::string(flag) + " '" + text + "': expected an integer from " +
                      std::to_string(std::numeric_limits<T>::min()) + " to " +
                      std::to_string(std::numeric_limits<T>::max()));
  }
  return v;
}

double number(const char* flag, const std::string& text) {
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE) {
    throw ConfigError(std::string(flag) + " '" + text + "': expected a number");
  }
  return v;
}

// `set`, its ConfigError prefixed with "<flag>: " (a parser's error names the value, not the flag).
template <class F>
void named(const char* flag, F set) {
  try {
    set();
  } catch (const ConfigError& e) {
    throw ConfigError(std::string(flag) + ": " + e.what());
  }
}

using C = TrainConfig;
using V = SettingValue;
const FSDPStrategyOptions& S(const C& c) { return c.strategy; }

// Rows: name, flag, off_flag, is_switch, help, help_shows_default,
// may_change_on_resume, record, digest_place, digest_label, hyperparameter,
// in_title, get, set, empty_text.
std::vector<RunSetting> make_table() {
  return {
      {"preset", "--preset", nullptr, false, "model size: tiny, default, 100m (sets --context, --dim, --layers, --heads)",
       true, true, nullptr, 0, nullptr, true, true, [](const C& c) -> V { return c.preset; },
       [](C& c, const std::string& t) {
         c.model = preset(t);
         c.preset = t;
       },
       nullptr},
      {"model.vocab", "--vocab", nullptr, false,
       "token ids the model knows (256: bytes; a --data file of token ids needs its tokenizer's vocabulary)", true,
       false, "model.vocab", 1, "vocab", false, false, [](const C& c) -> V { return c.model.vocab_size; },
       [](C& c, const std::string& t) { c.model.vocab_size = whole<int64_t>("--vocab", t); }, nullptr},
      {"model.context", "--context", nullptr, false, "tokens per sample (overrides the preset)", false, false,
       "model.context", 2, "context", true, true, [](const C& c) -> V { return c.model.context; },
       [](C& c, const std::string& t) { c.model.context = whole<int64_t>("--context", t); }, nullptr},
      {"model.dim", "--dim", nullptr, false, "model width (overrides the preset)", false, false, "model.dim", 3, "dim",
       true, true, [](const C& c) -> V { return c.model.dim; },
       [](C& c, const std::string& t) { c.model.dim = whole<int64_t>("--dim", t); }, nullptr},
      {"model.layers", "--layers", nullptr, false, "transformer blocks (overrides the preset)", false, false,
       "model.layers", 4, "layers", true, true, [](const C& c) -> V { return c.model.layers; },
       [](C& c, const std::string& t) { c.model.layers = whole<int64_t>("--layers", t); }, nullptr},
      {"model.heads", "--heads", nullptr, false, "attention heads (overrides the preset)", false, false, "model.heads",
       5, "heads", true, false, [](const C& c) -> V { return c.model.heads; },
       [](C& c, const std::string& t) { c.model.heads = whole<int64_t>("--heads", t); }, nullptr},
      {"model.source", "--model", nullptr, false,
       "gpt (the byte-level GPT of --preset), llama (a Llama-family decoder from --config, initialised from --seed) "
       "or hf:DIR (a Hugging Face model directory: its config.json, and its weights, each rank reading only its "
       "shards' bytes)",
       true, false, "model.source", 17, "model", true, false, [](const C& c) -> V { return c.model_source; },
       [](C& c, const std::string& t) { c.model_source = t; }, nullptr},
      {"model.config", "--config", nullptr, false, "the config.json of --model llama (Hugging Face's)", false, true,
       "model.config", 18, "config", true, false, [](const C& c) -> V { return c.model_config; },
       [](C& c, const std::string& t) { c.model_config = t; }, "(none)"},
      {"model.lora_rank", "--lora-rank", nullptr, false,
       "LoRA adapters of this rank on a Llama's projections, the base frozen (0: full fine-tuning; needs --engine "
       "fsdp2)",
       true, false, "model.lora_rank", 19, "lora_rank", true, false, [](const C& c) -> V { return c.lora.rank; },
       [](C& c, const std::string& t) { c.lora.rank = whole<int64_t>("--lora-rank", t); }, nullptr},
      {"model.lora_alpha", "--lora-alpha", nullptr, false, "LoRA's alpha: the adapters' output is scaled by alpha / rank",
       true, false, "model.lora_alpha", 20, "lora_alpha", true, false, [](const C& c) -> V { return c.lora.alpha; },
       [](C& c, const std::string& t) { c.lora.alpha = number("--lora-alpha", t); }, nullptr},
      {"model.lora_targets", "--lora-targets", nullptr, false,
       "the projections that get adapters, comma-separated: of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, "
       "down_proj",
       true, false, "model.lora_targets", 21, "lora_targets", true, false,
       [](const C& c) -> V { return models::lora_targets_text(c.lora.targets); },
       [](C& c, const std::string& t) { c.lora.targets = models::parse_lora_targets(t); }, nullptr},
      {"save_hf", "--save-hf", nullptr, false,
       "at the end, the model as a Hugging Face directory DIR that transformers loads (with --lora-rank: the "
       "adapters as PEFT's); DIR must not exist",
       false, true, nullptr, 0, nullptr, false, false, [](const C& c) -> V { return c.save_hf; },
       [](C& c, const std::string& t) { c.save_hf = t; }, "(none)"},
      {"steps", "--steps", nullptr, false, "training steps", true, true, "run.steps", 9, "steps", true, false,
       [](const C& c) -> V { return c.steps; }, [](C& c, const std::string& t) { c.steps = whole<int64_t>("--steps", t); },
       nullptr},
      {"batch", "--batch", nullptr, false, "sequences per rank per step", true, true, "run.batch", 10, "batch", true,
       true, [](const C& c) -> V { return c.batch; },
       [](C& c, const std::string& t) { c.batch = whole<int64_t>("--batch", t); }, nullptr},
      {"lr", "--lr", nullptr, false, "AdamW's peak learning rate (on --resume: applies from the resumed step)", true,
       true, "run.lr", 6, "lr", true, true, [](const C& c) -> V { return c.lr; },
       [](C& c, const std::string& t) { c.lr = number("--lr", t); }, nullptr},
      {"warmup_steps", "--warmup-steps", nullptr, false,
       "steps of linear warm-up to --lr; default (-1): a fifth of --steps", false, true, "run.warmup_steps", 8,
       "warmup", true, false, [](const C& c) -> V { return warmup_steps(c); },
       [](C& c, const std::string& t) { c.warmup_steps = whole<int64_t>("--warmup-steps", t); }, nullptr},
      {"min_lr", "--min-lr", nullptr, false,
       "learning rate at the last step (cosine decay from --lr); default (-1): a tenth of --lr", false, true,
       "run.min_lr", 7, "min_lr", true, false, [](const C& c) -> V { return min_learning_rate(c); },
       [](C& c, const std::string& t) { c.min_lr = number("--min-lr", t); }, nullptr},
      {"on_nonfinite_loss", "--on-nonfinite-loss", nullptr, false,
       "a step whose loss is NaN or inf: stop (before updating the weights; --resume continues from the last "
       "checkpoint) or skip its optimizer step and go on",
       true, true, nullptr, 0, nullptr, false, false, [](const C& c) -> V { return to_string(c.on_nonfinite_loss); },
       [](C& c, const std::string& t) {
         named("--on-nonfinite-loss", [&] { c.on_nonfinite_loss = parse_nonfinite_loss(t); });
       },
       nullptr},
      {"out", "--out", nullptr, false, "run directory (metrics.jsonl, checkpoints/)", true, true, nullptr, 0, nullptr,
       false, false, [](const C& c) -> V { return c.out; }, [](C& c, const std::string& t) { c.out = t; }, nullptr},
      {"data", "--data", nullptr, false,
       "data file to train on: text, or token ids (--data-format; default: a generated corpus)", false, true,
       "run.data", 12, "data", true, false, [](const C& c) -> V { return c.data; }, [](C& c, const std::string& t) { c.data = t; },
       "(the generated corpus)"},
      {"data_format", "--data-format", nullptr, false,
       "how --data holds its tokens: text (its bytes), uint16 or uint32 (raw little-endian token ids, nanoGPT's .bin), "
       "auto (llm.c's header when the file has one, else text)",
       true, true, "run.data_format", 0, nullptr, false, false, [](const C& c) -> V { return c.data_format; },
       [](C& c, const std::string& t) {
         check_data_format(t);
         c.data_format = t;
       },
       nullptr},
      {"save_every", "--save-every", nullptr, false, "checkpoint every N steps (0: at the end only)", true, true,
       nullptr, 0, nullptr, false, false, [](const C& c) -> V { return c.save_every; },
       [](C& c, const std::string& t) { c.save_every = whole<int64_t>("--save-every", t); }, nullptr},
      {"keep", "--keep", nullptr, false, "checkpoints to keep", true, true, nullptr, 0, nullptr, false, false,
       [](const C& c) -> V { return int64_t{c.keep}; }, [](C& c, const std::string& t) { c.keep = whole<int>("--keep", t); },
       nullptr},
      {"resume", "--resume", nullptr, true,
       "continue the run in --out from its newest checkpoint that verifies (a damaged one is moved aside; automatic "
       "after an fsdp-run --max-restarts restart)",
       false, true, nullptr, 0, nullptr, false, false, [](const C& c) -> V { return c.resume; },
       [](C& c, const std::string& t) { c.resume = t == "true"; }, nullptr},
      {"resume_from", "--resume-from", nullptr, false,
       "continue from this checkpoint (any run's); after a restart, the run's own newest checkpoint once it has one",
       false, true, nullptr, 0, nullptr, false, false, [](const C& c) -> V { return c.resume_from; },
       [](C& c, const std::string& t) { c.resume_from = t; }, nullptr},
      {"overwrite", "--overwrite", nullptr, true,
       "start a new run in an --out that holds one: removes its run.json, metrics.jsonl, train.log, loss.svg and the "
       "checkpoints of its run; anything else there stays, named (a new run into a used --out is refused otherwise)",
       false, true, nullptr, 0, nullptr, false, false, [](const C& c) -> V { return c.overwrite; },
       [](C& c, const std::string& t) { c.overwrite = t == "true"; }, nullptr},
      {"empty_init", "--eager-init", nullptr, true,
       "build the whole model on every rank before sharding (default: each block gets its memory when sharded; the "
       "same initial values)",
       false, true, nullptr, 0, nullptr, false, false, [](const C& c) -> V { return c.empty_init; },
       [](C& c, const std::string& t) { c.empty_init = t != "true"; }, nullptr},
      {"allow_data_change", "--allow-data-change", nullptr, true,
       "resume although the --data file's contents changed since the checkpoint (same path, other size or sampled "
       "pages); without it such a resume is refused",
       false, true, nullptr, 0, nullptr, false, false, [](const C& c) -> V { return c.allow_data_change; },
       [](C& c, const std::string& t) { c.allow_data_change = t == "true"; }, nullptr},
      {"allow_tokenizer_change", "--allow-tokenizer-change", nullptr, true,
       "train a --model hf:DIR on a --data file that fsdp-train prepare made with another tokenizer (its recorded "
       "fingerprint differs from DIR's); without it such a run is refused",
       false, true, nullptr, 0, nullptr, false, false, [](const C& c) -> V { return c.allow_tokenizer_change; },
       [](C& c, const std::string& t) { c.allow_tokenizer_change = t == "true"; }, nullptr},
      {"log_every", "--log-every", nullptr, false, "steps between log lines (when not on a terminal)", true, true,
       nullptr, 0, nullptr, false, false, [](const C& c) -> V { return c.log_every; },
       [](C& c, const std::string& t) { c.log_every = whole<int64_t>("--log-every", t); }, nullptr},
      {"eval_every", "--eval-every", nullptr, false, "held-out loss every N steps (0: never)", true, true, nullptr, 0,
       nullptr, false, false, [](const C& c) -> V { return c.eval_every; },
       [](C& c, const std::string& t) { c.eval_every = whole<int64_t>("--eval-every", t); }, nullptr},
      {"loggers", "--logger", nullptr, false,
       "loggers, comma-separated: tensorboard (event files in --out), csv (--out/csv/version_N/metrics.csv), jsonl "
       "(--out/metrics.jsonl, every step; the loss curve reads it), or none",
       true, true, nullptr, 0, nullptr, false, false, [](const C& c) -> V { return c.loggers; },
       [](C& c, const std::string& t) { c.loggers = t; }, nullptr},
      {"profile_steps", "--profile-steps", nullptr, false,
       "A:B: record steps A to B with LibTorch's profiler; a Chrome trace per rank in "
       "--out/profile/rank_<r>.pt.trace.json",
       false, true, nullptr, 0, nullptr, false, false, [](const C& c) -> V { return c.profile_steps; },
       [](C& c, const std::string& t) { c.profile_steps = t; }, nullptr},
      {"engine", "--engine", nullptr, false,
       "fsdp1 (FullyShardedDataParallel) or fsdp2 (fully_shard); checkpoints load into either", true, true, nullptr,
       0, nullptr, true, false, [](const C& c) -> V { return std::string(to_string(c.engine)); },
       [](C& c, const std::string& t) { named("--engine", [&] { c.engine = parse_engine(t); }); },
       nullptr},
      {"strategy.sharding_strategy", "--sharding-strategy", nullptr, false,
       "FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD", true, true, "run.sharding_strategy", 14, "sharding", true,
       true, [](const C& c) -> V { return std::string(to_string(S(c).sharding_strategy())); },
       [](C& c, const std::string& t) {
         named("--sharding-strategy", [&] { c.strategy.sharding_strategy(parse_sharding_strategy(t)); });
       },
       nullptr},
      {"strategy.state_dict_type", "--state-dict-type", nullptr, false, "checkpoint format: full or sharded", true,
       true, "run.state_dict_type", 15, "format", false, false,
       [](const C& c) -> V { return std::string(to_string(S(c).state_dict_type())); },
       [](C& c, const std::string& t) {
         named("--state-dict-type", [&] { c.strategy.state_dict_type(parse_checkpoint_format(t)); });
       },
       nullptr},
      {"strategy.precision", "--precision", nullptr, false,
       "32-true, bf16-mixed, bf16-true, 16-mixed, 16-true (16-*: made for CUDA; on CPU only with LibTorch 2.x, with "
       "a warning)",
       true, true, "run.precision", 13, "precision", true, true, [](const C& c) -> V { return S(c).precision(); },
       [](C& c, const std::string& t) { named("--precision", [&] { c.strategy.precision(t); }); }, nullptr},
      {"strategy.cpu_offload", "--cpu-offload", nullptr, true, "keep shards on CPU (no-op on CPU builds)", false, true,
       nullptr, 0, nullptr, false, false, [](const C& c) -> V { return S(c).cpu_offload().offload_params; },
       [](C& c, const std::string& t) { c.strategy.cpu_offload(t == "true"); }, nullptr},
      {"strategy.seed", "--seed", nullptr, false, "data and initialisation seed", true, true, "run.seed", 11, "seed",
       true, false, [](const C& c) -> V { return S(c).seed(); },
       [](C& c, const std::string& t) { c.strategy.seed(whole<uint64_t>("--seed", t)); }, nullptr},
      {"strategy.activation_checkpointing", "--activation-checkpointing", nullptr, true,
       "recompute each block's activations in backward", false, true, nullptr, 0, nullptr, true, false,
       [](const C& c) -> V { return activation_checkpointing(S(c)); },
       [](C& c, const std::string& t) {
         if (t == "true") c.strategy.activation_checkpointing_module_types<models::GPTBlockImpl>();
       },
       nullptr},
      {"strategy.mesh", "--mesh", nullptr, false, "R,S: HYBRID_SHARD over R replicas of S-rank shard groups (R*S = world)",
       false, true, "run.mesh", 16, "mesh", false, false, [](const C& c) -> V { return mesh_name(S(c)); },
       [](C& c, const std::string& t) {
         const auto [replicate, shard] = parse_mesh(t);  // names --mesh in its error
         c.strategy.sharding_strategy(ShardingStrategy::kHybridShard).device_mesh(replicate, shard);
       },
       "(none)"},
      {"strategy.use_orig_params", "", nullptr, false, "", false, true, nullptr, 0, nullptr, false, false,
       [](const C& c) -> V { return S(c).use_orig_params(); }, nullptr, nullptr},
      {"strategy.forward_prefetch", "--forward-prefetch", "--no-forward-prefetch", true,
       "gather the next unit while this one computes (default: on)", false, true, nullptr, 0, nullptr, false, false,
       [](const C& c) -> V { return S(c).forward_prefetch(); },
       [](C& c, const std::string& t) { c.strategy.forward_prefetch(t == "true"); }, nullptr},
      {"strategy.backward_prefetch", "--backward-prefetch", nullptr, false, "pre, post or none", true, true, nullptr, 0,
       nullptr, false, false, [](const C& c) -> V { return std::string(to_string(S(c).backward_prefetch())); },
       [](C& c, const std::string& t) {
         named("--backward-prefetch", [&] { c.strategy.backward_prefetch(parse_backward_prefetch(t)); });
       },
       nullptr},
      {"strategy.limit_all_gathers", "--no-limit-all-gathers", nullptr, true,
       "let prefetching gather more than two units at once", false, true, nullptr, 0, nullptr, false, false,
       [](const C& c) -> V { return S(c).limit_all_gathers(); },
       [](C& c, const std::string& t) { c.strategy.limit_all_gathers(t != "true"); }, nullptr},
      {"strategy.sync_module_states", "", nullptr, false, "", false, true, nullptr, 0, nullptr, false, false,
       [](const C& c) -> V { return S(c).sync_module_states(); }, nullptr, nullptr},
      {"strategy.max_reductions_in_flight", "", nullptr, false, "", false, true, nullptr, 0, nullptr, false, false,
       [](const C& c) -> V { return int64_t{S(c).fsdp().max_reductions_in_flight()}; }, nullptr, nullptr},
  };
}

}  // namespace

std::string short_name(const RunSetting& row) {
  const std::string name = row.name;
  return name.substr(name.rfind('.') + 1);
}

std::string setting_text(const SettingValue& v) {
  std::ostringstream os;
  std::visit(
      [&](const auto& x) {
        if constexpr (std::is_same_v<std::decay_t<decltype(x)>, bool>) {
          os << (x ? "true" : "false");
        } else {
          os << x;
        }
      },
      v);
  return os.str();
}

const std::vector<RunSetting>& run_settings() {
  static const std::vector<RunSetting> table = make_table();
  return table;
}

const RunSetting* find_setting(const std::string& name) {
  for (const auto& row : run_settings()) {
    if (name == row.name) return &row;
  }
  return nullptr;
}

std::string config_json(const TrainConfig& c) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (const auto& row : run_settings()) {
    const std::string name = row.name;
    const auto dot = name.find('.');
    nlohmann::ordered_json& at = dot == std::string::npos ? j[name] : j[name.substr(0, dot)][name.substr(dot + 1)];
    // Paths and names are bytes: held losslessly (fsdp/text/bytes_json.h).
    std::visit(
        [&](const auto& x) {
          if constexpr (std::is_same_v<std::decay_t<decltype(x)>, std::string>) {
            at = text::escape_bytes(x);
          } else {
            at = x;
          }
        },
        row.get(c));
  }
  return text::json_text(j.dump());
}

Hyperparameters hyperparameters(const TrainConfig& c, int world) {
  Hyperparameters out;
  for (const auto& row : run_settings()) {
    if (!row.hyperparameter) continue;
    std::visit(
        [&](const auto& x) {
          using T = std::decay_t<decltype(x)>;
          HyperparameterValue& h = out[short_name(row)];
          if constexpr (std::is_same_v<T, uint64_t>) {
            h = static_cast<int64_t>(x);  // as a checkpoint records it
          } else if constexpr (std::is_same_v<T, std::string>) {
            h = x.empty() && row.empty_text ? std::string(row.empty_text) : x;
          } else {
            h = x;
          }
        },
        row.get(c));
  }
  out["world"] = int64_t{world};
  return out;
}

std::string loss_curve_title(const TrainConfig& c, int world) {
  std::string title = "fsdp-train";
  for (const auto& row : run_settings()) {
    if (row.in_title) title += std::string(" ") + row.flag + " " + setting_text(row.get(c));
  }
  return title + ", world " + std::to_string(world);
}

}  // namespace fsdp::train
