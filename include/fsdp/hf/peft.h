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
// (adapter_config.json: r, lora_alpha, target_modules as a list). The file
// is read through formats' regular-file check (a FIFO or a directory is
// named, never opened for a blocking read; at most 1 MiB). ConfigError
// naming the file and the key, with what was expected and what it holds, for
// another peft_type, or an r, lora_alpha or target_modules missing or not a
// positive int64, a finite number > 0, a list of distinct non-empty names.
// The rank is not checked against memory here: inject_lora does that before
// it allocates the adapters.
peft::LoraConfig read_peft_config(const std::string& dir);

// [local: every rank reads the file itself] Loads PEFT's adapter directory
// `dir` into `model`, which peft::inject_lora adapted with the directory's
// settings (read_peft_config), unwrapped or sharded by either engine: each
// rank copies the part of each adapter it holds. ConfigError, before
// anything is written and before a tensor's bytes are read (the header is
// read through formats' checked safetensors reader), naming the file and
// the key: a model's module whose adapters are of another rank (key "r") or
// scaling (key "lora_alpha"); adapter_model.safetensors' tensors that are
// no adapter of the model, missing, of another shape than the model's whole
// adapter, or not of a floating-point dtype.
void load_peft_adapter(const std::shared_ptr<torch::nn::Module>& model, const std::string& dir);

}  // namespace fsdp::hf
