// The FSDP2 engine's group (param_group.h), its backward half: the
// pre- and post-backward hooks, the dtype autograd accumulates each
// unsharded gradient in, the reduce-scatter of the gradients and the root's
// end of backward, each as torch's _fsdp_param_group.py and
// _fsdp_collectives.py do it.
#include "param_group.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/engine.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <type_traits>
#include <utility>

#include "fsdp/core/detail/storage.h"
#include "fsdp/error.h"

namespace fsdp::detail {

namespace {

// torch's _get_gradient_divide_factors: the reduce-scatter's and the
// all-reduce's operations, and the divisions before and after them.
struct DivideFactors {
  std::optional<double> pre, post;
  dist::ReduceOp reduce_scatter_op = dist::ReduceOp::kSum;
  dist::ReduceOp all_reduce_op = dist::ReduceOp::kSum;
};

DivideFactors divide_factors(int rs_size, int ar_size, at::ScalarType reduce_dtype, std::optional<double> factor,
                             bool force_sum, const std::string& module) {
  DivideFactors f;
  const bool overflow_risk = reduce_dtype != at::kFloat && reduce_dtype != at::kBFloat16;
  const int dp = rs_size * ar_size;
  if (!overflow_risk && !force_sum) {
    if (!factor) {
      if (dp > 1) f.reduce_scatter_op = f.all_reduce_op = dist::ReduceOp::kAvg;
      return f;
    }
    if (*factor != rs_size) {
      throw ConfigError("fully_shard: module " + module + " has gradient divide factor " + std::to_string(*factor) +
                        ", which torch applies with ReduceOp.PREMUL_SUM; c10d's Gloo has no PREMUL_SUM: also call "
                        "set_force_sum_reduction_for_comms(true) (the reduction then sums and the division follows)");
    }
    f.reduce_scatter_op = dist::ReduceOp::kAvg;
    return f;
  }
  const double d = factor ? *factor : static_cast<double>(dp);
  if (overflow_risk) {
    double pre = 1;
    while (std::fmod(d, pre) == 0 && d / pre > pre) pre *= 2;
    f.pre = pre;
    f.post = d / pre;
  } else {
    f.post = d;
  }
  return f;
}

void div_if_needed(at::Tensor& t, const std::optional<double>& d) {
  if (d && *d != 1) t.div_(*d);
}


// Tensor::set_grad_dtype (LibTorch 2.15 has it, 1.13 not): the dtype autograd
// accumulates a leaf's gradient in; each use's gradient is cast to it before
// the uses are summed. std::nullopt: any dtype (the gradient's own, summed
// in it, and added in place to a gradient of another dtype).
template <class T, class = void>
struct HasGradDtype : std::false_type {};
template <class T>
struct HasGradDtype<T, std::void_t<decltype(std::declval<const T&>().set_grad_dtype(
                           std::declval<std::optional<at::ScalarType>>()))>> : std::true_type {};
constexpr bool kHasGradDtype = HasGradDtype<at::Tensor>::value;

// Sets `dtype` on the parameter and on the AccumulateGrad nodes of its
// unsharded form in `nodes`. A parameter's node changes with each change of
// its dtype (set_data), so a graph made before a reshard still sends the
// gradients to an earlier node, which the parameter no longer reaches.
// (Templates: the calls exist only where LibTorch has grad_dtype.)
template <class T, class Nodes>
void set_grad_dtype(const T& param, Nodes& nodes, std::optional<at::ScalarType> dtype) {
  if constexpr (HasGradDtype<T>::value) {
    param.set_grad_dtype(dtype);
    for (auto& node : nodes) node->mutable_input_metadata(0).set_grad_dtype(dtype);
  }
}

// Adds the unsharded parameter's current node to `nodes`, and drops those
// that no graph holds any more.
template <class T, class Nodes>
void track_grad_accumulator(const T& param, Nodes& nodes) {
  if constexpr (HasGradDtype<T>::value) {
    nodes.erase(std::remove_if(nodes.begin(), nodes.end(), [](const auto& n) { return n.use_count() == 1; }),
                nodes.end());
    auto node = torch::autograd::impl::grad_accumulator(param);
    if (node && std::find(nodes.begin(), nodes.end(), node) == nodes.end()) nodes.push_back(std::move(node));
  }
}

}  // namespace

at::ScalarType ParamGroup::unsharded_grad_dtype(const FSDPParam& p) const {
  const auto& reduce_dtype = options_.mp_policy().reduce_dtype;
  return reduce_dtype ? *reduce_dtype : p.padded.scalar_type();
}

void ParamGroup::adopt_grad_dtypes(bool unsharded) {
  if (!kHasGradDtype) return;
  for (auto& p : params_) {
    if (!p.requires_grad) continue;
    if (!unsharded) {
      std::vector<GradAccumulator> none;  // the nodes are the unsharded parameter's: they keep theirs
      set_grad_dtype(p.param, none, p.padded.scalar_type());
      continue;
    }
    set_grad_dtype(p.param, p.grad_accumulators, unsharded_grad_dtype(p));
    track_grad_accumulator(p.param, p.grad_accumulators);
  }
}

void ParamGroup::set_unsharded_grad_dtypes(bool defer_upcast) {
  if (!kHasGradDtype) return;
  at::NoGradGuard no_grad;
  for (auto& p : params_) {
    // torch's _fsdp_params_with_wider_grad_dtype: gradients accumulated in a
    // wider dtype than they are computed in (bfloat16 compute, float32 reduce).
    const at::ScalarType want = unsharded_grad_dtype(p), compute = compute_dtype(p);
    if (!p.requires_grad || !at::isFloatingType(want) || !at::isFloatingType(compute) ||
        c10::elementSize(want) <= c10::elementSize(compute)) {
      continue;
    }
    if (defer_upcast) {
      // A gradient to be reduced, or one to add to, comes in the compute
      // dtype (a tied parameter's uses summed in it).
      if (p.param.grad().defined() || requires_gradient_sync) set_grad_dtype(p.param, p.grad_accumulators, std::nullopt);
      continue;
    }
    if (p.param.grad().defined() && p.param.grad().scalar_type() != want) {
      p.param.mutable_grad() = p.param.grad().to(want);  // made while deferred, not reduced
    }
    set_grad_dtype(p.param, p.grad_accumulators, want);
  }
}

void ParamGroup::pre_backward() {
  if (state_ == GroupState::kPreBackward || state_ == GroupState::kPostBackward) return;
  state_ = GroupState::kPreBackward;
  if (!ctx_->callback_queued) {
    ctx_->callback_queued = true;
    std::shared_ptr<ParamGroup> root;
    for (const auto& w : ctx_->groups) {
      auto g = w.lock();
      if (g && g->is_root_) root = g;
    }
    std::weak_ptr<ParamGroup> weak = root ? root : shared_from_this();
    torch::autograd::Engine::get_default_engine().queue_callback([weak] {
      if (auto r = weak.lock()) r->finish_backward();
    });
  }
  unshard();
  hide_sharded_grads();
  set_unsharded_grad_dtypes(/*defer_upcast=*/true);
  if (!backward_prefetch.empty()) {
    prefetch(backward_prefetch);
  } else if (auto prev = previous_in_forward()) {
    prev->start_unshard();
  }
}

void ParamGroup::post_backward() {
  if (state_ != GroupState::kPreBackward) return;
  state_ = GroupState::kPostBackward;
  reduce();
  if (reshard_after_backward) reshard();
}

void ParamGroup::reduce() {
  at::NoGradGuard no_grad;
  const auto& want_dtype = options_.mp_policy().reduce_dtype;
  // torch's accumulate_unsharded_grad_if_needed: a gradient accumulated
  // without sync in reduce_dtype takes this backward's in.
  for (auto& p : params_) {
    if (p.accumulated_grad.defined() && p.param.grad().defined()) {
      p.accumulated_grad.add_(p.param.grad());
      p.param.mutable_grad() = at::Tensor();
    }
  }
  if (!requires_gradient_sync) {
    // torch 2.15: unsynced gradients stay on the unsharded parameters, in
    // their accumulation dtype (reshard() keeps them aside), and the next
    // backward adds to them in place.
    if (kHasGradDtype) {
      set_unsharded_grad_dtypes(/*defer_upcast=*/false);
      return;
    }
    // Without grad_dtype (older LibTorch), torch's former
    // to_accumulated_grad_if_needed: unsynced gradients accumulate in
    // reduce_dtype when it is set (and not theirs), apart from the parameter.
    for (auto& p : params_) {
      const at::Tensor& g = p.param.grad();
      if (want_dtype && g.defined() && g.scalar_type() != *want_dtype) {
        p.accumulated_grad = g.to(*want_dtype);
        p.param.mutable_grad() = at::Tensor();
      }
    }
    return;
  }
  auto grad_of = [](const FSDPParam& p) -> const at::Tensor& {
    return p.accumulated_grad.defined() ? p.accumulated_grad : p.param.grad();
  };
  std::vector<size_t> with_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (params_[i].requires_grad && grad_of(params_[i]).defined()) with_grad.push_back(i);
  }
  if (with_grad.empty()) {
    set_unsharded_grad_dtypes(/*defer_upcast=*/false);
    return;
  }
  at::ScalarType reduce_dtype;
  if (want_dtype) {
    reduce_dtype = *want_dtype;
  } else if (kHasGradDtype) {
    // torch 2.15's _get_reduce_dtype: promoted over the accumulation dtypes
    // (unsharded_grad_dtype: the parameters' own without reduce_dtype), not
    // the gradients' — bfloat16 compute without reduce_dtype reduces in float32.
    reduce_dtype = unsharded_grad_dtype(params_[with_grad[0]]);
    for (size_t i : with_grad) reduce_dtype = at::promoteTypes(reduce_dtype, unsharded_grad_dtype(params_[i]));
  } else {
    // Older torch (no grad_dtype): reduced in the gradients' dtype.
    reduce_dtype = grad_of(params_[with_grad[0]]).scalar_type();
    for (size_t i : with_grad) reduce_dtype = at::promoteTypes(reduce_dtype, grad_of(params_[i]).scalar_type());
  }
  const int ar_size = replicate_group_ ? replicate_group_->size() : 1;
  const DivideFactors f = divide_factors(shard_size_, ar_size, reduce_dtype, gradient_divide_factor,
                                         force_sum_reduction, name());
  int64_t block = 0;
  for (size_t i : with_grad) block += params_[i].padded_numel();
  const int w = shard_size_;
  // torch's chunk_cat: block r holds every parameter's padded rows of rank r.
  at::Tensor input = at::zeros({block * w}, params_[with_grad[0]].padded.options().dtype(reduce_dtype));
  int64_t off = 0;
  for (size_t i : with_grad) {
    FSDPParam& p = params_[i];
    at::Tensor g = grad_of(p).reshape({-1}).to(reduce_dtype);
    const int64_t pn = p.padded_numel();
    for (int r = 0; r < w; ++r) {
      const int64_t n = std::min(pn, std::max<int64_t>(0, p.numel() - r * pn));
      if (n > 0) input.narrow(0, r * block + off, n).copy_(g.narrow(0, r * pn, n));
    }
    off += pn;
    p.param.mutable_grad() = at::Tensor();
    p.accumulated_grad = at::Tensor();
  }
  set_unsharded_grad_dtypes(/*defer_upcast=*/false);
  div_if_needed(input, f.pre);
  RootContext::Pending pending;
  pending.group = shared_from_this();
  pending.input = input;
  pending.params = with_grad;
  pending.output = at::empty({block}, input.options());
  if (w > 1) {
    pending.work = shard_group_->reduce_scatter(pending.output, input, f.reduce_scatter_op);
  } else if (gradient_divide_factor && *gradient_divide_factor != 1.0) {
    pending.output.copy_(input / *gradient_divide_factor);
  } else {
    pending.output.copy_(input);
  }
  // The all-reduce across replicas and the division after it run when the
  // reduction completes (complete()).
  pending.post = f.post;
  pending.all_reduce_op = f.all_reduce_op;
  pending.all_reduce = requires_all_reduce;
  ctx_->pending.push_back(std::move(pending));
  // At most two reductions in flight (torch keeps one per group in flight
  // and waits the oldest at the next post-backward).
  while (ctx_->pending.size() > 2) {
    complete(ctx_->pending.front());
    ctx_->pending.erase(ctx_->pending.begin());
  }
}

