// PEFT's adapter directory (fsdp/hf/peft.h): save_peft_adapter writes
// adapter_model.safetensors and adapter_config.json; read_peft_config and
// load_peft_adapter read them back onto a model inject_lora adapted.
#include "fsdp/hf/peft.h"

#include <cmath>
#include <cstdint>
#include <map>
#include <set>
#include <vector>

#include <c10/core/ScalarType.h>

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

// The shape the model's adapter `key` ("<module>.lora_A.weight") has, whole
// (unsharded: LoraLayer's Linear options keep in and out), for each adapter
// of `model`. ConfigError naming `where` and the key ("r", "lora_alpha")
// when a module's adapters are not of `lora`'s rank and scaling (then `hint`).
std::map<std::string, std::vector<int64_t>> adapter_shapes(torch::nn::Module& model, const peft::LoraConfig& lora,
                                                           const std::string& where_text, const std::string& hint) {
  std::map<std::string, std::vector<int64_t>> shapes;
  const double scaling = lora.alpha / static_cast<double>(lora.rank);
  for (const auto& m : model.named_modules()) {
    const auto* layer = dynamic_cast<const peft::LoraLayer*>(m.value().get());
    if (!layer || !layer->lora_A) continue;
    const auto& a = layer->lora_A->options;
    const auto& b = layer->lora_B->options;
    const std::string where = where_text + ": key ";
    if (a.out_features() != lora.rank) {
      throw ConfigError(where + "\"r\": " + std::to_string(lora.rank) + ", but the model's module '" + m.key() +
                        "' has adapters of rank " + std::to_string(a.out_features()) + hint);
    }
    if (std::abs(layer->scaling - scaling) > 1e-12 * std::abs(scaling)) {
      throw ConfigError(where + "\"lora_alpha\": " + std::to_string(lora.alpha) + " makes lora_alpha / r = " +
                        std::to_string(scaling) + ", but the model's module '" + m.key() + "' scales its adapters by " +
                        std::to_string(layer->scaling) + hint);
    }
    const std::string prefix = m.key().empty() ? "" : m.key() + ".";
    shapes[prefix + "lora_A.weight"] = {a.out_features(), a.in_features()};
    shapes[prefix + "lora_B.weight"] = {b.out_features(), b.in_features()};
  }
  return shapes;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string out;
  for (const int64_t d : shape) out += (out.empty() ? "" : ", ") + std::to_string(d);
  return "[" + out + "]";
}

}  // namespace

void save_peft_adapter(const std::shared_ptr<torch::nn::Module>& model, const peft::LoraConfig& lora,
                       const std::string& out_dir, const std::string& base_model, dist::ProcessGroup& group) {
  if (lora.rank <= 0) throw ConfigError("save_peft_adapter: the model has no LoRA adapters (rank 0)");
  // The file's r and lora_alpha are `lora`'s: the model's adapters must be of
  // them (every rank sees the same modules: all throw, before the gather).
  adapter_shapes(*model, lora, "save_peft_adapter: the LoraConfig given",
                 ": pass the LoraConfig the model was adapted with (inject_lora's)");
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
  auto bad = [&](const std::string& key, const std::string& expected, const json* got) {
    return ConfigError(path + ": key \"" + key + "\": expected " + expected + ", got " +
                       (got ? got->dump().substr(0, 200) : std::string("nothing (the key is missing)")));
  };
  auto at = [&](const char* key) -> const json* {
    const auto it = c.find(key);
    return it == c.end() || it->is_null() ? nullptr : &*it;
  };
  if (!c.is_object()) throw ConfigError(path + ": expected a JSON object of PEFT's settings, got " + c.type_name());
  if (const json* t = at("peft_type"); !t || *t != "LORA") throw bad("peft_type", "\"LORA\"", t);
  peft::LoraConfig lora;
  // r: a positive int64 (a 2^63 or larger is unsigned in JSON and would wrap).
  const json* r = at("r");
  if (!r || !(r->is_number_integer() && (r->is_number_unsigned() ? r->get<uint64_t>() <= INT64_MAX : true) &&
              r->get<int64_t>() >= 1)) {
    throw bad("r", "an integer >= 1 (the adapters' rank)", r);
  }
  lora.rank = r->get<int64_t>();
  const json* alpha = at("lora_alpha");
  if (!alpha || !alpha->is_number() || !(alpha->get<double>() > 0) || !std::isfinite(alpha->get<double>())) {
    throw bad("lora_alpha", "a finite number > 0", alpha);
  }
  lora.alpha = alpha->get<double>();
  const std::string names = "a list of module names (PEFT's regex string is not supported)";
  const json* t = at("target_modules");
  if (!t || !t->is_array() || t->empty()) throw bad("target_modules", names, t);
  lora.targets.clear();
  for (const auto& name : *t) {
    if (!name.is_string() || name.get<std::string>().empty()) throw bad("target_modules", names, &name);
    lora.targets.push_back(name.get<std::string>());
  }
  try {
    peft::check_lora_config(lora);
  } catch (const ConfigError& e) {
    throw ConfigError(path + ": key \"target_modules\": " + e.what());  // what is left: a name given twice
  }
  return lora;
}

void load_peft_adapter(const std::shared_ptr<torch::nn::Module>& model, const std::string& dir) {
  const peft::LoraConfig lora = read_peft_config(dir);
  const std::string path = dir + "/adapter_model.safetensors";
  // The model's adapters, whole, checked against the file's r and lora_alpha
  // (another module's "lora_" parameter: of a shape load_state_dict checks).
  std::map<std::string, std::vector<int64_t>> wanted = adapter_shapes(*model, lora, dir + "/adapter_config.json",
                     ": inject_lora with the directory's settings (read_peft_config)");
  for (const auto& p : model->named_parameters()) {
    if (peft::is_lora_key(p.key())) wanted.emplace(p.key(), std::vector<int64_t>{});
  }
  // Every entry of the header against the model's before a byte is read.
  const formats::SafetensorsHeader h = formats::read_safetensors_header(path);
  auto key_of = [](const std::string& name) { return name.rfind(kPrefix, 0) == 0 ? name.substr(kPrefix.size()) : name; };
  std::vector<std::string> problems;
  std::set<std::string> found;
  for (const auto& t : h.tensors) {
    const auto it = wanted.find(key_of(t.name));
    if (it == wanted.end()) {
      problems.push_back("'" + t.name + "' is no adapter of the model");
      continue;
    }
    found.insert(it->first);
    if (!it->second.empty() && t.shape != it->second) {
      problems.push_back("'" + t.name + "' has the shape " + shape_text(t.shape) + ", the model's adapter " +
                         shape_text(it->second));
    } else if (!at::isFloatingType(t.dtype)) {
      problems.push_back("'" + t.name + "' is of dtype " + formats::safetensors_dtype_name(t.dtype) +
                         ", expected a floating-point one");
    }
  }
  for (const auto& [key, shape] : wanted) {
    if (!found.count(key)) problems.push_back("the model's adapter '" + key + "' is missing");
  }
  if (!problems.empty()) {
    std::string all;
    for (const auto& p : problems) all += (all.empty() ? "" : "; ") + p;
    throw ConfigError("load_peft_adapter: " + path + ": " + all);
  }
  StateDict state;
  for (const auto& t : h.tensors) state.insert(key_of(t.name), formats::read_safetensors_tensor(path, h, t));
  set_model_state_dict(model, state, StateDictOptions().strict(false));
}

}  // namespace fsdp::hf
