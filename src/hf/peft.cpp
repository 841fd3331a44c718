// save_peft_adapter: LoRA adapters as PEFT's adapter_model.safetensors and
// adapter_config.json (fsdp/hf/peft.h).
#include "fsdp/hf/peft.h"

#include <nlohmann/json.hpp>

#include "fsdp/distributed/rank_errors.h"
#include "fsdp/error.h"
#include "fsdp/formats/safetensors.h"
#include "fsdp/state_dict/distributed_state_dict.h"
#include "new_directory.h"

namespace fsdp::hf {

using json = nlohmann::json;

void save_peft_adapter(const std::shared_ptr<torch::nn::Module>& model, const models::LlamaConfig& config,
                       const std::string& out_dir, const std::string& base_model, dist::ProcessGroup& group) {
  if (config.lora.rank <= 0) throw ConfigError("save_peft_adapter: the model has no LoRA adapters (rank 0)");
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
                  if (key.find(".lora_A.") == std::string::npos && key.find(".lora_B.") == std::string::npos) {
                    throw ConfigError("save_peft_adapter: parameter " + key +
                                      " requires a gradient but is not a LoRA adapter; PEFT's file holds adapters only");
                  }
                  const at::Tensor& t = adapters.tensor(key);
                  const std::string name = "base_model.model." + key;
                  plan.push_back({name, t.scalar_type(), t.sizes().vec(), 0, 0});
                  by_name[name] = t;
                }
                formats::SafetensorsWriter w(out->staging() + "/adapter_model.safetensors", plan, {{"format", "pt"}});
                for (const auto& t : w.layout()) w.write(by_name.at(t.name));
                w.commit();
                json c = {{"peft_type", "LORA"},
                          {"task_type", "CAUSAL_LM"},
                          {"r", config.lora.rank},
                          {"lora_alpha", config.lora.alpha},
                          {"lora_dropout", 0.0},
                          {"target_modules", config.lora.targets},
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

}  // namespace fsdp::hf