void ParamGroup::complete(RootContext::Pending& p) {
  p.work.wait();
  ParamGroup& g = *p.group;
  at::NoGradGuard no_grad;
  at::Tensor out = p.output;
  if (g.replicate_group_) {
    // torch's partial_reduce_output: without the all-reduce across replicas
    // (set_requires_all_reduce(false)) the reduce-scattered gradients wait,
    // summed, for the next reduction that all-reduces.
    auto& partial = g.partial_reduce_output_;
    if (partial.defined() && g.partial_params_ != p.params) {
      throw ConfigError("fully_shard: module " + g.name() +
                        ": the gradients reduced without the all-reduce across replicas "
                        "(set_requires_all_reduce(false)) belong to other parameters than this backward's; every "
                        "micro-batch must give gradients to the same parameters");
    }
    if (!p.all_reduce) {
      if (partial.defined()) {
        partial.add_(out);
      } else {
        partial = out;
        g.partial_params_ = p.params;
      }
      p.input = at::Tensor();
      return;
    }
    if (partial.defined()) {
      out.add_(partial);
      partial = at::Tensor();
      g.partial_params_.clear();
    }
    if (g.replicate_group_->size() > 1) g.replicate_group_->all_reduce(out, p.all_reduce_op).wait();
  }
  div_if_needed(out, p.post);
  int64_t off = 0;
  for (size_t i : p.params) {
    FSDPParam& q = g.params_[i];
    at::Tensor shard = storage_view(out, off, q.local_shape());
    if (shard.scalar_type() != q.padded.scalar_type()) shard = shard.to(q.padded.scalar_type());
    off += q.padded_numel();
    // While the parameter is unsharded its sharded gradient waits aside.
    at::Tensor& slot = g.unsharded_ && !g.sharded_grads_shown_ ? q.sharded_grad : q.param.mutable_grad();
    if (slot.defined()) {
      slot.add_(shard);
    } else {
      slot = shard;
    }
  }
  p.input = at::Tensor();
}

