#include "unit.h"

#include <ATen/ATen.h>

#include <chrono>
#include <set>
#include <string>

#include "fsdp/error.h"

namespace fsdp::detail {

const char* to_string(TrainingState s) {
  switch (s) {
    case TrainingState::kIdle: return "idle";
    case TrainingState::kForward: return "forward";
    case TrainingState::kPreBackward: return "pre-backward";
    case TrainingState::kPostBackward: return "post-backward";
    case TrainingState::kSummoned: return "summoned";
  }
  return "?";
}

UnitState::UnitState(torch::nn::Module* module, std::vector<ParamInfo> params, UnitConfig config)
    : module_(module),
      config_(std::move(config)),
      handle_(module->name(), std::move(params), config_.shard_group, config_.param_dtype, config_.use_orig_params) {
  for (const auto& p : handle_.params()) {
    if (p.requires_grad) ++grads_expected_;
  }
  accumulators_.resize(handle_.params().size());
  saved_grads_.resize(handle_.params().size());
}

UnitState::~UnitState() = default;

void UnitState::transition(std::initializer_list<TrainingState> from, TrainingState to) {
  for (TrainingState f : from) {
    if (state_ == f) {
      state_ = to;
      return;
    }
  }
  throw Error(std::string("FSDP internal error: the unit at module ") + module_->name() + " cannot go from " +
              to_string(state_) + " to " + to_string(to));
}

int UnitState::units_unsharded() const { return shared_ ? shared_->units_unsharded() : 0; }

bool UnitState::holds_full_params() const {
  return !handle_.aliased() && (handle_.unsharded() || handle_.gathering());
}

bool UnitState::start_unshard() {
  if (handle_.unsharded() || handle_.gathering()) return false;
  follow_module_to();
  {
    ScopedSpan span("all_gather.issue", path_);
    if (!handle_.start_unshard()) return false;
  }
  if (!shared_) return true;
  RuntimeStats& st = shared_->stats;
  ++st.all_gathers;
  st.all_gather_bytes += handle_.padded_numel() * static_cast<int64_t>(c10::elementSize(compute_dtype()));
  st.peak_all_gathers_in_flight = std::max(st.peak_all_gathers_in_flight, ++st.all_gathers_in_flight);
  st.peak_units_unsharded = std::max(st.peak_units_unsharded, units_unsharded());
  return true;
}

void UnitState::finish_unshard() {
  if (!handle_.gathering() || !shared_) {
    handle_.finish_unshard();
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  {
    ScopedSpan span("all_gather.wait", path_);
    handle_.finish_unshard();
  }
  RuntimeStats& st = shared_->stats;
  st.all_gather_wait_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  --st.all_gathers_in_flight;
}

void UnitState::unshard() {
  if (handle_.unsharded()) return;
  start_unshard();
  finish_unshard();
}

void UnitState::reshard() {
  if (handle_.gathering()) finish_unshard();  // the backend is still writing into the full buffer
  handle_.reshard();
}

std::shared_ptr<UnitState> UnitState::neighbour(int step) const {
  if (root_.expired()) return nullptr;
  const auto& order = shared_->last_order;
  for (size_t i = 0; i < order.size(); ++i) {
    if (order[i].lock().get() != this) continue;
    const long j = static_cast<long>(i) + step;
    if (j < 0 || j >= static_cast<long>(order.size())) return nullptr;
    // Every unit of a UnitState's root is a UnitState.
    return std::static_pointer_cast<UnitState>(order[static_cast<size_t>(j)].lock());
  }
  return nullptr;
}

void UnitState::prefetch(int step) {
  auto next = neighbour(step);
  if (!next || next.get() == this || next->handle_.unsharded() || next->handle_.gathering()) return;
  if (config_.limit_all_gathers && units_unsharded() >= 2) return;
  ScopedSpan span("prefetch", next->path_);
  if (next->start_unshard() && shared_) ++shared_->stats.prefetches;
}

void UnitState::follow_module_to() {
  if (state_ == TrainingState::kSummoned || state_ == TrainingState::kPreBackward) return;
  handle_.follow_module_to(module_->name());
}

const std::vector<std::pair<at::Tensor, at::ScalarType>>& UnitState::cast_buffers() const {
  static const std::vector<std::pair<at::Tensor, at::ScalarType>> none;
  return root_.expired() ? none : shared_->cast_buffers;
}

const std::vector<std::weak_ptr<RootMember>>& UnitState::forward_order() const {
  static const std::vector<std::weak_ptr<RootMember>> none;
  return shared_ ? shared_->order : none;
}

bool UnitState::awaiting_backward() const {
  return state_ == TrainingState::kPreBackward || (!root_.expired() && shared_->awaiting_backward);
}

int UnitState::world_rank() const {
  const int rank = config_.shard_group ? config_.shard_group->rank() : 0;
  return config_.replicate_group ? config_.replicate_group->rank() * shard_size() + rank : rank;
}

at::Tensor UnitState::gather_master() const { return handle_.gather_master(); }

void UnitState::lazy_init_root() {
  is_root_ = true;
  root_ = weak_from_this();
  shared_ = std::make_shared<RootState>(weak_from_this(), *module_, config_.buffer_dtype);
  std::vector<const torch::nn::Module*> seen;
  for (const auto& item : module_->named_modules("", /*include_self=*/true)) {
    const auto& m = item.value();
    if (std::find(seen.begin(), seen.end(), m.get()) != seen.end()) continue;
    seen.push_back(m.get());
    auto slot = find_slot(m.get());
    auto unit = slot ? unit_of(*slot) : nullptr;
    if (!unit) continue;
    shared_->tree.push_back(unit);
    UnitState& u = *unit;
    u.path_ = item.key().empty() ? "(root)" : item.key();
    u.shared_ = shared_;
    u.handle_.set_pool(shared_->pool);
    if (&u != this) {
      u.is_root_ = false;
      u.root_ = weak_from_this();
    }
  }
}

void UnitState::begin_forward() {
  if (state_ == TrainingState::kSummoned) {
    throw ConfigError("FSDP: forward of the unit at module " + module_->name() +
                      " inside summon_full_params: leave the SummonFullParams scope first");
  }
  // The first unit whose forward runs with no unit around it is the root. A
  // unit re-run in backward (activation checkpointing) already has one.
  if (!is_root_ && root_.expired()) {
    auto outer = outer_.lock();
    if (outer && outer->forward_depth() == 0 && outer->root_.expired()) {
      // Before this check: LibTorch's "weight should have at least three
      // dimensions" (or another shape error) from the outer module's own
      // layers, which ran on their 1-D shards.
      throw ConfigError("FSDP: the unit at module " + module_->name() +
                        " ran its forward before the FSDP-wrapped module that holds it (module " +
                        outer->module_->name() +
                        ") ran its own: call the wrapped model through its holder, as model(x) or "
                        "model.forward(x), not model->forward(x), which runs the module's code on the shards of "
                        "its parameters (LibTorch then fails with errors such as \"weight should have at least "
                        "three dimensions\"); see docs/porting.md");
    }
    lazy_init_root();
  }
  if (!root_.expired()) {
    if (is_root_ && shared_->forward_depth == 0) shared_->begin_iteration();  // a new iteration
    shared_->order.push_back(weak_from_this());
  }
  // A forward re-run by activation checkpointing inside the unit's backward
  // keeps the backward state (and its full parameters).
  if (state_ != TrainingState::kPreBackward) transition({TrainingState::kIdle}, TrainingState::kForward);
  forward_span_.begin("forward", path_);
  unshard();
  if (config_.forward_prefetch) prefetch(+1);
}

void UnitState::end_forward(const std::vector<at::Tensor>& outputs) {
  forward_span_.end();
  if (state_ == TrainingState::kPreBackward) {  // a re-run inside this unit's own backward
    if (at::GradMode::is_enabled()) hook_accumulators();
    return;
  }
  transition({TrainingState::kForward}, TrainingState::kIdle);
  // A backward follows through this unit when it has parameters to train, or
  // when gradients flow through its outputs to what ran before it: a frozen
  // unit after trainable layers still differentiates its ops with respect to
  // their inputs, and those (a convolution's or a linear's input gradient)
  // read the full weights. PyTorch FSDP1 likewise hooks the pre-backward
  // unshard on the outputs of every unit in grad mode
  // (_register_pre_backward_hooks). A frozen unit has no gradient whose
  // arrival ends its backward: it reshards at the end of the backward
  // (finish_backward). (FSDP1 reshards it earlier, from a hook on the
  // gradients of its inputs: _register_post_backward_reshard_only_hook.)
  // Before this, a
  // frozen unit resharded here and its backward ran on 1-D shards ("weight
  // should have at least three dimensions") or freed storage (SIGSEGV).
  bool outputs_need_grad = false;
  for (const auto& t : outputs) outputs_need_grad |= t.defined() && t.requires_grad();
  const bool grad_mode = at::GradMode::is_enabled() && (grads_expected_ > 0 || outputs_need_grad);
  bool hooked = false;
  if (grad_mode) {
    if (!root_.expired()) shared_->awaiting_backward = true;
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
    if (is_root_) shared_->reshard_tree();  // nor does any unit's: drop what was prefetched
    return;
  }
  if (!hooked) {
    // Outputs we cannot see: no pre-backward hook, so keep the full
    // parameters and prepare the gradient buffer now.
    pre_backward();
    return;
  }
  const auto s = config_.strategy;
  if (s == ShardingStrategy::kFullShard || s == ShardingStrategy::kHybridShard) reshard();
}

void UnitState::undo_forward() {
  forward_span_.end();
  if (state_ == TrainingState::kForward) {
    state_ = TrainingState::kIdle;
    reshard();
  }
}

void UnitState::summon(const SummonOptions& o) {
  if (state_ == TrainingState::kSummoned) {
    throw ConfigError("FSDP: summon_full_params inside summon_full_params of the same unit");
  }
  if (state_ == TrainingState::kPreBackward || state_ == TrainingState::kPostBackward) {
    throw ConfigError("FSDP: summon_full_params during backward");
  }
  follow_module_to();
  summon_was_unsharded_ = handle_.unsharded();
  transition({TrainingState::kIdle}, TrainingState::kSummoned);
  const bool keep = !o.rank0_only || world_rank() == 0;
  if (handle_.aliased()) {  // whole parameters, used in place (offload_to_cpu too: they are on CPU)
    if (!o.writeback) summon_snapshot_ = handle_.flat_shard().clone();
    handle_.register_original_params(*module_);
    return;
  }
  // Full parameters in the master dtype (so that writeback loses nothing
  // under mixed precision), in a buffer of their own.
  at::Tensor full = gather_master();
  if (!keep) return;
  summon_full_ = full;
  for (auto& p : handle_.params()) p.param.set_data(param_view(full, p));
  handle_.register_original_params(*module_);
}

void UnitState::unsummon(const SummonOptions& o) {
  if (state_ != TrainingState::kSummoned) return;
  state_ = TrainingState::kIdle;
  at::NoGradGuard no_grad;
  if (handle_.aliased() || summon_full_.defined()) handle_.register_flat_param(*module_);
  if (handle_.aliased()) {
    if (summon_snapshot_.defined()) handle_.flat_shard().copy_(summon_snapshot_);
    summon_snapshot_ = at::Tensor();
    return;
  }
  if (summon_full_.defined() && o.writeback) {
    handle_.flat_shard().copy_(summon_full_.narrow(0, shard_begin(), shard_numel()));
  }
  summon_full_ = at::Tensor();
  if (summon_was_unsharded_) {
    // Back to the compute-dtype full parameters the forward was using; refresh
    // them if the shard changed.
    handle_.reshard();
    unshard();
  } else {
    handle_.set_sharded_data();
  }
}

// ---------------------------------------------------------------------------

std::shared_ptr<UnitState> unit_of(const Slot& slot) { return std::dynamic_pointer_cast<UnitState>(slot.engine); }

// The engines are two: an engine that is not FSDP1's unit is fully_shard's hooks.
bool is_fully_shard(const Slot& slot) { return slot.engine && !unit_of(slot); }

void UnitState::explain_forward_error(const std::string& what) {
  std::set<const RootMember*> ran;
  if (auto root = this->root()) {
    for (const auto& w : root->forward_order()) {
      if (auto u = w.lock()) ran.insert(u.get());
    }
  }
  std::string names;
  for (const auto& item : module_->named_modules("", /*include_self=*/false)) {
    auto slot = find_slot(item.value().get());
    auto unit = slot ? unit_of(*slot) : nullptr;
    if (!unit) continue;
    const UnitState& u = *unit;
    if (ran.count(&u) || u.is_unsharded() || u.training_state() != TrainingState::kIdle) continue;
    names += (names.empty() ? "'" : ", '") + item.key() + "'";
  }
  if (names.empty()) return;
  throw ConfigError("FSDP: the forward of the unit at module " + module_->name() +
                    " failed while FSDP unit(s) " + names +
                    " below it held only their shards (their forward had not run through their holder). If the "
                    "model calls such a unit's module directly, as unit->forward(x), call unit(x) instead: the "
                    "fsdp::Unit holder gathers the parameters first. LibTorch's error: " + what);
}

void UnitState::enter_forward() {
  depth_counter_ = shared_;
  if (depth_counter_) ++depth_counter_->forward_depth;
}

void UnitState::leave_forward() {
  if (depth_counter_) --depth_counter_->forward_depth;
  depth_counter_.reset();
}

void UnitState::pre_forward(std::vector<at::Tensor>& inputs) {
  begin_forward();
  enter_forward();
  if (!config_.param_dtype) return;
  try {  // the floating-point inputs in the compute dtype
    for (auto& t : inputs) {
      if (t.defined() && at::isFloatingType(t.scalar_type()) && t.scalar_type() != compute_dtype()) {
        t = t.to(compute_dtype());
      }
    }
  } catch (...) {
    forward_failed();
    throw;
  }
}

void UnitState::post_forward(std::vector<at::Tensor>& outputs) {
  leave_forward();
  end_forward(outputs);
}

void UnitState::forward_failed() noexcept {
  leave_forward();
  try {
    undo_forward();
  } catch (...) {  // already unwinding the forward's error
  }
}

std::vector<std::shared_ptr<UnitView>> unit_views_of(const std::shared_ptr<torch::nn::Module>& model) {
  auto units = units_of(model);
  return std::vector<std::shared_ptr<UnitView>>(units.begin(), units.end());
}

std::shared_ptr<UnitView> unit_view_at(const torch::nn::Module& module) {
  auto slot = find_slot(&module);
  return slot ? unit_of(*slot) : nullptr;
}

}  // namespace fsdp::detail
