// The tiny model directories the hostile-config tests start from: a Mistral
// (no hidden_size % heads rule, so that each size key can grow alone) with an
// explicit head_dim, its weights (zeros) written as model.safetensors beside
// whatever config.json a test gives.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "fsdp/formats/safetensors.h"
#include "fsdp/models/llama.h"
#include "../support/index_files.h"
#include "../support/subprocess.h"

namespace fsdp::testing {

inline nlohmann::json hostile_base_config() {
  return nlohmann::json::parse(R"({"architectures": ["MistralForCausalLM"], "model_type": "mistral", "vocab_size": 16,
      "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
      "num_key_value_heads": 1, "head_dim": 4, "max_position_embeddings": 64})");
}

// Writes model.safetensors into `dir`: zeros of the shapes `weights_config`
// (a config.json's text) implies.
inline void write_zero_weights(const std::string& dir, const std::string& weights_config) {
  std::filesystem::create_directories(dir);
  const auto c = models::parse_llama_config(weights_config, "weights");
  std::vector<formats::SafetensorsTensor> plan;
  for (const auto& [name, shape] : models::llama_state_shapes(c)) plan.push_back({name, at::kFloat, shape, 0, 0});
  formats::SafetensorsWriter w(dir + "/model.safetensors", plan, {{"format", "pt"}});
  for (const auto& t : w.layout()) w.write(torch::zeros(t.shape));
  w.commit();
}

// Writes the base's weights (zeros) and `config` into `dir`.
inline void write_hostile_model(const std::string& dir, const nlohmann::json& config) {
  write_zero_weights(dir, hostile_base_config().dump());
  write_file(dir + "/config.json", config.dump());
}

}  // namespace fsdp::testing
