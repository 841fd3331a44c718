// config.json of the Llama family, read as transformers 5 reads it
// (LlamaConfig, Qwen2Config, MistralConfig and RotaryEmbeddingConfigMixin's
// standardize_rope_params): the same defaults, the legacy keys of hub
// checkpoints (torch_dtype, rope_theta, rope_scaling with "type"), and a
// ConfigError naming the file and the key for everything else.
#include "fsdp/models/llama_config_json.h"

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <sstream>

#include "fsdp/error.h"
#include "fsdp/formats/regular_file.h"
#include "fsdp/models/llama_sizes.h"

namespace fsdp::models {

namespace {

using json = nlohmann::json;
constexpr size_t kMaxConfigBytes = 16u << 20;
// The transformers release whose config.json this file reads and writes
// (requirements.txt's pin).
constexpr const char* kEmulatedTransformers = "5.25.0";

[[noreturn]] void bad(const std::string& where, const std::string& key, const std::string& what) {
  throw ConfigError(where + ": key \"" + key + "\": " + what);
}

// j[key] if present and not null.
const json* field(const json& j, const std::string& key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return nullptr;
  return &*it;
}

int64_t int_of(const json& v, const std::string& where, const std::string& key) {
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float()) {  // 8.0 for an integer: accepted when whole, as Python's int() of it
    const double d = v.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15) return static_cast<int64_t>(d);
  }
  bad(where, key, "expected an integer, got " + v.dump());
}

int64_t get_int(const json& j, const std::string& key, int64_t fallback, const std::string& where,
                int64_t min = 0) {
  const json* v = field(j, key);
  const int64_t x = v ? int_of(*v, where, key) : fallback;
  if (x < min) bad(where, key, "expected an integer >= " + std::to_string(min) + ", got " + std::to_string(x));
  return x;
}

double get_double(const json& j, const std::string& key, double fallback, const std::string& where) {
  const json* v = field(j, key);
  if (!v) return fallback;
  if (!v->is_number()) bad(where, key, "expected a number, got " + v->dump());
  const double d = v->get<double>();
  if (!std::isfinite(d)) bad(where, key, "expected a finite number, got " + v->dump());
  return d;
}

bool get_bool(const json& j, const std::string& key, bool fallback, const std::string& where) {
  const json* v = field(j, key);
  if (!v) return fallback;
  if (!v->is_boolean()) bad(where, key, "expected true or false, got " + v->dump());
  return v->get<bool>();
}

std::string get_string(const json& j, const std::string& key, const std::string& fallback, const std::string& where) {
  const json* v = field(j, key);
  if (!v) return fallback;
  if (!v->is_string()) bad(where, key, "expected a string, got " + v->dump());
  return v->get<std::string>();
}

std::string supported_list() {
  std::string s;
  for (const auto& a : llama_architectures()) s += (s.empty() ? "" : ", ") + a;
  return s;
}

// Architecture and model_type, consistent with each other.
void read_architecture(const json& j, LlamaConfig& c, const std::string& where) {
  static const std::vector<std::pair<std::string, std::string>> kinds = {
      {"LlamaForCausalLM", "llama"}, {"Qwen2ForCausalLM", "qwen2"}, {"MistralForCausalLM", "mistral"}};
  std::string arch;
  if (const json* a = field(j, "architectures")) {
    if (!a->is_array() || a->empty() || !(*a)[0].is_string()) {
      bad(where, "architectures", "expected a list holding one architecture name, got " + a->dump());
    }
    if (a->size() != 1) bad(where, "architectures", "expected one architecture, got " + a->dump());
    arch = (*a)[0].get<std::string>();
  }
  const std::string type = get_string(j, "model_type", "", where);
  for (const auto& [name, model_type] : kinds) {
    if (arch.empty() ? type == model_type : arch == name) {
      if (!type.empty() && type != model_type) {
        bad(where, "model_type", "\"" + type + "\" disagrees with architectures [\"" + name + "\"] (expected \"" +
                                     model_type + "\")");
      }
      c.architecture = name;
      c.model_type = model_type;
      return;
    }
  }
  if (arch.empty() && type.empty()) {
    bad(where, "architectures", "missing (and no \"model_type\"); expected one of " + supported_list());
  }
  bad(where, arch.empty() ? "model_type" : "architectures",
      "\"" + (arch.empty() ? type : arch) + "\" is not supported; supported: " + supported_list());
}

// A warning through c10's handler, where the library's warnings go.
void warn(const std::string& where, const std::string& what) { TORCH_WARN("fsdp: ", where, ": ", what); }

