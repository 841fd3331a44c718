#include "unit.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <c10/util/strides.h>

#include "fsdp/error.h"

namespace fsdp::detail {

namespace {

// How many unit forwards are running on this thread (0 at the root's forward: a new iteration).
thread_local int tl_forward_depth = 0;

// Runs after autograd accumulated a parameter's gradient.
class GradReadyHook : public torch::autograd::FunctionPostHook {
 public:
  explicit GradReadyHook(std::weak_ptr<UnitState> unit) : unit_(std::move(unit)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    if (auto u = unit_.lock()) u->on_grad_ready();
    return outputs;
  }

 private:
  std::weak_ptr<UnitState> unit_;
};

c10::StorageImpl* storage_of(const at::Tensor& t) { return t.storage().unsafeGetStorageImpl(); }

// A tensor on `flat`'s storage at `offset` with `sizes`, contiguous, that
// autograd does not consider a view (optimizers detach_() gradients, which
// views refuse).
at::Tensor storage_view(const at::Tensor& flat, int64_t offset, at::IntArrayRef sizes) {
  at::Tensor t = at::empty({0}, flat.options());
  t.set_(flat.storage(), flat.storage_offset() + offset, sizes, c10::contiguous_strides(sizes));
  return t;
}

}  // namespace

UnitState::UnitState(torch::nn::Module* module, std::vector<ParamInfo> params, UnitConfig config)
    : module_(module), params_(std::move(params)), config_(std::move(config)) {
  if (config_.shard_group) {
    shard_size_ = config_.shard_group->size();
    shard_rank_ = config_.shard_group->rank();
  }
  at::TensorOptions options = at::TensorOptions().dtype(at::kFloat);
  if (!params_.empty()) options = params_[0].param.options().requires_grad(false);
  for (auto& p : params_) {
    if (p.param.scalar_type() != options.dtype().toScalarType() || p.param.device() != options.device()) {
      throw ConfigError("FSDP: parameter '" + p.name + "' is " + std::string(c10::toString(p.param.scalar_type())) +
                        " on " + p.param.device().str() + ", but '" + params_[0].name + "' of the same unit is " +
                        std::string(c10::toString(options.dtype().toScalarType())) + " on " +
                        options.device().str() + ": a unit's parameters must share dtype and device");
    }
    p.offset = numel_;
    p.numel = p.param.numel();
    p.shape = p.param.sizes().vec();
    p.requires_grad = p.param.requires_grad();
    numel_ += p.numel;
    if (p.requires_grad) ++grads_expected_;
  }
  shard_numel_ = (numel_ + shard_size_ - 1) / shard_size_;
  padded_numel_ = shard_numel_ * shard_size_;

  compute_dtype_ = config_.param_dtype.value_or(options.dtype().toScalarType());
  aliased_ = shard_size_ == 1 && compute_dtype_ == options.dtype().toScalarType();

  at::NoGradGuard no_grad;
  at::Tensor flat = at::zeros({padded_numel_}, options);
  for (auto& p : params_) flat.narrow(0, p.offset, p.numel).copy_(p.param.detach().reshape({-1}));
  if (aliased_) {
    // Nothing to gather or cast: the full parameter is the shard, always materialised.
    flat_shard_ = flat;
    full_ = flat;
    for (auto& p : params_) p.param.set_data(sharded_view(full_, p));
    unsharded_ = true;
  } else {
    flat_shard_ = shard_size_ == 1 ? flat : flat.narrow(0, shard_begin(), shard_numel_).clone();
    full_ = at::empty({padded_numel_}, options.dtype(compute_dtype_));
    unsharded_ = true;
    reshard();
  }
  shard_options_ = flat_shard_.options();
  accumulators_.resize(params_.size());
}

UnitState::~UnitState() = default;

at::Tensor UnitState::sharded_view(const at::Tensor& flat, const ParamInfo& p) const {
  if (shard_size_ == 1) return storage_view(flat, p.offset, p.shape);
  const int64_t lo = std::max(p.offset, shard_begin());
  const int64_t hi = std::min(p.offset + p.numel, shard_begin() + shard_numel_);
  if (hi <= lo) return storage_view(flat, 0, {0});
  return storage_view(flat, lo - shard_begin(), {hi - lo});
}

void UnitState::alloc_full() {
  c10::StorageImpl* st = storage_of(full_);
  const size_t bytes = static_cast<size_t>(padded_numel_) * full_.element_size();
  if (st->nbytes() >= bytes) return;
  st->set_data_ptr_noswap(st->allocator()->allocate(bytes));
  st->set_nbytes(bytes);
}

void UnitState::free_full() {
  c10::StorageImpl* st = storage_of(full_);
  st->set_data_ptr_noswap(c10::DataPtr(nullptr, full_.device()));
  st->set_nbytes(0);
}

void UnitState::start_unshard() {
  if (unsharded_ || gathering_) return;
  follow_module_to();
  alloc_full();
  at::NoGradGuard no_grad;
  if (shard_size_ == 1) {
    full_.copy_(flat_shard_);  // cast only
    return;
  }
  if (padded_numel_ == 0) return;  // a unit without parameters: nothing to gather (on every rank alike)
  pending_input_ = flat_shard_.scalar_type() == compute_dtype_ ? flat_shard_ : flat_shard_.to(compute_dtype_);
  pending_gather_ = config_.shard_group->all_gather(full_, pending_input_);
  gathering_ = true;
}

void UnitState::finish_unshard() {
  if (gathering_) {
    gathering_ = false;
    dist::Work work = std::move(pending_gather_);
    pending_input_ = at::Tensor();
    work.wait();
  }
  if (unsharded_) return;
  for (auto& p : params_) p.param.set_data(param_view(full_, p));
  unsharded_ = true;
}

void UnitState::unshard() {
  if (unsharded_) return;
  start_unshard();
  finish_unshard();
}

std::shared_ptr<UnitState> UnitState::neighbour(int step) const {
  auto root = root_.lock();
  if (!root) return nullptr;
  const auto& order = root->last_order_;
  for (size_t i = 0; i < order.size(); ++i) {
    if (order[i].lock().get() != this) continue;
    const long j = static_cast<long>(i) + step;
    if (j < 0 || j >= static_cast<long>(order.size())) return nullptr;
    return order[static_cast<size_t>(j)].lock();
  }
  return nullptr;
}

void UnitState::prefetch(int step) {
  auto next = neighbour(step);
  if (!next || next.get() == this || next->unsharded_ || next->gathering_) return;
  if (config_.limit_all_gathers) {
    auto root = root_.lock();
    int live = 0;
    for (auto& weak : root->tree_) {
      auto u = weak.lock();
      if (u && u != root && !u->aliased_ && (u->unsharded_ || u->gathering_)) ++live;
    }
    if (live >= 2) return;
  }
  next->start_unshard();
}

void UnitState::set_sharded_data() {
  for (auto& p : params_) {
    if (config_.use_orig_params || aliased_) {
      p.param.set_data(sharded_view(flat_shard_, p));
    } else {
      p.param.set_data(at::empty({0}, flat_shard_.options()));
    }
  }
}

void UnitState::reshard() {
  if (gathering_) finish_unshard();  // the backend is still writing into full_
  if (!unsharded_ || aliased_) return;
  set_sharded_data();
  free_full();
  unsharded_ = false;
}

void UnitState::follow_module_to() {
  if (summoned_ || gathering_ || in_backward_) return;
  at::NoGradGuard no_grad;
  if (config_.use_orig_params) {
    // Module::to() gave each original parameter data of its own.
    const at::Tensor& home = unsharded_ && !aliased_ ? full_ : flat_shard_;
    std::optional<at::TensorOptions> moved;
    for (const auto& p : params_) {
      if (p.param.is_alias_of(home)) continue;
      if (moved && (moved->dtype() != p.param.dtype() || moved->device() != p.param.device())) {
        throw ConfigError("FSDP: the parameters of the unit at module " + module_->name() +
                          " were moved to different dtypes or devices; expected one dtype and device per unit");
      }
      moved = p.param.options();
    }
    if (!moved) return;
    if (unsharded_ && !aliased_) {
      throw ConfigError("FSDP: Module::to() on the unit at module " + module_->name() +
                        " while its full parameters are in use (between forward and backward)");
    }
    at::Tensor shard = at::zeros({shard_numel_}, moved->requires_grad(false));
    for (const auto& p : params_) {
      at::Tensor dst = sharded_view(shard, p);
      if (!p.param.is_alias_of(home)) {
        dst.copy_(p.param.reshape(dst.sizes()));
      } else {
        dst.copy_(sharded_view(flat_shard_, p));
      }
    }
    flat_shard_ = shard;
  } else if (flat_shard_.dtype() == shard_options_.dtype() && flat_shard_.device() == shard_options_.device()) {
    return;
  }
  // The flat parameter (a TensorImpl the optimizer references) has new data.
  shard_options_ = flat_shard_.options();
  compute_dtype_ = config_.param_dtype.value_or(flat_shard_.scalar_type());
  aliased_ = shard_size_ == 1 && compute_dtype_ == flat_shard_.scalar_type();
  if (aliased_) {
    full_ = flat_shard_;
    set_sharded_data();
    unsharded_ = true;
  } else {
    full_ = at::empty({padded_numel_}, shard_options_.dtype(compute_dtype_).requires_grad(false));
    free_full();
    set_sharded_data();
    unsharded_ = false;
  }
}

bool UnitState::awaiting_backward() const {
  auto root = root_.lock();
  return in_backward_ || (root && root->awaiting_backward_);
}

int UnitState::world_rank() const {
  const int rank = config_.shard_group ? config_.shard_group->rank() : 0;
  return config_.replicate_group ? config_.replicate_group->rank() * shard_size_ + rank : rank;
}

void UnitState::register_original_params() {
  if (config_.use_orig_params || params_.empty()) return;
  parameters_of(*module_).erase("flat_param");
  for (const auto& p : params_) {
    for (const auto& [owner, key] : p.places) parameters_of(*owner).insert(key, p.param);
  }
}

void UnitState::register_flat_param() {
  if (config_.use_orig_params || params_.empty()) return;
  for (const auto& p : params_) {
    for (const auto& [owner, key] : p.places) parameters_of(*owner).erase(key);
  }
  parameters_of(*module_).insert("flat_param", flat_shard_);
}

at::Tensor UnitState::gather_master() const {
  at::NoGradGuard no_grad;
  if (shard_size_ == 1 || padded_numel_ == 0) return flat_shard_.clone();
  at::Tensor full = at::empty({padded_numel_}, flat_shard_.options().requires_grad(false));
  config_.shard_group->all_gather_unbuffered(full, flat_shard_.detach());  // one unit of memory, not two
  return full;
}

void UnitState::lazy_init_root() {
  if (config_.buffer_dtype) {
    at::NoGradGuard no_grad;
    for (auto& b : module_->buffers(/*recurse=*/true)) {
      if (at::isFloatingType(b.scalar_type()) && b.scalar_type() != *config_.buffer_dtype) {
        cast_buffers_.emplace_back(b, b.scalar_type());
        b.set_data(b.to(*config_.buffer_dtype));
      }
    }
  }
  is_root_ = true;
  root_ = weak_from_this();
  tree_.clear();
  std::vector<const torch::nn::Module*> seen;
  for (const auto& m : module_->modules(/*include_self=*/true)) {
    if (std::find(seen.begin(), seen.end(), m.get()) != seen.end()) continue;
    seen.push_back(m.get());
    auto slot = find_slot(m.get());
    if (!slot || !slot->unit) continue;
    tree_.push_back(slot->unit);
    if (slot->unit.get() != this) {
      slot->unit->is_root_ = false;
      slot->unit->root_ = weak_from_this();
      slot->unit->tree_.clear();
    }
  }
}

void UnitState::pre_forward() {
  if (summoned_) {
    throw ConfigError("FSDP: forward of the unit at module " + module_->name() +
                      " inside summon_full_params: leave the SummonFullParams scope first");
  }
  // The first unit whose forward runs with no unit around it is the root. A
  // unit re-run in backward (activation checkpointing) already has one.
  if (!is_root_ && root_.expired()) lazy_init_root();
  if (auto root = root_.lock()) {
    if (is_root_ && tl_forward_depth == 0) {  // a new iteration: keep the last order for prefetching
      if (!root->order_.empty()) root->last_order_ = std::move(root->order_);
      root->order_.clear();
      root->awaiting_backward_ = false;
    }
    root->order_.push_back(weak_from_this());
  }
  unshard();
  if (config_.forward_prefetch) prefetch(+1);
}

void UnitState::hook_accumulators() {
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!params_[i].requires_grad) continue;
    auto acc = torch::autograd::impl::grad_accumulator(params_[i].param);
    if (acc && acc != accumulators_[i]) {
      acc->add_post_hook(std::make_unique<GradReadyHook>(weak_from_this()));
      accumulators_[i] = acc;  // held, so that the hook stays on the node the next forwards use
    }
  }
}

