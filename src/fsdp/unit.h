// src/fsdp/unit.h — one FSDP unit: the flat parameter of the parameters it
// owns, its shard, its hooks. Private to the library.
#pragma once

#include <torch/csrc/autograd/function.h>
#include <torch/nn/module.h>

#include <memory>
#include <string>
#include <vector>

#include "autograd_node.h"
#include "fsdp/detail/unit.h"
#include "fsdp/dist/process_group.h"
#include "fsdp/fsdp.h"
#include "fsdp/state_dict.h"

namespace fsdp::detail {

// One original parameter inside a unit's flat parameter.
struct ParamInfo {
  at::Tensor param;                // the original parameter; its TensorImpl never changes
  std::string name;                // path relative to the unit's module
  std::vector<std::string> aliases;  // further names of a tied parameter (relative)
  // Where the parameter was registered: (module, key) for the name and each
  // alias, in the unwrapped model's order.
  std::vector<std::pair<torch::nn::Module*, std::string>> places;
  std::vector<int64_t> shape;
  int64_t offset = 0;              // in the unpadded flat parameter
  int64_t numel = 0;
  bool requires_grad = true;
  at::Tensor saved_grad;           // sharded gradient from before this backward
};

// Parameter `p`'s place in a full (unsharded) flat buffer, in its shape.
inline at::Tensor param_view(const at::Tensor& flat, const ParamInfo& p) {
  return flat.narrow(0, p.offset, p.numel).view(p.shape);
}

// Per-unit configuration resolved by wrap().
struct UnitConfig {
  ShardingStrategy strategy = ShardingStrategy::kFullShard;
  bool use_orig_params = false;
  dist::ProcessGroupPtr shard_group;      // null: shards of one (no sharding)
  dist::ProcessGroupPtr replicate_group;  // null: no replication
  std::optional<at::ScalarType> param_dtype;   // compute dtype (unset: the parameters')
  std::optional<at::ScalarType> reduce_dtype;  // gradient reduction dtype (unset: compute dtype)
  std::optional<at::ScalarType> buffer_dtype;
  bool forward_prefetch = false;
  BackwardPrefetch backward_prefetch = BackwardPrefetch::kBackwardPre;
  bool limit_all_gathers = true;
};

class UnitState : public std::enable_shared_from_this<UnitState> {
 public:
  // Flattens `params` (already the unit's, in order) and keeps this rank's
  // shard. Collective-free (sync_module_states is done by wrap()).
  UnitState(torch::nn::Module* module, std::vector<ParamInfo> params, UnitConfig config);
  ~UnitState();

  // [collective over the shard group when sharded] Materialises the full
  // parameters and points the original parameters at them.
  void unshard();
  // Frees the full parameters; the original parameters show their shards.
  void reshard();

  void pre_forward();
  void post_forward(const std::vector<at::Tensor>& outputs);
  void forward_failed();
  void pre_backward();
  void on_grad_ready();
  // [collective] Reduces the full gradient into the shard, reshards.
  void post_backward();
  // End of backward for the root: finishes every unit of its tree.
  void finish_backward();

  // no_sync: keep full gradients, reduce at the next synced backward.
  void set_no_sync(bool on) { no_sync_ = on; }
  // summon_full_params.
  void summon(const SummonOptions& options);
  void unsummon(const SummonOptions& options);
  // [collective over the shard group when sharded] The full flat parameter
  // in the master dtype (not the compute dtype), as a new tensor.
  at::Tensor gather_master() const;
  // This rank's gradient tensors (sharded; the flat gradient or one per parameter).
  std::vector<at::Tensor> sharded_grads() const;

  // Root bookkeeping (set at the root's first forward).
  void lazy_init_root();

  // Adopts a dtype or device change made by Module::to() (model->to(kHalf)):
  // the flat parameter's new data (use_orig_params=false) or the original
  // parameters' (true) becomes the shard. Called before every use of the shard.
  void follow_module_to();
  // True from a forward that will be differentiated until its backward ends
  // (or the next forward of the root starts).
  bool awaiting_backward() const;
  bool summoned() const { return summoned_; }
  // Rank in the unit's whole world (replicate rank * shard size + shard rank).
  int world_rank() const;
  // Buffers cast by mixed precision, with their original dtypes (root only).
  const std::vector<std::pair<at::Tensor, at::ScalarType>>& cast_buffers() const { return cast_buffers_; }
  std::shared_ptr<UnitState> root() const { return root_.lock(); }

  // State dict type and config (StateDictTypeGuard).
  StateDictType state_dict_type = StateDictType::kFull;
  StateDictConfig state_dict_config = FullStateDictConfig{};

