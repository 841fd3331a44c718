// fsdp/state_dict/distributed_state_dict.h — PyTorch's
// torch.distributed.checkpoint.state_dict API (get_model_state_dict,
// get_optimizer_state_dict, their setters, StateDictOptions) for every
// fsdp-cpp model: one that fully_shard sharded (FSDP2), one wrapped by
// FullyShardedDataParallel (FSDP1), or a plain module.
//
//   auto sd = fsdp::get_model_state_dict(model.ptr());          // sharded: no bytes move
//   auto full = fsdp::get_model_state_dict(model.ptr(), fsdp::StateDictOptions().full_state_dict(true));
//   fsdp::set_model_state_dict(model.ptr(), sd);
//   auto osd = fsdp::get_optimizer_state_dict(model.ptr(), optimizer);
//   fsdp::set_optimizer_state_dict(model.ptr(), optimizer, osd);
//
// The forms are those of fsdp/state_dict/state_dict.h and
// fsdp/state_dict/optim_state_dict.h, keyed as the unwrapped model's
// state_dict() (the optimizer's by "<parameter>.<field>"):
//  - sharded (full_state_dict false, the default): every sharded parameter
//    as a ShardedTensor of what this rank holds. For FSDP2 that is torch's
//    DTensor with Shard(0): one piece, this rank's rows, at offset
//    (row_offset, 0, ...), the parameter's own memory. Local: no collective,
//    no copy. For FSDP1 it is SHARDED_STATE_DICT (boxes of the flat shard).
//  - full (full_state_dict true): whole tensors, gathered parameter by
//    parameter (FSDP2) or unit by unit (FSDP1) — collectives.
// Values of either form load into a model of any world size and either
// engine: each rank copies the part it holds out of a whole tensor or of
// any ShardedTensor that covers it.
#pragma once

#include <torch/arg.h>

#include <memory>
#include <utility>

#include "fsdp/state_dict/optim_state_dict.h"
#include "fsdp/state_dict/state_dict.h"

namespace torch::nn {
class Module;
}
namespace torch::optim {
class Optimizer;
}

namespace fsdp {

// torch.distributed.checkpoint.state_dict.StateDictOptions, in LibTorch's
// TORCH_ARG idiom: fsdp::StateDictOptions().full_state_dict(true).cpu_offload(true).
struct StateDictOptions {
  // Whole tensors (gathered) instead of each rank's pieces.
  TORCH_ARG(bool, full_state_dict) = false;
  // Every tensor on CPU. With full_state_dict only rank 0 receives the
  // tensors; the other ranks get an empty state dict (torch's rule, against
  // running out of host memory).
  TORCH_ARG(bool, cpu_offload) = false;
  // Parameters with requires_grad false are left out, and not gathered
  // (a LoRA checkpoint holds the adapters only).
  TORCH_ARG(bool, ignore_frozen_params) = false;
  // Setters: every key of the model present and no other (ConfigError
  // listing all of them). A shape that differs is an error either way.
  TORCH_ARG(bool, strict) = true;
  // Setters: only rank 0 passes the (full) state dict; the others may pass
  // an empty one. Rank 0's tensors are broadcast one at a time, and each
  // rank keeps only the part it holds. Needs full_state_dict.
  TORCH_ARG(bool, broadcast_from_rank0) = false;
};

// [collective with full_state_dict (one all-gather per parameter or unit);
// local otherwise] The model's state dict (see the top of this file).
// Parameters outside every sharded module and buffers come as they are.
StateDict get_model_state_dict(const std::shared_ptr<torch::nn::Module>& model, const StateDictOptions& options = {});

// [local; collective over the model's shard and replicate groups with
// broadcast_from_rank0: one bytes broadcast, then one broadcast per tensor]
// Loads `state` (either form, any world size or engine at save) into the
// model. ConfigError, before anything is written, for missing or
// unexpected keys (strict), shapes that differ, pieces that do not hold
// what this rank needs, and broadcast_from_rank0 without full_state_dict or
// on a model that is not sharded (it travels over the model's groups).
void set_model_state_dict(const std::shared_ptr<torch::nn::Module>& model, const StateDict& state,
                          const StateDictOptions& options = {});

// [collective with full_state_dict (over each shard group: one small
// all-reduce of which state exists, then one all-gather per tensor);
// local otherwise] The state of `optimizer`, which steps the model's
// parameters (built on model->parameters() after sharding). For FSDP2 each
// state tensor is sharded as its parameter. Supported optimizers:
// fsdp::optim::AdamW and LibTorch's SGD, Adam, AdamW, Adagrad, RMSprop;
// others (LBFGS among them: it needs global reductions) are a ConfigError.
OptimStateDict get_optimizer_state_dict(const std::shared_ptr<torch::nn::Module>& model,
                                        const torch::optim::Optimizer& optimizer,
                                        const StateDictOptions& options = {});

// [local; collective with broadcast_from_rank0, as set_model_state_dict]
// Loads `state` into `optimizer`: hyper-parameters per group and the state
// of every parameter it names, this rank's part of each tensor.
// ConfigError listing every problem at once (load_optim_state_dict).
void set_optimizer_state_dict(const std::shared_ptr<torch::nn::Module>& model, torch::optim::Optimizer& optimizer,
                              const OptimStateDict& state, const StateDictOptions& options = {});

// [collective as the two getters] torch's get_state_dict(model, optimizer):
// get_model_state_dict then get_optimizer_state_dict, with the same options.
std::pair<StateDict, OptimStateDict> get_state_dict(const std::shared_ptr<torch::nn::Module>& model,
                                                    const torch::optim::Optimizer& optimizer,
                                                    const StateDictOptions& options = {});

// [as the two setters] torch's set_state_dict(model, optimizer, ...):
// set_model_state_dict then set_optimizer_state_dict, with the same options.
void set_state_dict(const std::shared_ptr<torch::nn::Module>& model, torch::optim::Optimizer& optimizer,
                    const StateDict& model_state_dict, const OptimStateDict& optim_state_dict,
                    const StateDictOptions& options = {});

}  // namespace fsdp