void UnitState::post_forward(const std::vector<at::Tensor>& outputs) {
  const bool grad_mode = at::GradMode::is_enabled() && grads_expected_ > 0;
  bool hooked = false;
  if (grad_mode) {
    if (auto root = root_.lock()) root->awaiting_backward_ = true;
    hook_accumulators();
    std::weak_ptr<UnitState> weak = weak_from_this();
    for (const auto& t : outputs) {
      if (t.defined() && t.requires_grad()) {
        t.register_hook([weak](const at::Tensor&) {
          if (auto u = weak.lock()) u->pre_backward();
        });
        hooked = true;
      }
    }
  }
  if (!grad_mode) {
    reshard();  // no backward follows
    if (is_root_) {  // nor does any unit's: drop what was prefetched
      for (auto& weak : tree_) {
        if (auto u = weak.lock()) u->reshard();
      }
    }
    return;
  }
  if (!hooked) {
    // Outputs we cannot see: no pre-backward hook, so keep the full
    // parameters and prepare the gradient buffer now.
    pre_backward();
    return;
  }
  if (in_backward_) return;  // a re-run inside this unit's own backward
  const auto s = config_.strategy;
  if (s == ShardingStrategy::kFullShard || s == ShardingStrategy::kHybridShard) reshard();
}

