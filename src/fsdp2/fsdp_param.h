// src/fsdp2/fsdp_param.h — one parameter that fully_shard manages (torch's
// FSDPParam, _fsdp_param.py): its shard, its full form, and the transitions
// between them, with what each does to the parameter's gradient. Private
// to the fsdp2 module; nothing here communicates (the collectives that
// fill and drain it are collectives.h).
//
// The layout is torch's: the parameter keeps `padded_rows` = ceil(dim0 / W)
// rows (W: the shard group's size), the first `local_rows` of them its
// own; its full form is W such blocks, rank after rank, in the compute dtype.
//
// Gradient slots. The module's parameter object (`param()`) shows one
// gradient at a time; the others wait here:
//  - sharded (to_sharded): .grad is the sharded gradient; a full gradient
//    accumulated without sync waits aside (unsynced);
//  - unsharded (to_unsharded): .grad is the full gradient backward
//    accumulates into; the sharded gradient waits aside, or is shown on
//    the parameter between a forward that leaves it unsharded and its
//    backward (show_sharded_grad), as torch's sharded parameter shows it.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/variable.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace fsdp::detail {

class FSDPParamGroup;

// A leaf's AccumulateGrad node (std::shared_ptr in LibTorch 1.13, c10::intrusive_ptr in 2.x).
using GradAccumulator = decltype(torch::autograd::impl::grad_accumulator(std::declval<const at::Tensor&>()));

// torch's ShardedState. Its SHARDED_POST_FORWARD is the group's here: the
// post-forward shard is one buffer for the whole group (collectives.h).
enum class ShardedState { kSharded, kUnsharded };

// True where LibTorch has Tensor::set_grad_dtype (2.15 has it, 1.13 not).
bool has_grad_dtype();

class FSDPParam {
 public:
  // [local] Shards `param` (at least 1-D) over `shard_size` ranks: copies
  // this rank's rows (dist::chunk_range's) into a padded block of the
  // parameter's dtype and points the parameter at them, dropping its
  // gradient. `param_dtype` / `reduce_dtype`: the mixed-precision policy's.
  // Allocates the shard (padded_numel elements) now; the full form's
  // storage stays empty until alloc_all_gather_output.
  FSDPParam(at::Tensor param, std::string name, int shard_size, int shard_rank,
            std::optional<at::ScalarType> param_dtype, std::optional<at::ScalarType> reduce_dtype);

  // The group whose shard `param` shows, read off the parameter's own
  // memory (torch reads it off the DTensor parameter): null when no live
  // group shards it, or while it is unsharded.
  static std::shared_ptr<FSDPParamGroup> managing_group(const at::Tensor& param);
  // Records the group that owns this parameter (for managing_group).
  void set_group(const std::shared_ptr<FSDPParamGroup>& group);

  const at::Tensor& param() const { return param_; }  // the module's parameter object; its TensorImpl never changes
  const std::string& name() const { return name_; }    // relative to the group's module
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t rows() const { return shape_[0]; }
  int64_t numel() const { return rows() * row_numel_; }
  int64_t padded_numel() const { return padded_rows_ * row_numel_; }
  int64_t local_rows() const { return local_rows_; }
  int64_t row_offset() const { return row_offset_; }
  std::vector<int64_t> local_shape() const;
  bool requires_grad() const { return requires_grad_; }
  ShardedState state() const { return state_; }
  at::ScalarType orig_dtype() const { return padded_.scalar_type(); }
  // The unsharded parameter's dtype (param_dtype for floating parameters).
  at::ScalarType compute_dtype() const { return compute_dtype_; }
  // The dtype torch's unsharded parameter accumulates its gradient in
  // (torch's unsharded_grad_dtype: reduce_dtype, or the parameter's own).
  at::ScalarType unsharded_grad_dtype() const { return reduce_dtype_ ? *reduce_dtype_ : orig_dtype(); }

