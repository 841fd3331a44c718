#include "unit.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <chrono>
#include <set>
#include <string>

#include "buffer_pool.h"
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

}  // namespace

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

int UnitState::units_unsharded() const {
  auto root = root_.lock();
  if (!root) return 0;
  int live = 0;
  for (auto& weak : shared_->tree) {
    auto u = weak.lock();
    if (u && u != root && !u->handle_.aliased() && (u->handle_.unsharded() || u->handle_.gathering())) ++live;
  }
  return live;
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
    return order[static_cast<size_t>(j)].lock();
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
  return shared_ ? shared_->cast_buffers : none;
}

const std::vector<std::weak_ptr<UnitState>>& UnitState::forward_order() const {
  static const std::vector<std::weak_ptr<UnitState>> none;
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
  shared_ = std::make_shared<RootShared>();
  shared_->pool = std::make_shared<BufferPool>();
  if (config_.buffer_dtype) {
    at::NoGradGuard no_grad;
    for (auto& b : module_->buffers(/*recurse=*/true)) {
      if (at::isFloatingType(b.scalar_type()) && b.scalar_type() != *config_.buffer_dtype) {
        shared_->cast_buffers.emplace_back(b, b.scalar_type());
        b.set_data(b.to(*config_.buffer_dtype));
      }
    }
  }
  std::vector<const torch::nn::Module*> seen;
  for (const auto& item : module_->named_modules("", /*include_self=*/true)) {
    const auto& m = item.value();
    if (std::find(seen.begin(), seen.end(), m.get()) != seen.end()) continue;
    seen.push_back(m.get());
    auto slot = find_slot(m.get());
    if (!slot || !slot->unit) continue;
    shared_->tree.push_back(slot->unit);
    UnitState& u = *slot->unit;
    u.path_ = item.key().empty() ? "(root)" : item.key();
    u.shared_ = shared_;
    u.handle_.set_pool(shared_->pool);
    if (&u != this) {
      u.is_root_ = false;
      u.root_ = weak_from_this();
    }
  }
}