void UnitState::forward_failed() {
  if (!in_backward_) reshard();
}

void UnitState::pre_backward() {
  if (in_backward_) return;
  in_backward_ = true;
  auto root = root_.lock();
  if (!root) root = shared_from_this();
  if (!root->callback_queued_) {
    root->callback_queued_ = true;
    std::weak_ptr<UnitState> weak_root = root;
    torch::autograd::Engine::get_default_engine().queue_callback([weak_root] {
      if (auto r = weak_root.lock()) r->finish_backward();
    });
  }
  unshard();
  if (config_.backward_prefetch == BackwardPrefetch::kBackwardPre) prefetch(-1);
  grads_ready_ = 0;
  if (grads_expected_ == 0) return;
  // A forward re-run in backward (activation checkpointing) builds its graph
  // on the parameters' current accumulators: make sure they are hooked.
  hook_accumulators();
  if (full_grad_.defined()) return;  // accumulated under no_sync: keep adding to it
  full_grad_ = at::zeros({padded_numel_}, full_.options());
  for (auto& p : params_) {
    if (!p.requires_grad) continue;
    p.saved_grad = p.param.grad();
    p.param.mutable_grad() = param_view(full_grad_, p);
  }
}

void UnitState::on_grad_ready() {
  if (!in_backward_) return;
  if (++grads_ready_ == grads_expected_) post_backward();
}

