// What a run is told (fsdp/train/train_config.h): presets, the checks made
// before training, and the learning-rate schedule.
#include "fsdp/train/train_config.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <system_error>
#include <variant>

#include "fsdp/error.h"
#include "fsdp/hf/hf_model.h"  // read_config, check_weights
#include "fsdp/models/llama.h"  // the sizes (check_llama_memory, byte_text, ...)
#include "fsdp/train/batches.h"  // kGeneratedCorpusBytes, read_data_layout
#include "fsdp/train/model_spec.h"
#include "fsdp/observability/profiler.h"  // parse_step_range
#include "fsdp/text/enum_names.h"
#include "hf_destination.h"
#include "token_fingerprint.h"

namespace fsdp::train {

namespace fs = std::filesystem;

std::pair<int, int> parse_mesh(const std::string& mesh) {
  const auto comma = mesh.find(',');
  auto whole_int = [](const std::string& text, int& v) {
    const char* end = text.data() + text.size();
    const auto [ptr, ec] = std::from_chars(text.data(), end, v);
    return ec == std::errc() && ptr == end && v > 0;
  };
  int r = 0, sh = 0;
  if (comma == std::string::npos || !whole_int(mesh.substr(0, comma), r) || !whole_int(mesh.substr(comma + 1), sh)) {
    throw ConfigError("--mesh '" + mesh + "' is invalid: expected R,S (two positive integers: the replicate and shard "
                      "sizes, e.g. 2,4)");
  }
  return {r, sh};
}

std::string mesh_name(const FSDPStrategyOptions& strategy) {
  const auto& mesh = strategy.device_mesh();
  return mesh ? std::to_string(mesh->first) + "," + std::to_string(mesh->second) : std::string();
}

bool activation_checkpointing(const FSDPStrategyOptions& strategy) {
  return static_cast<bool>(strategy.activation_checkpointing_policy()) ||
         static_cast<bool>(strategy.activation_checkpointing());
}

models::GPTConfig preset(const std::string& name) {
  models::GPTConfig c;
  if (name == "tiny") {
    c.context = 32;
    c.dim = 64;
    c.layers = 2;
    c.heads = 4;
  } else if (name == "default") {
    c.context = 128;
    c.dim = 256;
    c.layers = 4;
    c.heads = 4;
  } else if (name == "100m") {
    c.context = 128;
    c.dim = 768;
    c.layers = 14;
    c.heads = 12;
  } else {
    throw ConfigError("--preset '" + name + "' does not exist: expected tiny, default or 100m");
  }
  return c;
}

namespace {
constexpr text::EnumName<NonfiniteLoss> kNonfiniteLossNames[] = {{NonfiniteLoss::kStop, "stop"},
                                                                 {NonfiniteLoss::kSkip, "skip"}};
}  // namespace

std::string to_string(NonfiniteLoss policy) { return text::name_of(kNonfiniteLossNames, policy); }

NonfiniteLoss parse_nonfinite_loss(const std::string& name) {
  if (auto policy = text::value_of(kNonfiniteLossNames, name)) return *policy;
  throw ConfigError("'" + name + "' is not a policy for a non-finite loss: expected " +
                    text::list_names(kNonfiniteLossNames, " or "));
}

LoggerChoice chosen_loggers(const std::string& names) {
  LoggerChoice out;
  std::string rest = names;
  while (true) {
    const auto comma = rest.find(',');
    const std::string name = rest.substr(0, comma);
    if (name == "tensorboard") {
      out.tensorboard = true;
    } else if (name == "csv") {
      out.csv = true;
    } else if (name == "jsonl") {
      out.jsonl = true;
    } else if (!(name == "none" && names == "none")) {
      throw ConfigError("--logger '" + names + "': unknown logger '" + name +
                        "'; expected a comma-separated list of tensorboard, csv and jsonl, or none");
    }
    if (comma == std::string::npos) break;
    rest = rest.substr(comma + 1);
  }
  return out;
}

bool trains_llama(const TrainConfig& c) { return c.model_source == "llama" || c.model_source.rfind("hf:", 0) == 0; }

std::string hf_directory(const TrainConfig& c) {
  return c.model_source.rfind("hf:", 0) == 0 ? c.model_source.substr(3) : std::string();
}

namespace {

// The rules between settings (cross_setting_rules), each a function.

void check_model_and_config(const TrainConfig& c) {
  const bool hf = c.model_source.rfind("hf:", 0) == 0;
  if (c.model_source != "gpt" && c.model_source != "llama" && !hf) {
    throw ConfigError("--model '" + c.model_source + "': expected gpt (the byte-level GPT of --preset), llama (a "
                      "Llama-family decoder from --config config.json, initialised from --seed) or hf:DIR (a Hugging "
                      "Face model directory: its config.json and weights)");
  }
  if (hf && hf_directory(c).empty()) throw ConfigError("--model hf: names no directory: expected hf:DIR");
  if (c.model_source == "llama" && c.model_config.empty()) {
    throw ConfigError("--model llama needs --config FILE: the model's config.json (Hugging Face's)");
  }
  if (c.model_source != "llama" && !c.model_config.empty()) {
    throw ConfigError("--config " + c.model_config + " with --model " + c.model_source + ": --config is the config.json "
                      "of --model llama" + (hf ? std::string("; hf:DIR reads DIR/config.json") : std::string()) +
                      ": expected --model llama, or no --config");
  }
}

void check_lora_flags(const TrainConfig& c) {
  if (c.lora.rank == 0) return;
  if (!trains_llama(c)) {
    throw ConfigError("--lora-rank " + std::to_string(c.lora.rank) + " with --model " + c.model_source +
                      ": LoRA adapters are for a Llama's projections: expected --model llama or hf:DIR");
  }
  try {
    models::check_lora(c.lora);
  } catch (const ConfigError& e) {
    throw ConfigError(std::string("--lora-rank/--lora-alpha/--lora-targets: ") + e.what());
  }
  if (c.engine != Engine::kFsdp2) {
    throw ConfigError("--lora-rank " + std::to_string(c.lora.rank) + " with --engine " + to_string(c.engine) +
                      ": a frozen base costs no gradient memory only under fully_shard: expected --engine fsdp2");
  }
}

void check_llama_data(const TrainConfig& c) {
  if (trains_llama(c) && c.data.empty()) {
    throw ConfigError("--model " + c.model_source + " without --data: the generated corpus is bytes, and a Llama "
                      "takes its tokenizer's ids: expected --data FILE of token ids (fsdp-train prepare --tokenizer "
                      "DIR --out FILE TEXT... makes one)");
  }
}

void check_save_hf(const TrainConfig& c) {
  if (c.save_hf.empty()) return;
  check_save_hf_destination(c.save_hf, c.out, hf_directory(c));  // what the export at the end would refuse (issue 50 item 7)
  if (!trains_llama(c)) {
    throw ConfigError("--save-hf with --model " + c.model_source + ": a Hugging Face export is of a Llama-family "
                      "model: expected --model llama or hf:DIR");
  }
}

// The model's rules (the first four of cross_setting_rules).
constexpr int kModelRules = 4;

// ConfigError unless --model, --config and the LoRA flags fit together.
void check_model_source(const TrainConfig& c) {
  for (int i = 0; i < kModelRules; ++i) cross_setting_rules()[static_cast<size_t>(i)].check(c);
}

}  // namespace

models::LlamaConfig llama_config(const TrainConfig& c) {
  if (!trains_llama(c)) throw ConfigError("--model " + c.model_source + " is not a Llama-family model");
  models::LlamaConfig config = c.llama_as_read                ? *c.llama_as_read
                               : c.model_source == "llama" ? models::read_llama_config(c.model_config)
                                                           : hf::read_config(hf_directory(c));
  config.lora = c.lora;
  return config;
}

ModelSpec model_spec(const TrainConfig& c) {
  check_model_source(c);
  if (!trains_llama(c)) return GptSpec{c.model};
  LlamaSpec spec{hf_directory(c), llama_config(c)};
  const models::LlamaConfig& config = spec.config;
  // Before anything is built: an hf: directory's weights against its
  // config.json (headers only: a num_hidden_layers or vocab_size the weights
  // do not have is refused by key), then the model and its adapters against
  // this machine's memory (--model llama has no weights to check against).
  if (!spec.hf_directory.empty()) hf::check_weights(HfStorageReader(spec.hf_directory), config);
  std::string precision;
  try {
    precision = parse_precision(c.strategy.precision()).name;
  } catch (const ConfigError&) {  // validate_settings names it
  }
  const bool half_params = precision == "16-true" || precision == "bf16-true";
  models::check_llama_memory(config, half_params ? 2 : 4, "", "--lora-rank");
  const char* rank = std::getenv("RANK");
  if (!rank || std::string(rank) == "0") {
    for (const auto& w : models::lora_rank_warnings(config, "--lora-rank")) {
      std::cerr << "fsdp-train: WARNING: " << w << std::endl;
    }
  }
  return spec;
}

ModelSizes model_sizes(const TrainConfig& c) {
  if (!trains_llama(c)) return {c.model.vocab_size, c.model.context, c.model.dim, c.model.layers, c.model.heads};
  const models::LlamaConfig llama = llama_config(c);
  return {llama.vocab_size, c.model.context, llama.hidden_size, llama.num_hidden_layers, llama.num_attention_heads};
}

std::optional<models::LlamaConfig> resolve_model(TrainConfig& c) {
  const ModelSpec spec = model_spec(c);
  const auto* llama = std::get_if<LlamaSpec>(&spec);
  if (!llama) return std::nullopt;
  c.model.vocab_size = llama->config.vocab_size;
  c.model.dim = llama->config.hidden_size;
  c.model.layers = llama->config.num_hidden_layers;
  c.model.heads = llama->config.num_attention_heads;
  return llama->config;
}

namespace {

void check_data_format_needs_data(const TrainConfig& c) {
  if (c.data.empty() && (c.data_format == "uint16" || c.data_format == "uint32")) {
    throw ConfigError("--data-format " + c.data_format + " without --data: the generated corpus is text; expected a "
                      "--data file of " + c.data_format + " token ids, or --data-format auto or text");
  }
}

// What make_strategy's fully_shard form takes (has_fully_shard_form).
void check_engine_form(const TrainConfig& c) {
  if (c.engine != Engine::kFsdp2) return;
  if (!has_fully_shard_form(c.strategy.sharding_strategy())) {
    throw ConfigError("--engine fsdp2 with --sharding-strategy NO_SHARD: fully_shard always shards; expected "
                      "FULL_SHARD, SHARD_GRAD_OP or HYBRID_SHARD (or --engine fsdp1)");
  }
  if (!has_fully_shard_form(parse_precision(c.strategy.precision()))) {
    throw ConfigError("--engine fsdp2 with --precision " + c.strategy.precision() +
                      ": fsdp-train's fully_shard path takes 32-true or bf16-mixed (bfloat16 compute, float32 "
                      "reduction); the others are FSDP1's here: expected one of those two, or --engine fsdp1");
  }
}

void check_profile_steps(const TrainConfig& c) {
  if (c.profile_steps.empty()) return;
  const StepRange r = parse_step_range(c.profile_steps, "--profile-steps");
  if (r.last > c.steps) {
    throw ConfigError("--profile-steps '" + c.profile_steps + "': step " + std::to_string(r.last) +
                      " is past the run's last step (--steps " + std::to_string(c.steps) +
                      "); expected A:B with 1 <= A <= B <= " + std::to_string(c.steps));
  }
}

void check_min_lr(const TrainConfig& c) {
  if (std::isnan(c.min_lr) || c.min_lr > c.lr) {
    throw ConfigError("--min-lr must be at most --lr (" + std::to_string(c.lr) + "; -1: a tenth of it), got " +
                      std::to_string(c.min_lr));
  }
}

void check_heads(const TrainConfig& c) {
  if (!trains_llama(c) && c.model.dim % c.model.heads != 0) {
    throw ConfigError("--heads " + std::to_string(c.model.heads) + " does not divide the model width --dim " +
                      std::to_string(c.model.dim) + ": expected a divisor of it");
  }
}

void check_generated_corpus_context(const TrainConfig& c) {
  if (c.data.empty() && c.model.context + 2 > kGeneratedCorpusBytes) {
    // The generated corpus holds nothing out at such a context: its training text is all of it.
    throw ConfigError("--context " + std::to_string(c.model.context) + ": the generated corpus (" +
                      std::to_string(kGeneratedCorpusBytes) + " bytes; no --data) is too short: --context " +
                      std::to_string(c.model.context) + " needs at least " + std::to_string(c.model.context + 2) +
                      " bytes (a sample of " + std::to_string(c.model.context + 1) +
                      " and room to place it); expected --context at most " +
                      std::to_string(kGeneratedCorpusBytes - 2) + ", or a --data file that long");
  }
}

void check_data_context(const TrainConfig& c) {
  if (c.data.empty()) return;
  const DataLayout layout = read_data_layout(c.data, c.data_format, "--data");  // reads llm.c's header, if any
  const std::string unit = layout.unit();
  if (layout.tokens < c.model.context + 2) {  // one sample, and a choice of where it starts
    throw ConfigError("--data " + c.data + ": " + std::to_string(layout.tokens) + " " + unit +
                      (unit == "bytes" ? "" : " (" + layout.format + ")") + " is too short: --context " +
                      std::to_string(c.model.context) + " needs at least " + std::to_string(c.model.context + 2) +
                      " " + unit + " (a sample of " + std::to_string(c.model.context + 1) +
                      " and room to place it)");
  }
}

void check_data_tokenizer_of_model(const TrainConfig& c) {
  if (c.data.empty()) return;
  // An hf: run's file against its tokenizer (issue 50 item 15).
  check_data_tokenizer(c.data, hf_directory(c), c.allow_tokenizer_change, model_sizes(c).vocab);
}

void check_overwrite_resume(const TrainConfig& c) {
  if (c.overwrite && c.resume) {
    throw ConfigError("--overwrite and --resume contradict each other: --overwrite starts a new run in --out " + c.out +
                      ", --resume continues the run there; expected one of them");
  }
}

void check_resume_from_outside_out(const TrainConfig& c) {
  if (c.resume_from.empty() || !c.overwrite) return;
  // --overwrite empties --out: a checkpoint inside it would be gone before it is read.
  std::error_code ec;
  const fs::path from = fs::weakly_canonical(c.resume_from, ec), out = fs::weakly_canonical(c.out, ec);
  if (std::mismatch(out.begin(), out.end(), from.begin(), from.end()).first == out.end()) {
    throw ConfigError("--resume-from " + c.resume_from + " lies inside --out " + c.out +
                      ", which --overwrite empties first: expected a checkpoint outside it (copy it elsewhere, "
                      "or use --resume)");
  }
}

}  // namespace

const std::vector<CrossSettingRule>& cross_setting_rules() {
  static const std::vector<CrossSettingRule> rules = {
      {"--model with --config", check_model_and_config},
      {"--lora-* with --model and --engine", check_lora_flags},
      {"--model llama or hf:DIR with --data", check_llama_data},
      {"--save-hf with --model and --out", check_save_hf},
      {"--data-format with --data", check_data_format_needs_data},
      {"--engine fsdp2 with --sharding-strategy and --precision", check_engine_form},
      {"--profile-steps within --steps", check_profile_steps},
      {"--min-lr at most --lr", check_min_lr},
      {"--heads divides --dim", check_heads},
      {"--context within the generated corpus", check_generated_corpus_context},
      {"--data holds a sample of --context", check_data_context},
      {"--data of --model hf:DIR's tokenizer", check_data_tokenizer_of_model},
      {"--overwrite with --resume", check_overwrite_resume},
      {"--resume-from outside the --out that --overwrite empties", check_resume_from_outside_out},
  };
  return rules;
}

void validate(const TrainConfig& c) {
  validate_settings(c);  // run_settings.cpp: the rows' checks, then cross_setting_rules
  std::error_code ec;
  fs::create_directories(c.out, ec);
  bool writable = false;
  if (!ec) {
    // Created new (O_EXCL, which never follows a symbolic link), never
    // through a link that is there: nothing beneath --out is followed.
    const std::string probe = (fs::path(c.out) / ".write-test").string();
    int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    // Every rank probes at once: another rank's probe may come and go
    // between the open and the lstat; then try again (bounded).
    for (int tries = 0; fd < 0 && errno == EEXIST && tries < 100; ++tries) {
      struct stat gone {};
      if (::lstat(probe.c_str(), &gone) == 0) break;
      fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    }
    if (fd < 0 && errno == EEXIST) {
      struct stat st {};
      const bool there = ::lstat(probe.c_str(), &st) == 0;
      if (there && S_ISLNK(st.st_mode)) {
        std::error_code link_ec;
        const std::string target = fs::read_symlink(probe, link_ec).string();
        throw ConfigError("--out " + c.out + ": " + probe + " is a symbolic link" +
                          (link_ec ? std::string() : " (to " + target + ")") + " where fsdp-train writes the probe "
                          "that the directory can be written (.write-test); it follows no link beneath --out, and "
                          "wrote nothing through this one: expected no link there (remove it; --out itself may be a "
                          "link), or pass another --out");
      }
      // A probe a killed run left, or another rank's (gone again by now):
      // removed, and made anew.
      if (!there || (S_ISREG(st.st_mode) && (::unlink(probe.c_str()) == 0 || errno == ENOENT))) {
        fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
      }
    }
    writable = fd >= 0;
    if (fd >= 0) {
      ::close(fd);
      ::unlink(probe.c_str());
    }
  }
  if (!writable) throw ConfigError("--out " + c.out + ": the run directory cannot be created or written");
}

int64_t warmup_steps(const TrainConfig& c) { return c.warmup_steps < 0 ? c.steps / 5 : c.warmup_steps; }

double min_learning_rate(const TrainConfig& c) { return c.min_lr < 0 ? c.lr / 10 : c.min_lr; }

double learning_rate(const TrainConfig& c, int64_t step) {
  const int64_t warmup = warmup_steps(c);
  if (step < warmup) return c.lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
  if (c.steps <= warmup) return c.lr;
  const double progress = std::min(1.0, static_cast<double>(step - warmup) / static_cast<double>(c.steps - warmup));
  const double min_lr = min_learning_rate(c);
  return min_lr + 0.5 * (1.0 + std::cos(M_PI * progress)) * (c.lr - min_lr);
}

}  // namespace fsdp::train