  // [local] The padded shard, [padded_numel] in the parameter's dtype
  // (the all-gather's input), and this rank's rows of it, in shape (what
  // the optimizer steps outside forward and backward).
  const at::Tensor& padded() const { return padded_; }
  const at::Tensor& local() const { return local_; }
  // [local] The full form's flat buffer, W * padded_numel elements in the
  // compute dtype, given memory (torch's alloc_all_gather_outputs); the
  // copy-out fills it.
  const at::Tensor& alloc_all_gather_output();
  // The full form's buffer (memory only while unsharded).
  const at::Tensor& all_gather_output() const { return full_; }

  // [local] torch's to_unsharded: the parameter shows its full form (filled
  // by the copy-out); the sharded gradient waits aside and a full gradient
  // accumulated without sync is back on the parameter; the parameter's
  // grad_dtype becomes unsharded_grad_dtype (where LibTorch has it).
  void to_unsharded();
  // [local] torch's to_sharded: the parameter shows its shard again, its
  // sharded gradient back; a full gradient not reduced waits aside; the
  // full form's memory is freed.
  void to_sharded();
  // [local] While unsharded: shows the sharded gradient on the parameter
  // (the full one waits aside), and back. See the header comment.
  void show_sharded_grad();
  void hide_sharded_grad();

  // [local] torch's _set_unsharded_grad_dtypes for a parameter whose
  // gradient accumulates in a wider dtype than it is computed in (no-op
  // otherwise, and without grad_dtype). defer_upcast (pre-backward):
  // grad_dtype none when a gradient exists or this backward reduces
  // (`reduces`), so the gradient, a tied parameter's uses summed, comes in
  // the compute dtype; otherwise (post-backward) a gradient in another dtype
  // is cast to the wider one and grad_dtype set to it.
  void set_unsharded_grad_dtype(bool defer_upcast, bool reduces);
  // [local] torch's accumulate_unsharded_grad_if_needed: a gradient kept
  // without sync in reduce_dtype (old LibTorch) takes this backward's in.
  void accumulate_unsharded_grad_if_needed();
  // [local] torch's former to_accumulated_grad_if_needed (without
  // grad_dtype): an unsynced gradient accumulates in reduce_dtype, apart.
  void to_accumulated_grad_if_needed();
  // The full gradient to reduce (undefined: none), and its release.
  const at::Tensor& unsharded_grad() const;
  void clear_unsharded_grad();
  // [local] Adds the reduced gradient `shard` (this rank's rows, in the
  // reduce dtype) to the sharded gradient, cast to the parameter's dtype;
  // `aside`: the sharded gradient waits aside (unsharded, not shown).
  void add_sharded_grad(at::Tensor shard, bool aside);
  // The bytes of every gradient this parameter holds (shown or aside).
  int64_t live_grad_bytes() const;

 private:
  void adopt_grad_dtype();

  at::Tensor param_;
  std::string name_;
  std::vector<int64_t> shape_;
  int64_t row_numel_ = 1, padded_rows_ = 0, local_rows_ = 0, row_offset_ = 0;
  bool requires_grad_ = true;
  at::ScalarType compute_dtype_ = at::kFloat;
  std::optional<at::ScalarType> reduce_dtype_;
  ShardedState state_ = ShardedState::kSharded;
  at::Tensor padded_, local_, full_;
  at::Tensor sharded_grad_;      // the sharded gradient, kept aside while unsharded
  at::Tensor unsynced_grad_;     // full gradient accumulated without sync, while sharded
  at::Tensor accumulated_grad_;  // without grad_dtype: full gradient accumulated without sync in reduce_dtype
  // The unsharded parameter's AccumulateGrad nodes that a graph may still
  // send gradients to (each unshard after a change of dtype makes a new one):
  // grad_dtype, torch's property of its one unsharded parameter, goes to all.
  std::vector<GradAccumulator> grad_accumulators_;
};

}  // namespace fsdp::detail
