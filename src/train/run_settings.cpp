// fsdp-train's run settings, one row each (fsdp/train/run_settings.h), and
// what is printed from the rows alone: --print-config, the
// hyperparameters, the loss curve's title.
#include "fsdp/train/run_settings.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <system_error>
#include <sstream>
#include <string>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "fsdp/error.h"
#include "fsdp/text/bytes_json.h"
#include "fsdp/observability/profiler.h"  // parse_step_range
#include "fsdp/train/batches.h"  // check_data_format
#include "fsdp/train/model_spec.h"  // model_sizes
#include "run_settings_impl.h"  // Row: how a row is built

namespace fsdp::train {

namespace {

using namespace rows;  // Row, C, V, S, whole, named
namespace fs = std::filesystem;

// ConfigError when `out` is the filesystem root or the home directory:
// --overwrite removes files there, and a run scatters its files into it.
void refuse_system_directory(const std::string& out) {
  std::error_code ec;
  const fs::path at = fs::weakly_canonical(fs::absolute(out, ec), ec);
  auto same = [&](const fs::path& other) {
    std::error_code e;
    return !other.empty() && fs::equivalent(at, other, e);
  };
  const char* home = std::getenv("HOME");
  if (same("/") || (home && *home && same(home))) {
    throw ConfigError("--out " + out + " is " + (same("/") ? "the filesystem root" : "the home directory") +
                      ": a run writes metrics.jsonl, train.log, run.json and checkpoints/ there (and --overwrite "
                      "removes them): expected a directory of the run's own, e.g. runs/latest");
  }
}

// The table, in --print-config's and --help's order; each row's flag,
// parser and range check together. Its order is also the configuration
// digest's (number_digest): the rows in the digest (.digest) keep their
// order, and a new one goes after the last of its kind (.digest_when_set:
// after model.lora_targets), or a run directory's digest would change.
std::vector<RunSetting> make_table() {
  std::vector<RunSetting> t;
  auto add = [&](Row&& row) { t.push_back(std::move(row).done()); };
  add(Row("preset", "--preset", "model size: tiny, default, 100m (sets --context, --dim, --layers, --heads)")
          .get([](const C& c) -> V { return c.preset; })
          .set([](C& c, const std::string& t) {
            c.model = preset(t);
            c.preset = t;
          })
          .hyperparameter()
          .title());
  add(Row("model.vocab", "--vocab",
          "token ids the model knows (256: bytes; a --data file of token ids needs its tokenizer's vocabulary)")
          .of(&C::model, &models::GPTConfig::vocab_size)
          .get([](const C& c) -> V { return model_sizes(c).vocab; })  // a Llama's: its config.json's
          .positive()
          .at_most(double(int64_t{1} << 31))  // what checkpoint_model_config takes back
          .fixed_on_resume()
          .record("model.vocab")
          .digest("vocab"));
  add(Row("model.context", "--context", "tokens per sample (overrides the preset)")
          .of(&C::model, &models::GPTConfig::context)
          .positive()
          .default_in_words()
          .fixed_on_resume()
          .record("model.context")
          .digest("context")
          .hyperparameter()
          .title());
  add(Row("model.dim", "--dim", "model width (overrides the preset)")
          .of(&C::model, &models::GPTConfig::dim)
          .get([](const C& c) -> V { return model_sizes(c).dim; })  // a Llama's: its config.json's
          .positive()
          .default_in_words()
          .fixed_on_resume()
          .record("model.dim")
          .digest("dim")
          .hyperparameter()
          .title());
  add(Row("model.layers", "--layers", "transformer blocks (overrides the preset)")
          .of(&C::model, &models::GPTConfig::layers)
          .get([](const C& c) -> V { return model_sizes(c).layers; })  // a Llama's: its config.json's
          .positive()
          .default_in_words()
          .fixed_on_resume()
          .record("model.layers")
          .digest("layers")
          .hyperparameter()
          .title());
  add(Row("model.heads", "--heads", "attention heads (overrides the preset)")
          .of(&C::model, &models::GPTConfig::heads)
          .get([](const C& c) -> V { return model_sizes(c).heads; })  // a Llama's: its config.json's
          .positive()
          .default_in_words()
          .fixed_on_resume()
          .record("model.heads")
          .digest("heads")
          .hyperparameter());
  add(Row("model.source", "--model",
          "gpt (the byte-level GPT of --preset), llama (a Llama-family decoder from --config, initialised from --seed) "
          "or hf:DIR (a Hugging Face model directory: its config.json, and its weights, each rank reading only its "
          "shards' bytes)")
          .of(&C::model_source)
          .fixed_on_resume()
          .record("model.source")
          .digest_when_set("model")
          .hyperparameter());
  add(Row("model.config", "--config", "the config.json of --model llama (Hugging Face's)")
          .of(&C::model_config)
          .default_in_words()
          .record("model.config")
          .digest_when_set("config")
          .hyperparameter()
          .empty_text("(none)"));
  add(Row("model.lora_rank", "--lora-rank",
          "LoRA adapters of this rank on a Llama's projections, the base frozen (0: full fine-tuning; needs --engine "
          "fsdp2)")
          .of(&C::lora, &models::LoraConfig::rank)
          .fixed_on_resume()
          .record("model.lora_rank")
          .digest_when_set("lora_rank")
          .hyperparameter());
  add(Row("model.lora_alpha", "--lora-alpha", "LoRA's alpha: the adapters' output is scaled by alpha / rank")
          .of(&C::lora, &models::LoraConfig::alpha)
          .fixed_on_resume()
          .record("model.lora_alpha")
          .digest_when_set("lora_alpha")
          .hyperparameter());
  add(Row("model.lora_targets", "--lora-targets",
          "the projections that get adapters, comma-separated: of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, "
          "down_proj")
          .get([](const C& c) -> V { return models::lora_targets_text(c.lora.targets); })
          .set([](C& c, const std::string& t) { c.lora.targets = models::parse_lora_targets(t); })
          .fixed_on_resume()
          .record("model.lora_targets")
          .digest_when_set("lora_targets")
          .hyperparameter());
  add(Row("save_hf", "--save-hf",
          "at the end, the model as a Hugging Face directory DIR that transformers loads (with --lora-rank: the "
          "adapters as PEFT's); DIR must not exist")
          .of(&C::save_hf)
          .default_in_words()
          .empty_text("(none)"));
  add(Row("lr", "--lr", "AdamW's peak learning rate (on --resume: applies from the resumed step)")
          .of(&C::lr)
          .check([](const C& c) {
            if (!(c.lr > 0) || !std::isfinite(c.lr)) {
              throw ConfigError("--lr must be a positive number, got " + std::to_string(c.lr));
            }
          })
          .record("run.lr")
          .digest("lr")
          .hyperparameter()
          .title());
  add(Row("min_lr", "--min-lr",
          "learning rate at the last step (cosine decay from --lr); default (-1): a tenth of --lr")
          .of(&C::min_lr)
          .get([](const C& c) -> V { return min_learning_rate(c); })  // -1 resolved
          .check([](const C& c) {
            if (c.min_lr < 0 && c.min_lr != -1) {
              throw ConfigError("--min-lr must be 0 or positive (or -1: a tenth of --lr), got " +
                                std::to_string(c.min_lr));
            }
          })
          .default_in_words()
          .record("run.min_lr")
          .digest("min_lr")
          .hyperparameter());
  add(Row("warmup_steps", "--warmup-steps", "steps of linear warm-up to --lr; default (-1): a fifth of --steps")
          .of(&C::warmup_steps)
          .get([](const C& c) -> V { return warmup_steps(c); })  // -1 resolved
          .at_least(-1, "0 or positive (or -1: a fifth of --steps)")
          .default_in_words()
          .record("run.warmup_steps")
          .digest("warmup")
          .hyperparameter());
  add(Row("steps", "--steps", "training steps").of(&C::steps).positive().record("run.steps").digest("steps")
          .hyperparameter());
  add(Row("batch", "--batch", "sequences per rank per step")
          .of(&C::batch)
          .positive()
          .record("run.batch")
          .digest("batch")
          .hyperparameter()
          .title());
  add(Row("on_nonfinite_loss", "--on-nonfinite-loss",
          "a step whose loss is NaN or inf: stop (before updating the weights; --resume continues from the last "
          "checkpoint) or skip its optimizer step and go on")
          .get([](const C& c) -> V { return to_string(c.on_nonfinite_loss); })
          .set([](C& c, const std::string& t) {
            named("--on-nonfinite-loss", [&] { c.on_nonfinite_loss = parse_nonfinite_loss(t); });
          }));
  add(Row("out", "--out", "run directory (metrics.jsonl, checkpoints/)").of(&C::out).check([](const C& c) {
    if (c.out.empty()) throw ConfigError("--out is empty: expected the run directory (e.g. runs/latest)");
    refuse_system_directory(c.out);
  }));
  add(Row("strategy.seed", "--seed", "data and initialisation seed")
          .get([](const C& c) -> V { return S(c).seed(); })
          .set([](C& c, const std::string& t) { c.strategy.seed(whole<uint64_t>("--seed", t)); })
          .record("run.seed")
          .digest("seed")
          .hyperparameter());
  add(Row("data", "--data", "data file to train on: text, or token ids (--data-format; default: a generated corpus)")
          .of(&C::data)
          .check([](const C& c) {
            if (c.data.empty()) return;
            std::error_code ec;
            if (!fs::exists(c.data, ec)) throw ConfigError("--data " + c.data + ": no such file");
            if (!fs::is_regular_file(c.data, ec)) {
              throw ConfigError("--data " + c.data +
                                ": not a regular file (a FIFO, device or directory); expected a text file");
            }
            const auto size = fs::file_size(c.data, ec);
            if (ec || size == 0) throw ConfigError("--data " + c.data + ": the file is empty");
          })
          .default_in_words()
          .record("run.data")
          .digest("data")
          .hyperparameter()
          .empty_text("(the generated corpus)"));
  add(Row("data_format", "--data-format",
          "how --data holds its tokens: text (its bytes), uint16 or uint32 (raw little-endian token ids, nanoGPT's "
          ".bin), auto (llm.c's header when the file has one, else text)")
          .of(&C::data_format)
          .set([](C& c, const std::string& t) {
            check_data_format(t);
            c.data_format = t;
          })
          .check([](const C& c) { check_data_format(c.data_format); })
          .record("run.data_format"));
  add(Row("save_every", "--save-every", "checkpoint every N steps (0: at the end only)")
          .of(&C::save_every)
          .at_least(0, "0 (only at the end) or positive"));
  add(Row("keep", "--keep", "checkpoints to keep").of(&C::keep).positive());
  add(Row("resume", "--resume",
          "continue the run in --out from its newest checkpoint that verifies (a damaged one is moved aside; automatic "
          "after an fsdp-run --max-restarts restart)")
          .of(&C::resume)
          .switch_flag()
          .default_in_words());
  add(Row("resume_from", "--resume-from",
          "continue from this checkpoint (any run's); after a restart, the run's own newest checkpoint once it has one")
          .of(&C::resume_from)
          .check([](const C& c) {
            std::error_code ec;
            if (!c.resume_from.empty() && !fs::exists(c.resume_from, ec)) {
              throw ConfigError("--resume-from " + c.resume_from + ": no such checkpoint (file or directory)");
            }
          })
          .default_in_words());
  add(Row("overwrite", "--overwrite",
          "start a new run in an --out that holds one: removes its run.json, metrics.jsonl, train.log, loss.svg and the "
          "checkpoints of its run; anything else there stays, named (a new run into a used --out is refused otherwise)")
          .of(&C::overwrite)
          .switch_flag()
          .default_in_words());
  add(Row("empty_init", "--eager-init",
          "build the whole model on every rank before sharding (default: each block gets its memory when sharded; the "
          "same initial values)")
          .get([](const C& c) -> V { return c.empty_init; })
          .set([](C& c, const std::string& t) { c.empty_init = t != "true"; })
          .switch_flag()
          .default_in_words());
  add(Row("allow_data_change", "--allow-data-change",
          "resume although the --data file's contents changed since the checkpoint (same path, other size or sampled "
          "pages); without it such a resume is refused")
          .of(&C::allow_data_change)
          .switch_flag()
          .default_in_words());
  add(Row("allow_tokenizer_change", "--allow-tokenizer-change",
          "train a --model hf:DIR on a --data file that fsdp-train prepare made with another tokenizer (its recorded "
          "fingerprint differs from DIR's); without it such a run is refused")
          .of(&C::allow_tokenizer_change)
          .switch_flag()
          .default_in_words());
  add(Row("log_every", "--log-every", "steps between log lines (when not on a terminal)").of(&C::log_every).positive());
  add(Row("eval_every", "--eval-every", "held-out loss every N steps (0: never)")
          .of(&C::eval_every)
          .at_least(0, "0 (never) or positive"));
  add(Row("loggers", "--logger",
          "loggers, comma-separated: tensorboard (event files in --out), csv (--out/csv/version_N/metrics.csv), jsonl "
          "(--out/metrics.jsonl, every step; the loss curve reads it), or none")
          .of(&C::loggers)
          .check([](const C& c) { (void)chosen_loggers(c.loggers); }));
  add(Row("profile_steps", "--profile-steps",
          "A:B: record steps A to B with LibTorch's profiler; a Chrome trace per rank in "
          "--out/profile/rank_<r>.pt.trace.json")
          .of(&C::profile_steps)
          .check([](const C& c) {
            if (!c.profile_steps.empty()) (void)parse_step_range(c.profile_steps, "--profile-steps");
          })
          .default_in_words());
  add(Row("engine", "--engine", "fsdp1 (FullyShardedDataParallel) or fsdp2 (fully_shard); checkpoints load into either")
          .get([](const C& c) -> V { return std::string(to_string(c.engine)); })
          .set([](C& c, const std::string& t) { named("--engine", [&] { c.engine = parse_engine(t); }); })
          .hyperparameter());
  add(Row("strategy.precision", "--precision",
          "32-true, bf16-mixed, bf16-true, 16-mixed, 16-true (16-*: made for CUDA; on CPU only with LibTorch 2.x, with "
          "a warning)")
          .get([](const C& c) -> V { return S(c).precision(); })
          .set([](C& c, const std::string& t) { named("--precision", [&] { c.strategy.precision(t); }); })
          .record("run.precision")
          .digest("precision")
          .hyperparameter()
          .title());
  add(Row("strategy.sharding_strategy", "--sharding-strategy", "FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD")
          .get([](const C& c) -> V { return std::string(to_string(S(c).sharding_strategy())); })
          .set([](C& c, const std::string& t) {
            named("--sharding-strategy", [&] { c.strategy.sharding_strategy(parse_sharding_strategy(t)); });
          })
          .record("run.sharding_strategy")
          .digest("sharding")
          .hyperparameter()
          .title());
  add(Row("strategy.state_dict_type", "--state-dict-type", "checkpoint format: full or sharded")
          .get([](const C& c) -> V { return std::string(to_string(S(c).state_dict_type())); })
          .set([](C& c, const std::string& t) {
            named("--state-dict-type", [&] { c.strategy.state_dict_type(parse_checkpoint_format(t)); });
          })
          .record("run.state_dict_type")
          .digest("format"));
  add(Row("strategy.cpu_offload", "--cpu-offload", "keep shards on CPU (no-op on CPU builds)")
          .get([](const C& c) -> V { return S(c).cpu_offload().offload_params; })
          .set([](C& c, const std::string& t) { c.strategy.cpu_offload(t == "true"); })
          .switch_flag()
          .default_in_words());
  add(Row("strategy.activation_checkpointing", "--activation-checkpointing",
          "recompute each block's activations in backward")
          .get([](const C& c) -> V { return activation_checkpointing(S(c)); })
          .set([](C& c, const std::string& t) {
            if (t == "true") c.strategy.activation_checkpointing_module_types<models::GPTBlockImpl>();
          })
          .switch_flag()
          .default_in_words()
          .hyperparameter());
  add(Row("strategy.mesh", "--mesh", "R,S: HYBRID_SHARD over R replicas of S-rank shard groups (R*S = world)")
          .get([](const C& c) -> V { return mesh_name(S(c)); })
          .set([](C& c, const std::string& t) {
            const auto [replicate, shard] = parse_mesh(t);  // names --mesh in its error
            c.strategy.sharding_strategy(ShardingStrategy::kHybridShard).device_mesh(replicate, shard);
          })
          .default_in_words()
          .record("run.mesh")
          .digest("mesh")
          .empty_text("(none)"));
  add(Row("strategy.use_orig_params", "", "").get([](const C& c) -> V { return S(c).use_orig_params(); })
          .default_in_words());
  add(Row("strategy.forward_prefetch", "--forward-prefetch", "gather the next unit while this one computes (default: on)")
          .get([](const C& c) -> V { return S(c).forward_prefetch(); })
          .set([](C& c, const std::string& t) { c.strategy.forward_prefetch(t == "true"); })
          .switch_flag("--no-forward-prefetch")
          .default_in_words());
  add(Row("strategy.backward_prefetch", "--backward-prefetch", "pre, post or none")
          .get([](const C& c) -> V { return std::string(to_string(S(c).backward_prefetch())); })
          .set([](C& c, const std::string& t) {
            named("--backward-prefetch", [&] { c.strategy.backward_prefetch(parse_backward_prefetch(t)); });
          }));
  add(Row("strategy.limit_all_gathers", "--no-limit-all-gathers", "let prefetching gather more than two units at once")
          .get([](const C& c) -> V { return S(c).limit_all_gathers(); })
          .set([](C& c, const std::string& t) { c.strategy.limit_all_gathers(t != "true"); })
          .switch_flag()
          .default_in_words());
  add(Row("strategy.sync_module_states", "", "").get([](const C& c) -> V { return S(c).sync_module_states(); })
          .default_in_words());
  add(Row("strategy.max_reductions_in_flight", "", "")
          .get([](const C& c) -> V { return int64_t{S(c).fsdp().max_reductions_in_flight()}; })
          .default_in_words());
  return t;
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

namespace {

// The digest's places, from the table's order: first the rows always in the
// digest, then those that join it only when set.
std::vector<RunSetting> number_digest(std::vector<RunSetting> table) {
  int place = 0;
  for (const bool when_set : {false, true}) {
    for (auto& row : table) {
      if (row.digest_label && row.digest_when_set == when_set) row.digest_place = ++place;
    }
  }
  return table;
}

}  // namespace

const std::vector<RunSetting>& run_settings() {
  static const std::vector<RunSetting> table = number_digest(make_table());
  return table;
}

const RunSetting* find_setting(const std::string& name) {
  for (const auto& row : run_settings()) {
    if (name == row.name) return &row;
  }
  return nullptr;
}

void validate_settings(const TrainConfig& c) {
  for (const auto& row : run_settings()) {
    if (row.check) row.check(c);
  }
  for (const auto& rule : cross_setting_rules()) rule.check(c);
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