void UnitState::post_backward() {
  if (!in_backward_) return;
  in_backward_ = false;
  if (config_.backward_prefetch == BackwardPrefetch::kBackwardPost) prefetch(-1);
  if (grads_expected_ == 0) {
    reshard();
    return;
  }
  at::NoGradGuard no_grad;
  for (auto& p : params_) {
    if (!p.requires_grad) continue;
    const at::Tensor& g = p.param.grad();
    at::Tensor slot = full_grad_.narrow(0, p.offset, p.numel);
    // Autograd accumulates into our view; if something replaced it, copy.
    if (g.defined() && g.data_ptr() != slot.data_ptr()) slot.copy_(g.reshape({-1}));
  }
  if (no_sync_) {  // keep the full gradient; the next synced backward reduces it
    reshard();
    return;
  }
  const at::ScalarType reduce_dtype = config_.reduce_dtype.value_or(compute_dtype_);
  at::Tensor to_reduce = full_grad_.scalar_type() == reduce_dtype ? full_grad_ : full_grad_.to(reduce_dtype);
  at::Tensor shard_grad;
  if (shard_size_ > 1) {
    shard_grad = at::empty({shard_numel_}, to_reduce.options());
    config_.shard_group->reduce_scatter(shard_grad, to_reduce, dist::ReduceOp::kAvg).wait();
  } else {
    shard_grad = to_reduce;
  }
  if (config_.replicate_group && config_.replicate_group->size() > 1) {
    config_.replicate_group->all_reduce(shard_grad, dist::ReduceOp::kAvg).wait();
  }
  full_grad_ = at::Tensor();
  // The optimizer steps the master shard, in its own dtype.
  if (shard_grad.scalar_type() != flat_shard_.scalar_type()) shard_grad = shard_grad.to(flat_shard_.scalar_type());
  if (config_.use_orig_params) {
    for (auto& p : params_) {
      if (!p.requires_grad) continue;
      at::Tensor g = sharded_view(shard_grad, p);
      if (p.saved_grad.defined() && p.saved_grad.numel() == g.numel()) g.add_(p.saved_grad.reshape(g.sizes()));
      p.param.mutable_grad() = g;
      p.saved_grad = at::Tensor();
    }
  } else {
    for (auto& p : params_) {
      p.param.mutable_grad() = at::Tensor();
      p.saved_grad = at::Tensor();
    }
    at::Tensor& fg = flat_shard_.mutable_grad();
    if (fg.defined()) {
      fg.add_(shard_grad);
    } else {
      fg = shard_grad;
    }
  }
  reshard();
}

