// fsdp/strategy/model_parallel.h — Lightning Fabric's ModelParallelStrategy,
// in C++: the user's function applies fully_shard (FSDP2) to the model on the
// strategy's device mesh; the strategy joins the job, checks the optimizer,
// offers the training loop's collectives, and saves and loads checkpoints
// (torch.distributed.checkpoint.state_dict's semantics: a DCP directory, or
// one full file).
//
//   fsdp::ModelParallelStrategy strategy(fsdp::ModelParallelStrategyOptions().parallelize_fn(
//       [](std::shared_ptr<torch::nn::Module> m, const fsdp::Mesh& mesh) {
//         auto net = std::dynamic_pointer_cast<NetImpl>(m);
//         for (auto& block : net->blocks) fsdp::fully_shard(block, {mesh});
//         fsdp::fully_shard(m, {mesh});   // m held by an fsdp::Unit / FullyShard holder
//         return m;
//       }));
//   strategy.setup_environment();                          // [collective]
//   auto model = strategy.setup_module(net);               // calls parallelize_fn(net, mesh)
//   fsdp::optim::AdamW opt(model->parameters(), ...);
//   strategy.setup_optimizer(opt);
//   ... loss.backward(); strategy.clip_gradients_norm(model, 1.0); opt.step();
//   strategy.save_checkpoint("ckpt", fsdp::CheckpointState().model("model", model).optimizer("opt", opt));
//
// DIFFERENCE FROM LIGHTNING: fsdp-cpp has no tensor parallelism, so the mesh
// is the data-parallel one (1-D, dimension "data_parallel", the whole
// world); tensor_parallel_size other than 1 is a ConfigError.
//
// ModelParallelStrategy(FSDPStrategyOptions) is FSDPStrategy's fully_shard
// form: the same options, the same units (its auto-wrap policy), sharded by
// fully_shard instead of FullyShardedDataParallel (fsdp-train's --engine
// fsdp2; make_strategy in fsdp/strategy/engine.h).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>

#include <torch/arg.h>

#include "fsdp/checkpoint/checkpoint_io.h"
#include "fsdp/distributed/process_group.h"
#include "fsdp/fsdp2/fully_shard.h"
#include "fsdp/strategy/strategy.h"

namespace fsdp {

// Lightning's ModelParallelStrategy arguments, in LibTorch's TORCH_ARG idiom.
struct ModelParallelStrategyOptions {
  using ParallelizeFn =
      std::function<std::shared_ptr<torch::nn::Module>(std::shared_ptr<torch::nn::Module>, const Mesh&)>;
  // Required: applies fully_shard (and anything else) to the model on the
  // mesh and returns the model.
  TORCH_ARG(ParallelizeFn, parallelize_fn);
  // Ranks per data-parallel group; 0 (Lightning's "auto"): the whole world.
  TORCH_ARG(int, data_parallel_size) = 0;
  // Only 1 (fsdp-cpp has no tensor parallelism).
  TORCH_ARG(int, tensor_parallel_size) = 1;
  // true: sharded checkpoints (a DCP directory, every rank writing its rows);
  // false: one full file, assembled on rank 0.
  TORCH_ARG(bool, save_distributed_checkpoint) = true;
  // As FSDPStrategyOptions' (fsdp/strategy/strategy_options.h).
  TORCH_ARG(std::optional<launch::Backend>, process_group_backend);
  TORCH_ARG(std::optional<std::chrono::milliseconds>, timeout);
  TORCH_ARG(dist::ProcessGroupPtr, world);
  TORCH_ARG(uint64_t, seed) = 0;
};

// Whether FSDP1's sharding strategy, and a precision, have a fully_shard
// form (ModelParallelStrategy(FSDPStrategyOptions)): FULL_SHARD,
// SHARD_GRAD_OP and HYBRID_SHARD do (fully_shard always shards: NO_SHARD
// does not); "32-true" and "bf16-mixed" do (bfloat16 compute, float32
// reduction: torch's MixedPrecisionPolicy), the other precisions not here.
bool has_fully_shard_form(ShardingStrategy strategy);
bool has_fully_shard_form(const PrecisionConfig& precision);

// FSDP2's Strategy (fsdp/strategy/strategy_base.h).
class ModelParallelStrategy : public Strategy {
 public:
  // ConfigError for a missing parallelize_fn and for tensor_parallel_size != 1.
  explicit ModelParallelStrategy(ModelParallelStrategyOptions options);
  // FSDPStrategy(options) in fully_shard's form: its environment, precision
  // and checkpoint format are `options`' (an FSDPStrategy inside); the mesh
  // is the one FSDP1 would shard over (the world group; HYBRID_SHARD: its
  // device_mesh, or sharding within a node by hybrid_shard_size); and
  // setup_module applies fully_shard to every module options' auto-wrap
  // policy selects, bottom-up, then to the root (fully_shard_tree), with
  // reshard_after_forward false under SHARD_GRAD_OP, bf16-mixed as
  // MixedPrecisionPolicy{bfloat16, float32}, cpu_offload as OffloadPolicy,
  // and then the options' activation checkpointing. ConfigError for what
  // has no fully_shard form (has_fully_shard_form: NO_SHARD, the
  // precisions but "32-true" and "bf16-mixed"; an explicit
  // mixed_precision), naming it.
  explicit ModelParallelStrategy(FSDPStrategyOptions options);

