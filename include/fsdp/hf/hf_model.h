// fsdp/hf/hf_model.h — Hugging Face model directories in and out for the
// Llama family (fsdp/models/llama.h): its config.json, its weights checked
// against the config, loaded into a model that either engine may already
// have sharded, each rank reading only the byte ranges of its shards
// (fsdp/checkpoint/hf_storage.h). docs/models.md.
//
//   auto config = fsdp::hf::read_config(dir);         // dir/config.json
//   fsdp::EmptyInitGuard empty;                       // layers wait for sharding
//   fsdp::Unit<fsdp::models::LlamaImpl> model(config);
//   for (auto& layer : model->model->layers) fsdp::fully_shard(layer, {mesh});
//   fsdp::fully_shard(model, {mesh});
//   fsdp::hf::load_weights(dir, config, model.ptr(), *world);  // [collective]
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <vector>
#include <memory>
#include <string>

#include <torch/nn/module.h>

#include "fsdp/checkpoint/hf_storage.h"
#include "fsdp/distributed/process_group.h"
#include "fsdp/models/llama.h"

namespace fsdp::hf {

// [local] The model's config: `dir`/config.json, parsed as
// models::parse_llama_config does (its errors name that file).
models::LlamaConfig read_config(const std::string& dir);

// [local] The tensors of `reader` against the state a model of `config`
// has (models::llama_state_shapes): ConfigError naming the file (or the
// index) and the key for a tensor the config expects that no file holds, a
// tensor the config has no place for, and a shape that disagrees (with the
// expected shape and the config keys it comes from). transformers'
// save_pretrained omits a tied lm_head.weight; a file that holds it anyway
// (older saves) is accepted when tie_word_embeddings is set, and skipped.
void check_weights(const HfStorageReader& reader, const models::LlamaConfig& config);
// The same for any tensors: `shapes` by state-dict name; `location` names
// the whole (an index, a checkpoint) and `file_of(name)` the file that holds
// a tensor, in messages.
void check_tensors(const std::map<std::string, std::vector<int64_t>>& shapes, const models::LlamaConfig& config,
                   const std::string& location, const std::function<std::string(const std::string&)>& file_of);

// What a load read and held, per rank (HfStorageReader's counters).
struct LoadStats {
  int64_t bytes_read = 0;          // tensor bytes read from the files
  int64_t peak_buffer_bytes = 0;   // the most bytes of read chunks alive at once
};

// [collective over `group`] Loads the weights of the Hugging Face model
// directory `dir` into `model` (a models::Llama of the directory's config,
// unwrapped, FSDP1-wrapped or fully_shard-ed), after check_weights against
// `config`. Each rank reads only the chunks its shards overlap (of at most
// `chunk_bytes`), converted to the model's dtype. Returns this rank's
// counters. Errors are agreed across ranks, as load_checkpoint's.
LoadStats load_weights(const std::string& dir, const models::LlamaConfig& config,
                       const std::shared_ptr<torch::nn::Module>& model, dist::ProcessGroup& group,
                       int64_t chunk_bytes = HfStorageReader::kDefaultChunkBytes);

}  // namespace fsdp::hf
