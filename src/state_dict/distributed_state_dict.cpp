// torch.distributed.checkpoint.state_dict's API over fsdp-cpp's state dicts:
// the options become a state dict type and config for the model's units and
// groups; broadcast_from_rank0 sends rank 0's tensors one by one and keeps
// this rank's part of each.
#include "fsdp/state_dict/distributed_state_dict.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdio>
#include <functional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "fsdp/error.h"
#include "fsdp/state_dict/detail/visit.h"
#include "model_index.h"
#include "shard_geometry.h"

namespace fsdp {

using namespace detail;

namespace {

void check(const StateDictOptions& o, const char* what) {
  if (o.broadcast_from_rank0() && !o.full_state_dict()) {
    throw ConfigError(std::string(what) + ": full_state_dict must be True when broadcast_from_rank0 is True.");
  }
}

StateDictType type_of(const StateDictOptions& o) {
  return o.full_state_dict() ? StateDictType::kFull : StateDictType::kSharded;
}

// torch: full_state_dict with cpu_offload gives the tensors to rank 0 only.
StateDictConfig config_of(const StateDictOptions& o) {
  if (o.full_state_dict()) return FullStateDictConfig{/*rank0_only=*/o.cpu_offload(), /*offload_to_cpu=*/o.cpu_offload()};
  return ShardedStateDictConfig{o.cpu_offload()};
}

// ---------------------------------------------------------------------------
// broadcast_from_rank0

// Length-prefixed fields: "<bytes>:<field>".
void put(std::string& out, const std::string& field) { out += std::to_string(field.size()) + ":" + field; }

class Reader {
 public:
  explicit Reader(const std::string& s) : s_(s) {}
  bool done() const { return pos_ >= s_.size(); }
  std::string next() {
    const size_t colon = s_.find(':', pos_);
    if (colon == std::string::npos) throw Error("broadcast_from_rank0: rank 0's metadata is truncated");
    const size_t n = std::stoull(s_.substr(pos_, colon - pos_));
    if (colon + 1 + n > s_.size()) throw Error("broadcast_from_rank0: rank 0's metadata is truncated");
    std::string out = s_.substr(colon + 1, n);
    pos_ = colon + 1 + n;
    return out;
  }
  int64_t number() { return std::stoll(next()); }