  // [collective] Joins the job (as FSDPStrategy::setup_environment) and makes
  // the mesh: ConfigError if data_parallel_size * tensor_parallel_size is
  // not the world size (Lightning's message).
  void setup_environment() override;
  // The data-parallel mesh handed to parallelize_fn (after setup_environment).
  const Mesh& device_mesh() const;
  dist::ProcessGroup& group() const override { return inner_.group(); }
  int global_rank() const override { return inner_.global_rank(); }
  int world_size() const override { return inner_.world_size(); }
  at::Device root_device() const override { return inner_.root_device(); }
  // FSDPStrategy's (the options' precision: none but FSDPStrategyOptions').
  ModuleInitContext module_init_context(bool empty_init = true) const override {
    return inner_.module_init_context(empty_init);
  }

  // [whatever parallelize_fn runs: fully_shard is local] Calls
  // parallelize_fn(module, device_mesh()) and returns its result.
  // ConfigError (Lightning's words) when the model holds FSDP1 units, or
  // when parallelize_fn returns null.
  std::shared_ptr<torch::nn::Module> setup_module(std::shared_ptr<torch::nn::Module> module);
  // [local] fsdp::check_optimizer on the models set up: the optimizer must
  // step their parameters, each listed once; LBFGS is refused by name.
  void setup_optimizer(const torch::optim::Optimizer& optimizer) const override;

  // [collective] The training loop's collectives, as FSDPStrategy's.
  at::Tensor all_reduce(const at::Tensor& tensor, dist::ReduceOp op = dist::ReduceOp::kAvg) const override {
    return inner_.all_reduce(tensor, op);
  }
  void barrier() const override { inner_.barrier(); }
  std::string broadcast(const std::string& data, int src = 0) const override { return inner_.broadcast(data, src); }
  void print(const std::string& message) const override { inner_.print(message); }
  // loss.backward() and optimizer.step(), as FSDPStrategy's (whose gradient
  // scaler fully_shard's precisions never have).
  void backward(const at::Tensor& loss) const override { inner_.backward(loss); }
  bool optimizer_step(torch::optim::Optimizer& optimizer) const override { return inner_.optimizer_step(optimizer); }

  // [collective] fsdp::clip_grad_norm_ over the gradients of the fully_shard
  // root `module` (DTensor's arithmetic). ConfigError if fully_shard did not
  // shard `module`.
  at::Tensor clip_gradients_norm(const std::shared_ptr<torch::nn::Module>& module, double max_norm,
                                 double norm_type = 2.0) const;
  // The same (no gradient scaler to unscale `optimizer`'s gradients for).
  at::Tensor clip_gradients_norm(const std::shared_ptr<torch::nn::Module>& module, torch::optim::Optimizer& optimizer,
                                 double max_norm, double norm_type = 2.0) const override;
  // Lightning's no_backward_sync for FSDP2: while the guard lives, every
  // fully_shard module under `module` skips gradient reduction
  // (set_requires_gradient_sync(false)); its end turns it back on. `enabled`
  // false: a null guard. Local.
  class NoSync {
   public:
    explicit NoSync(FSDPModule root);
    ~NoSync();
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    FSDPModule root_;
  };
  std::unique_ptr<NoSync> no_backward_sync(const std::shared_ptr<torch::nn::Module>& module, bool enabled = true) const;

  // [collective] Checkpoints: sharded (save_distributed_checkpoint) or full;
  // see fsdp/checkpoint/checkpoint_io.h. Either loads at any world size.
  void save_checkpoint(const std::string& path, const CheckpointState& state,
                       std::function<bool(const std::string&, const std::string&)> filter = nullptr) const override;
  std::map<std::string, CheckpointValue> load_checkpoint(const std::string& path, CheckpointState& state,
                                                         bool strict = true) const override;

 protected:
  std::shared_ptr<torch::nn::Module> setup_module_impl(std::shared_ptr<torch::nn::Module> module) override {
    return setup_module(std::move(module));
  }

 private:
  ModelParallelStrategyOptions options_;
  FSDPStrategy inner_;  // environment, collectives and checkpoints
  // Built from FSDPStrategyOptions: the mesh is the one FSDP1 would shard over (fsdp1_mesh).
  bool fsdp_layout_ = false;
  Mesh fsdp1_mesh() const;  // [collective when it makes HYBRID_SHARD's groups]
  std::optional<Mesh> mesh_;
  std::vector<std::weak_ptr<torch::nn::Module>> models_;
};

}  // namespace fsdp
