// fsdp/models/llama_sizes.h — what a Llama config (fsdp/models/llama_config.h)
// would cost, counted from its sizes alone (no tensor made), against the
// memory this process can have, so that a hostile config.json ends in a
// ConfigError naming the file, the key and the bytes, never in LibTorch's
// allocator or the OOM killer. parse_llama_config and the model's
// constructor call these. Local calls, no collectives.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fsdp/models/llama_config.h"

namespace fsdp::models {

// The memory this process may have: physical RAM (sysconf), or less when
// RLIMIT_AS caps the address space (the cap less what is mapped already).
// `what` says which, with the bytes, for messages.
struct MemoryBudget {
  long double bytes = 0;
  std::string what;
};
MemoryBudget memory_budget();
// "549755813632 bytes (512.0 GiB)"; "about 1.209e+24 bytes" past int64.
std::string byte_text(long double bytes);
// The bytes a model of `config` takes: its parameters (and LoRA adapters)
// of `element_bytes` each, and each decoder layer's module objects (64 KiB
// counted per layer).
long double llama_memory_bytes(const LlamaConfig& config, int64_t element_bytes);
// Sizes no process could hold, checked as a config is parsed
// (parse_llama_config calls it before anything of num_hidden_layers' length
// is made): ConfigError naming `where` (default: config.source_path) and
// the costliest key when the model would exceed 2^62 bytes in float32
// (int64 counts overflow past that), or when its num_hidden_layers' module
// objects alone exceed memory_budget().
void check_llama_sizes(const LlamaConfig& config, const std::string& where = "");
// The model against memory_budget() before it is built: ConfigError naming
// `where` (default: config.source_path), the costliest key (the one whose
// setting to 1 saves the most bytes), or the LoRA rank (named `rank_name`)
// when the adapters are what does not fit, and the bytes needed. Counts the
// whole model, or this machine's share when WORLD_SIZE and LOCAL_WORLD_SIZE
// say ranks span machines. LlamaImpl's constructor calls it with the
// default dtype's size.
void check_llama_memory(const LlamaConfig& config, int64_t element_bytes, const std::string& where = "",
                        const std::string& rank_name = "LoraConfig::rank");
// Warnings for a LoRA rank above a target projection's smaller dimension
// (the adapter's product B A cannot have that rank: memory for nothing).
// PEFT accepts any rank above 0, and so does this: warnings, not an error.
std::vector<std::string> lora_rank_warnings(const LlamaConfig& config, const std::string& rank_name);

}  // namespace fsdp::models