// A RoPE value that must be a finite number above 0.
double positive(const json& j, const std::string& name, double fallback, const std::string& where,
                const std::string& key) {
  const json* v = field(j, name);
  if (!v) return fallback;
  if (!v->is_number()) bad(where, key, "expected a number, got " + v->dump());
  const double d = v->get<double>();
  if (!std::isfinite(d) || !(d > 0)) bad(where, key, "expected a finite number above 0, got " + v->dump());
  return d;
}

// The RoPE parameters, combined as transformers 5 combines them
// (convert_rope_params_to_dict, standardize_rope_params): a legacy
// `rope_scaling` (when not null or empty) replaces `rope_parameters` whole;
// within the dict they name, its own `rope_theta` (and
// partial_rotary_factor) wins over the top-level key, which is the default
// (10000.0 without one); `rope_type` wins over the legacy `type`. Where the
// keys disagree, a warning says how they were read. Every value that
// divides or is a base (rope_theta, factor, low_freq_factor,
// high_freq_factor) is refused by key unless finite and above 0.
void read_rope(const json& j, LlamaConfig& c, const std::string& where) {
  const json* scaling = field(j, "rope_scaling");
  const json* params = field(j, "rope_parameters");
  const bool scaling_used = scaling && !(scaling->is_object() && scaling->empty());
  const std::string key = scaling_used ? "rope_scaling" : "rope_parameters";
  const json* p = scaling_used ? scaling : params;
  json rope = p ? *p : json::object();
  if (!rope.is_object()) bad(where, key, "expected an object, got " + rope.dump());
  // Per-layer-type rope parameters (nested objects) are not this family's.
  for (auto it = rope.begin(); it != rope.end(); ++it) {
    if (it->is_object()) bad(where, key + "." + it.key(), "per-layer RoPE parameters are not supported");
  }
  const std::string k = key + ".";
  // What each dict says once transformers has filled it in (its rope_theta
  // from the top level, "type" as "rope_type"): fsdp-cpp's own export writes
  // rope_scaling as rope_parameters without its theta, which agrees.
  auto resolved = [&](json d) {
    if (!d.is_object()) return d;
    if (!d.contains("rope_theta") && field(j, "rope_theta")) d["rope_theta"] = *field(j, "rope_theta");
    if (!d.contains("rope_type") && d.contains("type")) d["rope_type"] = d["type"];
    d.erase("type");
    return d;
  };
  if (scaling_used && params && resolved(*params) != resolved(*scaling)) {
    warn(where,
         "both \"rope_scaling\" and \"rope_parameters\" are set and differ; read as transformers 5 reads them: "
         "\"rope_scaling\" " + scaling->dump() + " replaces \"rope_parameters\" " + params->dump() + " whole");
  }
  const double top_theta = positive(j, "rope_theta", 10000.0, where, "rope_theta");
  c.rope_theta = positive(rope, "rope_theta", top_theta, where, k + "rope_theta");
  if (field(rope, "rope_theta") && field(j, "rope_theta") && c.rope_theta != top_theta) {
    warn(where,
         "\"" + k + "rope_theta\" (" + field(rope, "rope_theta")->dump() + ") and the top-level \"rope_theta\" (" +
             field(j, "rope_theta")->dump() + ") differ; read as transformers 5 reads them: the " + key +
             " one, " + field(rope, "rope_theta")->dump());
  }
  std::string type = get_string(rope, "rope_type", "", where + " (" + key + ")");
  if (type.empty()) type = get_string(rope, "type", "default", where + " (" + key + ")");
  if (type != "default" && type != "linear" && type != "llama3") {
    bad(where, k + "rope_type",
        "\"" + type + "\" is not supported; supported: default, linear, llama3 (dynamic, yarn, longrope are not)");
  }
  c.rope_type = type;
  const double partial = rope.contains("partial_rotary_factor")
                             ? get_double(rope, "partial_rotary_factor", 1.0, where)
                             : get_double(j, "partial_rotary_factor", 1.0, where);
  if (partial != 1.0) bad(where, "partial_rotary_factor", "only 1.0 is supported, got " + std::to_string(partial));
  auto need = [&](const std::string& name) -> double {
    if (!field(rope, name)) bad(where, k + name, "missing; rope_type \"" + type + "\" needs it");
    return positive(rope, name, 0.0, where, k + name);
  };
  if (type == "linear" || type == "llama3") c.rope_factor = need("factor");
  if (type == "llama3") {
    c.rope_low_freq_factor = need("low_freq_factor");
    c.rope_high_freq_factor = need("high_freq_factor");
    if (c.rope_high_freq_factor == c.rope_low_freq_factor) {
      bad(where, k + "high_freq_factor", "must differ from low_freq_factor");
    }
    // A top-level original_max_position_embeddings wins (Phi-3's exception in
    // transformers); else the rope parameters', else max_position_embeddings.
    if (field(j, "original_max_position_embeddings")) {
      c.rope_original_max_position_embeddings = get_int(j, "original_max_position_embeddings", 0, where, 1);
    } else {
      c.rope_original_max_position_embeddings =
          get_int(rope, "original_max_position_embeddings", c.max_position_embeddings, where + " (" + key + ")", 1);
    }
  }
}