void ParamGroup::finish_backward() {
  auto ctx = ctx_;
  std::vector<std::shared_ptr<ParamGroup>> groups;
  for (const auto& w : ctx->groups) {
    if (auto g = w.lock()) groups.push_back(g);
  }
  // Groups whose inputs' gradients never came (inputs without gradients,
  // such as token ids) reduce now, in the tree's order on every rank.
  for (auto& g : groups) g->post_backward();
  for (auto& p : ctx->pending) complete(p);
  ctx->pending.clear();
  for (auto& g : groups) {
    if (g->state_ != GroupState::kForward) g->state_ = GroupState::kIdle;
    // The last backward of a step leaves every group sharded, with its
    // gradients on the parameters, for the optimizer.
    if (g->reshard_after_backward || ctx->is_last_backward) g->reshard();
  }
  ctx->callback_queued = false;
}

int64_t ParamGroup::live_grad_bytes() const {
  int64_t bytes = 0;
  auto add = [&](const at::Tensor& t) {
    if (t.defined()) bytes += t.numel() * static_cast<int64_t>(t.element_size());
  };
  for (const auto& p : params_) {
    add(p.param.grad());
    add(p.sharded_grad);
    add(p.unsynced_grad);
    add(p.accumulated_grad);
  }
  return bytes;
}


}  // namespace fsdp::detail
