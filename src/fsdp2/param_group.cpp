// The FSDP2 engine's group (param_group.h): sharding, the all-gather with its
// copy-in and copy-out, and the hooks of forward, each as torch's
// _fsdp_param_group.py and _fsdp_collectives.py do it. The backward half
// (hooks, gradient dtypes, reduce-scatter) is param_group_backward.cpp.
#include "param_group.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <utility>

#include "fsdp/core/detail/storage.h"
#include "fsdp/error.h"

namespace fsdp::detail {

namespace {

// How many sharded modules' forwards run on this thread (0 at the root's:
// a new iteration).
thread_local int tl_depth = 0;

bool is_float(at::ScalarType t) { return at::isFloatingType(t); }

}  // namespace

std::vector<int64_t> FSDPParam::local_shape() const {
  std::vector<int64_t> s = shape;
  s[0] = local_rows;
  return s;
}

ParamGroup::ParamGroup(std::vector<torch::nn::Module*> modules, std::vector<FSDPParam> params,
                       FullyShardOptions options)
    : modules_(std::move(modules)), params_(std::move(params)), options_(std::move(options)) {
  shard_group_ = options_.mesh().shard_group();
  replicate_group_ = options_.mesh().replicate_group();
  shard_size_ = shard_group_->size();
  shard_rank_ = shard_group_->rank();
  at::NoGradGuard no_grad;
  for (auto& p : params_) {
    p.rows = p.shape[0];
    p.row_numel = 1;
    for (size_t d = 1; d < p.shape.size(); ++d) p.row_numel *= p.shape[d];
    p.padded_rows = (p.rows + shard_size_ - 1) / shard_size_;
    const dist::ChunkRange mine = dist::chunk_range(p.rows, shard_size_, shard_rank_);
    p.local_rows = mine.numel;
    p.row_offset = mine.offset;
    p.requires_grad = p.param.requires_grad();
    const at::Tensor whole = p.param.detach().reshape({-1});
    p.padded = at::zeros({p.padded_numel()}, whole.options());
    const int64_t n = p.local_rows * p.row_numel;
    if (n > 0) p.padded.narrow(0, 0, n).copy_(whole.narrow(0, p.row_offset * p.row_numel, n));
    p.local = p.padded.narrow(0, 0, n).view(p.local_shape());
    p.full = at::empty({p.padded_numel() * shard_size_}, p.padded.options().dtype(compute_dtype(p)));
    free_storage(p.full);
    p.param.mutable_grad() = at::Tensor();
    p.param.set_data(p.local);
  }
}

ParamGroup::~ParamGroup() = default;

std::string ParamGroup::name() const {
  if (modules_.size() == 1) return modules_[0]->name();
  std::string out = "[";
  for (size_t i = 0; i < modules_.size(); ++i) out += (i ? ", " : "") + modules_[i]->name();
  return out + "]";
}

at::ScalarType ParamGroup::compute_dtype(const FSDPParam& p) const {
  const auto& want = options_.mp_policy().param_dtype;
  const at::ScalarType own = p.padded.scalar_type();
  return want && is_float(own) ? *want : own;
}

bool ParamGroup::resharded_after_forward() const {
  return reshard_after_forward.value_or(!is_root_);
}

int64_t ParamGroup::gather_numel(const FSDPParam& p) const {
  return gather_dtype_ == at::kByte ? p.padded_numel() * static_cast<int64_t>(c10::elementSize(compute_dtype(p)))
                                    : p.padded_numel();
}

void ParamGroup::start_unshard() {
  if (unsharded_ || gathering_) return;
  at::NoGradGuard no_grad;
  // One dtype for the whole gather: the parameters' compute dtype, or bytes
  // when they differ (torch's uint8 all-gather).
  gather_dtype_ = params_.empty() ? at::kFloat : compute_dtype(params_[0]);
  for (const auto& p : params_) {
    if (compute_dtype(p) != gather_dtype_) gather_dtype_ = at::kByte;
  }
  gather_block_ = 0;
  for (const auto& p : params_) gather_block_ += gather_numel(p);
  const auto opts = at::TensorOptions().dtype(gather_dtype_).device(shard_group_->device());
  from_post_forward_ = post_forward_shard_.defined();
  at::Tensor in;
  if (from_post_forward_) {
    // Resharded after forward to the smaller group: gather within it.
    in = post_forward_shard_;
    post_forward_shard_ = at::Tensor();
  } else {
    in = at::empty({gather_block_}, opts);
    int64_t off = 0;
    for (const auto& p : params_) {
      at::Tensor src = p.padded.to(compute_dtype(p));
      if (gather_dtype_ == at::kByte) src = src.view(at::kByte);
      in.narrow(0, off, gather_numel(p)).copy_(src);
      off += gather_numel(p);
    }
  }
  const dist::ProcessGroupPtr& group = from_post_forward_ ? post_forward_group : shard_group_;
  if (group->size() == 1) {
    gather_out_ = in;
    gather_work_ = dist::Work();
  } else {
    gather_out_ = at::empty({in.numel() * group->size()}, opts);
    gather_work_ = group->all_gather(gather_out_, in);
  }
  gathering_ = true;
}

void ParamGroup::wait_unshard() {
  if (unsharded_) return;
  if (!gathering_) start_unshard();
  gather_work_.wait();
  at::NoGradGuard no_grad;
  // Where rank r's block of a parameter (at offset `off` of a block, `pn`
  // long) lies in the output: the shard group's gather holds W blocks of
  // every parameter's rows, rank after rank; the post-forward group's gather
  // holds its members' post-forward shards (post_forward_shard), each
  // W / n ranks' blocks of every parameter.
  const int64_t per_member = from_post_forward_ ? shard_size_ / post_forward_group->size() : 1;
  auto source = [&](int r, int64_t off, int64_t pn) {
    if (!from_post_forward_) return r * gather_block_ + off;
    return (r / per_member) * per_member * gather_block_ + per_member * off + (r % per_member) * pn;
  };
  int64_t off = 0;
  for (auto& p : params_) {
    alloc_storage(p.full);
    at::Tensor dst = gather_dtype_ == at::kByte ? p.full.view(at::kByte) : p.full;
    const int64_t pn = gather_numel(p);
    for (int r = 0; r < shard_size_; ++r) dst.narrow(0, r * pn, pn).copy_(gather_out_.narrow(0, source(r, off, pn), pn));
    off += pn;
    p.sharded_grad = p.param.grad();
    p.param.mutable_grad() = at::Tensor();
    p.param.set_data(p.full.narrow(0, 0, p.numel()).view(p.shape));
    p.param.mutable_grad() = p.unsynced_grad;
    p.unsynced_grad = at::Tensor();
  }
  adopt_grad_dtypes(/*unsharded=*/true);
  gather_out_ = at::Tensor();
  gather_work_ = dist::Work();
  gathering_ = false;
  unsharded_ = true;
}

void ParamGroup::reshard_to_post_forward() {
  if (gathering_) wait_unshard();
  if (!unsharded_) return;
  // This rank keeps, of every parameter, the blocks of the W / n shard-group
  // ranks its post-forward index stands for: 1/n of the full parameters.
  const int n = post_forward_group->size();
  const int64_t per_member = shard_size_ / n;
  const int64_t first = post_forward_group->rank() * per_member;
  at::NoGradGuard no_grad;
  at::Tensor keep = at::empty({gather_block_ * per_member}, params_.empty() ? at::TensorOptions() : params_[0].full.options().dtype(gather_dtype_));
  int64_t off = 0;
  for (auto& p : params_) {
    const at::Tensor src = gather_dtype_ == at::kByte ? p.full.view(at::kByte) : p.full;
    const int64_t pn = gather_numel(p);
    keep.narrow(0, per_member * off, per_member * pn).copy_(src.narrow(0, first * pn, per_member * pn));
    off += pn;
  }
  reshard();
  post_forward_shard_ = keep;
}

void ParamGroup::show_sharded_grads() {
  if (!unsharded_ || sharded_grads_shown_) return;
  for (auto& p : params_) {
    p.unsynced_grad = p.param.grad();
    p.param.mutable_grad() = p.sharded_grad;
    p.sharded_grad = at::Tensor();
  }
  sharded_grads_shown_ = true;
}

void ParamGroup::hide_sharded_grads() {
  if (!sharded_grads_shown_) return;
  for (auto& p : params_) {
    p.sharded_grad = p.param.grad();
    p.param.mutable_grad() = p.unsynced_grad;
    p.unsynced_grad = at::Tensor();
  }
  sharded_grads_shown_ = false;
}

void ParamGroup::reshard() {
  if (gathering_) wait_unshard();  // the backend may still write into the buffer
  post_forward_shard_ = at::Tensor();
  if (!unsharded_) return;
  hide_sharded_grads();
  at::NoGradGuard no_grad;
  for (auto& p : params_) {
    // A full gradient not reduced (set_requires_gradient_sync(false)) waits
    // for the next backward.
    p.unsynced_grad = p.param.grad();
    p.param.mutable_grad() = at::Tensor();
    p.param.set_data(p.local);
    p.param.mutable_grad() = p.sharded_grad;
    p.sharded_grad = at::Tensor();
    free_storage(p.full);
  }
  adopt_grad_dtypes(/*unsharded=*/false);
  unsharded_ = false;
}

void ParamGroup::lazy_init() {
  if (modules_.size() > 1) {
    // torch: "FSDP requires a single root module".
    throw ConfigError("fully_shard: the group of modules " + name() +
                      " ran forward first, as the root of its model, but a root is one module: apply fully_shard "
                      "to the model that calls them too, and run the model");
  }
  ctx_ = std::make_shared<RootContext>();
  is_root_ = true;
  for (const auto& item : module()->named_modules("", /*include_self=*/true)) {
    auto g = group_of(*item.value());
    if (!g) continue;
    if (std::none_of(ctx_->groups.begin(), ctx_->groups.end(),
                     [&](const std::weak_ptr<ParamGroup>& w) { return w.lock() == g; })) {
      ctx_->groups.push_back(g);
    }
    if (g.get() != this) {
      g->ctx_ = ctx_;
      g->is_root_ = false;
    }
  }
}

void ParamGroup::prefetch(const std::vector<std::weak_ptr<ParamGroup>>& groups) {
  for (const auto& w : groups) {
    if (auto g = w.lock()) g->start_unshard();
  }
}

std::shared_ptr<ParamGroup> ParamGroup::previous_in_forward() const {
  const auto& order = ctx_->forward_order;
  for (size_t i = order.size(); i-- > 1;) {
    if (order[i].lock().get() == this) return order[i - 1].lock();
  }
  return nullptr;
}

void ParamGroup::pre_forward(std::vector<at::Tensor>& inputs) {
  if (!ctx_) lazy_init();
  if (modules_to_run_.empty()) modules_to_run_ = modules_;
  if (is_root_ && tl_depth == 0 && state_ != GroupState::kPreBackward) ctx_->forward_order.clear();
  ++tl_depth;
  // A forward re-run in this group's backward (activation checkpointing)
  // finds its parameters gathered and keeps the backward's state. Of a
  // list's modules, the first to run in a pass starts the group's forward;
  // the others only cast their inputs.
  const bool rerun = state_ == GroupState::kPreBackward;
  const bool first_in_pass = !rerun && state_ != GroupState::kForward;
  if (first_in_pass) {
    state_ = GroupState::kForward;
    ctx_->forward_order.push_back(weak_from_this());
  }
  unshard();
  if (first_in_pass) prefetch(forward_prefetch);
  const auto& mp = options_.mp_policy();
  for (auto& t : inputs) {
    if (mp.cast_forward_inputs && mp.param_dtype && t.defined() && is_float(t.scalar_type())) t = t.to(*mp.param_dtype);
  }
  if (!first_in_pass && !rerun) return;
  // torch's RegisterPostBackwardFunction: the gradients of this forward's
  // inputs are complete when its backward is done.
  inputs_pending_ = 0;
  if (rerun || !at::GradMode::is_enabled()) return;
  std::weak_ptr<ParamGroup> weak = weak_from_this();
  for (auto& t : inputs) {
    if (!t.defined() || !t.requires_grad()) continue;
    t = t.view_as(t);
    ++inputs_pending_;
    t.register_hook([weak](const at::Tensor&) {
      if (auto g = weak.lock()) {
        if (--g->inputs_pending_ == 0) g->post_backward();
      }
    });
  }
}

void ParamGroup::post_forward(torch::nn::Module* module, std::vector<at::Tensor>& outputs) {
  --tl_depth;
  if (state_ != GroupState::kPreBackward) {  // not a re-run inside backward
    auto it = std::find(modules_to_run_.begin(), modules_to_run_.end(), module);
    if (it != modules_to_run_.end()) {
      modules_to_run_.erase(it);
      if (modules_to_run_.empty()) {
        end_forward(outputs);
        if (tl_depth == 0) end_unfinished_forwards(outputs);
      }
    }
  }
  cast_outputs(outputs);
}

void ParamGroup::end_forward(std::vector<at::Tensor>& outputs) {
  state_ = GroupState::kIdle;
  if (resharded_after_forward()) {
    if (post_forward_group) {
      reshard_to_post_forward();
    } else {
      reshard();
    }
  } else {
    // Unsharded until backward: the optimizer's view of .grad is the
    // sharded gradient meanwhile (a zero_grad between forward and backward
    // clears what this backward would add to, as in torch).
    show_sharded_grads();
  }
  if (at::GradMode::is_enabled()) {
    std::weak_ptr<ParamGroup> weak = weak_from_this();
    for (const auto& t : outputs) {
      if (!t.defined() || !t.requires_grad()) continue;
      t.register_hook([weak](const at::Tensor&) {
        if (auto g = weak.lock()) g->pre_backward();
      });
    }
  }
}

void ParamGroup::cast_outputs(std::vector<at::Tensor>& outputs) const {
  if (const auto& od = options_.mp_policy().output_dtype) {
    for (auto& t : outputs) {
      if (t.defined() && is_float(t.scalar_type())) t = t.to(*od);
    }
  }
}

void ParamGroup::end_unfinished_forwards(std::vector<at::Tensor>& outputs) {
  // In reverse pre-order, so that within a nesting chain the deepest
  // group's output cast comes first (torch's order).
  for (auto w = ctx_->groups.rbegin(); w != ctx_->groups.rend(); ++w) {
    auto g = w->lock();
    if (!g || g.get() == this || g->modules_to_run_.empty()) continue;
    g->end_forward(outputs);
    g->cast_outputs(outputs);
    g->modules_to_run_.clear();
  }
}

void ParamGroup::forward_failed() noexcept {
  --tl_depth;
  if (state_ == GroupState::kForward) state_ = GroupState::kIdle;
  modules_to_run_.clear();
  try {
    reshard();
  } catch (...) {
  }
}

}  // namespace fsdp::detail
