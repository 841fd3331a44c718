// FSDP2's collectives (collectives.h), as torch's _fsdp_collectives.py
// makes them.
#include "collectives.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "fsdp/error.h"

namespace fsdp::detail {

int64_t all_gather_numel(const FSDPParam& p, at::ScalarType dtype) {
  return dtype == at::kByte ? p.padded_numel() * static_cast<int64_t>(c10::elementSize(p.compute_dtype()))
                            : p.padded_numel();
}

AllGatherResult foreach_all_gather(const std::vector<FSDPParam>& params, const dist::ProcessGroupPtr& group,
                                   at::Tensor post_forward_shard) {
  at::NoGradGuard no_grad;
  AllGatherResult r;
  // One dtype for the whole gather: the parameters' compute dtype, or bytes
  // when they differ (torch's uint8 all-gather).
  r.dtype = params.empty() ? at::kFloat : params[0].compute_dtype();
  for (const auto& p : params) {
    if (p.compute_dtype() != r.dtype) r.dtype = at::kByte;
  }
  for (const auto& p : params) r.block += all_gather_numel(p, r.dtype);
  const auto opts = at::TensorOptions().dtype(r.dtype).device(group->device());
  r.from_post_forward = post_forward_shard.defined();
  at::Tensor in;
  if (r.from_post_forward) {
    in = std::move(post_forward_shard);  // resharded after forward to the smaller group: gather within it
  } else {
    in = at::empty({r.block}, opts);
    int64_t off = 0;
    for (const auto& p : params) {
      at::Tensor src = p.padded().to(p.compute_dtype());
      if (r.dtype == at::kByte) src = src.view(at::kByte);
      const int64_t n = all_gather_numel(p, r.dtype);
      in.narrow(0, off, n).copy_(src);
      off += n;
    }
  }
  if (group->size() == 1) {
    r.out = in;
  } else {
    r.out = at::empty({in.numel() * group->size()}, opts);
    r.work = group->all_gather(r.out, in);
  }
  return r;
}

void foreach_all_gather_copy_out(AllGatherResult& result, std::vector<FSDPParam>& params, int shard_size,
                                 int post_forward_size) {
  result.work.wait();
  at::NoGradGuard no_grad;
  // Where rank r's piece of a parameter (at offset `off` of a block, `pn`
  // long) lies in the output: the shard group's gather holds W blocks of
  // every parameter's rows, rank after rank; the post-forward group's
  // gather holds its members' post-forward shards (post_forward_shard),
  // each W / n ranks' blocks of every parameter.
  const int64_t per_member = result.from_post_forward ? shard_size / post_forward_size : 1;
  const int64_t block = result.block;
  auto source = [&](int r, int64_t off, int64_t pn) {
    if (!result.from_post_forward) return r * block + off;
    return (r / per_member) * per_member * block + per_member * off + (r % per_member) * pn;
  };
  int64_t off = 0;
  for (auto& p : params) {
    const at::Tensor& full = p.alloc_all_gather_output();
    at::Tensor dst = result.dtype == at::kByte ? full.view(at::kByte) : full;
    const int64_t pn = all_gather_numel(p, result.dtype);
    for (int r = 0; r < shard_size; ++r) dst.narrow(0, r * pn, pn).copy_(result.out.narrow(0, source(r, off, pn), pn));
    off += pn;
  }
  result.out = at::Tensor();
  result.work = dist::Work();
}

at::Tensor post_forward_shard(const std::vector<FSDPParam>& params, const AllGatherResult& layout, int shard_size,
                              int n, int rank) {
  // This rank keeps, of every parameter, the blocks of the W / n shard-group
  // ranks its post-forward index stands for.
  const int64_t per_member = shard_size / n;
  const int64_t first = rank * per_member;
  at::NoGradGuard no_grad;
  at::Tensor keep = at::empty({layout.block * per_member}, params.empty() ? at::TensorOptions()
                                                                           : params[0].all_gather_output().options().dtype(layout.dtype));
  int64_t off = 0;
  for (const auto& p : params) {
    const at::Tensor& full = p.all_gather_output();
    const at::Tensor src = layout.dtype == at::kByte ? full.view(at::kByte) : full;
    const int64_t pn = all_gather_numel(p, layout.dtype);
    keep.narrow(0, per_member * off, per_member * pn).copy_(src.narrow(0, first * pn, per_member * pn));
    off += pn;
  }
  return keep;
}

DivideFactors gradient_divide_factors(int rs_size, int ar_size, at::ScalarType reduce_dtype,
                                      std::optional<double> factor, bool force_sum, const std::string& module) {
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

ReduceScatter foreach_reduce_scatter(const std::vector<FSDPParam>& params, const std::vector<size_t>& indices,
                                     std::vector<at::Tensor> grads, at::ScalarType reduce_dtype,
                                     const DivideFactors& factors, const dist::ProcessGroupPtr& group,
                                     std::optional<double> divide_factor) {
  at::NoGradGuard no_grad;
  int64_t block = 0;
  for (size_t i : indices) block += params[i].padded_numel();
  const int w = group->size();
  // torch's chunk_cat: block r holds every parameter's padded rows of rank r.
  at::Tensor input = at::zeros({block * w}, params[indices[0]].padded().options().dtype(reduce_dtype));
  int64_t off = 0;
  for (size_t k = 0; k < indices.size(); ++k) {
    const FSDPParam& p = params[indices[k]];
    const at::Tensor g = grads[k].reshape({-1}).to(reduce_dtype);
    grads[k] = at::Tensor();  // the full gradient's memory goes as soon as it is copied in
    const int64_t pn = p.padded_numel();
    for (int r = 0; r < w; ++r) {
      const int64_t n = std::min(pn, std::max<int64_t>(0, p.numel() - r * pn));
      if (n > 0) input.narrow(0, r * block + off, n).copy_(g.narrow(0, r * pn, n));
    }
    off += pn;
  }
  div_if_needed(input, factors.pre);
  ReduceScatter rs;
  rs.input = input;
  rs.params = indices;
  rs.output = at::empty({block}, input.options());
  if (w > 1) {
    rs.work = group->reduce_scatter(rs.output, input, factors.reduce_scatter_op);
  } else if (divide_factor && *divide_factor != 1.0) {
    rs.output.copy_(input / *divide_factor);
  } else {
    rs.output.copy_(input);
  }
  // The all-reduce across replicas and the division after it run when the
  // reduction completes.
  rs.post = factors.post;
  rs.all_reduce_op = factors.all_reduce_op;
  return rs;
}

void all_reduce_replicas(at::Tensor& output, const dist::ProcessGroupPtr& replicas, dist::ReduceOp op) {
  if (replicas && replicas->size() > 1) replicas->all_reduce(output, op).wait();
}

}  // namespace fsdp::detail
