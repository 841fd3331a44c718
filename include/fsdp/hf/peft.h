// fsdp/hf/peft.h — LoRA adapters (models::LoraConfig) as PEFT saves them:
// a directory with adapter_model.safetensors and adapter_config.json that
// peft's PeftModel.from_pretrained(base_model, dir) loads onto the
// transformers model (docs/models.md, "LoRA").
#pragma once

#include <memory>
#include <string>

#include <torch/nn/module.h>

#include "fsdp/distributed/process_group.h"
#include "fsdp/models/llama.h"

namespace fsdp::hf {

// [collective over `group`] Writes the adapters of `model` (a models::Llama
// built with config.lora, unwrapped or sharded by either engine) into the new
// directory `out_dir`: adapter_model.safetensors, whose keys are PEFT's
// ("base_model.model.<name>.lora_A.weight", float32 or the adapters' dtype),
// and adapter_config.json (peft_type LORA, task_type CAUSAL_LM, r,
// lora_alpha, target_modules, lora_dropout 0, bias "none",
// base_model_name_or_path = `base_model`). The adapters are gathered whole
// to rank 0 (their memory only: the frozen base is not gathered), which
// writes them into a hidden directory beside `out_dir` and renames it into
// place; every rank returns once it is there or throws the same error.
// ConfigError if the config has no adapters, or `out_dir` exists.
void save_peft_adapter(const std::shared_ptr<torch::nn::Module>& model, const models::LlamaConfig& config,
                       const std::string& out_dir, const std::string& base_model, dist::ProcessGroup& group);

}  // namespace fsdp::hf
