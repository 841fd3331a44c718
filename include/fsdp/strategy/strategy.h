// fsdp/strategy/strategy.h — Lightning Fabric's FSDPStrategy, in C++: one object that
// sets up the process group, wraps the model with its policies, applies
// precision and activation checkpointing, checks optimizers, offers the
// training loop's collectives, and saves and loads checkpoints.
//
//   auto strategy = fsdp::FSDPStrategy(fsdp::FSDPStrategyOptions()
//                                          .auto_wrap_module_types<BlockImpl>()
//                                          .precision("bf16-mixed")
//                                          .state_dict_type(fsdp::CheckpointFormat::kSharded));
//   strategy.setup_environment();                       // [collective] process group from fsdp-run's env
//   auto model = strategy.setup_module(std::make_shared<NetImpl>());
//   torch::optim::AdamW opt(model->parameters(), ...);
//   strategy.setup_optimizer(opt);
//   ... loss.backward(); strategy.clip_gradients_norm(model, 1.0); opt.step();
//   strategy.save_checkpoint("ckpt", fsdp::CheckpointState().model("model", model.ptr()).optimizer("opt", opt));
//
// Error messages are Lightning Fabric's (lightning/fabric/strategies/fsdp.py)
// where it has one. Warnings go through c10's warning handler (TORCH_WARN;
// by default to stderr), from rank 0 only. Metrics go to the loggers of the
// options (fsdp/observability/loggers.h) through log / log_dict.
#pragma once

#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>


#include "fsdp/checkpoint/checkpoint_io.h"
#include "fsdp/core/activation_checkpointing.h"
#include "fsdp/core/fully_sharded_data_parallel.h"
#include "fsdp/core/utils.h"
#include "fsdp/distributed/process_group.h"
#include "fsdp/observability/loggers.h"
#include "fsdp/strategy/grad_scaler.h"
#include "fsdp/strategy/init_context.h"
#include "fsdp/strategy/strategy_base.h"
#include "fsdp/strategy/strategy_options.h"

namespace torch::optim {
class Optimizer;
}

namespace fsdp {

// FSDP1's Strategy (fsdp/strategy/strategy_base.h).
class FSDPStrategy : public Strategy {
 public:
  // Validates the options (ConfigError with Lightning's messages: hybrid
  // sharding without a policy, group or mesh; process_group with
  // device_mesh; a mesh without HYBRID_SHARD; both checkpointing options).
  // Unknown names (precision, state_dict_type, backend, sharding strategy)
  // are refused earlier, by the options' setters.
  explicit FSDPStrategy(FSDPStrategyOptions options = {});

  // [collective] Joins the job described by the environment (fsdp-run /
  // torchrun variables; none set: a single process, rank 0 of 1), with the
  // options' backend and timeout, seeds LibTorch's (process-wide) default
  // generator with the options' seed, and builds the device mesh. A world
  // group given in the options is used instead of joining; so is the one another strategy of this process joined while it
  // is still held (as Lightning reuses an initialised default group; its
  // backend and timeout stay) — ConfigError if the environment's rank or
  // world size disagree with it.
  void setup_environment() override;

  dist::ProcessGroup& group() const override;
  int global_rank() const override;
  int world_size() const override;
  // Where this rank computes: the group's device (CPU for Gloo, this rank's
  // CUDA device for NCCL; setup_module moves the model there). Move each
  // batch here before the forward. CPU before setup_environment().
  at::Device root_device() const override;
  // Lightning's distributed_sampler_kwargs: give them to
  // torch::data::samplers::DistributedRandomSampler / DistributedSequentialSampler.
  struct SamplerArgs {
    size_t num_replicas;
    size_t rank;
  };
  SamplerArgs distributed_sampler_kwargs() const;
  const PrecisionConfig& precision() const { return precision_; }
  CheckpointFormat state_dict_type() const { return options_.state_dict_type(); }
  // The effective FSDP settings, as Lightning's attributes of the same names:
  // the sharding strategy, the MixedPrecision the model is wrapped with (an
  // explicit mixed_precision, else the precision name's; none for "-true"
  // and "32"), and the CPU offload.
  ShardingStrategy sharding_strategy() const { return options_.sharding_strategy(); }
  std::optional<MixedPrecision> mixed_precision_config() const;
  CPUOffload cpu_offload() const { return options_.cpu_offload(); }
  // Lightning's module_sharded_context: the FSDP options this strategy wraps
  // with (sharding strategy, mixed precision, CPU offload, groups, device,
  // pass-through options), without its auto-wrap policy, for wrapping
  // submodules by hand:
  //   block = strategy.wrap(block);   // or FullyShardedDataParallel<M>(m, strategy.module_sharded_options())
  // then setup_module(model) wraps the root around them. Local; requires
  // setup_environment.
  FSDPOptions module_sharded_options() const;
  // [collective] FullyShardedDataParallel<M>(module, module_sharded_options()).
  template <class ModuleImpl>
  Unit<ModuleImpl> wrap(std::shared_ptr<ModuleImpl> module) const {
    FullyShardedDataParallel<ModuleImpl> wrapped(std::move(module), module_sharded_options());
    return wrapped;
  }

