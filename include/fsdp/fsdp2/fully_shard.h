// fsdp/fsdp2/fully_shard.h — FSDP2: PyTorch's fully_shard for LibTorch
// modules. Each parameter is sharded on its own, as a DTensor with Shard(0):
// this rank holds a block of its rows (torch.chunk's), and the module's
// parameter object holds exactly that block outside forward and backward, so
// any elementwise optimizer steps it directly. The side-by-side with
// PyTorch, and what differs: docs/fsdp2.md.
//
//   fsdp::Unit<NetImpl> net(args...);                // blocks held in fsdp::Unit too
//   auto mesh = fsdp::Mesh::of(world);               // 1-D: FSDP
//   for (auto& block : net->blocks) fsdp::fully_shard(block, {mesh});
//   fsdp::FSDPModule root = fsdp::fully_shard(net, {mesh});
//   fsdp::optim::AdamW opt(net->parameters(), ...);  // the local shards
//   auto loss = net(x).sum(); loss.backward(); opt.step();
//
// INTERPOSITION. LibTorch has no module hooks: a sharded module runs its
// hooks when it is called through an fsdp::Unit holder (or FullyShard), as
// `block(x)`, never `block->forward(x)` (fsdp/core/fully_sharded_data_parallel.h).
// fully_shard refuses a module no holder can interpose.
//
// COLLECTIVES. fully_shard itself communicates nothing, except with an int
// reshard_after_forward below the shard size: then it creates the smaller
// groups (for each such call, as torch makes its post-forward mesh), a
// collective over the shard group. Every forward and
// backward of a sharded module, unshard(), and ShardedParam::full_tensor() are
// collectives over the mesh: every rank runs them in the same order.
//
// MEMORY. Outside forward and backward each rank holds its shards: per
// parameter ceil(rows / shard size) rows (the last ranks fewer, or none).
// A module's full parameters exist from its pre-forward to its post-forward
// (reshard_after_forward true) or to the end of its backward, and from its
// pre-backward to its post-backward. A frozen parameter (requires_grad
// false) never has gradient memory, sharded or full.
//
// Not yet: offload on CUDA — refused by name.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fsdp/core/fully_sharded_data_parallel.h"
#include "fsdp/distributed/process_group.h"
#include "fsdp/dtensor/dtensor.h"
#include "fsdp/fsdp2/options.h"

namespace fsdp {

// One parameter as this rank holds it: torch's DTensor with placement
// Shard(0) on the mesh's shard dimension (Replicate on the replicate one).
// A value: copies share the tensors.
struct ShardedParam {
  std::string name;                   // the parameter's path under the module fully_shard was applied to
  at::Tensor param;                   // the module's parameter object (outside forward: `local`'s data)
  at::Tensor local;                   // this rank's rows: [rows, ...] with rows ≤ ceil(dim0 / shard size), maybe 0
  std::vector<int64_t> global_shape;  // the whole parameter's shape
  int64_t row_offset = 0;             // the global index of local's first row
  Mesh mesh;
  static constexpr int kShardDim = 0;  // the placement: Shard(0)

  // [local] The parameter as a DTensor: Shard(0) on the shard dimension
  // (Replicate on HSDP's replicate dimension), sharing `local` — or `rows`,
  // a tensor shaped like `local` (an optimizer's state of it, say).
  DTensor dtensor(const at::Tensor& rows = {}) const;
  // [collective over the mesh's shard group] The whole parameter, as a new
  // tensor: one all-gather of global_shape's elements.
  at::Tensor full_tensor() const { return gather(local); }
  // [collective over the mesh's shard group] The whole tensor of which
  // `rows` is this rank's part, sharded as this parameter is (`rows` shaped
  // like `local`: an optimizer's state of it, say), as a new tensor.
  at::Tensor gather(const at::Tensor& rows) const;
};

// A wait for an asynchronous unshard (torch's UnshardHandle).
class UnshardHandle {
 public:
  UnshardHandle() = default;
  explicit UnshardHandle(std::function<void()> wait) : wait_(std::move(wait)) {}
  // Blocks until the full parameters are in place. Idempotent.
  void wait();