 private:
  const std::string& s_;
  size_t pos_ = 0;
};

// The model's groups and whether this rank is the world's rank 0.
struct Route {
  std::vector<dist::ProcessGroupPtr> groups;  // shard group, then replicate group (null: none)
  bool root = false;
};

Route route_of(const ModelIndex& idx, const char* what) {
  Route r{broadcast_groups(idx), world_rank(idx) == 0};
  if (r.groups.empty()) {
    throw ConfigError(std::string(what) +
                      ": broadcast_from_rank0 sends rank 0's tensors over the model's groups, but the model is "
                      "neither wrapped by FullyShardedDataParallel nor sharded by fully_shard: load the state "
                      "dict on every rank instead");
  }
  return r;
}

// [collective] Rank 0's bytes on every rank: over the shard group from its
// first rank, then over the replicate group from its first (whose members
// hold rank 0's bytes after the first step).
std::string broadcast_bytes(const Route& r, std::string bytes) {
  for (const auto& g : r.groups) {
    if (g && g->size() > 1) bytes = g->broadcast_bytes(bytes, 0);
  }
  return bytes;
}

// [collective] Rank 0's tensor (`t` there; ignored elsewhere) on every rank.
at::Tensor broadcast_tensor(const Route& r, const at::Tensor& t, at::ScalarType dtype, const std::vector<int64_t>& shape) {
  const at::Device device = r.groups.front()->device();
  at::Tensor buf = r.root ? t.detach().to(device, dtype).contiguous().clone()
                          : at::empty(shape, at::TensorOptions().dtype(dtype).device(device));
  for (const auto& g : r.groups) {
    if (g && g->size() > 1) g->broadcast(buf, 0).wait();
  }
  return buf;
}

// This rank's part of the whole tensor `full` of `item` (a copy: `full` is
// dropped after), or `full` itself where every rank holds all of it.
StateValue keep_mine(const Item* item, const at::Tensor& full) {
  if (!item || item->whole() || full.sizes().vec() != item->value.shape()) return full;
  ShardedTensor out{item->value.shape(), full.scalar_type(), {}};
  for (const auto& box : item->value.local_shards()) {
    at::Tensor piece = full;
    for (size_t d = 0; d < box.offsets.size(); ++d) {
      piece = piece.narrow(static_cast<int64_t>(d), box.offsets[d], box.tensor.size(static_cast<int64_t>(d)));
    }
    out.local_shards.push_back(Shard{box.offsets, piece.clone()});
  }
  return out;
}

// [collective] Rank 0's `state` (whole tensors) as every rank's state dict of
// its parts. `item_of` names the model's item a key belongs to (null: none).
// `extra`: more bytes from rank 0, returned in `extra_out`.
StateDict broadcast_state(const Route& r, const StateDict& state, const std::function<const Item*(const std::string&)>& item_of,
                          const char* what, const std::string& extra = "", std::string* extra_out = nullptr) {
  std::string meta;
  if (r.root) {
    std::string entries, problem;
    for (const auto& [key, v] : state) {
      if (!std::holds_alternative<at::Tensor>(v)) {
        problem = std::string(what) + ": broadcast_from_rank0 takes rank 0's full state dict, but '" + key +
                  "' is a ShardedTensor (get it with full_state_dict)";
        break;
      }
      const at::Tensor& t = std::get<at::Tensor>(v);
      put(entries, key);
      put(entries, std::to_string(static_cast<int>(t.scalar_type())));
      put(entries, std::to_string(t.dim()));
      for (int64_t d : t.sizes()) put(entries, std::to_string(d));
    }
    put(meta, problem);
    put(meta, extra);
    put(meta, entries);
  }
  meta = broadcast_bytes(r, meta);  // [collective]
  Reader top(meta);
  const std::string problem = top.next();
  if (!problem.empty()) throw ConfigError(problem);
  const std::string extra_in = top.next();
  if (extra_out) *extra_out = extra_in;
  const std::string entries = top.next();
  Reader in(entries);
  StateDict out;
  while (!in.done()) {
    const std::string key = in.next();
    const auto dtype = static_cast<at::ScalarType>(in.number());
    std::vector<int64_t> shape(static_cast<size_t>(in.number()));
    for (auto& d : shape) d = in.number();
    at::Tensor full = broadcast_tensor(r, r.root ? state.tensor(key) : at::Tensor(), dtype, shape);  // [collective]
    out.insert(key, keep_mine(item_of(key), full));
  }
  return out;
}

// The model's items by key, under FULL keys (the original parameters' names).
std::unordered_map<std::string, Item> items_by_key(torch::nn::Module& model, const ModelIndex& idx) {
  std::vector<Item> items;
  walk(model, "", idx, StateDictType::kFull, items);
  std::unordered_map<std::string, Item> out;
  for (auto& item : items) out.emplace(item.key, std::move(item));
  return out;
}

// Param groups as bytes: per group, its names then its options.
std::string encode_groups(const std::vector<OptimParamGroup>& groups) {
  std::string out;
  put(out, std::to_string(groups.size()));
  for (const auto& g : groups) {
    put(out, std::to_string(g.params.size()));
    for (const auto& p : g.params) put(out, p);
    put(out, std::to_string(g.options.size()));
    for (const auto& [k, v] : g.options) {
      put(out, k);
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.17g", v);
      put(out, buf);
    }
  }
  return out;
}

std::vector<OptimParamGroup> decode_groups(const std::string& bytes) {
  Reader in(bytes);
  std::vector<OptimParamGroup> out(static_cast<size_t>(in.number()));
  for (auto& g : out) {
    g.params.resize(static_cast<size_t>(in.number()));
    for (auto& p : g.params) p = in.next();
    const int64_t n = in.number();
    for (int64_t i = 0; i < n; ++i) {
      const std::string k = in.next();
      g.options[k] = std::stod(in.next());
    }
  }
  return out;
}

}  // namespace

StateDict get_model_state_dict(const std::shared_ptr<torch::nn::Module>& model, const StateDictOptions& options) {
  check(options, "get_model_state_dict");
  StateDictTypeGuard guard(model, type_of(options), config_of(options));
  return collect_state_dict(model, "", options.ignore_frozen_params());
}

void set_model_state_dict(const std::shared_ptr<torch::nn::Module>& model, const StateDict& state,
                          const StateDictOptions& options) {
  check(options, "set_model_state_dict");
  if (!model) throw ConfigError("set_model_state_dict: the model is null");
  // Either form loads under SHARDED (FSDP1's LOCAL would expect flat entries).
  StateDictTypeGuard guard(model, StateDictType::kSharded);
  if (!options.broadcast_from_rank0()) {
    load_state_dict(model, state, options.strict());
    return;
  }
  const ModelIndex idx = index_model(model);
  const Route r = route_of(idx, "set_model_state_dict");
  const auto items = items_by_key(*model, idx);
  const StateDict mine = broadcast_state(
      r, state,
      [&](const std::string& key) -> const Item* {
        auto it = items.find(key);
        return it == items.end() ? nullptr : &it->second;
      },
      "set_model_state_dict");
  load_state_dict(model, mine, options.strict());
}

OptimStateDict get_optimizer_state_dict(const std::shared_ptr<torch::nn::Module>& model,
                                        const torch::optim::Optimizer& optimizer, const StateDictOptions& options) {
  check(options, "get_optimizer_state_dict");
  StateDictTypeGuard guard(model, type_of(options), config_of(options));
  return optim_state_dict(model, optimizer);
}

void set_optimizer_state_dict(const std::shared_ptr<torch::nn::Module>& model, torch::optim::Optimizer& optimizer,
                              const OptimStateDict& state, const StateDictOptions& options) {
  check(options, "set_optimizer_state_dict");
  if (!model) throw ConfigError("set_optimizer_state_dict: the model is null");
  if (!options.broadcast_from_rank0()) {
    load_optim_state_dict(model, optimizer, state);
    return;
  }
  const ModelIndex idx = index_model(model);
  const Route r = route_of(idx, "set_optimizer_state_dict");
  const auto items = items_by_key(*model, idx);
  OptimStateDict mine;
  std::string groups;
  mine.state = broadcast_state(
      r, state.state,
      [&](const std::string& key) -> const Item* {  // "<parameter>.<field>": the parameter's
        const size_t dot = key.rfind('.');
        auto it = dot == std::string::npos ? items.end() : items.find(key.substr(0, dot));
        return it == items.end() ? nullptr : &it->second;
      },
      "set_optimizer_state_dict", r.root ? encode_groups(state.param_groups) : std::string(), &groups);
  mine.param_groups = decode_groups(groups);
  load_optim_state_dict(model, optimizer, mine);
}

std::pair<StateDict, OptimStateDict> get_state_dict(const std::shared_ptr<torch::nn::Module>& model,
                                                    const torch::optim::Optimizer& optimizer,
                                                    const StateDictOptions& options) {
  StateDict m = get_model_state_dict(model, options);
  return {std::move(m), get_optimizer_state_dict(model, optimizer, options)};
}

void set_state_dict(const std::shared_ptr<torch::nn::Module>& model, torch::optim::Optimizer& optimizer,
                    const StateDict& model_state_dict, const OptimStateDict& optim_state_dict,
                    const StateDictOptions& options) {
  set_model_state_dict(model, model_state_dict, options);
  set_optimizer_state_dict(model, optimizer, optim_state_dict, options);
}

}  // namespace fsdp
