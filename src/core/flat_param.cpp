#include "flat_param.h"

#include <ATen/ATen.h>

#include "buffer_pool.h"
#include "fsdp/core/detail/storage.h"
#include "fsdp/error.h"

namespace fsdp::detail {

FlatParamHandle::FlatParamHandle(const std::string& owner, std::vector<ParamInfo> params,
                                 dist::ProcessGroupPtr shard_group, std::optional<at::ScalarType> compute_dtype,
                                 bool use_orig_params)
    : params_(std::move(params)),
      shard_group_(std::move(shard_group)),
      param_dtype_(compute_dtype),
      use_orig_params_(use_orig_params) {
  if (shard_group_) {
    shard_size_ = shard_group_->size();
    shard_rank_ = shard_group_->rank();
  }
  at::TensorOptions options = at::TensorOptions().dtype(at::kFloat);
  if (!params_.empty()) options = params_[0].param.options().requires_grad(false);
  for (auto& p : params_) {
    if (p.param.scalar_type() != options.dtype().toScalarType() || p.param.device() != options.device()) {
      throw ConfigError("FSDP: parameter '" + p.name + "' is " + std::string(c10::toString(p.param.scalar_type())) +
                        " on " + p.param.device().str() + ", but '" + params_[0].name + "' of the same unit" +
                        (owner.empty() ? "" : " (at module " + owner + ")") + " is " +
                        std::string(c10::toString(options.dtype().toScalarType())) + " on " +
                        options.device().str() + ": a unit's parameters must share dtype and device");
    }
    // torch's FlatParamHandle with use_orig_params (align_addresses): each
    // original parameter starts at a multiple of 16 bytes, zero padding
    // before it, so that every rank holds the parts torch's ranks hold.
    if (use_orig_params_) {
      const int64_t aligned = std::max<int64_t>(1, 16 / static_cast<int64_t>(p.param.element_size()));
      numel_ = (numel_ + aligned - 1) / aligned * aligned;
    }
    p.offset = numel_;
    p.numel = p.param.numel();
    p.shape = p.param.sizes().vec();
    p.requires_grad = p.param.requires_grad();
    numel_ += p.numel;
  }
  shard_numel_ = (numel_ + shard_size_ - 1) / shard_size_;
  padded_numel_ = shard_numel_ * shard_size_;

  compute_dtype_ = param_dtype_.value_or(options.dtype().toScalarType());
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
}

at::Tensor FlatParamHandle::sharded_view(const at::Tensor& flat, const ParamInfo& p) const {
  if (shard_size_ == 1) return storage_view(flat, p.offset, p.shape);
  const int64_t lo = std::max(p.offset, shard_begin());
  const int64_t hi = std::min(p.offset + p.numel, shard_begin() + shard_numel_);
  if (hi <= lo) return storage_view(flat, 0, {0});
  return storage_view(flat, lo - shard_begin(), {hi - lo});
}

void FlatParamHandle::alloc_full() {
  if (pool_ && full_.is_cpu()) {
    alloc_storage(full_, [this](size_t bytes) { return pool_->take(bytes); });
  } else {
    alloc_storage(full_);
  }
}

void FlatParamHandle::free_full() { free_storage(full_); }

at::Tensor FlatParamHandle::new_full_buffer_zeroed() const {
  at::Tensor t = pool_ && full_.is_cpu() ? pool_->empty(padded_numel_, full_.options())
                                         : at::empty({padded_numel_}, full_.options());
  return t.zero_();
}

bool FlatParamHandle::start_unshard() {
  if (unsharded_ || gathering_) return false;
  alloc_full();
  at::NoGradGuard no_grad;
  if (shard_size_ == 1) {
    full_.copy_(flat_shard_);  // cast only
    return false;
  }
  if (padded_numel_ == 0) return false;  // a unit without parameters: nothing to gather (on every rank alike)
  pending_input_ = flat_shard_.scalar_type() == compute_dtype_ ? flat_shard_ : flat_shard_.to(compute_dtype_);
  pending_gather_ = shard_group_->all_gather(full_, pending_input_);
  gathering_ = true;
  return true;
}

bool FlatParamHandle::finish_unshard() {
  bool waited = false;
  if (gathering_) {
    gathering_ = false;
    dist::Work work = std::move(pending_gather_);
    pending_input_ = at::Tensor();
    work.wait();
    waited = true;
  }
  if (unsharded_) return waited;
  for (auto& p : params_) p.param.set_data(param_view(full_, p));
  unsharded_ = true;
  return waited;
}

void FlatParamHandle::set_sharded_data() {
  for (auto& p : params_) {
    if (use_orig_params_ || aliased_) {
      p.param.set_data(sharded_view(flat_shard_, p));
    } else {
      p.param.set_data(at::empty({0}, flat_shard_.options()));
    }
  }
}

void FlatParamHandle::reshard() {
  if (gathering_) finish_unshard();  // the backend is still writing into full_
  if (!unsharded_ || aliased_) return;
  set_sharded_data();
  free_full();
  unsharded_ = false;
}

void FlatParamHandle::follow_module_to(const std::string& owner) {
  if (gathering_) return;
  at::NoGradGuard no_grad;
  if (use_orig_params_) {
    // Module::to() gave each original parameter data of its own.
    const at::Tensor& home = unsharded_ && !aliased_ ? full_ : flat_shard_;
    std::optional<at::TensorOptions> moved;
    for (const auto& p : params_) {
      if (p.param.is_alias_of(home)) continue;
      if (moved && (moved->dtype() != p.param.dtype() || moved->device() != p.param.device())) {
        throw ConfigError("FSDP: the parameters of the unit at module " + owner +
                          " were moved to different dtypes or devices; expected one dtype and device per unit");
      }
      moved = p.param.options();
    }
    if (!moved) return;
    if (unsharded_ && !aliased_) {
      throw ConfigError("FSDP: Module::to() on the unit at module " + owner +
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
  compute_dtype_ = param_dtype_.value_or(flat_shard_.scalar_type());
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

void FlatParamHandle::register_original_params(torch::nn::Module& module) {
  if (use_orig_params_ || params_.empty()) return;
  parameters_of(module).erase("flat_param");
  for (const auto& p : params_) {
    for (const auto& [owner, key] : p.places) parameters_of(*owner).insert(key, p.param);
  }
}

void FlatParamHandle::register_flat_param(torch::nn::Module& module) {
  if (use_orig_params_ || params_.empty()) return;
  for (const auto& p : params_) {
    for (const auto& [owner, key] : p.places) parameters_of(*owner).erase(key);
  }
  parameters_of(module).insert("flat_param", flat_shard_);
}

at::Tensor FlatParamHandle::gather_master() const {
  at::NoGradGuard no_grad;
  if (shard_size_ == 1 || padded_numel_ == 0) return flat_shard_.clone();
  at::Tensor full = at::empty({padded_numel_}, flat_shard_.options().requires_grad(false));
  shard_group_->all_gather_unbuffered(full, flat_shard_.detach());  // one unit of memory, not two
  return full;
}

int64_t FlatParamHandle::live_full_bytes() const {
  if (aliased_) return 0;
  return static_cast<int64_t>(full_.storage().nbytes());
}

}  // namespace fsdp::detail
