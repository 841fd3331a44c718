// fsdp/hf/peft.h — LoRA adapters (fsdp/peft/lora.h) as PEFT saves them: a
// directory with adapter_model.safetensors and adapter_config.json that
// peft's PeftModel.from_pretrained(base_model, dir) loads onto the
// transformers model (docs/models.md, "LoRA"), and back onto a model that
// fsdp::peft::inject_lora adapted.
#pragma once

#include <memory>
#include <string>

#include <torch/nn/module.h>

#include "fsdp/distributed/process_group.h"
#include "fsdp/models/llama.h"
#include "fsdp/peft/lora.h"

namespace fsdp::hf {

// [collective over `group`] Writes the adapters of `model` (any module that
// peft::inject_lora adapted with `lora`, unwrapped or sharded by either
// engine) into the new directory `out_dir`: adapter_model.safetensors,
// whose keys are PEFT's ("base_model.model.<name>.lora_A.weight", float32 or
// the adapters' dtype), and adapter_config.json (peft_type LORA, task_type
// CAUSAL_LM, r, lora_alpha, target_modules, lora_dropout 0, bias "none",
// base_model_name_or_path = `base_model`). The adapters are gathered whole
// to rank 0 (their memory only: the frozen base is not gathered), which
// writes them into a hidden directory beside `out_dir` and renames it into
// place; every rank returns once it is there or throws the same error.
// ConfigError if `lora` has no adapters (rank 0), a trained parameter is
// not an adapter, or `out_dir` exists.
void save_peft_adapter(const std::shared_ptr<torch::nn::Module>& model, const peft::LoraConfig& lora,
                       const std::string& out_dir, const std::string& base_model, dist::ProcessGroup& group);
// The same for a models::Llama built with config.lora (its adapters' settings).
void save_peft_adapter(const std::shared_ptr<torch::nn::Module>& model, const models::LlamaConfig& config,
                       const std::string& out_dir, const std::string& base_model, dist::ProcessGroup& group);

// [local] The LoRA settings of PEFT's adapter directory `dir`
// (adapter_config.json: r, lora_alpha, target_modules as a list).
// ConfigError naming the file for another peft_type or a missing setting.
peft::LoraConfig read_peft_config(const std::string& dir);

// [local: every rank reads the file itself] Loads PEFT's adapter directory
// `dir` into `model`, which peft::inject_lora adapted with the directory's
// settings (read_peft_config), unwrapped or sharded by either engine: each
// rank copies the part of each adapter it holds. ConfigError, before
// anything is written, when the file's adapters and the model's differ (a
// key missing or extra, another shape, another alpha / rank).
void load_peft_adapter(const std::shared_ptr<torch::nn::Module>& model, const std::string& dir);

}  // namespace fsdp::hf