void read_windows(const json& j, LlamaConfig& c, const std::string& where) {
  const int64_t L = c.num_hidden_layers;
  int64_t window = 0;  // 0: none (null)
  if (const json* w = field(j, "sliding_window")) {
    window = int_of(*w, where, "sliding_window");
    if (window <= 0) bad(where, "sliding_window", "expected a positive integer or null");
  }
  std::vector<std::string> types;
  if (c.model_type == "qwen2") {
    if (!get_bool(j, "use_sliding_window", false, where)) window = 0;
    if (const json* t = field(j, "layer_types")) {
      if (!t->is_array() || static_cast<int64_t>(t->size()) != L) {
        bad(where, "layer_types", "expected a list of " + std::to_string(L) + " layer types");
      }
      for (size_t i = 0; i < t->size(); ++i) {
        const auto& e = (*t)[i];
        if (!e.is_string() || (e != "full_attention" && e != "sliding_attention")) {
          bad(where, "layer_types[" + std::to_string(i) + "]",
              "expected \"full_attention\" or \"sliding_attention\", got " + e.dump());
        }
        types.push_back(e.get<std::string>());
      }
    } else {
      const int64_t max_window_layers = get_int(j, "max_window_layers", 28, where);
      for (int64_t i = 0; i < L; ++i) {
        types.push_back(window > 0 && i >= max_window_layers ? "sliding_attention" : "full_attention");
      }
    }
  } else if (c.model_type == "mistral") {
    types.assign(L, window > 0 ? "sliding_attention" : "full_attention");
  } else {
    types.assign(L, "full_attention");  // Llama has no sliding window
  }
  c.layer_windows.assign(L, 0);
  for (int64_t i = 0; i < L; ++i) {
    if (types[i] == "sliding_attention") {
      if (!window) bad(where, "sliding_window", "layer " + std::to_string(i) + " slides but the window is null");
      c.layer_windows[i] = window;
    }
  }
}

}  // namespace

