#include "fsdp/hf/hf_model.h"

#include <algorithm>
#include <filesystem>
#include <set>

#include "fsdp/checkpoint/storage.h"
#include "fsdp/error.h"

namespace fsdp::hf {

namespace fs = std::filesystem;

namespace {

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string config_summary(const models::LlamaConfig& c) {
  return "vocab_size=" + std::to_string(c.vocab_size) + ", hidden_size=" + std::to_string(c.hidden_size) +
         ", intermediate_size=" + std::to_string(c.intermediate_size) +
         ", num_hidden_layers=" + std::to_string(c.num_hidden_layers) +
         ", num_attention_heads=" + std::to_string(c.num_attention_heads) +
         ", num_key_value_heads=" + std::to_string(c.num_key_value_heads) + ", head_dim=" + std::to_string(c.head_dim);
}

}  // namespace

models::LlamaConfig read_config(const std::string& dir) {
  return models::read_llama_config((std::filesystem::path(dir) / "config.json").string());
}

void check_tensors(const std::map<std::string, std::vector<int64_t>>& shapes, const models::LlamaConfig& config,
                   const std::string& location, const std::function<std::string(const std::string&)>& file_of) {
  const std::string where_config =
      config.source_path.empty() ? std::string("the config") : config.source_path;
  std::set<std::string> known;
  for (const auto& [name, shape] : models::llama_state_shapes(config)) {
    known.insert(name);
    auto t = shapes.find(name);
    if (t == shapes.end()) {
      throw ConfigError(location + ": tensor \"" + name + "\" is missing; " + where_config + " (" +
                        config_summary(config) + ") expects it with shape " + shape_text(shape));
    }
    if (t->second != shape) {
      throw ConfigError(file_of(name) + ": tensor \"" + name + "\" has shape " + shape_text(t->second) + "; " +
                        where_config + " (" + config_summary(config) + ") expects " + shape_text(shape));
    }
  }
  for (const auto& [name, shape] : shapes) {
    if (known.count(name)) continue;
    if (config.tie_word_embeddings && name == "lm_head.weight") continue;
    throw ConfigError(file_of(name) + ": tensor \"" + name + "\" has no place in a " + config.architecture + " of " +
                      where_config + " (" + config_summary(config) + ")");
  }
}

void check_weights(const HfStorageReader& reader, const models::LlamaConfig& config) {
  const fs::path dir = fs::path(reader.location()).parent_path();
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& [name, file] : reader.files()) shapes[name] = reader.index().tensors.at("model/" + name).shape;
  check_tensors(shapes, config, reader.location(), [&](const std::string& name) {
    return (dir / reader.files().at(name)).string();
  });
}

LoadStats load_weights(const std::string& dir, const models::LlamaConfig& config,
                       const std::shared_ptr<torch::nn::Module>& model, dist::ProcessGroup& group,
                       int64_t chunk_bytes) {
  HfStorageReader reader(dir, chunk_bytes);
  check_weights(reader, config);
  // A tied lm_head.weight that an older save kept is not the model's: not read.
  LoadPlanner planner = [&](const StorageReader&, LoadPlan plan) {
    if (config.tie_word_embeddings) {
      plan.reads.erase(std::remove_if(plan.reads.begin(), plan.reads.end(),
                                      [](const TensorRead& r) { return r.key == "model/lm_head.weight"; }),
                       plan.reads.end());
    }
    return plan;
  };
  // check_weights has seen every tensor the config expects; LoRA's adapters
  // are not in a Hugging Face model (they start as PEFT starts them).
  load_checkpoint(reader, model, group, /*strict=*/!config.tie_word_embeddings && config.lora.rank == 0, planner);
  return {reader.bytes_read(), reader.peak_buffer_bytes()};
}

}  // namespace fsdp::hf