  torch::nn::Module* module() const { return module_; }
  const std::vector<ParamInfo>& params() const { return params_; }
  const UnitConfig& config() const { return config_; }
  int64_t numel() const { return numel_; }
  int64_t padded_numel() const { return padded_numel_; }
  int64_t shard_numel() const { return shard_numel_; }
  int shard_size() const { return shard_size_; }
  int shard_rank() const { return shard_rank_; }
  bool is_unsharded() const { return unsharded_; }
  at::ScalarType compute_dtype() const { return compute_dtype_; }
  const at::Tensor& flat_shard() const { return flat_shard_; }
  // Bytes of full parameters / full gradients alive right now.
  int64_t live_full_param_bytes() const;
  int64_t live_grad_bytes() const;

  // This rank's part of parameter i, as its data outside forward: a 1-D
  // slice of the shard (shard size 1: the whole parameter, in shape).
  at::Tensor sharded_view(const at::Tensor& flat, const ParamInfo& p) const;
  // The range of the unpadded flat parameter this rank holds.
  int64_t shard_begin() const { return shard_rank_ * shard_numel_; }

 private:
  void alloc_full();
  void set_sharded_data();
  // Asynchronous unshard: start issues the all-gather, finish waits for it.
  void start_unshard();
  void finish_unshard();
  // The unit that ran `step` places after this one in the last recorded
  // forward order (+1: next forward, -1: next backward).
  std::shared_ptr<UnitState> neighbour(int step) const;
  void prefetch(int step);
  void free_full();
  void hook_accumulators();
  // Summon with use_orig_params=false: the original parameters take the
  // flat parameter's place in the modules' registries, and back.
  void register_original_params();
  void register_flat_param();

  torch::nn::Module* module_;
  std::vector<ParamInfo> params_;
  UnitConfig config_;
  int shard_size_ = 1;
  int shard_rank_ = 0;
  at::ScalarType compute_dtype_ = at::kFloat;
  bool aliased_ = false;  // shard size 1 and no cast: full_ is flat_shard_, never freed
  at::TensorOptions shard_options_;  // the shard's dtype and device, as last seen
  int64_t numel_ = 0;
  int64_t padded_numel_ = 0;
  int64_t shard_numel_ = 0;
  at::Tensor flat_shard_;  // [shard_numel_]; for use_orig_params=false the registered flat_param
  at::Tensor full_;        // [padded_numel_]; its storage is freed while resharded (shard size > 1)
  at::Tensor full_grad_;   // [padded_numel_] during backward
  bool unsharded_ = false;
  bool no_sync_ = false;
  bool summoned_ = false;
  bool summon_was_unsharded_ = false;
  at::Tensor summon_snapshot_;
  at::Tensor summon_full_;
  bool gathering_ = false;       // an all-gather into full_ is in flight
  dist::Work pending_gather_;
  at::Tensor pending_input_;  // master-dtype full parameters while summoned with mixed precision

  // Backward bookkeeping.
  std::vector<NodePtr> accumulators_;
  int grads_expected_ = 0;
  int grads_ready_ = 0;
  bool in_backward_ = false;      // pre_backward ran, post_backward not yet

  // Root only.
  bool awaiting_backward_ = false;
  std::vector<std::pair<at::Tensor, at::ScalarType>> cast_buffers_;
  bool is_root_ = false;
  bool callback_queued_ = false;
  std::vector<std::weak_ptr<UnitState>> tree_;  // every unit of the root's tree, pre-order
  std::vector<std::weak_ptr<UnitState>> order_;       // forward order of this iteration
  std::vector<std::weak_ptr<UnitState>> last_order_;  // ... and of the previous one (for prefetching)
  std::weak_ptr<UnitState> root_;
};

// The units of `model`'s tree, pre-order (wrap.cpp).
std::vector<std::shared_ptr<UnitState>> units_of(const std::shared_ptr<torch::nn::Module>& model);

// Makes `m` (at `path`, a child of `parent`) interposable: its fsdp::Unit
// slot, or a stand-in in its parent Sequential; ConfigError naming `why`
// (the feature that wants it) otherwise (wrap.cpp).
std::shared_ptr<Slot> interpose(torch::nn::Module* parent, torch::nn::Module& m, const std::string& path,
                                const std::string& why);

// Gives every Sequential element under `root` that is a unit or checkpointed
// (wrapped before it was placed there) the stand-in that runs it.
void interpose_sequential_elements(torch::nn::Module& root);

// True when `t` is the flat parameter (shard) of some FSDP unit (wrap.cpp).
bool is_flat_param(const at::Tensor& t);

// The parameter registry of any module (torch::nn::Module keeps it protected).
torch::OrderedDict<std::string, at::Tensor>& parameters_of(torch::nn::Module& m);

// Parameters of `model` that no unit owns (ignored modules), each once.
std::vector<at::Tensor> unowned_params(const std::shared_ptr<torch::nn::Module>& model);

}  // namespace fsdp::detail
