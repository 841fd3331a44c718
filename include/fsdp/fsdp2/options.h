// fsdp/fsdp2/options.h — what fully_shard is told (fsdp/fsdp2/fully_shard.h):
// the mesh, torch's MixedPrecisionPolicy and OffloadPolicy, and
// reshard_after_forward. Values only: nothing here communicates or allocates.
#pragma once

#include <c10/core/ScalarType.h>
#include <torch/arg.h>

#include <optional>
#include <string>
#include <vector>

#include "fsdp/distributed/process_group.h"
#include "fsdp/dtensor/device_mesh.h"  // fsdp::Mesh (1-D: FSDP; 2-D (replicate, shard): HSDP)

namespace fsdp {

// torch's MixedPrecisionPolicy. Unset dtypes: the parameter's own.
//  - param_dtype: the dtype of the full parameters (all-gathered in it) and
//    of forward and backward;
//  - reduce_dtype: the dtype gradients are reduced in (unset: as torch 2.15,
//    the parameters' own — bfloat16 compute reduces in float32 — or, with a
//    LibTorch without grad_dtype, the gradients');
//  - output_dtype: forward outputs of floating point are cast to it;
//  - cast_forward_inputs: floating-point forward inputs are cast to param_dtype.
// The optimizer always steps the shards in the parameters' own dtype.
struct MixedPrecisionPolicy {
  std::optional<at::ScalarType> param_dtype;
  std::optional<at::ScalarType> reduce_dtype;
  std::optional<at::ScalarType> output_dtype;
  bool cast_forward_inputs = true;
};

// torch's OffloadPolicy (CPUOffloadPolicy when offload_params). On a CPU
// mesh (Gloo) everything already lives on CPU: accepted, it changes nothing,
// as in torch. On CUDA it is not implemented yet: fully_shard refuses it.
struct OffloadPolicy {
  bool offload_params = false;
  bool pin_memory = true;
};

// reshard_after_forward: true (free the full parameters after forward,
// gather again in backward), false (keep them until backward ends), or the
// size of a smaller group to keep them sharded over in between (a factor of
// the shard size; equal to it means true).
class ReshardAfterForward {
 public:
  /* implicit */ ReshardAfterForward(bool reshard) : size_(reshard ? kAll : 0), is_bool_(true) {}
  /* implicit */ ReshardAfterForward(int size) : size_(size), is_bool_(false) {}
  bool is_bool() const { return is_bool_; }
  // 0: false; -1: true; else the group size given.
  int size() const { return size_; }
  static constexpr int kAll = -1;

 private:
  int size_;
  bool is_bool_;
};

// fully_shard's arguments, in LibTorch's TORCH_ARG idiom.
struct FullyShardOptions {
  FullyShardOptions() = default;
  /* implicit */ FullyShardOptions(Mesh mesh) : mesh_(std::move(mesh)) {}
  // Required: the mesh (a 1-D mesh of the world group, usually).
  TORCH_ARG(Mesh, mesh);
  // Unset: false for the root (the module whose forward runs first), true
  // for the others, as torch.
  TORCH_ARG(std::optional<ReshardAfterForward>, reshard_after_forward);
  TORCH_ARG(MixedPrecisionPolicy, mp_policy);
  TORCH_ARG(OffloadPolicy, offload_policy);
  // Parameters left whole and unsharded on every rank, outside every group
  // (their gradients are not reduced either, as in torch).
  TORCH_ARG(std::vector<at::Tensor>, ignored_params);
};

}  // namespace fsdp
