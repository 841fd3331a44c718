// fsdp/state_dict/state_dict.h — model state dicts with PyTorch FSDP's semantics.
//
// LibTorch modules have no state_dict(); these functions give one to any
// module, wrapped or not, with the keys of the unwrapped model (parameters,
// then persistent buffers, module by module in registration order — PyTorch's
// order; tied parameters under each of their names). On a model with FSDP
// units the value of each key depends on the units' state dict type:
//
//   FULL_STATE_DICT    the full tensor, gathered unit by unit (a collective),
//                      in the parameters' own (master) dtype — float32 under
//                      mixed precision. FullStateDictConfig{rank0_only,
//                      offload_to_cpu}: with rank0_only only rank 0 gets the
//                      units' entries (an FSDP root gives the other ranks an
//                      empty dict); offload_to_cpu puts every tensor on CPU.
//                      Peak extra memory: the result plus one unit's flat
//                      parameter.
//   LOCAL_STATE_DICT   one entry per unit, "<unit path>.flat_param": this
//                      rank's shard of the unit's flat parameter (unpadded),
//                      as a ShardedTensor over the flat parameter. No copy:
//                      the shard's own memory (clone it to keep a snapshot).
//   SHARDED_STATE_DICT every parameter as a ShardedTensor: its global shape
//                      and the pieces of it this rank holds (offsets, sizes),
//                      views of the shard, no gather, no copy.
//
// Parameters outside every unit (ignored modules, a non-FSDP root's own
// layers) and all buffers are returned as they are (same data pointer); a
// buffer that mixed precision cast to buffer_dtype comes back in its original
// dtype (a copy). Non-persistent buffers (set_persistent) are left out.
//
// Loading writes into this rank's shards (and plain parameters and buffers);
// it needs no collective. A key's value may be a full tensor or any
// ShardedTensor that holds the part this rank needs (the same sharding, or a
// gathered one); LOCAL_STATE_DICT entries must come from the same sharding.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "fsdp/distributed/process_group.h"
#include "fsdp/state_dict/sharded_tensor.h"       // Shard, ShardedTensor, StateValue, the box arithmetic
#include "fsdp/state_dict/state_dict_options.h"   // StateDictType, the configs, StateDictTypeGuard, set_persistent

namespace torch::nn {
class Module;
}

namespace fsdp {

// An ordered map from names to tensors or sharded tensors.
class StateDict {
 public:
  using Entry = std::pair<std::string, StateValue>;

  // Adds `key` at the end; ConfigError if it is already there.
  void insert(const std::string& key, StateValue value);
  // Replaces the value of `key`, or adds it at the end.
  void set(const std::string& key, StateValue value);
  bool contains(const std::string& key) const { return index_.count(key) > 0; }
  // ConfigError naming the key if it is absent.
  const StateValue& at(const std::string& key) const;
  // The value as a tensor / a sharded tensor; ConfigError if it is the other kind.
  const at::Tensor& tensor(const std::string& key) const;
  const ShardedTensor& sharded(const std::string& key) const;
  bool is_sharded(const std::string& key) const;
  void erase(const std::string& key);

  std::vector<std::string> keys() const;
  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  std::vector<Entry>::const_iterator begin() const { return entries_.begin(); }
  std::vector<Entry>::const_iterator end() const { return entries_.end(); }

 private:
  std::vector<Entry> entries_;
  std::unordered_map<std::string, size_t> index_;
};

// [local] `state` with fn applied to every tensor (to each local piece of a
// ShardedTensor), e.g. clone (a deep copy: state dicts alias the model's
// memory) or a move to CPU.
StateDict map_tensors(const StateDict& state, const std::function<at::Tensor(const at::Tensor&)>& fn);

// [collective on models with FULL_STATE_DICT units; local otherwise]
// The state dict of `model` (see the top of this file), keys prefixed by
// `prefix` (e.g. "model."). Every rank must call it when it is collective.
StateDict state_dict(const std::shared_ptr<torch::nn::Module>& model, const std::string& prefix = "");

// [local] Loads `state` into `model` (wrapped or not) under the units' state
// dict type. strict: every expected key present and no other (all missing
// and unexpected keys are reported in one ConfigError). A shape mismatch is
// an error in either mode, reported together with the others. Loading
// between a forward and its backward, or inside summon_full_params, is a
// ConfigError.
void load_state_dict(const std::shared_ptr<torch::nn::Module>& model, const StateDict& state, bool strict = true);

// [local] load_state_dict one value at a time, for loads whose values are
// read as they are needed (a checkpoint's pieces): `shapes` holds every key
// the state has, each a ShardedTensor of its global shape and dtype without
// pieces; it is checked as load_state_dict checks a state (missing,
// unexpected and mismatched keys, all reported in one ConfigError before
// anything is asked or written). Then each key of the model that `shapes`
// holds is asked of `value_of(key)` and copied in before the next is asked,
// so memory holds one value at a time. A value that does not hold what this
// rank needs is a ConfigError when it comes: the values before it are
// loaded by then.
void load_state_dict(const std::shared_ptr<torch::nn::Module>& model, const StateDict& shapes,
                     const std::function<StateValue(const std::string&)>& value_of, bool strict = true);

// [collective over `group`: one bytes all-gather, then one all-gather per
// sharded entry] Replaces every ShardedTensor of `state` by the full tensor,
// assembled from the pieces all ranks of `group` hold (PyTorch's
// _gather_state_dict). Plain tensors are kept as they are. ConfigError
// naming the key if the pieces do not cover the tensor.
StateDict gather_state_dict(const StateDict& state, dist::ProcessGroup& group);

}  // namespace fsdp