void UnitState::finish_backward() {
  callback_queued_ = false;
  awaiting_backward_ = false;
  for (auto& weak : tree_) {
    auto u = weak.lock();
    if (!u) continue;
    if (u->in_backward_) {
      u->post_backward();
    } else {
      u->reshard();
    }
  }
  if (tree_.empty()) {  // a root that never ran lazy init (cannot happen) or a lone unit
    if (in_backward_) post_backward();
  }
}

void UnitState::summon(const SummonOptions& o) {
  if (summoned_) throw ConfigError("FSDP: summon_full_params inside summon_full_params of the same unit");
  if (in_backward_) throw ConfigError("FSDP: summon_full_params during backward");
  follow_module_to();
  summon_was_unsharded_ = unsharded_;
  summoned_ = true;
  const bool keep = !o.rank0_only || world_rank() == 0;
  if (aliased_) {  // whole parameters, used in place (offload_to_cpu too: they are on CPU)
    if (!o.writeback) summon_snapshot_ = flat_shard_.clone();
    register_original_params();
    return;
  }
  // Full parameters in the master dtype (so that writeback loses nothing
  // under mixed precision), in a buffer of their own.
  at::Tensor full = gather_master();
  if (!keep) return;
  summon_full_ = full;
  for (auto& p : params_) p.param.set_data(param_view(full, p));
  register_original_params();
}

void UnitState::unsummon(const SummonOptions& o) {
  if (!summoned_) return;
  summoned_ = false;
  at::NoGradGuard no_grad;
  if (aliased_ || summon_full_.defined()) register_flat_param();
  if (aliased_) {
    if (summon_snapshot_.defined()) flat_shard_.copy_(summon_snapshot_);
    summon_snapshot_ = at::Tensor();
    return;
  }
  if (summon_full_.defined() && o.writeback) flat_shard_.copy_(summon_full_.narrow(0, shard_begin(), shard_numel_));
  summon_full_ = at::Tensor();
  if (summon_was_unsharded_) {
    // Back to the compute-dtype full parameters the forward was using; refresh
    // them if the shard changed.
    unsharded_ = false;
    unshard();
  } else {
    set_sharded_data();
  }
}

std::vector<at::Tensor> UnitState::sharded_grads() const {
  std::vector<at::Tensor> out;
  if (config_.use_orig_params) {
    for (const auto& p : params_) {
      if (p.param.grad().defined()) out.push_back(p.param.grad());
    }
  } else if (flat_shard_.grad().defined()) {
    out.push_back(flat_shard_.grad());
  }
  return out;
}

int64_t UnitState::live_full_param_bytes() const {
  if (aliased_) return 0;
  return static_cast<int64_t>(storage_of(full_)->nbytes());
}

int64_t UnitState::live_grad_bytes() const {
  int64_t bytes = full_grad_.defined() ? full_grad_.numel() * full_grad_.element_size() : 0;
  if (config_.use_orig_params) {
    for (const auto& p : params_) {
      const auto& g = p.param.grad();
      if (g.defined() && !full_grad_.defined()) bytes += g.numel() * g.element_size();
    }
  } else if (flat_shard_.grad().defined()) {
    bytes += flat_shard_.grad().numel() * flat_shard_.grad().element_size();
  }
  return bytes;
}

// ---------------------------------------------------------------------------

ForwardScope::ForwardScope(UnitState& unit) : unit_(unit) {
  unit_.pre_forward();
  ++tl_forward_depth;
}

ForwardScope::~ForwardScope() {
  if (!finished_) {
    --tl_forward_depth;
    unit_.forward_failed();
  }
}

at::Tensor ForwardScope::cast_tensor(const at::Tensor& t) const {
  if (!unit_.config().param_dtype || !t.defined() || !at::isFloatingType(t.scalar_type()) ||
      t.scalar_type() == unit_.compute_dtype()) {
    return t;
  }
  return t.to(unit_.compute_dtype());
}

void ForwardScope::finish(const std::vector<at::Tensor>& outputs) {
  finished_ = true;
  --tl_forward_depth;
  unit_.post_forward(outputs);
}

}  // namespace fsdp::detail
