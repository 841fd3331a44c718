// fsdp/models/llama_config_json.h — a Llama-family model's config.json
// read into a LlamaConfig (fsdp/models/llama_config.h), as transformers 5
// reads it, and written back for export. Every size is checked against
// memory as it is read (fsdp/models/llama_sizes.h), so that a hostile file
// ends in a ConfigError naming it. Local calls, no collectives.
#pragma once

#include <string>

#include "fsdp/models/llama_config.h"

namespace fsdp::models {

// Parses a config.json text. `where` names the file in errors. ConfigError
// naming the file, the key and what was expected for: text that is not a JSON
// object (or over 16 MiB), an architecture outside llama_architectures()
// (named, with the list), a missing or ill-typed key the model needs, sizes
// that do not fit (heads that do not divide, num_key_value_heads not dividing
// num_attention_heads), and settings that change the computation in ways not
// implemented (rope_type, partial_rotary_factor, hidden_act). Cost: linear in
// the text.
LlamaConfig parse_llama_config(const std::string& json_text, const std::string& where);
// Reads and parses the file `path` (a config.json).
LlamaConfig read_llama_config(const std::string& path);
// The config as transformers' config.json (for export): the source text's
// keys kept, the LlamaConfig fields written over them, "dtype" set to `dtype`,
// "transformers_version" set to the release emulated (5.25.0), and the legacy
// keys (rope_theta, rope_scaling, torch_dtype) written beside
// rope_parameters and dtype with the same values, so that transformers 4.x
// and 5 read the same model.
std::string llama_config_json(const LlamaConfig& config, const std::string& dtype);

}  // namespace fsdp::models
