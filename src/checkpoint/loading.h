// src/checkpoint/loading.h — what the loader's three steps share
// (fsdp/checkpoint/storage.h describes the seam): the built-in storage
// (sources.cpp, pickled.cpp; also used by tools.cpp and copy_to_sharded),
// the plan (plan.cpp) and its apply step (apply.cpp), called by loader.cpp.
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

// ---- Reading: the built-in storage (sources.cpp), plan (plan.cpp), apply (apply.cpp) ----

// The built-in storage: an opened checkpoint of any format load_checkpoint
// reads, its index and where its bytes are.
struct Source : StorageReader {
  std::string path;
  std::string where;  // the index file, for messages
  formats::Index ix;
  std::unique_ptr<formats::FullReader> full;  // full format (and raw)
  std::string dir;                         // sharded format
  bool raw = false;  // a module state dict from torch.save (open_source's accept_raw): `full` and `pickled` only
  // A full checkpoint that PyTorch or Lightning wrote (no fsdp-cpp index),
  // or a raw source: `ix` is built from its pickle (index_pickled,
  // index_raw); its tensors are views of the zip's storage records, without
  // chunks or checksums.
  std::map<std::string, formats::pickle::TensorRef> pickled;  // by tensor key
  std::set<std::string> numbered;  // optimizer entries keyed by PyTorch's parameter ids (0, 1, ...), not names
  // A safetensors file (accept_raw): its header; `ix` holds its tensors as one model entry, without chunks.
  std::unique_ptr<formats::SafetensorsHeader> safetensors;
  std::map<std::string, size_t> safetensors_at;  // tensor key -> its place in safetensors->tensors

  const formats::Index& index() const override { return ix; }
  std::string location() const override { return where; }
  std::vector<StorageBox> chunks(const std::string& key) const override;
  at::Tensor read_chunk(const std::string& key, size_t chunk) const override;
  bool keyed_by_ids(const std::string& entry) const override { return numbered.count(entry) > 0; }

  const formats::EntryRecord* entry(const std::string& name) const;  // null if absent
  // The checkpoint's one model entry; ConfigError (starting with `caller`)
  // if it holds none or several.
  const formats::EntryRecord& the_model(const std::string& caller) const;
  // ConfigError if the index has no tensor `key`.
  const formats::TensorEntry& tensor(const std::string& key) const;
  // The whole tensor `key`; ConfigError if its chunks do not cover it.
  at::Tensor read_whole(const std::string& key) const;
};

// The entry `name` of `reader`'s index; null if absent.
const formats::EntryRecord* find_entry(const StorageReader& reader, const std::string& name);
// The one model entry of `reader`; ConfigError "<caller>: <what> holds ..."
// if it holds none or several.
const formats::EntryRecord& the_model(const StorageReader& reader, const std::string& caller, const std::string& what);
// The tensor `key` of `reader`'s index; ConfigError naming the storage if absent.
const formats::TensorEntry& find_tensor(const StorageReader& reader, const std::string& key);

// The entries of the pickle of `s.full` (a torch.save'd dict: Lightning's or
// FSDP's full checkpoint, or {"model": model.state_dict(), "optimizer":
// optimizer.state_dict(), ...}) into s.ix and s.pickled (pickled.cpp).
// A dict of tensors is a model, a dict with "state" and "param_groups" an
// optimizer, a number, bool, string or tensor a value; other dicts nest
// ("a.b" for {"a": {"b": ...}}); anything else is left out. ConfigError
// naming the file when the pickle is not a dict or is malformed.
void index_pickled(Source& s);

// Opens `path` (either format; ConfigError "does not point to a valid
// checkpoint" or naming the damage). accept_raw: a PyTorch zip file without
// fsdp-cpp's index whose pickle may be a module's state dict opens as a raw
// source, and a safetensors file (by content, or any file named
// *.safetensors) as one with its header; PyTorch's legacy format and
// TorchScript archives are named as such. Without accept_raw a safetensors
// file is "not a valid checkpoint", saying how it loads.
std::unique_ptr<Source> open_source(const std::string& path, bool accept_raw = false);

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
