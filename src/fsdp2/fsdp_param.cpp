// One parameter that fully_shard manages (fsdp_param.h): its sharding and
// its transitions, as torch's FSDPParam makes them (_fsdp_param.py).
#include "fsdp_param.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <type_traits>
#include <utility>

#include "fsdp/core/detail/storage.h"
#include "fsdp/distributed/process_group.h"

namespace fsdp::detail {

namespace {

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

// The shard's memory carries its group: the context of its DataPtr holds
// the allocation and a weak reference to the group (managing_group).
struct ShardMemory {
  at::Tensor owner;
  std::weak_ptr<FSDPParamGroup> group;
};
void delete_shard_memory(void* ctx) { delete static_cast<ShardMemory*>(ctx); }

// Zeros of `numel` elements whose storage's context is a ShardMemory.
at::Tensor tagged_zeros(int64_t numel, const at::TensorOptions& options) {
  at::Tensor owner = at::zeros({numel}, options);
  auto* memory = new ShardMemory{owner, {}};
  c10::DataPtr ptr(owner.data_ptr(), memory, &delete_shard_memory, owner.device());
  c10::Storage storage(c10::Storage::use_byte_size_t(), owner.nbytes(), std::move(ptr), nullptr, false);
  at::Tensor t = at::empty({0}, options);
  t.set_(storage, 0, {numel}, {1});
  return t;
}

ShardMemory* shard_memory(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage()) return nullptr;
  const c10::DataPtr& ptr = t.storage().data_ptr();
  if (ptr.get_deleter() != &delete_shard_memory) return nullptr;
  return static_cast<ShardMemory*>(ptr.get_context());
}

}  // namespace

bool has_grad_dtype() { return kHasGradDtype; }

FSDPParam::FSDPParam(at::Tensor param, std::string name, int shard_size, int shard_rank,
                     std::optional<at::ScalarType> param_dtype, std::optional<at::ScalarType> reduce_dtype)
    : param_(std::move(param)), name_(std::move(name)), shape_(param_.sizes().vec()), reduce_dtype_(reduce_dtype) {
  at::NoGradGuard no_grad;
  for (size_t d = 1; d < shape_.size(); ++d) row_numel_ *= shape_[d];
  padded_rows_ = (rows() + shard_size - 1) / shard_size;
  const dist::ChunkRange mine = dist::chunk_range(rows(), shard_size, shard_rank);
  local_rows_ = mine.numel;
  row_offset_ = mine.offset;
  requires_grad_ = param_.requires_grad();
  const at::Tensor whole = param_.detach().reshape({-1});
  padded_ = tagged_zeros(padded_numel(), whole.options());
  const int64_t n = local_rows_ * row_numel_;
  if (n > 0) padded_.narrow(0, 0, n).copy_(whole.narrow(0, row_offset_ * row_numel_, n));
  local_ = padded_.narrow(0, 0, n).view(local_shape());
  const at::ScalarType own = padded_.scalar_type();
  compute_dtype_ = param_dtype && at::isFloatingType(own) ? *param_dtype : own;
  full_ = at::empty({padded_numel() * shard_size}, padded_.options().dtype(compute_dtype_));
  free_storage(full_);
  param_.mutable_grad() = at::Tensor();
  param_.set_data(local_);
}

std::shared_ptr<FSDPParamGroup> FSDPParam::managing_group(const at::Tensor& param) {
  const ShardMemory* memory = shard_memory(param);
  return memory ? memory->group.lock() : nullptr;
}

void FSDPParam::set_group(const std::shared_ptr<FSDPParamGroup>& group) {
  if (ShardMemory* memory = shard_memory(padded_)) memory->group = group;
}

std::vector<int64_t> FSDPParam::local_shape() const {
  std::vector<int64_t> s = shape_;
  s[0] = local_rows_;
  return s;
}

const at::Tensor& FSDPParam::alloc_all_gather_output() {
  alloc_storage(full_);
  return full_;
}

void FSDPParam::adopt_grad_dtype() {
  if (!kHasGradDtype || !requires_grad_) return;
  if (state_ == ShardedState::kSharded) {
    std::vector<GradAccumulator> none;  // the nodes are the unsharded parameter's: they keep theirs
    set_grad_dtype(param_, none, orig_dtype());
    return;
  }
  set_grad_dtype(param_, grad_accumulators_, unsharded_grad_dtype());
  track_grad_accumulator(param_, grad_accumulators_);
}

