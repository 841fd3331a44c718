// The plan of a load (fsdp/checkpoint/storage.h): which pieces of which saved
// chunks each of this rank's boxes needs, computed from the storage's index
// and the model's local boxes. Reads no tensor data.
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <sstream>

#include "fsdp/checkpoint/checkpoint_io.h"
#include "fsdp/checkpoint/storage.h"
#include "fsdp/error.h"
#include "fsdp/state_dict/detail/optimizer_kinds.h"
#include "fsdp/state_dict/detail/visit.h"
#include "fsdp/state_dict/optim_state_dict.h"
#include "loading.h"
#include "parts.h"

namespace fsdp {

std::string LoadPlan::to_string() const {
  std::ostringstream os;
  for (const auto& r : reads) {
    os << r.key << (r.whole ? " (whole):" : ":");
    for (const auto& b : r.boxes) {
      os << " " << c10::IntArrayRef(b.box.offsets) << "+" << c10::IntArrayRef(b.box.sizes) << " <- chunks {";
      for (size_t i = 0; i < b.chunks.size(); ++i) os << (i ? ", " : "") << b.chunks[i];
      os << "}";
    }
    os << "\n";
  }
  return os.str();
}

namespace detail {

std::vector<LocalBoxes> local_boxes(const std::shared_ptr<torch::nn::Module>& model) {
  std::vector<LocalBoxes> out;
  StateDictTypeGuard guard(model, StateDictType::kSharded);
  visit_state_dict(model, "", [&](const std::string& key, StateValue v) {
    if (std::holds_alternative<at::Tensor>(v)) {
      const auto& t = std::get<at::Tensor>(v);
      out.push_back({key, t.sizes().vec(), {Shard{std::vector<int64_t>(static_cast<size_t>(t.dim()), 0), t}}});
    } else {
      const auto& st = std::get<ShardedTensor>(v);
      out.push_back({key, st.global_shape, st.local_shards});
    }
  });
  return out;
}

std::string state_key_name(const std::string& stored, const std::map<std::string, std::string>& ids) {
  const auto sep = stored.rfind('.');
  if (sep == std::string::npos) return stored;
  auto it = ids.find(stored.substr(0, sep));
  return (it == ids.end() ? stored.substr(0, sep) : it->second) + stored.substr(sep);
}

const LocalBoxes* param_of(const std::string& name, const std::map<std::string, LocalBoxes>& params) {
  const auto dot = name.rfind('.');
  if (dot == std::string::npos) return nullptr;
  auto it = params.find(name.substr(0, dot));
  return it == params.end() ? nullptr : &it->second;
}

std::map<std::string, std::string> names_of_ids(const StorageReader& reader, const formats::EntryRecord& rec,
                                                const std::shared_ptr<torch::nn::Module>& model,
                                                const torch::optim::Optimizer& optimizer) {
  std::map<std::string, std::string> out;
  if (!reader.keyed_by_ids(rec.name)) return out;
  const auto names = optimizer_param_names(model, optimizer);
  const std::string where = "checkpoint: " + reader.location() + ", optimizer '" + rec.name + "'";
  if (names.size() != rec.param_groups.size()) {
    throw ConfigError(where + " has " + std::to_string(rec.param_groups.size()) + " param groups, the optimizer " +
                      std::to_string(names.size()));
  }
  for (size_t g = 0; g < names.size(); ++g) {
    const auto& ids = rec.param_groups[g].params;
    if (ids.size() != names[g].size()) {
      throw ConfigError(where + ": param_groups[" + std::to_string(g) + "] numbers " + std::to_string(ids.size()) +
                        " parameters, the optimizer's group holds " + std::to_string(names[g].size()));
    }
    for (size_t i = 0; i < ids.size(); ++i) {
      if (!out.emplace(ids[i], names[g][i]).second) throw ConfigError(where + " lists parameter id " + ids[i] + " twice");
    }
  }
  return out;
}

namespace {

// `box`, with the saved chunks of `chunks` that overlap it.
BoxRead box_read(const std::vector<StorageBox>& chunks, StorageBox box) {
  BoxRead out{std::move(box), {}};
  for (size_t i = 0; i < chunks.size(); ++i) {
    const StorageBox& c = chunks[i];
    bool overlap = true;
    for (size_t d = 0; d < c.offsets.size(); ++d) {
      overlap &= std::max(c.offsets[d], out.box.offsets[d]) <
                 std::min(c.offsets[d] + c.sizes[d], out.box.offsets[d] + out.box.sizes[d]);
    }
    if (overlap) out.chunks.push_back(i);
  }
  return out;
}

// The read of this rank's `boxes` of the saved tensor `key`.
TensorRead boxes_read(const StorageReader& reader, const std::string& entry, const std::string& key,
                      const std::vector<Shard>& boxes) {
  const auto chunks = reader.chunks(key);
  TensorRead read{entry, key, false, {}};
  for (const auto& b : boxes) read.boxes.push_back(box_read(chunks, StorageBox{b.offsets, b.tensor.sizes().vec()}));
  return read;
}

// The read of the whole saved tensor `key`.
TensorRead whole_read(const StorageReader& reader, const std::string& entry, const std::string& key) {
  const auto& t = find_tensor(reader, key);
  return TensorRead{entry, key, true,
                    {box_read(reader.chunks(key), StorageBox{std::vector<int64_t>(t.shape.size(), 0), t.shape})}};
}

void plan_optimizer(const StorageReader& reader, const std::string& entry,
                    const std::shared_ptr<torch::nn::Module>& model, const torch::optim::Optimizer& optimizer,
                    LoadPlan& plan) {
  const formats::EntryRecord& rec = *find_entry(reader, entry);
  std::map<std::string, LocalBoxes> params;
  for (auto& b : local_boxes(model)) params.emplace(b.key, std::move(b));
  const auto ids = names_of_ids(reader, rec, model, optimizer);
  for (const auto& stored : rec.keys) {
    const std::string tkey = entry + "/" + stored;
    const auto& t = find_tensor(reader, tkey);
    const LocalBoxes* param = param_of(state_key_name(stored, ids), params);
    if (!param) continue;  // not a parameter: the apply step reports it as unexpected
    // State shaped like its parameter: this rank's boxes of it; anything else (step): whole.
    plan.reads.push_back(t.shape == param->shape ? boxes_read(reader, entry, tkey, param->boxes)
                                                 : whole_read(reader, entry, tkey));
  }
}

}  // namespace

LoadPlan plan_model(const StorageReader& reader, const std::string& entry,
                    const std::shared_ptr<torch::nn::Module>& model) {
  LoadPlan plan;
  for (const auto& [key, shape, boxes] : local_boxes(model)) {
    const std::string tkey = entry + "/" + key;
    auto it = reader.index().tensors.find(tkey);
    // Missing or of another shape: the apply step reports it.
    if (it == reader.index().tensors.end() || it->second.shape != shape) continue;
    plan.reads.push_back(boxes_read(reader, entry, tkey, boxes));
  }
  return plan;
}

LoadPlan plan_state(const StorageReader& reader, const CheckpointState& state,
                    const std::shared_ptr<torch::nn::Module>& optimizers_model) {
  LoadPlan plan;
  std::set<std::string> requested;
  for (const auto& e : state.entries()) {
    requested.insert(e.name);
    const formats::EntryRecord* rec = find_entry(reader, e.name);
    if (!rec) continue;
    if (e.kind == CheckpointState::Entry::kModel) {
      for (auto& r : plan_model(reader, e.name, state.models().at(e.name)).reads) plan.reads.push_back(std::move(r));
    } else if (e.kind == CheckpointState::Entry::kOptimizer) {
      plan_optimizer(reader, e.name, optimizers_model, *state.optimizers().at(e.name), plan);
    } else if (rec->type == formats::EntryType::kTensor) {
      plan.reads.push_back(whole_read(reader, e.name, e.name));
    }
  }
  for (const auto& rec : reader.index().entries) {  // the tensor values beyond those requested
    if (rec.type == formats::EntryType::kTensor && !requested.count(rec.name)) {
      plan.reads.push_back(whole_read(reader, rec.name, rec.name));
    }
  }
  return plan;
}

}  // namespace detail

}  // namespace fsdp
