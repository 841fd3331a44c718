// fsdp/strategy/strategy_base.h — Strategy: what a training loop asks of a
// strategy, whichever engine shards the model (Lightning Fabric's Strategy
// base class). FSDPStrategy (FSDP1: FullyShardedDataParallel units,
// fsdp/strategy/strategy.h) and ModelParallelStrategy (FSDP2: fully_shard,
// fsdp/strategy/model_parallel.h) implement it; a loop written against it
// (fsdp-train's) runs under either and never asks which. make_strategy
// (fsdp/strategy/engine.h) picks one by fsdp::Engine.
//
//   std::unique_ptr<fsdp::Strategy> s = fsdp::make_strategy(fsdp::Engine::kFsdp2, options);
//   s->setup_environment();                       // [collective]
//   auto model = s->setup_module(std::make_shared<NetImpl>());   // fsdp::Unit<NetImpl>
//   s->setup_optimizer(opt);
//   s->backward(loss); s->clip_gradients_norm(model.ptr(), opt, 1.0); s->optimizer_step(opt);
#pragma once

#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <type_traits>

#include "fsdp/checkpoint/checkpoint_io.h"
#include "fsdp/core/fully_sharded_data_parallel.h"
#include "fsdp/distributed/process_group.h"
#include "fsdp/error.h"
#include "fsdp/strategy/grad_scaler.h"
#include "fsdp/strategy/init_context.h"

namespace torch::optim {
class Optimizer;
}

namespace fsdp {

class Strategy {
 public:
  virtual ~Strategy() = default;

  // [collective] Joins the job (the environment's, or the world group the
  // options give), seeds LibTorch's default generator, builds the meshes.
  virtual void setup_environment() = 0;
  // The world group, this rank, the world size (after setup_environment).
  virtual dist::ProcessGroup& group() const = 0;
  virtual int global_rank() const = 0;
  virtual int world_size() const = 0;
  bool is_global_zero() const { return global_rank() == 0; }
  // Where this rank computes (move each batch here); CPU before setup_environment.
  virtual at::Device root_device() const = 0;
  // Build the model while the returned context lives (empty_init: each
  // unit gets its memory when the engine shards it). Local.
  virtual ModuleInitContext module_init_context(bool empty_init = true) const = 0;

  // Shards `module` as the strategy does (FSDP1 units by its auto-wrap
  // policy, or fully_shard by its parallelize function) and returns the
  // holder to call it through, whose forward runs the engine's hooks.
  // [collective for FSDP1 (the units' set-up); fully_shard is local]
  // ConfigError as the strategy's set-up, and when the strategy returns a
  // module of another type than ModuleImpl.
  template <class ModuleImpl>
  Unit<ModuleImpl> setup_module(std::shared_ptr<ModuleImpl> module) {
    // The root's holder first: the engine interposes the root's forward
    // through it (fully_shard refuses a root that no holder holds).
    Unit<ModuleImpl> holder(module);
    const std::shared_ptr<torch::nn::Module> out = setup_module_impl(module);
    if (out.get() == static_cast<torch::nn::Module*>(module.get())) return holder;
    auto other = std::dynamic_pointer_cast<ModuleImpl>(out);
    if (!other) throw ConfigError("Strategy::setup_module: the strategy returned no module of the type it was given");
    return Unit<ModuleImpl>(std::move(other));
  }
  template <class ModuleImpl>
  Unit<ModuleImpl> setup_module(const torch::nn::ModuleHolder<ModuleImpl>& module) {
    return setup_module(module.ptr());
  }
  // [local] Checks that `optimizer` steps the parameters of the models set
  // up (each listed once); ConfigError otherwise.
  virtual void setup_optimizer(const torch::optim::Optimizer& optimizer) const = 0;

  // [collective] The training loop's collectives over the world.
  virtual at::Tensor all_reduce(const at::Tensor& tensor, dist::ReduceOp op = dist::ReduceOp::kAvg) const = 0;
  virtual void barrier() const = 0;
  virtual std::string broadcast(const std::string& data, int src = 0) const = 0;
  // [collective] Rank `src`'s value on every rank.
  template <class T, class = std::enable_if_t<std::is_trivially_copyable_v<T>>>
  T broadcast_value(const T& value, int src = 0) const {
    std::string bytes(reinterpret_cast<const char*>(&value), sizeof(T));
    bytes = broadcast(bytes, src);
    T out;
    std::memcpy(&out, bytes.data(), sizeof(T));
    return out;
  }
  // Prints `message` (plus newline) on rank 0 only.
  virtual void print(const std::string& message) const = 0;

  // loss.backward(), scaled first under a gradient scaler. Local; the
  // engine's hooks it triggers are collectives.
  virtual void backward(const at::Tensor& loss) const = 0;
  // [collective] Clips the gradients of the model set up (`module`, its
  // root) to max_norm with the engine's arithmetic (FSDP1's
  // clip_grad_norm_, or DTensor's for fully_shard), unscaling `optimizer`'s
  // gradients first under a gradient scaler; returns the total norm before
  // clipping (0-d, the same on every rank).
  virtual at::Tensor clip_gradients_norm(const std::shared_ptr<torch::nn::Module>& module,
                                         torch::optim::Optimizer& optimizer, double max_norm,
                                         double norm_type = 2.0) const = 0;
  // optimizer.step(); under a gradient scaler [collective] the scaler's
  // step, skipped when a gradient is not finite on any rank. Whether it stepped.
  virtual bool optimizer_step(torch::optim::Optimizer& optimizer) const = 0;
  // The gradient scaler ("16-mixed"), or null.
  virtual ShardedGradScaler* grad_scaler() const { return nullptr; }

  // [collective] Checkpoints (fsdp/checkpoint/checkpoint_io.h), in the
  // strategy's format; either engine's load into either.
  virtual void save_checkpoint(const std::string& path, const CheckpointState& state,
                               std::function<bool(const std::string&, const std::string&)> filter = nullptr) const = 0;
  virtual std::map<std::string, CheckpointValue> load_checkpoint(const std::string& path, CheckpointState& state,
                                                                 bool strict = true) const = 0;

 protected:
  // The engine's half of setup_module: shards `module`, returns the module
  // to call (itself, or what a parallelize function returned).
  virtual std::shared_ptr<torch::nn::Module> setup_module_impl(std::shared_ptr<torch::nn::Module> module) = 0;
};

}  // namespace fsdp