void FSDPParam::to_unsharded() {
  sharded_grad_ = param_.grad();
  param_.mutable_grad() = at::Tensor();
  param_.set_data(full_.narrow(0, 0, numel()).view(shape_));
  param_.mutable_grad() = unsynced_grad_;
  unsynced_grad_ = at::Tensor();
  state_ = ShardedState::kUnsharded;
  adopt_grad_dtype();
}

void FSDPParam::to_sharded() {
  // A full gradient not reduced (set_requires_gradient_sync(false)) waits
  // for the next backward.
  unsynced_grad_ = param_.grad();
  param_.mutable_grad() = at::Tensor();
  param_.set_data(local_);
  param_.mutable_grad() = sharded_grad_;
  sharded_grad_ = at::Tensor();
  free_storage(full_);
  state_ = ShardedState::kSharded;
  adopt_grad_dtype();
}

void FSDPParam::show_sharded_grad() {
  unsynced_grad_ = param_.grad();
  param_.mutable_grad() = sharded_grad_;
  sharded_grad_ = at::Tensor();
}

void FSDPParam::hide_sharded_grad() {
  sharded_grad_ = param_.grad();
  param_.mutable_grad() = unsynced_grad_;
  unsynced_grad_ = at::Tensor();
}

void FSDPParam::set_unsharded_grad_dtype(bool defer_upcast, bool reduces) {
  if (!kHasGradDtype) return;
  // torch's _fsdp_params_with_wider_grad_dtype: gradients accumulated in a
  // wider dtype than they are computed in (bfloat16 compute, float32 reduce).
  const at::ScalarType want = unsharded_grad_dtype(), compute = compute_dtype_;
  if (!requires_grad_ || !at::isFloatingType(want) || !at::isFloatingType(compute) ||
      c10::elementSize(want) <= c10::elementSize(compute)) {
    return;
  }
  if (defer_upcast) {
    // A gradient to be reduced, or one to add to, comes in the compute
    // dtype (a tied parameter's uses summed in it).
    if (param_.grad().defined() || reduces) set_grad_dtype(param_, grad_accumulators_, std::nullopt);
    return;
  }
  if (param_.grad().defined() && param_.grad().scalar_type() != want) {
    param_.mutable_grad() = param_.grad().to(want);  // made while deferred, not reduced
  }
  set_grad_dtype(param_, grad_accumulators_, want);
}

void FSDPParam::accumulate_unsharded_grad_if_needed() {
  if (accumulated_grad_.defined() && param_.grad().defined()) {
    accumulated_grad_.add_(param_.grad());
    param_.mutable_grad() = at::Tensor();
  }
}

void FSDPParam::to_accumulated_grad_if_needed() {
  const at::Tensor& g = param_.grad();
  if (reduce_dtype_ && g.defined() && g.scalar_type() != *reduce_dtype_) {
    accumulated_grad_ = g.to(*reduce_dtype_);
    param_.mutable_grad() = at::Tensor();
  }
}

const at::Tensor& FSDPParam::unsharded_grad() const {
  return accumulated_grad_.defined() ? accumulated_grad_ : param_.grad();
}

void FSDPParam::clear_unsharded_grad() {
  param_.mutable_grad() = at::Tensor();
  accumulated_grad_ = at::Tensor();
}

void FSDPParam::add_sharded_grad(at::Tensor shard, bool aside) {
  if (shard.scalar_type() != orig_dtype()) shard = shard.to(orig_dtype());
  at::Tensor& slot = aside ? sharded_grad_ : param_.mutable_grad();
  if (slot.defined()) {
    slot.add_(shard);
  } else {
    slot = shard;
  }
}

int64_t FSDPParam::live_grad_bytes() const {
  int64_t bytes = 0;
  for (const at::Tensor* t : {&param_.grad(), &sharded_grad_, &unsynced_grad_, &accumulated_grad_}) {
    if (t->defined()) bytes += t->numel() * static_cast<int64_t>(t->element_size());
  }
  return bytes;
}

}  // namespace fsdp::detail
