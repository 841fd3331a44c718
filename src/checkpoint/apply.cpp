// The apply step of a load (fsdp/checkpoint/storage.h): the planned chunks
// read from the storage and copied into the model, its optimizers and the
// values, entry by entry (one entry's pieces in memory at a time).
#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <set>

#include "fsdp/checkpoint/checkpoint_io.h"
#include "fsdp/checkpoint/storage.h"
#include "fsdp/error.h"
#include "fsdp/state_dict/detail/optimizer_kinds.h"
#include "fsdp/state_dict/optim_state_dict.h"
#include "loading.h"
#include "parts.h"

namespace fsdp::detail {

std::vector<at::Tensor> apply_read(const StorageReader& reader, const TensorRead& read) {
  const auto& t = find_tensor(reader, read.key);
  std::vector<at::Tensor> out;
  std::set<size_t> chunks;
  int64_t need = 0;
  for (const auto& b : read.boxes) {
    out.push_back(at::empty(b.box.sizes, at::TensorOptions().dtype(t.dtype)));
    need += out.back().numel();
    chunks.insert(b.chunks.begin(), b.chunks.end());
  }
  const std::vector<StorageBox> boxes = chunks.empty() ? std::vector<StorageBox>() : reader.chunks(read.key);
  int64_t covered = 0;
  for (size_t c : chunks) {  // each chunk read once, into every box that plans it
    const at::Tensor src = reader.read_chunk(read.key, c);
    for (size_t i = 0; i < read.boxes.size(); ++i) {
      const auto& planned = read.boxes[i].chunks;
      if (std::find(planned.begin(), planned.end(), c) == planned.end()) continue;
      covered += copy_overlap(out[i], read.boxes[i].box.offsets, {Shard{boxes.at(c).offsets, src}});
    }
  }
  if (covered != need) {
    throw ConfigError("checkpoint: " + reader.location() +
                      (read.whole ? ": the chunks of tensor '" + read.key + "' do not cover it"
                                  : ": tensor '" + read.key + "' lacks elements this rank needs") +
                      " (a shard is missing from the index)");
  }
  return out;
}

namespace {

// The reads `plan` plans for `entry`, by tensor key.
std::map<std::string, const TensorRead*> reads_of(const LoadPlan& plan, const std::string& entry) {
  std::map<std::string, const TensorRead*> out;
  for (const auto& r : plan.reads) {
    if (r.entry == entry) out.emplace(r.key, &r);
  }
  return out;
}

// This rank's pieces of a saved tensor of dtype and shape `t`, as `read` plans them.
ShardedTensor sharded(const StorageReader& reader, const TensorRead& read, const formats::TensorEntry& t) {
  ShardedTensor st{t.shape, t.dtype, {}};
  std::vector<at::Tensor> pieces = apply_read(reader, read);
  for (size_t i = 0; i < pieces.size(); ++i) st.local_shards.push_back(Shard{read.boxes[i].box.offsets, pieces[i]});
  return st;
}

}  // namespace

void load_model(const StorageReader& reader, const LoadPlan& plan, const std::string& entry,
                const std::shared_ptr<torch::nn::Module>& model, bool strict) {
  const formats::EntryRecord* rec = find_entry(reader, entry);
  const auto reads = reads_of(plan, entry);
  // The keys and shapes first (checked before anything is read), then each
  // tensor's pieces read as the model takes it: one tensor in memory at a
  // time beside the model, never a second copy of all its shards.
  StateDict shapes;
  std::set<std::string> wanted;
  for (const auto& [key, shape, boxes] : local_boxes(model)) {
    wanted.insert(key);
    const std::string tkey = entry + "/" + key;
    if (!reader.index().tensors.count(tkey)) continue;  // missing: load_state_dict reports it
    const auto& t = find_tensor(reader, tkey);
    if (t.shape != shape) {
      shapes.insert(key, ShardedTensor{t.shape, t.dtype, {}});  // reported as a size mismatch
      continue;
    }
    if (!reads.count(tkey)) continue;  // left out of the plan: missing
    shapes.insert(key, ShardedTensor{t.shape, t.dtype, {}});
  }
  if (rec) {
    for (const auto& k : rec->keys) {
      if (!wanted.count(k)) shapes.insert(k, ShardedTensor{find_tensor(reader, entry + "/" + k).shape, at::kFloat, {}});
    }
  }
  StateDictTypeGuard guard(model, StateDictType::kSharded);
  load_state_dict(
      model, shapes,
      [&](const std::string& key) -> StateValue {
        const std::string tkey = entry + "/" + key;
        return sharded(reader, *reads.at(tkey), find_tensor(reader, tkey));
      },
      strict);
}

void load_optimizer(const StorageReader& reader, const LoadPlan& plan, const std::string& entry,
                    const std::shared_ptr<torch::nn::Module>& model, torch::optim::Optimizer& optimizer) {
  const formats::EntryRecord& rec = *find_entry(reader, entry);
  const auto reads = reads_of(plan, entry);
  std::map<std::string, LocalBoxes> params;
  for (auto& b : local_boxes(model)) params.emplace(b.key, std::move(b));
  const auto ids = names_of_ids(reader, rec, model, optimizer);  // keys by parameter name (PyTorch's ids translated)
  OptimStateDict osd;
  for (const auto& stored : rec.keys) {
    const std::string tkey = entry + "/" + stored;
    const std::string k = state_key_name(stored, ids);
    const auto& t = find_tensor(reader, tkey);
    if (!param_of(k, params)) {
      osd.state.insert(k, ShardedTensor{t.shape, t.dtype, {}});  // not a parameter: reported as unexpected
      continue;
    }
    auto r = reads.find(tkey);
    if (r == reads.end()) continue;  // left out of the plan
    if (r->second->whole) {
      osd.state.insert(k, apply_read(reader, *r->second)[0]);
    } else {
      osd.state.insert(k, sharded(reader, *r->second, t));
    }
  }
  const std::string kind = kind_of(optimizer).name;
  for (const auto& g : rec.param_groups) {
    OptimParamGroup group{
        {}, libtorch_options(kind, g.options, "checkpoint: " + reader.location() + ", optimizer '" + entry + "'")};
    for (const auto& p : g.params) {
      auto it = ids.find(p);
      group.params.push_back(it == ids.end() ? p : it->second);
    }
    osd.param_groups.push_back(std::move(group));
  }
  load_optim_state_dict(model, optimizer, osd);
}

std::optional<CheckpointValue> read_value(const StorageReader& reader, const LoadPlan& plan,
                                          const formats::EntryRecord& e) {
  if (e.type != formats::EntryType::kTensor) {
    return std::visit([](const auto& v) { return CheckpointValue(v); }, e.value);
  }
  for (const auto& r : plan.reads) {
    if (r.entry == e.name && r.key == e.name) return apply_read(reader, r)[0];
  }
  return std::nullopt;  // left out of the plan
}

}  // namespace fsdp::detail
