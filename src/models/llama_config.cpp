// LlamaConfig's own lists and checks: the architectures the model
// implements, and the projections LoRA may target (check_lora).
#include "fsdp/models/llama_config.h"

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

void check_lora(const LoraConfig& lora) {
  peft::check_lora_config(lora, lora_target_names(), "a projection of the decoder");
}

}  // namespace fsdp::models
