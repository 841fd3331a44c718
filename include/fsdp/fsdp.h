// fsdp/fsdp.h — Fully Sharded Data Parallel for LibTorch modules: the whole
// FSDP API in one include, as torch/torch.h is LibTorch's. Each part has its
// own header in fsdp/core/:
//   options.h                    FSDPOptions, sharding strategies, mixed precision,
//                                CPU offload, backward prefetch, auto-wrap policies
//   fully_sharded_data_parallel.h  FullyShardedDataParallel, Unit, EmptyInitGuard
//   utils.h                      no_sync, summon_full_params, clip_grad_norm_,
//                                check_optimizer, memory and runtime statistics
//   unit_list.h                  UnitList, a ModuleList whose elements are units
//   activation_checkpointing.h   CheckpointWrapper, apply_activation_checkpointing
// FSDP2 (fully_shard, per-parameter sharding) is fsdp/fsdp2/fully_shard.h,
// and the mesh and DTensor both engines lay tensors on are in fsdp/dtensor/,
// included here too. The strategy layer is fsdp/strategy/strategy.h, state dicts are in
// fsdp/state_dict/, checkpoints on disk in fsdp/checkpoint/.
#pragma once

#include "fsdp/core/activation_checkpointing.h"
#include "fsdp/core/fully_sharded_data_parallel.h"
#include "fsdp/core/options.h"
#include "fsdp/core/unit_list.h"
#include "fsdp/core/utils.h"
#include "fsdp/dtensor/dtensor.h"
#include "fsdp/fsdp2/fully_shard.h"
