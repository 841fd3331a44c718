// fsdp/core/detail/unit_view.h — core's door for the modules above it
// (state_dict, strategy); not for applications. One FSDP unit seen from
// outside the sharding engine: where its parameters are in its flat
// parameter, which part of it this rank holds, and the few operations a
// state dict needs. The engine (src/core/unit.h, UnitState) implements it;
// a unit of another engine on the same comm layer can too.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/distributed/process_group.h"

namespace torch::nn {
class Module;
}

namespace fsdp::detail {

// One original parameter inside a unit's flat parameter. Fixed at wrap time
// (the unit owns it; it lives as long as the unit).
struct ParamInfo {
  at::Tensor param;                  // the original parameter; its TensorImpl never changes
  std::string name;                  // path relative to the unit's module
  std::vector<std::string> aliases;  // further names of a tied parameter (relative)
  // Where the parameter was registered: (module, key) for the name and each
  // alias, in the unwrapped model's order.
  std::vector<std::pair<torch::nn::Module*, std::string>> places;
  std::vector<int64_t> shape;
  int64_t offset = 0;  // in the unpadded flat parameter
  int64_t numel = 0;
  bool requires_grad = true;
};

// [local] Parameter `p`'s place in a full (unsharded) flat buffer of its
// unit (gather_master's result), in its shape: a view, no copy.
inline at::Tensor param_view(const at::Tensor& flat, const ParamInfo& p) {
  return flat.narrow(0, p.offset, p.numel).view(p.shape);
}

// A view of one FSDP unit. Every call is [local] and O(1) unless it says
// otherwise; none changes the unit's training state, and all but
// follow_module_to and reshard are read-only.
class UnitView {
 public:
  virtual ~UnitView() = default;

  // The module the unit wraps.
  virtual torch::nn::Module* module() const = 0;
  // The original parameters it owns, in flat-parameter order.
  virtual const std::vector<ParamInfo>& params() const = 0;
  // This rank's shard of the flat parameter, in the master dtype: the
  // optimizer's tensor when use_orig_params is false.
  virtual const at::Tensor& flat_shard() const = 0;
  // Elements of the flat parameter: unpadded, padded to a multiple of the
  // shard group's size, and in one shard.
  virtual int64_t numel() const = 0;
  virtual int64_t padded_numel() const = 0;
  virtual int64_t shard_numel() const = 0;
  // The shard group's size (1: not sharded) and where this rank's shard
  // begins in the unpadded flat parameter.
  virtual int shard_size() const = 0;
  virtual int64_t shard_begin() const = 0;
  // The group the flat parameter is sharded over (null: shards of one).
  virtual const dist::ProcessGroupPtr& shard_group() const = 0;
  // The group the shards are replicated over (HYBRID_SHARD; null: none).
  virtual const dist::ProcessGroupPtr& replicate_group() const = 0;
  // Rank in the unit's whole world (replicate rank * shard size + shard rank).
  virtual int world_rank() const = 0;
  // Inside summon_full_params.
  virtual bool summoned() const = 0;
  // True from a forward that will be differentiated until its backward ends
  // (or the next forward of the root starts).
  virtual bool awaiting_backward() const = 0;
  // Buffers of its root's tree that mixed precision cast, with their
  // original dtypes (empty before the root's first forward).
  virtual const std::vector<std::pair<at::Tensor, at::ScalarType>>& cast_buffers() const = 0;

  // [collective over the shard group when sharded] The full flat parameter
  // in the master dtype (not the compute dtype), as a new tensor: one
  // all-gather, padded_numel() elements.
  virtual at::Tensor gather_master() const = 0;
  // [local] Adopts a dtype or device change made by Module::to()
  // (model->to(kHalf)): the new data becomes the shard (nothing inside
  // summon_full_params or the unit's backward). A pass over the parameters
  // when nothing changed, a copy of the shard when something did; a
  // ConfigError when they moved to different dtypes or devices. Call it
  // before reading or writing flat_shard().
  virtual void follow_module_to() = 0;
  // [local] Frees full parameters left from a forward without backward
  // (the original parameters show their shards again), so that what a
  // state dict loads into the shards is what the next forward gathers.
  // Nothing when the unit holds none.
  virtual void reshard() = 0;
};

// [local] The units of `model`'s tree, pre-order (none for a plain model).
std::vector<std::shared_ptr<UnitView>> unit_views_of(const std::shared_ptr<torch::nn::Module>& model);

// [local] The unit that wraps `module`, or null when it is no FSDP unit.
std::shared_ptr<UnitView> unit_view_at(const torch::nn::Module& module);

}  // namespace fsdp::detail