void UnitState::pre_forward() {
  if (state_ == TrainingState::kSummoned) {
    throw ConfigError("FSDP: forward of the unit at module " + module_->name() +
                      " inside summon_full_params: leave the SummonFullParams scope first");
  }
  // The first unit whose forward runs with no unit around it is the root. A
  // unit re-run in backward (activation checkpointing) already has one.
  if (!is_root_ && root_.expired()) {
    auto outer = outer_.lock();
    if (outer && tl_forward_depth == 0 && outer->root_.expired()) {
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
    RootShared& sh = *shared_;
    if (is_root_ && tl_forward_depth == 0) {  // a new iteration: keep the last order for prefetching
      recover_from_unfinished_backward();
      if (!sh.order.empty()) sh.last_order = std::move(sh.order);
      sh.order.clear();
      sh.awaiting_backward = false;
    }
    sh.order.push_back(weak_from_this());
  }
  // A forward re-run by activation checkpointing inside the unit's backward
  // keeps the backward state (and its full parameters).
  if (state_ != TrainingState::kPreBackward) transition({TrainingState::kIdle}, TrainingState::kForward);
  forward_span_.begin("forward", path_);
  unshard();
  if (config_.forward_prefetch) prefetch(+1);
}

void UnitState::hook_accumulators() {
  auto& params = handle_.params();
  for (size_t i = 0; i < params.size(); ++i) {
    if (!params[i].requires_grad) continue;
    auto acc = torch::autograd::impl::grad_accumulator(params[i].param);
    if (acc && acc != accumulators_[i]) {
      acc->add_post_hook(std::make_unique<GradReadyHook>(weak_from_this()));
      accumulators_[i] = acc;  // held, so that the hook stays on the node the next forwards use
    }
  }
}

void UnitState::post_forward(const std::vector<at::Tensor>& outputs) {
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
    if (is_root_) {  // nor does any unit's: drop what was prefetched
      for (auto& weak : shared_->tree) {
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
  const auto s = config_.strategy;
  if (s == ShardingStrategy::kFullShard || s == ShardingStrategy::kHybridShard) reshard();
}

void UnitState::forward_failed() {
  forward_span_.end();
  if (state_ == TrainingState::kForward) {
    state_ = TrainingState::kIdle;
    reshard();
  }
}

void UnitState::pre_backward() {
  // Already in backward, or done with it for this pass (the unit's outputs
  // were used more than once): nothing to do.
  if (state_ == TrainingState::kPreBackward || state_ == TrainingState::kPostBackward) return;
  transition({TrainingState::kIdle}, TrainingState::kPreBackward);
  backward_span_.begin("backward", path_);
  // The root finishes the backward of its tree (a unit whose root is gone:
  // its own, under the context it kept).
  auto root = root_.lock();
  if (!root) root = shared_from_this();
  if (!shared_->callback_queued) {
    shared_->callback_queued = true;
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
  full_grad_ = handle_.new_full_buffer_zeroed();
  for (auto& p : handle_.params()) {
    if (!p.requires_grad) continue;
    p.saved_grad = p.param.grad();
    p.param.mutable_grad() = param_view(full_grad_, p);
  }
}

void UnitState::on_grad_ready() {
  if (state_ != TrainingState::kPreBackward) return;
  if (++grads_ready_ == grads_expected_) post_backward();
}

void UnitState::post_backward() {
  if (state_ != TrainingState::kPreBackward) return;
  transition({TrainingState::kPreBackward}, TrainingState::kPostBackward);
  if (config_.backward_prefetch == BackwardPrefetch::kBackwardPost) prefetch(-1);
  if (grads_expected_ == 0) {
    reshard();
    backward_span_.end();
    return;
  }
  at::NoGradGuard no_grad;
  for (auto& p : handle_.params()) {
    if (!p.requires_grad) continue;
    const at::Tensor& g = p.param.grad();
    at::Tensor slot = full_grad_.narrow(0, p.offset, p.numel);
    // Autograd accumulates into our view; if something replaced it, copy.
    if (g.defined() && g.data_ptr() != slot.data_ptr()) slot.copy_(g.reshape({-1}));
  }
  if (!no_sync_) issue_reduction();  // else keep the full gradient: the next synced backward reduces it
  reshard();
  backward_span_.end();
}

void UnitState::issue_reduction() {
  const at::ScalarType reduce_dtype = config_.reduce_dtype.value_or(compute_dtype());
  PendingReduction r;
  r.unit = shared_from_this();
  r.input = full_grad_.scalar_type() == reduce_dtype ? full_grad_ : full_grad_.to(reduce_dtype);
  full_grad_ = at::Tensor();
  // Until the reduced shard arrives the parameters have no gradient: nothing
  // may see the unreduced one.
  for (auto& p : handle_.params()) {
    if (p.requires_grad) p.param.mutable_grad() = at::Tensor();
  }
  const bool replicate = config_.replicate_group && config_.replicate_group->size() > 1;
  if (shard_size() > 1) {
    ScopedSpan span("reduce_scatter.issue", path_);
    r.output = at::empty({shard_numel()}, r.input.options());
    r.work = config_.shard_group->reduce_scatter(r.output, r.input, dist::ReduceOp::kAvg);
    r.replicate_next = replicate;
  } else if (replicate) {
    ScopedSpan span("all_reduce.issue", path_);
    r.output = r.input;
    r.work = config_.replicate_group->all_reduce(r.output, dist::ReduceOp::kAvg);
  } else {
    r.output = r.input;  // nothing to reduce: one rank
  }
  // Every unit that reaches backward ran a forward, which gave it its root's runtime.
  if (!shared_) throw Error("FSDP internal error: the unit at module " + module_->name() + " reduces without a root");
  RuntimeStats& st = shared_->stats;
  ++st.reductions;
  ++st.reductions_in_flight;
  if (shard_size() > 1 || replicate) st.reduction_bytes += static_cast<int64_t>(r.input.nbytes());
  shared_->pending.push_back(std::move(r));
  while (static_cast<int>(shared_->pending.size()) > config_.max_reductions_in_flight) complete_oldest_reduction();
  st.peak_reductions_in_flight = std::max(st.peak_reductions_in_flight, st.reductions_in_flight);
}

void UnitState::complete_oldest_reduction() {
  PendingReduction r = std::move(shared_->pending.front());
  shared_->pending.pop_front();
  const auto t0 = std::chrono::steady_clock::now();
  {
    ScopedSpan span(r.unit->shard_size() > 1 ? "reduce_scatter.wait" : "all_reduce.wait", r.unit->path_);
    if (r.replicate_next) start_replicate_stage(r);
    r.work.wait();
  }
  r.input = at::Tensor();  // back to the pool
  RuntimeStats& st = shared_->stats;
  st.reduction_wait_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  --st.reductions_in_flight;
  r.unit->accept_gradient(std::move(r.output));
}

void UnitState::start_replicate_stage(PendingReduction& r) {
  r.work.wait();  // the reduce-scatter over the shard group
  r.input = at::Tensor();
  r.replicate_next = false;
  r.work = r.unit->config_.replicate_group->all_reduce(r.output, dist::ReduceOp::kAvg);
}

void UnitState::drain_reductions() {
  if (!shared_ || shared_->pending.empty()) return;
  // HYBRID_SHARD: issue every replicate all-reduce before waiting for any,
  // in issue order (the same on every rank).
  for (auto& r : shared_->pending) {
    if (r.replicate_next) start_replicate_stage(r);
  }
  while (!shared_->pending.empty()) complete_oldest_reduction();
}

void UnitState::accept_gradient(at::Tensor shard_grad) {
  at::NoGradGuard no_grad;
  const at::Tensor& flat_shard = handle_.flat_shard();
  // The optimizer steps the master shard, in its own dtype.
  if (shard_grad.scalar_type() != flat_shard.scalar_type()) shard_grad = shard_grad.to(flat_shard.scalar_type());
  if (config_.use_orig_params) {
    for (auto& p : handle_.params()) {
      if (!p.requires_grad) continue;
      at::Tensor g = sharded_view(shard_grad, p);
      if (p.saved_grad.defined() && p.saved_grad.numel() == g.numel()) g.add_(p.saved_grad.reshape(g.sizes()));
      p.param.mutable_grad() = g;
      p.saved_grad = at::Tensor();
    }
  } else {
    for (auto& p : handle_.params()) {
      p.param.mutable_grad() = at::Tensor();
      p.saved_grad = at::Tensor();
    }
    at::Tensor& fg = handle_.flat_shard().mutable_grad();
    if (fg.defined()) {
      fg.add_(shard_grad);
    } else {
      fg = shard_grad;
    }
  }
}

void UnitState::recover_from_unfinished_backward() {
  // A backward that threw never ran the end-of-backward callback: complete
  // what it issued (every rank issued the same), forget the rest.
  drain_reductions();
  shared_->callback_queued = false;
  for (auto& weak : shared_->tree) {
    auto u = weak.lock();
    if (!u || (u->state_ != TrainingState::kPreBackward && u->state_ != TrainingState::kPostBackward)) continue;
    u->state_ = TrainingState::kIdle;
    u->full_grad_ = at::Tensor();
    u->reshard();
    u->backward_span_.end();
  }
}

void UnitState::finish_backward() {
  shared_->callback_queued = false;
  shared_->awaiting_backward = false;
  std::vector<std::shared_ptr<UnitState>> units;
  for (auto& weak : shared_->tree) {
    if (auto u = weak.lock()) units.push_back(u);
  }
  if (units.empty()) units.push_back(shared_from_this());  // a lone unit
  // Units whose gradients never all arrived (unused parameters) reduce what they have.
  for (auto& u : units) {
    if (u->state_ == TrainingState::kPreBackward) u->post_backward();
  }
  drain_reductions();
  for (auto& u : units) {
    if (u->state_ == TrainingState::kPostBackward) u->state_ = TrainingState::kIdle;
    if (u->state_ == TrainingState::kIdle) u->reshard();
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

std::vector<at::Tensor> UnitState::sharded_grads() const {
  std::vector<at::Tensor> out;
  if (config_.use_orig_params) {
    for (const auto& p : params()) {
      if (p.param.grad().defined()) out.push_back(p.param.grad());
    }
  } else if (flat_shard().grad().defined()) {
    out.push_back(flat_shard().grad());
  }
  return out;
}

int64_t UnitState::live_grad_bytes() const {
  int64_t bytes = full_grad_.defined() ? full_grad_.numel() * full_grad_.element_size() : 0;
  if (config_.use_orig_params) {
    for (const auto& p : params()) {
      const auto& g = p.param.grad();
      if (g.defined() && !full_grad_.defined()) bytes += g.numel() * g.element_size();
    }
  } else if (flat_shard().grad().defined()) {
    bytes += flat_shard().grad().numel() * flat_shard().grad().element_size();
  }
  return bytes;
}

// ---------------------------------------------------------------------------

void explain_forward_error(UnitState& unit, const std::string& what) {
  std::set<const UnitState*> ran;
  if (auto root = unit.root()) {
    for (const auto& w : root->forward_order()) {
      if (auto u = w.lock()) ran.insert(u.get());
    }
  }
  std::string names;
  for (const auto& item : unit.module()->named_modules("", /*include_self=*/false)) {
    auto slot = find_slot(item.value().get());
    if (!slot || !slot->unit) continue;
    const UnitState& u = *slot->unit;
    if (ran.count(&u) || u.is_unsharded() || u.training_state() != TrainingState::kIdle) continue;
    names += (names.empty() ? "'" : ", '") + item.key() + "'";
  }
  if (names.empty()) return;
  throw ConfigError("FSDP: the forward of the unit at module " + unit.module()->name() +
                    " failed while FSDP unit(s) " + names +
                    " below it held only their shards (their forward had not run through their holder). If the "
                    "model calls such a unit's module directly, as unit->forward(x), call unit(x) instead: the "
                    "fsdp::Unit holder gathers the parameters first. LibTorch's error: " + what);
}

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