 private:
  std::function<void()> wait_;
};

namespace detail {
class FSDPParamGroup;  // src/fsdp2/param_group.h (torch's FSDPParamGroup)
using ParamGroup = FSDPParamGroup;  // its former name, kept for one release
}

// A module that fully_shard sharded (torch's FSDPModule), as a handle: copies
// refer to the same group. Every setter applies to this module and, with
// recurse (the default), to every sharded module below it, as torch's.
class FSDPModule {
 public:
  FSDPModule() = default;
  explicit FSDPModule(std::shared_ptr<detail::ParamGroup> group) : group_(std::move(group)) {}

  // The module fully_shard was applied to (of a list, the first root).
  torch::nn::Module& module() const;
  // The modules fully_shard was applied to: one, or a list's roots.
  std::vector<torch::nn::Module*> modules() const;
  // This group's parameters, in order (the modules' named_parameters order;
  // names relative to the module that holds them).
  std::vector<ShardedParam> sharded_params() const;

  // [collective] Gathers the full parameters now. async_op: returns at once,
  // and the handle's wait() (or the next forward) completes the gather.
  UnshardHandle unshard(bool async_op = false);
  // [local] Frees the full parameters; the parameters show their shards.
  void reshard();

  // false: backward keeps accumulating full gradients unreduced (gradient
  // accumulation without communication); the next backward with true
  // reduces the sum.
  void set_requires_gradient_sync(bool required, bool recurse = true);
  // HSDP (2-D mesh): false skips the all-reduce across replicas; the
  // reduce-scattered gradients are kept, summed, and join the next
  // reduction that all-reduces (gradient accumulation with half the
  // communication). No effect on a 1-D mesh, as in torch.
  void set_requires_all_reduce(bool required, bool recurse = true);
  void set_reshard_after_forward(bool reshard, bool recurse = true);
  void set_reshard_after_backward(bool reshard, bool recurse = true);
  // false: the next backward is not the last of the step; its end leaves
  // modules with reshard_after_backward false unsharded.
  void set_is_last_backward(bool last);
  // The modules whose full parameters this module's forward (backward)
  // starts gathering when it begins, so that they overlap its compute.
  void set_modules_to_forward_prefetch(const std::vector<FSDPModule>& modules);
  void set_modules_to_backward_prefetch(const std::vector<FSDPModule>& modules);
  // Gradients are divided by `factor` instead of the data-parallel size.
  // Gloo has no PREMUL_SUM: with a factor other than the shard size, call
  // set_force_sum_reduction_for_comms(true) too (the reduction then sums,
  // and the division follows it), else backward throws ConfigError.
  void set_gradient_divide_factor(double factor);
  void set_force_sum_reduction_for_comms(bool enable);

  bool valid() const { return group_ != nullptr; }
  const std::shared_ptr<detail::ParamGroup>& group() const { return group_; }

