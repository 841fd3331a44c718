// src/core/flat_param.h — a unit's flat parameter: the parameters it owns,
// flattened, this rank's shard of them, and the full buffer they are
// gathered into (PyTorch's FlatParamHandle). It knows how to shard, gather,
// free and show views; it knows nothing of hooks, order or gradients' reduction
// (those are the unit's: unit.h). Private to the library.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/core/detail/unit_view.h"  // ParamInfo, param_view
#include "fsdp/distributed/process_group.h"

namespace fsdp::detail {

class BufferPool;

// The parameter registry of any module (torch::nn::Module keeps it
// protected; wrap.cpp).
torch::OrderedDict<std::string, at::Tensor>& parameters_of(torch::nn::Module& m);

class FlatParamHandle {
 public:
  // Flattens `params` (already the unit's, in order) into a buffer padded to
  // a multiple of the shard group's size and keeps this rank's chunk. With
  // use_orig_params each parameter starts at a multiple of 16 bytes (zeros
  // before it), as in torch's FlatParameter, so ranks hold torch's parts.
  // `compute_dtype` unset: the parameters' own. Collective-free.
  FlatParamHandle(const std::string& owner, std::vector<ParamInfo> params, dist::ProcessGroupPtr shard_group,
                  std::optional<at::ScalarType> compute_dtype, bool use_orig_params);

  // [collective over the shard group when sharded] Issues the all-gather of
  // the shard (cast to the compute dtype) into the full buffer; returns
  // false (and issues nothing) when the full parameters are there or on the
  // way already.
  bool start_unshard();
  // Waits for the gather start_unshard issued (if any) and points the
  // original parameters at the full buffer. Returns whether it waited.
  bool finish_unshard();
  // Frees the full buffer (unless it is the shard itself); the original
  // parameters show their shards (use_orig_params) or nothing.
  void reshard();
  // The full parameters are there (or are the shard: world 1 without a cast).
  bool unsharded() const { return unsharded_; }
  bool gathering() const { return gathering_; }
  // Shard size 1 and no cast: the full buffer is the shard, never freed.
  bool aliased() const { return aliased_; }

  // Where full buffers come from (unset: LibTorch's allocator). CPU only.
  void set_pool(std::shared_ptr<BufferPool> pool) { pool_ = std::move(pool); }
  const std::shared_ptr<BufferPool>& pool() const { return pool_; }
  // A zeroed buffer of the full (padded) size in the compute dtype, for the
  // full gradient; pooled where the full parameters are.
  at::Tensor new_full_buffer_zeroed() const;

  // [collective over the shard group when sharded] The full flat parameter
  // in the master dtype, as a new tensor.
  at::Tensor gather_master() const;

  // Adopts a dtype or device change made by Module::to() (see UnitState).
  // `owner` names the unit in errors.
  void follow_module_to(const std::string& owner);

  // Summon with use_orig_params=false: the original parameters take the
  // flat parameter's place in the modules' registries (the unit's module:
  // `module`), and back.
  void register_original_params(torch::nn::Module& module);
  void register_flat_param(torch::nn::Module& module);
  // The original parameters show their shards (or nothing).
  void set_sharded_data();

  // This rank's part of parameter p of `flat` (a shard-sized buffer) as a
  // 1-D slice (shard size 1: the whole parameter, in shape).
  at::Tensor sharded_view(const at::Tensor& flat, const ParamInfo& p) const;

  std::vector<ParamInfo>& params() { return params_; }
  const std::vector<ParamInfo>& params() const { return params_; }
  const dist::ProcessGroupPtr& shard_group() const { return shard_group_; }
  int64_t numel() const { return numel_; }
  int64_t padded_numel() const { return padded_numel_; }
  int64_t shard_numel() const { return shard_numel_; }
  int shard_size() const { return shard_size_; }
  int shard_rank() const { return shard_rank_; }
  int64_t shard_begin() const { return shard_rank_ * shard_numel_; }
  at::ScalarType compute_dtype() const { return compute_dtype_; }
  const at::Tensor& flat_shard() const { return flat_shard_; }
  at::Tensor& flat_shard() { return flat_shard_; }
  const at::Tensor& full() const { return full_; }
  // Bytes of full parameters alive right now (0 when aliased).
  int64_t live_full_bytes() const;

 private:
  void alloc_full();
  void free_full();

  std::vector<ParamInfo> params_;
  dist::ProcessGroupPtr shard_group_;  // null: shards of one
  std::optional<at::ScalarType> param_dtype_;
  bool use_orig_params_;
  std::shared_ptr<BufferPool> pool_;
  int shard_size_ = 1;
  int shard_rank_ = 0;
  at::ScalarType compute_dtype_ = at::kFloat;
  bool aliased_ = false;
  at::TensorOptions shard_options_;  // the shard's dtype and device, as last seen
  int64_t numel_ = 0;
  int64_t padded_numel_ = 0;
  int64_t shard_numel_ = 0;
  at::Tensor flat_shard_;  // [shard_numel_]; for use_orig_params=false the registered flat_param
  at::Tensor full_;        // [padded_numel_]; its storage is freed while resharded (unless aliased)
  bool unsharded_ = false;
  bool gathering_ = false;  // an all-gather into full_ is in flight
  dist::Work pending_gather_;
  at::Tensor pending_input_;
};

}  // namespace fsdp::detail