  // Lightning's module_init_context(empty_init): build the model while the
  // returned context lives. empty_init=true: every fsdp::Unit<M>(args...)
  // built on this thread holds no memory until setup_module materialises it,
  // unit by unit, right before sharding it — peak memory during setup is the
  // shards plus about one unit, with the values of an eager build (see
  // EmptyInitGuard in fsdp/fsdp.h). Under "bf16-true" / "16-true" the
  // parameters are created in that dtype (see ModuleInitContext). Local.
  ModuleInitContext module_init_context(bool empty_init = true) const override {
    return ModuleInitContext(empty_init, precision_.model_dtype);
  }

  // setup_module(module) (Strategy's; returns fsdp::Unit<M>): [collective]
  // Wraps `module` (FSDP with the options and the auto-wrap policy), then
  // applies activation checkpointing. A model that already has checkpointed
  // layers keeps them (warning).
  // Manual wrapping: when submodules are already FSDP units (wrapped by hand,
  // e.g. with wrap() above; members or Sequential elements), the policy is
  // ignored (warning) and only the root is wrapped around them, owning the
  // parameters no unit holds. DIFFERENCE FROM LIGHTNING, on purpose:
  // Lightning leaves such a root unwrapped, so parameters outside the units
  // would neither be sharded nor have their gradients reduced (ranks would
  // drift apart), and clip_gradients_norm / no_backward_sync would refuse the
  // model; with the root wrapped, manual wrapping trains and checkpoints as
  // auto-wrapping does. A root that is itself a unit is left as it is.

  // [local] With use_orig_params=false, checks that `optimizer` steps the
  // parameters of a model this strategy set up (fsdp::check_optimizer:
  // Lightning's "does not seem to reference any FSDP parameters" error);
  // with use_orig_params=true it checks nothing else, as Lightning. Either
  // way a tensor the optimizer lists twice (a tied weight from LibTorch's
  // parameters()) is a ConfigError naming it (check_parameters_listed_once).
  void setup_optimizer(const torch::optim::Optimizer& optimizer) const override;
  // Lightning's joint setup: the optimizers must have been built on the
  // model's parameters and use_orig_params must be true (its error otherwise).
  template <class ModuleImpl>
  Unit<ModuleImpl> setup_module_and_optimizers(std::shared_ptr<ModuleImpl> module,
                                               const std::vector<torch::optim::Optimizer*>& optimizers) {
    check_joint_setup();
    auto wrapped = setup_module(std::move(module));
    for (auto* o : optimizers) setup_optimizer(*o);
    return wrapped;
  }

  // Collectives over the whole world, for the training loop.
  // [collective] Reduces `tensor` in place over the world and returns it
  // (default: the mean, dist::ReduceOp::kAvg).
  at::Tensor all_reduce(const at::Tensor& tensor, dist::ReduceOp op = dist::ReduceOp::kAvg) const override;
  // Lightning's reduce_op string: "mean" (or "avg"), "sum", "max", parsed by
  // dist::parse_reduce_op (ConfigError listing them for another name).
  at::Tensor all_reduce(const at::Tensor& tensor, const std::string& op) const;
  void barrier() const override;  // [collective]
  // [collective] Rank `src`'s bytes / string on every rank (a value:
  // Strategy's broadcast_value).
  std::string broadcast(const std::string& data, int src = 0) const override;
  // Prints `message` (plus newline) on rank 0 only.
  void print(const std::string& message) const override;

  // Lightning's fabric.log / fabric.log_dict: rank 0 hands the metrics to
  // every logger of the options; other ranks do nothing. Local (no
  // collective): log a value every rank agrees on (all_reduce it first) or
  // rank 0's own. `step` nullopt: each logger counts its calls. A logger's
  // failed write is a warning, never an error.
  void log(const std::string& name, double value, std::optional<int64_t> step = std::nullopt) const;
  void log_dict(const Metrics& metrics, std::optional<int64_t> step = std::nullopt) const;
  // Lightning's fabric.logger (the first logger; nullptr without one) and fabric.loggers.
  std::shared_ptr<Logger> logger() const;
  const std::vector<std::shared_ptr<Logger>>& loggers() const { return options_.loggers(); }

