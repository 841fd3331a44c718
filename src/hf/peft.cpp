// PEFT's adapter directory (fsdp/hf/peft.h): save_peft_adapter writes
// adapter_model.safetensors and adapter_config.json; read_peft_config and
// load_peft_adapter read them back onto a model inject_lora adapted.
#include "fsdp/hf/peft.h"

#include <cmath>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "fsdp/distributed/rank_errors.h"
#include "fsdp/error.h"
#include "fsdp/formats/regular_file.h"
#include "fsdp/formats/safetensors.h"
#include "fsdp/state_dict/distributed_state_dict.h"
#include "new_directory.h"

namespace fsdp::hf {

using json = nlohmann::json;

namespace {

const std::string kPrefix = "base_model.model.";  // PEFT's key prefix of the wrapped model

}  // namespace

void save_peft_adapter(const std::shared_ptr<torch::nn::Module>& model, const peft::LoraConfig& lora,
                       const std::string& out_dir, const std::string& base_model, dist::ProcessGroup& group) {
  if (lora.rank <= 0) throw ConfigError("save_peft_adapter: the model has no LoRA adapters (rank 0)");
  // Every rank takes part in the gather; only the adapters require gradients.
  const StateDict adapters = get_model_state_dict(
      model, StateDictOptions().full_state_dict(true).cpu_offload(true).ignore_frozen_params(true));
  std::unique_ptr<detail::NewDirectory> out;
  dist::agree(group, dist::capture([&] {
                if (group.rank() != 0) return;
                out = std::make_unique<detail::NewDirectory>(out_dir, "save_peft_adapter");
                std::vector<formats::SafetensorsTensor> plan;
                std::map<std::string, at::Tensor> by_name;
                for (const auto& [key, value] : adapters) {
                  if (!peft::is_lora_key(key)) {
                    throw ConfigError("save_peft_adapter: parameter " + key +
                                      " requires a gradient but is not a LoRA adapter; PEFT's file holds adapters only");
                  }
                  const at::Tensor& t = adapters.tensor(key);
                  const std::string name = kPrefix + key;
                  plan.push_back({name, t.scalar_type(), t.sizes().vec(), 0, 0});
                  by_name[name] = t;
                }
                formats::SafetensorsWriter w(out->staging() + "/adapter_model.safetensors", plan, {{"format", "pt"}});
                for (const auto& t : w.layout()) w.write(by_name.at(t.name));
                w.commit();
                json c = {{"peft_type", "LORA"},
                          {"task_type", "CAUSAL_LM"},
                          {"r", lora.rank},
                          {"lora_alpha", lora.alpha},
                          {"lora_dropout", 0.0},
                          {"target_modules", lora.targets},
                          {"bias", "none"},
                          {"fan_in_fan_out", false},
                          {"inference_mode", true},
                          {"init_lora_weights", true},
                          {"use_rslora", false},
                          {"use_dora", false},
                          {"modules_to_save", nullptr},
                          {"base_model_name_or_path", base_model}};
                out->write_text("adapter_config.json", c.dump(2) + "\n");
                out->commit();
              }),
              "save_peft_adapter: writing " + out_dir);
}

void save_peft_adapter(const std::shared_ptr<torch::nn::Module>& model, const models::LlamaConfig& config,
                       const std::string& out_dir, const std::string& base_model, dist::ProcessGroup& group) {
  save_peft_adapter(model, config.lora, out_dir, base_model, group);
}

peft::LoraConfig read_peft_config(const std::string& dir) {
  const std::string path = dir + "/adapter_config.json";
  const json c = [&] {
    try {
      return json::parse(formats::read_regular_file(path, 1 << 20, "PEFT's adapter_config.json"));
    } catch (const json::exception& e) {
      throw ConfigError(path + ": not JSON: " + e.what());
    }
  }();
  auto bad = [&](const std::string& what) { return ConfigError(path + ": " + what); };
  if (!c.is_object() || c.value("peft_type", "") != "LORA") throw bad("its peft_type is not \"LORA\"");
  peft::LoraConfig lora;
  if (!c.contains("r") || !c["r"].is_number_integer()) throw bad("its 'r' (the rank) is missing or not an integer");
  if (!c.contains("lora_alpha") || !c["lora_alpha"].is_number()) throw bad("its 'lora_alpha' is missing or not a number");
  lora.rank = c["r"].get<int64_t>();
  lora.alpha = c["lora_alpha"].get<double>();
  const json& t = c.value("target_modules", json());
  if (!t.is_array() || t.empty()) throw bad("its 'target_modules' is not a list of names (a regex is not supported)");
  lora.targets.clear();
  for (const auto& name : t) {
    if (!name.is_string()) throw bad("its 'target_modules' holds a value that is not a name");
    lora.targets.push_back(name.get<std::string>());
  }
  try {
    peft::check_lora_config(lora);
  } catch (const ConfigError& e) {
    throw bad(e.what());
  }
  return lora;
}

void load_peft_adapter(const std::shared_ptr<torch::nn::Module>& model, const std::string& dir) {
  const peft::LoraConfig lora = read_peft_config(dir);
  const std::string path = dir + "/adapter_model.safetensors";
  // The model's adapters, and their scaling against the file's alpha / r.
  std::set<std::string> wanted;
  for (const auto& p : model->named_parameters()) {
    if (peft::is_lora_key(p.key())) wanted.insert(p.key());
  }
  const double scaling = lora.alpha / static_cast<double>(lora.rank);
  for (const auto& m : model->named_modules()) {
    const auto* layer = dynamic_cast<const peft::LoraLayer*>(m.value().get());
    if (layer && layer->lora_A && std::abs(layer->scaling - scaling) > 1e-12 * std::abs(scaling)) {
      throw ConfigError("load_peft_adapter: " + path + " is of lora_alpha / r = " + std::to_string(scaling) +
                        " but the model's module '" + m.key() + "' scales its adapters by " +
                        std::to_string(layer->scaling) + ": inject_lora with the directory's settings (read_peft_config)");
    }
  }
  const formats::SafetensorsHeader h = formats::read_safetensors_header(path);
  std::vector<std::string> problems;
  StateDict state;
  for (const auto& t : h.tensors) {
    const std::string key = t.name.rfind(kPrefix, 0) == 0 ? t.name.substr(kPrefix.size()) : t.name;
    if (!wanted.erase(key)) {
      problems.push_back("'" + t.name + "' is no adapter of the model");
      continue;
    }
    state.insert(key, formats::read_safetensors_tensor(path, h, t));
  }
  for (const auto& key : wanted) problems.push_back("the model's adapter '" + key + "' is missing");
  if (!problems.empty()) {
    std::string all;
    for (const auto& p : problems) all += (all.empty() ? "" : "; ") + p;
    throw ConfigError("load_peft_adapter: " + path + ": " + all);
  }
  set_model_state_dict(model, state, StateDictOptions().strict(false));
}

}  // namespace fsdp::hf
