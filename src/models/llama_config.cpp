// LlamaConfig's own checks and lists: the LoRA settings (targets as text
// and back, their check) and the architectures the model implements.
#include "fsdp/models/llama_config.h"

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "fsdp/error.h"

namespace fsdp::models {

const std::vector<std::string>& llama_architectures() {
  static const std::vector<std::string> names = {"LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM"};
  return names;
}

const std::vector<std::string>& lora_target_names() {
  static const std::vector<std::string> names = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                 "gate_proj", "up_proj", "down_proj"};
  return names;
}

std::string lora_targets_text(const std::vector<std::string>& targets) {
  std::string joined;
  for (const auto& t : targets) joined += (joined.empty() ? "" : ",") + t;
  return joined;
}

std::vector<std::string> parse_lora_targets(const std::string& text) {
  std::vector<std::string> out;
  for (size_t at = 0; at <= text.size();) {
    const size_t comma = std::min(text.find(',', at), text.size());
    out.push_back(text.substr(at, comma - at));
    at = comma + 1;
  }
  return out;
}

void check_lora(const LoraConfig& lora) {
  if (lora.rank < 0) throw ConfigError("LoRA: rank " + std::to_string(lora.rank) + " is negative; expected 0 (none) or more");
  if (lora.rank == 0) return;
  if (!(lora.alpha > 0) || !std::isfinite(lora.alpha)) {
    throw ConfigError("LoRA: alpha " + std::to_string(lora.alpha) + " must be a positive number");
  }
  if (lora.targets.empty()) throw ConfigError("LoRA: rank " + std::to_string(lora.rank) + " but no target projections");
  std::string all;
  for (const auto& n : lora_target_names()) all += (all.empty() ? "" : ", ") + n;
  for (size_t i = 0; i < lora.targets.size(); ++i) {
    const auto& t = lora.targets[i];
    if (std::find(lora_target_names().begin(), lora_target_names().end(), t) == lora_target_names().end()) {
      throw ConfigError("LoRA: target \"" + t + "\" is not a projection of the decoder; expected some of " + all);
    }
    if (std::find(lora.targets.begin(), lora.targets.begin() + static_cast<std::ptrdiff_t>(i), t) !=
        lora.targets.begin() + static_cast<std::ptrdiff_t>(i)) {
      throw ConfigError("LoRA: target \"" + t + "\" is given twice");
    }
  }
}

}  // namespace fsdp::models
