// The strategy layer: Lightning Fabric's FSDPStrategy in C++.
#include "fsdp/strategy/strategy.h"

#include <ATen/ATen.h>
#include <c10/core/DefaultDtype.h>
#include <c10/util/Exception.h>
#include <torch/optim/optimizer.h>
#include <torch/utils.h>
#include <torch/version.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <iostream>
#include <mutex>

#include "fsdp/launch/env.h"
#include "fsdp/error.h"
#include "fsdp/core/detail/empty_init.h"
#include "fsdp/fault_points/fault_points.h"
#include "fsdp/distributed/rank_errors.h"
#include "fsdp/core/trace_span.h"
#include "fsdp/core/detail/unit_view.h"

namespace fsdp {

// ---------------------------------------------------------------------------
// The strategy.

FSDPStrategy::FSDPStrategy(FSDPStrategyOptions options) : options_(std::move(options)) {
  precision_ = parse_precision(options_.precision());
  if (options_.process_group() && options_.device_mesh()) {
    throw ConfigError("The arguments `FSDPStrategy(process_group=..., device_mesh=...)` are mutually exclusive."
                      "Pass only one of them.");
  }
  if (options_.sharding_strategy() == ShardingStrategy::kHybridShard && !options_.auto_wrap_policy() &&
      !options_.process_group() && !options_.device_mesh()) {
    throw ConfigError("The hybrid sharding strategy requires you to pass at least one of the parameters: "
                      "`auto_wrap_policy`, `process_group` tuple, or `device_mesh`.");
  }
  if (options_.device_mesh() && options_.sharding_strategy() != ShardingStrategy::kHybridShard) {
    throw ConfigError("FSDPStrategy: device_mesh (" + std::to_string(options_.device_mesh()->first) + ", " +
                      std::to_string(options_.device_mesh()->second) +
                      ") is only valid with the HYBRID_SHARD sharding strategy, not " +
                      to_string(options_.sharding_strategy()));
  }
  if (options_.activation_checkpointing_policy() && options_.activation_checkpointing()) {
    throw ConfigError("You cannot set both `activation_checkpointing` and `activation_checkpointing_policy`. Use the "
                      "latter.");
  }
  if (options_.activation_checkpointing()) {
    TORCH_WARN("fsdp: FSDPStrategyOptions::activation_checkpointing is deprecated, use "
               "activation_checkpointing_policy instead.");
  }
}

void FSDPStrategy::setup_environment() {
  if (options_.world()) {
    group_ = options_.world();
  } else {
    // The world group this process joined from its environment, while any
    // strategy still holds it: a second strategy uses it (as Lightning uses
    // an initialised default group) instead of joining again.
    static std::mutex joined_mutex;
    static std::weak_ptr<dist::ProcessGroup> joined;
    const launch::DistEnv env = launch::read_dist_env();
    std::lock_guard<std::mutex> lock(joined_mutex);
    if (auto existing = joined.lock()) {
      if (existing->rank() != env.rank || existing->size() != env.world_size) {
        throw ConfigError("FSDPStrategy::setup_environment: this process already joined the world group as rank " +
                          std::to_string(existing->rank()) + " of " + std::to_string(existing->size()) +
                          ", but the environment now says rank " + std::to_string(env.rank) + " of " +
                          std::to_string(env.world_size) + ": expected the same rank and world size");
      }
      group_ = existing;
    } else {
      dist::InitOptions o = dist::InitOptions::from_env(env);
      if (options_.timeout()) o.timeout = *options_.timeout();
      if (options_.process_group_backend()) o.backend = *options_.process_group_backend();
      group_ = dist::init_process_group(o);
      joined = group_;
    }
  }
  torch::manual_seed(options_.seed());  // the same on every rank
  if (precision_.needs_grad_scaler) scaler_ = std::make_shared<ShardedGradScaler>(group_);
  if (options_.device_mesh()) {
    const auto [replicate, shard] = *options_.device_mesh();
    if (replicate * shard != group_->size()) {
      throw ConfigError("FSDPStrategy: device_mesh (" + std::to_string(replicate) + ", " + std::to_string(shard) +
                        ") has " + std::to_string(replicate * shard) + " ranks but the world size is " +
                        std::to_string(group_->size()) + ": their product must equal the world size");
    }
    mesh_ = dist::init_device_mesh(group_, replicate, shard);
  }
  // [collective when there are loggers] Rank 0 opens them; its error stops every rank.
  if (!options_.loggers().empty()) {
    const auto failure = dist::capture([&] {
      if (!is_global_zero()) return;
      for (const auto& logger : options_.loggers()) {
        if (!logger) throw ConfigError("FSDPStrategyOptions::loggers: a logger is null");
        logger->open();
      }
    });
    dist::agree_from(*group_, 0, failure, "FSDPStrategy::setup_environment: ");
  }
}

void FSDPStrategy::require_group(const char* what) const {
  if (!group_) {
    throw ConfigError(std::string("FSDPStrategy::") + what +
                      ": call setup_environment() first (it joins the process group)");
  }
}

dist::ProcessGroup& FSDPStrategy::group() const {
  require_group("group");
  return *group_;
}
at::Device FSDPStrategy::root_device() const { return group_ ? group_->device() : at::Device(at::kCPU); }
int FSDPStrategy::global_rank() const { return group_ ? group_->rank() : 0; }
int FSDPStrategy::world_size() const { return group_ ? group_->size() : 1; }

FSDPStrategy::SamplerArgs FSDPStrategy::distributed_sampler_kwargs() const {
  return {static_cast<size_t>(world_size()), static_cast<size_t>(global_rank())};
}

FSDPOptions FSDPStrategy::fsdp_options() const {
  FSDPOptions o = options_.fsdp();
  if (auto mixed = mixed_precision_config()) o.mixed_precision(*mixed);
  // Lightning's device_id=root_device.index: a CUDA group gets the model on its device.
  if (!o.device_id() && group_ && group_->device().is_cuda()) o.device_id(group_->device());
  if (mesh_) {
    o.device_mesh(*mesh_);
  } else {
    if (!o.process_group()) o.process_group(group_);
    if (o.sharding_strategy() == ShardingStrategy::kHybridShard) {
      // Lightning's default: shard within a node, replicate across nodes.
      int local = 0;
      try {
        const auto env = launch::read_dist_env();
        if (env.launched) local = env.local_world_size;  // else not launched: one node
      } catch (const ConfigError&) {
        // a partial launcher environment: one node
      }
      const int size = o.process_group()->size();
      o.hybrid_shard_size(local > 0 && size % local == 0 ? local : size);
    }
  }
  return o;
}

std::optional<FSDPOptions> FSDPStrategy::begin_setup(const std::shared_ptr<torch::nn::Module>& module) {
  require_group("setup_module");
  if (!module) throw ConfigError("FSDPStrategy::setup_module: the module is null");
  if (((precision_.mixed && precision_.mixed->param_dtype == at::kHalf) || precision_.model_dtype == at::kHalf) &&
      !float16_compute_available(group_->device().type())) {
    throw ConfigError("FSDPStrategy: precision '" + precision_.name + "' computes in float16, which this LibTorch " +
                      TORCH_VERSION + " has no " + c10::DeviceTypeName(group_->device().type()) +
                      " kernels for (matmul, tanh, ...): use \"bf16-mixed\" or \"bf16-true\", LibTorch 2.x, or a "
                      "CUDA build");
  }
  if (precision_.model_dtype) detail::module_to(*module, std::nullopt, *precision_.model_dtype);
  const auto units = fsdp_modules(module);
  if (units.empty()) return fsdp_options();
  if (options_.auto_wrap_policy() && is_global_zero()) {
    TORCH_WARN("fsdp: A FSDP `auto_wrap_policy` is set, but the model is already wrapped. The policy will be "
               "ignored.");
  }
  if (units.front().second == module) return std::nullopt;  // the root is a unit already
  return module_sharded_options();  // manual wrapping: the root around the user's units
}

std::shared_ptr<torch::nn::Module> FSDPStrategy::setup_module_impl(std::shared_ptr<torch::nn::Module> module) {
  if (auto options = begin_setup(module)) detail::wrap(module, *options);
  after_wrap(module);
  return module;
}

FSDPOptions FSDPStrategy::module_sharded_options() const {
  require_group("module_sharded_options");
  return fsdp_options().auto_wrap_policy(nullptr);
}

std::optional<MixedPrecision> FSDPStrategy::mixed_precision_config() const {
  if (options_.mixed_precision()) return options_.mixed_precision();
  return precision_.mixed;
}

void FSDPStrategy::after_wrap(const std::shared_ptr<torch::nn::Module>& module) {
  models_.push_back(module);
  const CheckpointCheck& policy = options_.activation_checkpointing_policy() ? options_.activation_checkpointing_policy()
                                                                             : options_.activation_checkpointing();
  if (!policy) return;
  for (const auto& m : module->modules(/*include_self=*/true)) {
    if (is_checkpointed(*m)) {
      if (is_global_zero()) {
        TORCH_WARN("fsdp: FSDP checkpointing is configured, but the model already contains checkpointed layers. "
                   "Checkpointing will be ignored.");
      }
      return;
    }
  }
  apply_activation_checkpointing(module, policy);
}

void FSDPStrategy::setup_optimizer(const torch::optim::Optimizer& optimizer) const {
  std::vector<std::shared_ptr<torch::nn::Module>> models;
  for (const auto& m : models_) {
    if (auto model = m.lock()) models.push_back(std::move(model));
  }
  // A tensor listed twice (a tied weight from LibTorch's parameters()) would step twice.
  check_parameters_listed_once(models, optimizer, "setup_optimizer");
  if (options_.use_orig_params()) return;  // the optimizer holds the original parameters either way
  check_optimizer(models, optimizer);
}

void FSDPStrategy::check_joint_setup() const {
  if (!options_.use_orig_params()) {
    throw ConfigError("You set `FSDPStrategy(use_orig_params=False)` but this is not supported when setting the model "
                      "and optimizer up jointly. Either set it to `True` or set the objects up in this order: Create "
                      "the model, call `setup_module`, create the optimizer, call `setup_optimizer`.");
  }
}

at::Tensor FSDPStrategy::all_reduce(const at::Tensor& tensor, dist::ReduceOp op) const {
  require_group("all_reduce");
  group_->all_reduce(tensor, op).wait();
  return tensor;
}

at::Tensor FSDPStrategy::all_reduce(const at::Tensor& tensor, const std::string& op) const {
  return all_reduce(tensor, dist::parse_reduce_op(op, "FSDPStrategy::all_reduce"));
}

void FSDPStrategy::backward(const at::Tensor& loss) const { (scaler_ ? scaler_->scale(loss) : loss).backward(); }

bool FSDPStrategy::optimizer_step(torch::optim::Optimizer& optimizer) const {
  detail::fault_point("optimizer-step", global_rank());  // docs/reliability.md
  detail::ScopedSpan span("optimizer.step");
  if (!scaler_) {
    optimizer.step();
    return true;
  }
  const bool stepped = scaler_->step(optimizer);
  scaler_->update();
  return stepped;
}

void FSDPStrategy::barrier() const {
  if (group_) group_->barrier();
}

std::string FSDPStrategy::broadcast(const std::string& data, int src) const {
  if (!group_) return data;
  return group_->broadcast_bytes(data, src);
}

void FSDPStrategy::print(const std::string& message) const {
  if (is_global_zero()) std::cout << message << std::endl;
}

void FSDPStrategy::log(const std::string& name, double value, std::optional<int64_t> step) const {
  log_dict({{name, value}}, step);
}

void FSDPStrategy::log_dict(const Metrics& metrics, std::optional<int64_t> step) const {
  if (!is_global_zero()) return;
  for (const auto& logger : options_.loggers()) {
    if (logger) logger->log_metrics(metrics, step);
  }
}

std::shared_ptr<Logger> FSDPStrategy::logger() const {
  return options_.loggers().empty() ? nullptr : options_.loggers().front();
}

namespace {

// Lightning's isinstance(module, FullyShardedDataParallel): the module itself is a unit.
bool is_wrapped_root(const std::shared_ptr<torch::nn::Module>& module) {
  return module && detail::unit_view_at(*module);
}

}  // namespace

at::Tensor FSDPStrategy::clip_gradients_norm(const std::shared_ptr<torch::nn::Module>& module, double max_norm,
                                             double norm_type) const {
  if (!is_wrapped_root(module)) {
    throw ConfigError("Gradient clipping with FSDP is only possible if the module passed to "
                      "`FSDPStrategy.clip_gradients_norm` is wrapped in `FullyShardedDataParallel`. Got: " +
                      (module ? module->name() : std::string("null")) + ".");
  }
  return clip_grad_norm_(module, max_norm, norm_type);
}

at::Tensor FSDPStrategy::clip_gradients_norm(const std::shared_ptr<torch::nn::Module>& module,
                                             torch::optim::Optimizer& optimizer, double max_norm,
                                             double norm_type) const {
  if (scaler_) scaler_->unscale_(optimizer);
  return clip_gradients_norm(module, max_norm, norm_type);
}

void FSDPStrategy::clip_gradients_value(torch::optim::Optimizer& optimizer, double clip_value) const {
  if (!(clip_value > 0)) {
    throw ConfigError("FSDPStrategy::clip_gradients_value: clip_value must be positive, got " +
                      std::to_string(clip_value));
  }
  if (scaler_) scaler_->unscale_(optimizer);
  at::NoGradGuard no_grad;
  for (auto& group : optimizer.param_groups()) {
    for (auto& p : group.params()) {
      if (p.grad().defined()) p.mutable_grad().clamp_(-clip_value, clip_value);
    }
  }
}

std::unique_ptr<NoSync> FSDPStrategy::no_backward_sync(const std::shared_ptr<torch::nn::Module>& module,
                                                       bool enabled) const {
  if (!enabled) return nullptr;  // Lightning: `if not enabled: yield; return`
  if (!is_wrapped_root(module)) {
    throw ConfigError("Blocking backward sync is only possible if the module passed to "
                      "`FSDPStrategy.no_backward_sync` is wrapped in `FullyShardedDataParallel`. Got: " +
                      (module ? module->name() : std::string("null")) + ".");
  }
  return std::make_unique<NoSync>(module);
}

void FSDPStrategy::save_checkpoint(const std::string& path, const CheckpointState& state,
                                   std::function<bool(const std::string&, const std::string&)> filter) const {
  require_group("save_checkpoint");
  fsdp::save_checkpoint(path, state, *group_, CheckpointOptions(options_.state_dict_type()).filter(std::move(filter)));
}

std::map<std::string, CheckpointValue> FSDPStrategy::load_checkpoint(const std::string& path, CheckpointState& state,
                                                                     bool strict) const {
  require_group("load_checkpoint");
  return fsdp::load_checkpoint(path, state, *group_, strict);
}

void FSDPStrategy::load_checkpoint(const std::string& path, const std::shared_ptr<torch::nn::Module>& module,
                                   bool strict) const {
  require_group("load_checkpoint");
  std::error_code ec;
  if (std::filesystem::is_directory(broadcast(path), ec)) {  // Lightning: rank 0's path for everyone
    throw ConfigError("Failed to load checkpoint directly into the model. The given path must be a single file "
                      "containing the full state dict: " + path);
  }
  fsdp::load_checkpoint(path, module, *group_, strict);
}

void FSDPStrategy::load_checkpoint(const std::string&, torch::optim::Optimizer&) const {
  throw ConfigError("Loading a single optimizer object from a checkpoint is not supported yet with the FSDP strategy.");
}

}  // namespace fsdp
