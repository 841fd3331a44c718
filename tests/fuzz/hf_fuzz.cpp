// libFuzzer targets for the readers of a Hugging Face model directory
// (scripts/fuzz.sh):
//   FSDP_FUZZ_HF_CONFIG  a config.json (fsdp/models/llama.h's
//                        parse_llama_config): a config it accepts gives its
//                        state's shapes, and its export text
//                        (llama_config_json) parses back to the same sizes
//   FSDP_FUZZ_HF_INDEX   a model.safetensors.index.json
//                        (fsdp/checkpoint/hf_storage.h's HfStorageReader)
//                        beside two real safetensors files: an index it
//                        accepts is checked against a tiny config
//                        (fsdp/hf/hf_model.h's check_weights) and every chunk
//                        of every tensor is read
// An fsdp::Error (the ConfigError naming the file and the key) is the
// expected outcome of bad input; a crash, a hang, an out-of-bounds access
// (AddressSanitizer), any other exception, or an allocation beyond
// libFuzzer's -malloc_limit_mb is a finding. With FSDP_FUZZ_SEEDS=<dir>, the
// target first writes its seed corpus there: configs in the layouts
// transformers 5 and hub checkpoints write (Llama 3 with llama3 RoPE, Qwen2
// with a sliding window, Mistral, legacy keys), or indexes that
// save_pretrained writes.
#include <ATen/ATen.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "fsdp/checkpoint/hf_storage.h"
#include "fsdp/error.h"
#include "fsdp/formats/safetensors.h"
#include "fsdp/hf/hf_model.h"
#include "fsdp/models/llama.h"

namespace {

namespace fs = std::filesystem;

void write(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

const char* const kConfigs[] = {
    R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 96, "hidden_size": 32,
"intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
"max_position_embeddings": 64, "rms_norm_eps": 1e-06, "attention_bias": false, "mlp_bias": false, "dtype": "float32",
"rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
"high_freq_factor": 4.0, "original_max_position_embeddings": 16}, "tie_word_embeddings": false, "bos_token_id": 1,
"eos_token_id": [2, 3], "pad_token_id": null})",
    R"({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 96, "hidden_size": 32,
"intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
"layer_types": ["full_attention", "sliding_attention"], "max_window_layers": 1, "sliding_window": 4,
"use_sliding_window": true, "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}, "dtype": "bfloat16"})",
    R"({"architectures": ["MistralForCausalLM"], "hidden_size": 64, "num_attention_heads": 16, "num_hidden_layers": 3,
"sliding_window": 16, "rope_scaling": {"type": "linear", "factor": 2.0}, "torch_dtype": "float16"})",
    R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
"vocab_size": 100, "rope_theta": 500000.0, "torch_dtype": "bfloat16", "tie_word_embeddings": true,
"rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
"original_max_position_embeddings": 8192, "rope_type": "llama3"}})",
};

#ifdef FSDP_FUZZ_HF_INDEX
// The tiny config whose tensors the two files hold.
const fsdp::models::LlamaConfig& tiny() {
  static const fsdp::models::LlamaConfig c = fsdp::models::parse_llama_config(
      R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 16, "hidden_size": 8, "intermediate_size": 16,
"num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1})",
      "config.json");
  return c;
}

// A directory with the tiny model's tensors split over two files (written once).
const std::string& model_dir() {
  static const std::string dir = [] {
    char tmpl[] = "/tmp/fsdp-fuzz-hf-XXXXXX";
    const std::string d = mkdtemp(tmpl);
    const auto shapes = fsdp::models::llama_state_shapes(tiny());
    for (int f = 0; f < 2; ++f) {
      std::vector<fsdp::formats::SafetensorsTensor> plan;
      for (size_t i = 0; i < shapes.size(); ++i) {
        if (static_cast<int>(i % 2) == f) plan.push_back({shapes[i].first, at::kFloat, shapes[i].second, 0, 0});
      }
      fsdp::formats::SafetensorsWriter w(d + "/model-0000" + std::to_string(f + 1) + "-of-00002.safetensors", plan, {});
      for (const auto& t : w.layout()) w.write(at::randn(t.shape));
      w.commit();
    }
    return d;
  }();
  return dir;
}

std::string real_index() {
  const auto shapes = fsdp::models::llama_state_shapes(tiny());
  std::string map;
  for (size_t i = 0; i < shapes.size(); ++i) {
    map += std::string(i ? ",\n    " : "") + "\"" + shapes[i].first + "\": \"model-0000" + std::to_string(i % 2 + 1) +
           "-of-00002.safetensors\"";
  }
  return "{\n  \"metadata\": {\"total_parameters\": 672, \"total_size\": 2688},\n  \"weight_map\": {\n    " + map +
         "\n  }\n}\n";
}
#endif

void write_seeds(const std::string& dir) {
  fs::create_directories(dir);
#ifdef FSDP_FUZZ_HF_CONFIG
  int n = 0;
  for (const char* c : kConfigs) write(dir + "/seed-" + std::to_string(n++), c);
#endif
#ifdef FSDP_FUZZ_HF_INDEX
  write(dir + "/seed-real", real_index());
  write(dir + "/seed-missing-file", "{\"weight_map\": {\"model.norm.weight\": \"model-00009-of-00009.safetensors\"}}");
#endif
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* seeds = std::getenv("FSDP_FUZZ_SEEDS")) write_seeds(seeds);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
#ifdef FSDP_FUZZ_HF_CONFIG
  try {
    const auto c = fsdp::models::parse_llama_config(input, "config.json");
    const auto shapes = fsdp::models::llama_state_shapes(c);
    const auto again = fsdp::models::parse_llama_config(fsdp::models::llama_config_json(c, "float32"), "exported");
    if (fsdp::models::llama_state_shapes(again) != shapes) std::abort();  // the export must keep the sizes
  } catch (const fsdp::Error&) {
  }
#endif
#ifdef FSDP_FUZZ_HF_INDEX
  const std::string& dir = model_dir();
  write(dir + "/model.safetensors.index.json", input);
  try {
    fsdp::HfStorageReader reader(dir, 24);
    fsdp::hf::check_weights(reader, tiny());
    for (const auto& [key, t] : reader.index().tensors) {
      for (size_t i = 0; i < t.chunks.size(); ++i) (void)reader.read_chunk(key, i);
    }
  } catch (const fsdp::Error&) {
  }
#endif
  return 0;
}