LlamaConfig parse_llama_config(const std::string& text, const std::string& where) {
  if (text.size() > kMaxConfigBytes) {
    throw ConfigError(where + ": " + std::to_string(text.size()) + " bytes; a config.json is expected under 16 MiB");
  }
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw ConfigError(where + ": not valid JSON (" + e.what() + ")");
  }
  if (!j.is_object()) throw ConfigError(where + ": expected a JSON object, got " + std::string(j.type_name()));
  LlamaConfig c;
  c.source_json = text;
  c.source_path = where;
  read_architecture(j, c, where);
  const bool llama = c.model_type == "llama", qwen2 = c.model_type == "qwen2", mistral = c.model_type == "mistral";
  // transformers' defaults per architecture.
  c.vocab_size = get_int(j, "vocab_size", llama ? 32000 : qwen2 ? 151936 : 32000, where, 1);
  c.hidden_size = get_int(j, "hidden_size", 4096, where, 1);
  c.intermediate_size = get_int(j, "intermediate_size", llama ? 11008 : qwen2 ? 22016 : 14336, where, 1);
  c.num_hidden_layers = get_int(j, "num_hidden_layers", 32, where, 0);
  c.num_attention_heads = get_int(j, "num_attention_heads", 32, where, 1);
  c.num_key_value_heads = get_int(j, "num_key_value_heads", mistral ? 8 : c.num_attention_heads, where, 1);
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    bad(where, "num_key_value_heads",
        std::to_string(c.num_key_value_heads) + " does not divide num_attention_heads=" +
            std::to_string(c.num_attention_heads));
  }
  if (llama && c.hidden_size % c.num_attention_heads != 0) {  // LlamaConfig.validate_architecture
    bad(where, "hidden_size",
        std::to_string(c.hidden_size) + " is not a multiple of num_attention_heads=" +
            std::to_string(c.num_attention_heads));
  }
  c.head_dim = get_int(j, "head_dim", c.hidden_size / c.num_attention_heads, where, 1);
  if (c.head_dim % 2 != 0) bad(where, "head_dim", "expected an even number (RoPE rotates pairs), got " + std::to_string(c.head_dim));
  c.max_position_embeddings = get_int(j, "max_position_embeddings", llama ? 2048 : qwen2 ? 32768 : 4096 * 32, where, 1);
  c.rms_norm_eps = get_double(j, "rms_norm_eps", 1e-6, where);
  if (c.rms_norm_eps < 0) bad(where, "rms_norm_eps", "expected a non-negative number");
  c.initializer_range = get_double(j, "initializer_range", 0.02, where);
  c.tie_word_embeddings = get_bool(j, "tie_word_embeddings", false, where);
  c.attention_bias = llama && get_bool(j, "attention_bias", false, where);
  c.qkv_bias = qwen2;
  c.mlp_bias = llama && get_bool(j, "mlp_bias", false, where);
  c.attention_dropout = get_double(j, "attention_dropout", 0.0, where);
  if (c.attention_dropout < 0 || c.attention_dropout >= 1) bad(where, "attention_dropout", "expected a number in [0, 1)");
  const std::string act = get_string(j, "hidden_act", "silu", where);
  if (act != "silu") bad(where, "hidden_act", "\"" + act + "\" is not supported; supported: silu");
  read_rope(j, c, where);
  check_llama_sizes(c, where);  // before anything of num_hidden_layers' length is made
  read_windows(j, c, where);
  if (const json* p = field(j, "pad_token_id")) c.pad_token_id = int_of(*p, where, "pad_token_id");
  if (c.pad_token_id && (*c.pad_token_id < 0 || *c.pad_token_id >= c.vocab_size)) {
    bad(where, "pad_token_id", "expected a token id below vocab_size=" + std::to_string(c.vocab_size));
  }
  if (const json* b = field(j, "bos_token_id")) c.bos_token_id = int_of(*b, where, "bos_token_id");
  if (const json* e = field(j, "eos_token_id")) {
    if (e->is_array()) {
      for (size_t i = 0; i < e->size(); ++i) {
        c.eos_token_ids.push_back(int_of((*e)[i], where, "eos_token_id[" + std::to_string(i) + "]"));
      }
    } else {
      c.eos_token_ids.push_back(int_of(*e, where, "eos_token_id"));
    }
  }
  // `dtype` (transformers 5), else the legacy `torch_dtype`.
  c.dtype = get_string(j, "dtype", "", where);
  if (c.dtype.empty()) c.dtype = get_string(j, "torch_dtype", "float32", where);
  if (c.dtype != "float32" && c.dtype != "bfloat16" && c.dtype != "float16") {
    bad(where, field(j, "dtype") ? "dtype" : "torch_dtype",
        "\"" + c.dtype + "\" is not supported; supported: float32, bfloat16, float16");
  }
  return c;
}

LlamaConfig read_llama_config(const std::string& path) {
  // formats' regular-file check: a FIFO is refused, never waited on; a
  // directory or a device is named.
  return parse_llama_config(formats::read_regular_file(path, kMaxConfigBytes, "a model's config.json"), path);
}

std::string llama_config_json(const LlamaConfig& c, const std::string& dtype) {
  json j = c.source_json.empty() ? json::object() : json::parse(c.source_json);
  j["architectures"] = json::array({c.architecture});
  j["model_type"] = c.model_type;
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["head_dim"] = c.head_dim;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["hidden_act"] = "silu";
  if (c.model_type == "llama") {
    j["attention_bias"] = c.attention_bias;
    j["mlp_bias"] = c.mlp_bias;
  }
  json rope = {{"rope_type", c.rope_type}, {"rope_theta", c.rope_theta}};
  if (c.rope_type != "default") rope["factor"] = c.rope_factor;
  if (c.rope_type == "llama3") {
    rope["low_freq_factor"] = c.rope_low_freq_factor;
    rope["high_freq_factor"] = c.rope_high_freq_factor;
    rope["original_max_position_embeddings"] = c.rope_original_max_position_embeddings;
  }
  j["rope_parameters"] = rope;
  // The legacy keys too, equal to rope_parameters, so that a transformers 4.x
  // reader (which knows only rope_theta, rope_scaling and torch_dtype) builds
  // the same model: transformers 5 takes a non-null rope_scaling whole in
  // place of rope_parameters and fills its rope_theta from the top level,
  // which is the same theta.
  j["rope_theta"] = c.rope_theta;
  if (c.rope_type == "default") {
    j["rope_scaling"] = nullptr;
  } else {
    json scaling = rope;
    scaling.erase("rope_theta");
    j["rope_scaling"] = scaling;
  }
  j["dtype"] = dtype;
  j["torch_dtype"] = dtype;
  // The keys written are those of the transformers release requirements.txt
  // pins (and that the tests compare with), not the source's.
  j["transformers_version"] = kEmulatedTransformers;
  return j.dump(2) + "\n";
}

}  // namespace fsdp::models
