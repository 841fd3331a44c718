// Lightning Fabric's ModelParallelStrategy over fully_shard (FSDP2): the
// environment, collectives and checkpoints are FSDPStrategy's; the model is
// the user's parallelize_fn's.
#include "fsdp/strategy/model_parallel.h"

#include <torch/nn/module.h>

#include "fsdp/core/activation_checkpointing.h"
#include "fsdp/core/utils.h"
#include "fsdp/error.h"

namespace fsdp {

namespace {

FSDPStrategyOptions inner_options(const ModelParallelStrategyOptions& o) {
  FSDPStrategyOptions out;
  out.world(o.world()).seed(o.seed()).timeout(o.timeout()).process_group_backend(o.process_group_backend());
  out.state_dict_type(o.save_distributed_checkpoint() ? CheckpointFormat::kSharded : CheckpointFormat::kFull);
  return out;
}

FSDPModule root_of(const std::shared_ptr<torch::nn::Module>& module, const char* what) {
  auto root = module ? fsdp_module_of(*module) : std::nullopt;
  if (!root) {
    throw ConfigError(std::string("ModelParallelStrategy::") + what + ": the module " +
                      (module ? module->name() : std::string("null")) +
                      " is not sharded by fully_shard: pass the root that parallelize_fn sharded");
  }
  return *root;
}

// `options` once checked to have a fully_shard form (ConfigError naming what has none).
const FSDPStrategyOptions& fully_shardable(const FSDPStrategyOptions& options) {
  const char* what = "ModelParallelStrategy(FSDPStrategyOptions): ";
  if (!has_fully_shard_form(options.sharding_strategy())) {
    throw ConfigError(std::string(what) + "sharding_strategy " + to_string(options.sharding_strategy()) +
                      " has no fully_shard form: fully_shard always shards; expected FULL_SHARD, SHARD_GRAD_OP or "
                      "HYBRID_SHARD");
  }
  if (!has_fully_shard_form(parse_precision(options.precision()))) {
    throw ConfigError(std::string(what) + "precision " + options.precision() +
                      " has no fully_shard form here: expected 32-true or bf16-mixed (bfloat16 compute, float32 "
                      "reduction)");
  }
  if (options.mixed_precision()) {
    throw ConfigError(std::string(what) + "an explicit mixed_precision has no fully_shard form here: expected the "
                      "precision name (32-true or bf16-mixed)");
  }
  return options;
}

// fully_shard's options for FSDP1's `options` (all but the mesh, which
// setup_environment makes).
FullyShardOptions fully_shard_options(const FSDPStrategyOptions& options) {
  FullyShardOptions o;
  if (options.sharding_strategy() == ShardingStrategy::kShardGradOp) o.reshard_after_forward(false);
  if (parse_precision(options.precision()).name == "bf16-mixed") {
    MixedPrecisionPolicy mp;
    mp.param_dtype = at::kBFloat16;
    mp.reduce_dtype = at::kFloat;
    o.mp_policy(mp);
  }
  if (options.cpu_offload().offload_params) {
    OffloadPolicy offload;
    offload.offload_params = true;
    o.offload_policy(offload);
  }
  return o;
}

}  // namespace

bool has_fully_shard_form(ShardingStrategy strategy) { return strategy != ShardingStrategy::kNoShard; }

bool has_fully_shard_form(const PrecisionConfig& precision) {
  return precision.name == "32-true" || precision.name == "bf16-mixed";
}

ModelParallelStrategy::ModelParallelStrategy(FSDPStrategyOptions options)
    : inner_(fully_shardable(options)), fsdp_layout_(true) {
  const CheckpointCheck checkpointed =
      options.activation_checkpointing_policy() ? options.activation_checkpointing_policy()
                                                : options.activation_checkpointing();
  options_.save_distributed_checkpoint(options.state_dict_type() == CheckpointFormat::kSharded);
  options_.parallelize_fn([shard = fully_shard_options(options), policy = options.auto_wrap_policy(), checkpointed](
                              std::shared_ptr<torch::nn::Module> module, const Mesh& mesh) {
    FullyShardOptions o = shard;
    o.mesh(mesh);
    fully_shard_tree(module, o, policy);
    if (checkpointed) apply_activation_checkpointing(module, checkpointed);
    return module;
  });
}

ModelParallelStrategy::ModelParallelStrategy(ModelParallelStrategyOptions options)
    : options_(std::move(options)), inner_(inner_options(options_)) {
  if (!options_.parallelize_fn()) {
    throw ConfigError("ModelParallelStrategy: parallelize_fn is required (a function that applies fully_shard to "
                      "the model on the mesh and returns it)");
  }
  if (options_.tensor_parallel_size() != 1) {
    throw ConfigError("ModelParallelStrategy: tensor_parallel_size=" + std::to_string(options_.tensor_parallel_size()) +
                      ", but fsdp-cpp has no tensor parallelism: expected 1 (data parallelism with fully_shard only)");
  }
  if (options_.data_parallel_size() < 0) {
    throw ConfigError("ModelParallelStrategy: data_parallel_size=" + std::to_string(options_.data_parallel_size()) +
                      ": expected a positive size, or 0 for the whole world");
  }
}

void ModelParallelStrategy::setup_environment() {
  inner_.setup_environment();
  const int world = inner_.world_size();
  const int dp = options_.data_parallel_size() == 0 ? world : options_.data_parallel_size();
  if (dp * options_.tensor_parallel_size() != world) {
    throw ConfigError("The sizes `data_parallel_size=" + std::to_string(dp) + "` and `tensor_parallel_size=" +
                      std::to_string(options_.tensor_parallel_size()) +
                      "` multiplied should equal the world size (" + std::to_string(world) + ").");
  }
  if (fsdp_layout_) {
    mesh_ = fsdp1_mesh();
    return;
  }
  auto& g = inner_.group();
  mesh_ = Mesh::of(std::shared_ptr<dist::ProcessGroup>(&g, [](dist::ProcessGroup*) {}), "data_parallel");
}

Mesh ModelParallelStrategy::fsdp1_mesh() const {
  const FSDPOptions wrap = inner_.module_sharded_options();
  // FSDP1's layout: the options' device mesh, or HYBRID_SHARD's default of
  // sharding within a node (hybrid_shard_size) and replicating across nodes.
  std::optional<dist::DeviceMesh> mesh = wrap.device_mesh();
  const int world = wrap.process_group() ? wrap.process_group()->size() : 0;
  if (!mesh && inner_.sharding_strategy() == ShardingStrategy::kHybridShard && wrap.hybrid_shard_size() > 0 &&
      wrap.hybrid_shard_size() < world) {
    mesh = dist::init_device_mesh(wrap.process_group(), world / wrap.hybrid_shard_size(), wrap.hybrid_shard_size());
  }
  return mesh ? Mesh::hybrid(*mesh) : Mesh::of(wrap.process_group());
}

const Mesh& ModelParallelStrategy::device_mesh() const {
  if (!mesh_) {
    throw ConfigError("ModelParallelStrategy::device_mesh: Accessing the device mesh before processes have "
                      "initialized is not allowed (call setup_environment() first).");
  }
  return *mesh_;
}

std::shared_ptr<torch::nn::Module> ModelParallelStrategy::setup_module(std::shared_ptr<torch::nn::Module> module) {
  if (!module) throw ConfigError("ModelParallelStrategy::setup_module: the module is null");
  if (!fsdp_modules(module).empty()) {
    throw ConfigError("Found modules that are wrapped with `FullyShardedDataParallel`. The `ModelParallelStrategy` "
                      "only supports the FSDP2 API (fsdp::fully_shard).");
  }
  auto out = options_.parallelize_fn()(std::move(module), device_mesh());
  if (!out) throw ConfigError("The `parallelize_fn` must return a module, but got: null");
  models_.push_back(out);
  return out;
}

void ModelParallelStrategy::setup_optimizer(const torch::optim::Optimizer& optimizer) const {
  std::vector<std::shared_ptr<torch::nn::Module>> models;
  for (const auto& m : models_) {
    if (auto model = m.lock()) models.push_back(std::move(model));
  }
  check_optimizer(models, optimizer);
}

at::Tensor ModelParallelStrategy::clip_gradients_norm(const std::shared_ptr<torch::nn::Module>& module, double max_norm,
                                                      double norm_type) const {
  root_of(module, "clip_gradients_norm");  // ConfigError unless fully_shard sharded it
  return clip_grad_norm_(module, max_norm, norm_type);
}

at::Tensor ModelParallelStrategy::clip_gradients_norm(const std::shared_ptr<torch::nn::Module>& module,
                                                      torch::optim::Optimizer& /*optimizer*/, double max_norm,
                                                      double norm_type) const {
  return clip_gradients_norm(module, max_norm, norm_type);
}

ModelParallelStrategy::NoSync::NoSync(FSDPModule root) : root_(std::move(root)) {
  root_.set_requires_gradient_sync(false);
}

ModelParallelStrategy::NoSync::~NoSync() { root_.set_requires_gradient_sync(true); }

std::unique_ptr<ModelParallelStrategy::NoSync> ModelParallelStrategy::no_backward_sync(
    const std::shared_ptr<torch::nn::Module>& module, bool enabled) const {
  if (!enabled) return nullptr;
  return std::make_unique<NoSync>(root_of(module, "no_backward_sync"));
}

void ModelParallelStrategy::save_checkpoint(const std::string& path, const CheckpointState& state,
                                            std::function<bool(const std::string&, const std::string&)> filter) const {
  inner_.save_checkpoint(path, state, std::move(filter));
}

std::map<std::string, CheckpointValue> ModelParallelStrategy::load_checkpoint(const std::string& path,
                                                                             CheckpointState& state,
                                                                             bool strict) const {
  return inner_.load_checkpoint(path, state, strict);
}

}  // namespace fsdp
