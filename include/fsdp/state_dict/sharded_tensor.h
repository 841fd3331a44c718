// fsdp/state_dict/sharded_tensor.h — a state dict's value: a whole tensor or
// this rank's pieces of one (fsdp::Shard and fsdp::ShardedTensor, which live
// in fsdp/dtensor/shards.h, below both engines). Local: no collective.
#pragma once

#include <ATen/core/Tensor.h>

#include <variant>

#include "fsdp/dtensor/shards.h"

namespace fsdp {

// A state dict's value: a whole tensor or this rank's pieces of one.
using StateValue = std::variant<at::Tensor, ShardedTensor>;

}  // namespace fsdp
