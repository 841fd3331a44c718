#include "fsdp/hf/hf_model.h"

#include <algorithm>
#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>

#include "fsdp/checkpoint/storage.h"
#include "fsdp/error.h"
#include "fsdp/models/llama.h"  // the sizes (check_llama_memory, byte_text, ...)

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

namespace {

// A tensor name as JSON writes it: quoted, a NUL or a control byte escaped
// (a name from a file must not cut or garble the message).
std::string quoted(const std::string& name) { return nlohmann::json(name).dump(); }

// The config keys each dimension of a state-dict tensor comes from.
std::vector<std::string> dim_keys(const std::string& name) {
  auto ends = [&](const std::string& tail) {
    return name.size() >= tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
  };
  const std::string q = "keys \"num_attention_heads\" * \"head_dim\"",
                    kv = "keys \"num_key_value_heads\" * \"head_dim\"", V = "key \"vocab_size\"",
                    H = "key \"hidden_size\"", I = "key \"intermediate_size\"";
  if (ends("embed_tokens.weight") || ends("lm_head.weight")) return {V, H};
  if (ends("q_proj.weight")) return {q, H};
  if (ends("q_proj.bias")) return {q};
  if (ends("k_proj.weight") || ends("v_proj.weight")) return {kv, H};
  if (ends("k_proj.bias") || ends("v_proj.bias")) return {kv};
  if (ends("o_proj.weight")) return {H, q};
  if (ends("gate_proj.weight") || ends("up_proj.weight")) return {I, H};
  if (ends("gate_proj.bias") || ends("up_proj.bias")) return {I};
  if (ends("down_proj.weight")) return {H, I};
  return {H};  // the norms, o_proj's and down_proj's biases
}

// The layers `shapes` holds: the distinct N of "model.layers.N." and the largest.
std::pair<int64_t, int64_t> layers_held(const std::map<std::string, std::vector<int64_t>>& shapes) {
  static const std::string prefix = "model.layers.";
  std::set<int64_t> seen;
  for (const auto& kv : shapes) {
    const std::string& name = kv.first;
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    const size_t dot = name.find('.', prefix.size());
    const std::string digits = name.substr(prefix.size(), dot == std::string::npos ? std::string::npos : dot - prefix.size());
    if (digits.empty() || digits.size() > 12 || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    seen.insert(std::stoll(digits));
  }
  return {static_cast<int64_t>(seen.size()), seen.empty() ? -1 : *seen.rbegin()};
}

}  // namespace

void check_tensors(const std::map<std::string, std::vector<int64_t>>& shapes, const models::LlamaConfig& config,
                   const std::string& location, const std::function<std::string(const std::string&)>& file_of) {
  const std::string where_config =
      config.source_path.empty() ? std::string("the config") : config.source_path;
  // The layer count first: a config's num_hidden_layers is never listed
  // (nor built) beyond the layers the weights hold (fewer: the listing below
  // names the tensors that have no place).
  const auto [held, last] = layers_held(shapes);
  if (config.num_hidden_layers > held) {
    throw ConfigError(where_config + ": key \"num_hidden_layers\": " + std::to_string(config.num_hidden_layers) +
                      ", but " + location + " holds " +
                      (held == 0 ? std::string("no layer's tensors")
                                 : "the tensors of " + std::to_string(held) + " layers (model.layers.N with N from 0 to " +
                                       std::to_string(last) + ")") +
                      "; expected num_hidden_layers to be the weights' layer count");
  }
  std::set<std::string> known;
  for (const auto& [name, shape] : models::llama_state_shapes(config)) {
    known.insert(name);
    auto t = shapes.find(name);
    if (t == shapes.end()) {
      throw ConfigError(location + ": tensor " + quoted(name) + " is missing; " + where_config + " (" +
                        config_summary(config) + ") expects it with shape " + shape_text(shape));
    }
    if (t->second != shape) {
      std::string why;
      const auto keys = dim_keys(name);
      for (size_t d = 0; d < shape.size() && d < t->second.size() && d < keys.size(); ++d) {
        if (shape[d] == t->second[d]) continue;
        long double elements = 1;
        for (int64_t x : shape) elements *= static_cast<long double>(x);
        why = ": dimension " + std::to_string(d) + " comes from " + keys[d] + " (" + std::to_string(shape[d]) +
              "), the weights' is " + std::to_string(t->second[d]) + "; the config's shape would need " +
              models::byte_text(elements * 4) + " in float32";
        break;
      }
      throw ConfigError(file_of(name) + ": tensor " + quoted(name) + " has shape " + shape_text(t->second) + "; " +
                        where_config + " (" + config_summary(config) + ") expects " + shape_text(shape) + why);
    }
  }
  for (const auto& [name, shape] : shapes) {
    if (known.count(name)) continue;
    if (config.tie_word_embeddings && name == "lm_head.weight") continue;
    throw ConfigError(file_of(name) + ": tensor " + quoted(name) + " has no place in a " + config.architecture + " of " +
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
