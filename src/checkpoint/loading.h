// src/checkpoint/loading.h — what the loader's three steps share
// (fsdp/checkpoint/storage.h describes the seam): lookups in any storage
// (indexed_reader.cpp; the built-in readers are in readers.h), the plan
// (plan.cpp) and its apply step (apply.cpp), called by loader.cpp.
// Private to the checkpoint module.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "fsdp/checkpoint/checkpoint_io.h"
#include "fsdp/checkpoint/storage.h"
#include "fsdp/formats/format.h"
#include "fsdp/formats/safetensors.h"
#include "fsdp/formats/torch_pickle.h"
#include "fsdp/state_dict/state_dict.h"

namespace torch::optim {
class Optimizer;
}

namespace fsdp::detail {

// ---- Reading: what every storage offers (indexed_reader.cpp) ----
// The built-in storage readers, one per format, are in readers.h; the
// registry that detects them in storage_registry.cpp.

// The entry `name` of `reader`'s index; null if absent.
const formats::EntryRecord* find_entry(const StorageReader& reader, const std::string& name);
// The one model entry of `reader`; ConfigError "<caller>: <what> holds ..."
// if it holds none or several.
const formats::EntryRecord& the_model(const StorageReader& reader, const std::string& caller, const std::string& what);
// The tensor `key` of `reader`'s index; ConfigError naming the storage if absent.
const formats::TensorEntry& find_tensor(const StorageReader& reader, const std::string& key);

// [local, I/O] The whole tensor `key` of `reader`, read chunk by chunk;
// ConfigError naming the storage if its chunks do not cover it.
at::Tensor read_whole(const StorageReader& reader, const std::string& key);

// ---- The plan (plan.cpp) ----

// The default plan of loading the entries `state` asks for that `reader`
// holds, and the tensor values beyond them: model entries by the boxes
// their model holds, optimizers by the boxes of `optimizers_model` (the
// model they belong to), values whole. ConfigError for an optimizer keyed
// by ids whose groups do not match the optimizer's.
LoadPlan plan_state(const StorageReader& reader, const CheckpointState& state,
                    const std::shared_ptr<torch::nn::Module>& optimizers_model);
// The default plan of loading model entry `entry` into `model`.
LoadPlan plan_model(const StorageReader& reader, const std::string& entry,
                    const std::shared_ptr<torch::nn::Module>& model);

// The boxes this rank holds of every key of `model`'s state (SHARDED view),
// with the key's global shape.
struct LocalBoxes {
  std::string key;
  std::vector<int64_t> shape;
  std::vector<Shard> boxes;
};
std::vector<LocalBoxes> local_boxes(const std::shared_ptr<torch::nn::Module>& model);

// A saved optimizer state key ("<param>.<field>", the parameter as saved: a
// name, or an id that `ids` names) by the parameter's name.
std::string state_key_name(const std::string& stored, const std::map<std::string, std::string>& ids);
// The parameter of optimizer state key `name` ("<param>.<field>") among
// `params`; null when it names none.
const LocalBoxes* param_of(const std::string& name, const std::map<std::string, LocalBoxes>& params);

// PyTorch's parameter ids (optimizer.state_dict()) -> the names of the
// parameters they stand for: group by group, the i-th id of a group is the
// group's i-th parameter in the model's order (optimizer_param_names).
// Empty unless reader.keyed_by_ids(rec.name).
std::map<std::string, std::string> names_of_ids(const StorageReader& reader, const formats::EntryRecord& rec,
                                                const std::shared_ptr<torch::nn::Module>& model,
                                                const torch::optim::Optimizer& optimizer);

// ---- Applying a plan (apply.cpp) ----

// [local, I/O] The tensors `read` plans, one per box, of the saved dtype:
// each planned chunk read once and copied into the boxes it overlaps.
// ConfigError naming the storage when the chunks do not cover the boxes.
std::vector<at::Tensor> apply_read(const StorageReader& reader, const TensorRead& read);

// Loads model entry `entry` of `reader` into `model`, reading what `plan`
// plans for it (a key the plan leaves out is missing).
void load_model(const StorageReader& reader, const LoadPlan& plan, const std::string& entry,
                const std::shared_ptr<torch::nn::Module>& model, bool strict);
// Loads optimizer entry `entry` into `optimizer` of `model`, as planned.
void load_optimizer(const StorageReader& reader, const LoadPlan& plan, const std::string& entry,
                    const std::shared_ptr<torch::nn::Module>& model, torch::optim::Optimizer& optimizer);
// The value `e`, a tensor as planned; nullopt for a tensor the plan leaves out.
std::optional<CheckpointValue> read_value(const StorageReader& reader, const LoadPlan& plan,
                                          const formats::EntryRecord& e);

}  // namespace fsdp::detail
