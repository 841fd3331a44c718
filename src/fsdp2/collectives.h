// src/fsdp2/collectives.h — FSDP2's collectives as free functions over a
// group's parameters (torch's _fsdp_collectives.py): the all-gather with
// its copy-in and copy-out, the reduce-scatter with its chunk_cat copy-in,
// the all-reduce across replicas (HSDP) and the divisions around them.
// Private to the fsdp2 module. Each function that issues a collective says
// so; every rank calls it with the same parameters in the same order.
//
// The layout (fsdp_param.h) is torch's, so that every collective moves and
// sums what torch's moves and sums:
//  - the all-gather input is the concatenation of every parameter's padded
//    shard (`block` elements, or bytes); the output is W such blocks, rank
//    after rank; each parameter's full form is copied out of its W pieces;
//  - the reduce-scatter input is W blocks, block r holding every
//    parameter's padded rows r (torch's chunk_cat), zero padding included;
//    the output is this rank's block, each sharded gradient a slice of it.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <vector>

#include "fsdp/distributed/process_group.h"
#include "fsdp_param.h"

namespace fsdp::detail {

// An all-gather in flight (torch's AllGatherResult).
struct AllGatherResult {
  dist::Work work;
  at::Tensor out;
  int64_t block = 0;                  // one rank's elements (bytes for kByte)
  at::ScalarType dtype = at::kFloat;  // the compute dtype, or kByte when the parameters' differ
  bool from_post_forward = false;     // gathered within the post-forward group
};

// One rank's elements of `p` in an all-gather of `dtype` (bytes for kByte).
int64_t all_gather_numel(const FSDPParam& p, at::ScalarType dtype);

// [collective over `group`, issued, not waited] torch's foreach_all_gather:
// copies every parameter's shard, cast to its compute dtype, into one
// block (the copy-in; bytes when the dtypes differ, torch's uint8
// all-gather) and all-gathers it. With `post_forward_shard` defined (a
// reshard to the post-forward group), gathers that within `group` instead.
AllGatherResult foreach_all_gather(const std::vector<FSDPParam>& params, const dist::ProcessGroupPtr& group,
                                   at::Tensor post_forward_shard);

// [local; waits for the gather] torch's foreach_all_gather_copy_out: gives
// each parameter's full form memory and copies its W pieces into it.
// `shard_size`: W; `post_forward_size`: the post-forward group's size when
// the gather was within it.
void foreach_all_gather_copy_out(AllGatherResult& result, std::vector<FSDPParam>& params, int shard_size,
                                 int post_forward_size);

// [local] Of every (unsharded) parameter's full form, the blocks of the
// W / n shard-group ranks that post-forward rank `rank` of n stands for,
// packed as that group's all-gather input: 1/n of the full parameters.
at::Tensor post_forward_shard(const std::vector<FSDPParam>& params, const AllGatherResult& layout, int shard_size,
                              int n, int rank);

// torch's _get_gradient_divide_factors: the reduce-scatter's and the
// all-reduce's operations, and the divisions before and after them.
// ConfigError for a divide factor that needs PREMUL_SUM (Gloo has none).
struct DivideFactors {
  std::optional<double> pre, post;
  dist::ReduceOp reduce_scatter_op = dist::ReduceOp::kSum;
  dist::ReduceOp all_reduce_op = dist::ReduceOp::kSum;
};
DivideFactors gradient_divide_factors(int rs_size, int ar_size, at::ScalarType reduce_dtype,
                                      std::optional<double> factor, bool force_sum, const std::string& module);

// A reduce-scatter in flight, and what its completion needs.
struct ReduceScatter {
  dist::Work work;
  at::Tensor input, output;
  std::vector<size_t> params;  // the group's parameters in it, in order
  std::optional<double> post;  // the division after the reduction
  dist::ReduceOp all_reduce_op = dist::ReduceOp::kSum;  // across replicas (2-D mesh)
};

// [collective over `group` when it has more than one rank; issued, not
// waited] torch's foreach_reduce, its first half: the chunk_cat copy-in of
// the full gradients `grads` of params[indices[i]] in `reduce_dtype` (each
// released once copied: pass the only references), the
// division before, the reduce-scatter. `divide_factor`: the module's (a
// group of one rank divides by it instead of reducing).
ReduceScatter foreach_reduce_scatter(const std::vector<FSDPParam>& params, const std::vector<size_t>& indices,
                                     std::vector<at::Tensor> grads, at::ScalarType reduce_dtype,
                                     const DivideFactors& factors, const dist::ProcessGroupPtr& group,
                                     std::optional<double> divide_factor);

// [collective over `replicas` when it has more than one rank] The second
// half: the all-reduce of a reduce-scattered `output` across replicas
// (HSDP), waited.
void all_reduce_replicas(at::Tensor& output, const dist::ProcessGroupPtr& replicas, dist::ReduceOp op);

// Divides `t` in place unless `d` is unset or 1 (torch's _div_if_needed).
void div_if_needed(at::Tensor& t, const std::optional<double>& d);

}  // namespace fsdp::detail