 private:
  std::shared_ptr<detail::ParamGroup> group_;
};

// [local; collective over the shard group with an int reshard_after_forward
// below the shard size] Shards the parameters of `module` that no module below it sharded
// (and that are not ignored) over options.mesh, each on dim 0, and makes its
// forward gather them (torch's fully_shard). Apply it bottom-up: the blocks,
// then the root. `module` must be interposable: held by an fsdp::Unit (or
// FullyShard) holder. ConfigError, naming the module (and the parameter), for:
// a module sharded twice, or by FullyShardedDataParallel; a container without
// a forward (ModuleList, ModuleDict); a scalar (0-d) parameter; a mesh that
// is neither 1-D nor 2-D, or 2-D without dimension names; an int
// reshard_after_forward that is not a factor of the shard size; a parameter
// that another fully_shard group manages (tied: shard the modules together).
FSDPModule fully_shard(const std::shared_ptr<torch::nn::Module>& module, const FullyShardOptions& options);
// [local, as above] torch's fully_shard([a, b, ...]): one group of the
// parameters of several modules (the listed modules that no other listed one
// holds), gathered in one all-gather and reduced in one reduce-scatter. The
// first of them to run in a forward gathers the group; each casts its inputs
// (and outputs) as mp_policy says; the last to run reshards it and hooks the
// pre-backward on its output; the root's forward ends the group's forward if
// some of them did not run (a head called outside the model's forward). The
// modules that share a parameter (a head tied to an embedding) must be
// sharded together this way: fully_shard refuses, naming it, a parameter that
// another group manages already. A list cannot be the root: run the model
// that holds them, sharded too. All the handles of the modules (fsdp_module_of)
// are this one group's.
FSDPModule fully_shard(const std::vector<std::shared_ptr<torch::nn::Module>>& modules, const FullyShardOptions& options);
template <class M>
FSDPModule fully_shard(const torch::nn::ModuleHolder<M>& holder, const FullyShardOptions& options) {
  return fully_shard(std::shared_ptr<torch::nn::Module>(holder.ptr()), options);
}

// [local] fully_shard on every module under `root` (bottom-up) that
// `policy` selects, then on `root`: FSDP1's auto-wrap policies
// (fsdp/core/options.h) give the same units.
FSDPModule fully_shard_tree(const std::shared_ptr<torch::nn::Module>& root, const FullyShardOptions& options,
                            const AutoWrapPolicy& policy);

// [collective over the shard group] torch.nn.utils.clip_grad_norm_ over the
// sharded gradients of every group under `root` (in root's parameters()
// order), as DTensor computes it: each rank takes the norm of each local
// shard, the ranks combine these norms one by one (all-reduce of their
// norm_type-th powers, or of their maximum for an infinite norm_type), the
// total is the norm of the combined norms, and every gradient is
// multiplied by min(1, max_norm / (norm + 1e-6)). Returns the total norm (a
// 0-d tensor, the same on every rank). Call it after the last backward of a
// step (parameters resharded); ConfigError for a gradient on a parameter that
// no group under root manages.
// Deprecated (kept for one release): call fsdp::clip_grad_norm_(model, ...)
// (fsdp/core/utils.h), the one entry point for both engines, which runs this
// arithmetic for a model whose root fully_shard sharded.
at::Tensor clip_grad_norm_(const FSDPModule& root, double max_norm, double norm_type = 2.0);

// [local] The FSDPModule of `module`, if fully_shard sharded it.
std::optional<FSDPModule> fsdp_module_of(const torch::nn::Module& module);

// The one-line port of an FSDP1 model: where FSDP1 had
//   fsdp::FullyShardedDataParallel<NetImpl> model(net, fsdp::FSDPOptions()...auto_wrap_policy(p));
// FSDP2 takes
//   fsdp::FullyShard<NetImpl> model(net, fsdp::FullyShardOptions(mesh), p);
// a holder of the root (call it as model(x)) that applied fully_shard_tree.
template <class ModuleImpl>
class FullyShard : public Unit<ModuleImpl> {
 public:
  FullyShard(std::shared_ptr<ModuleImpl> module, const FullyShardOptions& options, const AutoWrapPolicy& policy = {})
      : Unit<ModuleImpl>(std::move(module)) {
    fsdp_ = fully_shard_tree(this->impl_, options, policy);
  }
  FullyShard(const torch::nn::ModuleHolder<ModuleImpl>& module, const FullyShardOptions& options,
             const AutoWrapPolicy& policy = {})
      : FullyShard(module.ptr(), options, policy) {}
  FSDPModule& fsdp() { return fsdp_; }

 private:
  FSDPModule fsdp_;
};

}  // namespace fsdp