  // [collective] Clips the model's gradients to max_norm (FSDP's
  // clip_grad_norm_); unscales them first under a gradient scaler. TypeError
  // text of Lightning if the root is not FSDP-wrapped.
  at::Tensor clip_gradients_norm(const std::shared_ptr<torch::nn::Module>& module, double max_norm,
                                 double norm_type = 2.0) const;
  // The same, unscaling `optimizer`'s gradients first when a gradient scaler is in use.
  at::Tensor clip_gradients_norm(const std::shared_ptr<torch::nn::Module>& module, torch::optim::Optimizer& optimizer,
                                 double max_norm, double norm_type = 2.0) const override;
  // Lightning's clip_gradients_value: clamps every gradient of `optimizer`'s
  // parameters to [-clip_value, clip_value], unscaling them first under a
  // gradient scaler. Local: an element's clamp needs no other element, so
  // clamping each rank's shard is clamping the full gradient. ConfigError
  // for a clip_value that is not positive.
  void clip_gradients_value(torch::optim::Optimizer& optimizer, double clip_value) const;
  // Lightning's backward: loss.backward(), the loss scaled first under
  // "16-mixed" (its gradient scaler). Local; the unit hooks it triggers are
  // collectives.
  void backward(const at::Tensor& loss) const override;
  // Lightning's optimizer_step: optimizer.step(); under "16-mixed" [collective]
  // unscales (unless clip_gradients_norm did), skips the step when a gradient
  // is not finite on any rank, and updates the scale. Returns whether it stepped.
  bool optimizer_step(torch::optim::Optimizer& optimizer) const override;
  // The gradient scaler of "16-mixed" (null for other precisions); made by
  // setup_environment. Use scaler->scale(loss).backward(), scaler->step(opt),
  // scaler->update().
  ShardedGradScaler* grad_scaler() const override { return scaler_.get(); }
  // Gradient accumulation without communication (FSDP's no_sync); Lightning's
  // error if the root is not FSDP-wrapped. `enabled` false (Lightning's
  // `enabled`): a null guard, the backward syncs, and the module is not
  // checked, so that one line serves every micro-batch of an accumulation:
  //   auto guard = strategy.no_backward_sync(model.ptr(), /*enabled=*/!last_micro_batch);
  std::unique_ptr<NoSync> no_backward_sync(const std::shared_ptr<torch::nn::Module>& module,
                                           bool enabled = true) const;

  // [collective] Checkpoints in the options' state_dict_type (kFull: one
  // file, kSharded: a directory); see fsdp/checkpoint_io.h. Errors as Lightning's.
  void save_checkpoint(const std::string& path, const CheckpointState& state,
                       std::function<bool(const std::string&, const std::string&)> filter = nullptr) const override;
  std::map<std::string, CheckpointValue> load_checkpoint(const std::string& path, CheckpointState& state,
                                                         bool strict = true) const override;
  // [collective] The model of a single-file (full) checkpoint into `module`
  // (Lightning's module-only load, which Fabric's load_raw calls): an
  // fsdp-cpp full checkpoint, or a raw torch.save(model.state_dict()) file
  // (see fsdp::load_checkpoint in checkpoint_io.h); a sharded checkpoint's
  // directory is refused with Lightning's message (load it through a
  // CheckpointState).
  void load_checkpoint(const std::string& path, const std::shared_ptr<torch::nn::Module>& module,
                       bool strict = true) const;
  // Lightning: "Loading a single optimizer object from a checkpoint is not
  // supported yet with the FSDP strategy."
  void load_checkpoint(const std::string& path, torch::optim::Optimizer& optimizer) const;

 protected:
  // [collective] Wraps `module` (FSDP with the options and the auto-wrap
  // policy), then applies activation checkpointing; returns `module`.
  std::shared_ptr<torch::nn::Module> setup_module_impl(std::shared_ptr<torch::nn::Module> module) override;

 private:
  // Checks the set-up, converts a "-true" precision's model, and returns the
  // options to wrap the root with: the policy's, or none (warning when a
  // policy is set) if submodules are already FSDP units; nullopt when the
  // root itself is already one.
  std::optional<FSDPOptions> begin_setup(const std::shared_ptr<torch::nn::Module>& module);
  FSDPOptions fsdp_options() const;
  void after_wrap(const std::shared_ptr<torch::nn::Module>& module);
  void check_joint_setup() const;
  void require_group(const char* what) const;

  FSDPStrategyOptions options_;
  PrecisionConfig precision_;
  dist::ProcessGroupPtr group_;
  std::optional<dist::DeviceMesh> mesh_;
  // The models setup_module set up, for setup_optimizer (not kept alive).
  std::vector<std::weak_ptr<torch::nn::Module>> models_;
  std::shared_ptr<ShardedGradScaler> scaler_;
};

}  // namespace fsdp
