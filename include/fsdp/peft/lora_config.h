// fsdp/peft/lora_config.h — PEFT's LoraConfig and its checks: plain values,
// no LibTorch, no collectives. The pass that applies it to a model is
// fsdp/peft/lora.h (inject_lora).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fsdp::peft {

// PEFT's LoraConfig: each targeted linear module W (y = x W^T + b) gets A
// [rank, in] and B [out, rank] and computes y + (B (A x)) * alpha / rank.
// A starts as PEFT's (Kaiming-uniform, a = sqrt(5)), B as zeros, so the
// adapted model starts as the base model.
struct LoraConfig {
  int64_t rank = 0;  // 0: no adapters
  double alpha = 16;
  // PEFT's target_modules: a module matches a target when its name (as
  // named_modules() gives it) equals it or ends with "." + it.
  std::vector<std::string> targets = {"q_proj", "v_proj"};
};

// ConfigError for a rank below 0, alpha not positive, no targets with a
// rank, a repeated target, and either an empty target or (when `known` is
// not empty) a target outside `known`, which the message calls
// `known_what` ("a projection of the decoder").
void check_lora_config(const LoraConfig& lora, const std::vector<std::string>& known = {},
                       const std::string& known_what = "a module of the model");
// LoraConfig::targets as comma-separated text ("q_proj,v_proj"), and back
// (every piece kept, empty ones too: check_lora_config refuses those).
std::string lora_targets_text(const std::vector<std::string>& targets);
std::vector<std::string> parse_lora_targets(const std::string& text);
// PEFT's target_modules match of one module name: equal, or ends with "." + target.
bool matches_target(const std::string& module_name, const std::string& target);

}  // namespace fsdp::peft
