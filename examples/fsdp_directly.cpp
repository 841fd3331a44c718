// The "FSDP directly" example of docs/usage.md as a whole program: blocks wrapped
// with fsdp::FullyShardedDataParallel, a few training steps on random data,
// then its state dicts (FULL, saved and loaded back) and a sharded
// checkpoint on disk (in a temporary directory, removed at the end). Run:
//   build/bin/fsdp-run --nproc-per-node 2 -- build/bin/example-fsdp-directly
// Without a launcher it runs as rank 0 of 1. docs/usage.md shows the regions
// between "// [readme:NAME]" and "// [/readme]" (scripts/check_readme_snippets.py
// keeps them equal).
#include <fsdp/checkpoint/checkpoint_io.h>
#include <fsdp/distributed/process_group.h>
#include <fsdp/state_dict/optim_state_dict.h>
#include <fsdp/state_dict/state_dict.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <stdexcept>
#include <string>

// After training: docs/usage.md's state dicts and checkpoint (defined below main).
template <class Model>
void save_and_load(Model& model, torch::optim::Optimizer& optimizer, const fsdp::dist::ProcessGroupPtr& world, int step);

// [readme:fsdp-directly]
#include <fsdp/fsdp.h>
#include <torch/torch.h>

struct BlockImpl : torch::nn::Module {
  BlockImpl() { fc = register_module("fc", torch::nn::Linear(16, 16)); }
  torch::Tensor forward(torch::Tensor x) { return x + torch::tanh(fc(x)); }
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(Block);

struct NetImpl : torch::nn::Module {
  NetImpl() {
    blocks = register_module("blocks", torch::nn::Sequential(Block(), Block()));  // auto-wrappable as is
    head = register_module("head", fsdp::Unit<BlockImpl>(std::make_shared<BlockImpl>()));  // plain until wrapped
  }
  torch::Tensor forward(torch::Tensor x) { return head(blocks->forward(x)); }  // head(x), not head->forward(x)
  torch::nn::Sequential blocks{nullptr};
  fsdp::Unit<BlockImpl> head{nullptr};
};

int main() {
  auto world = fsdp::dist::init_process_group_from_env();  // torchrun / fsdp-run environment; none: rank 0 of 1
  auto options = fsdp::FSDPOptions()  // chainable setters, as LibTorch's options
                     .process_group(world)
                     .sharding_strategy(fsdp::ShardingStrategy::kFullShard)
                     .auto_wrap_policy(fsdp::transformer_auto_wrap_policy<BlockImpl>());
  fsdp::FullyShardedDataParallel<NetImpl> model(std::make_shared<NetImpl>(), options);
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-3));  // after wrapping
  torch::manual_seed(world->rank());  // each rank draws its own batches
  for (int step = 0; step < 10; ++step) {
    auto x = torch::randn({8, 16}), y = x.flip(1);  // this rank's part of the global batch
    optimizer.zero_grad();
    auto loss = torch::mse_loss(model(x), y);  // model(x): the root's forward goes through FSDP
    loss.backward();                           // gradients reduce-scattered unit by unit
    fsdp::clip_grad_norm_(model.ptr(), 1.0);
    optimizer.step();                          // steps this rank's shards
  }
  save_and_load(model, optimizer, world, /*step=*/10);  // state dicts and a checkpoint: below
}
// [/readme]

// Throws unless the model's full parameters are those of `before`.
static void expect_parameters(const std::shared_ptr<torch::nn::Module>& model,
                              const std::vector<std::pair<std::string, at::Tensor>>& before, const std::string& what) {
  auto now = fsdp::full_parameters(model);  // [collective]
  if (now.size() != before.size()) throw std::runtime_error(what + " changed the model's parameter count");
  for (size_t i = 0; i < now.size(); ++i) {
    if (now[i].first != before[i].first || !torch::equal(now[i].second, before[i].second)) {
      throw std::runtime_error(what + " changed parameter " + now[i].first);
    }
  }
}

template <class Model>
void save_and_load(Model& model, torch::optim::Optimizer& optimizer, const fsdp::dist::ProcessGroupPtr& world, int step) {
  const auto trained = fsdp::full_parameters(model.ptr());  // [collective] to compare with after each load

  // [readme:state-dict]
  fsdp::StateDict weights;
  fsdp::OptimStateDict opt;
  {
    fsdp::StateDictTypeGuard guard(model.ptr(), fsdp::StateDictType::kFull);  // FullStateDictConfig{rank0_only, offload}
    weights = fsdp::state_dict(model.ptr());                          // collective: full tensors, unwrapped names
    opt = fsdp::optim_state_dict(model.ptr(), optimizer);             // keyed by parameter names
  }
  fsdp::load_state_dict(model.ptr(), weights);                          // any FSDP layout, or an unwrapped model
  fsdp::load_optim_state_dict(model.ptr(), optimizer, opt);             // any world size
  // [/readme]
  expect_parameters(model.ptr(), trained, "loading the state dict");
  if (!weights.contains("blocks.0.fc.weight") || !opt.state.contains("head.fc.weight.exp_avg")) {
    throw std::runtime_error("the state dicts lack the unwrapped model's names");
  }

  // A fresh directory, the same on every rank: rank 0 makes it.
  std::string made;
  if (world->rank() == 0) {
    made = (std::filesystem::temp_directory_path() / "fsdp-example-XXXXXX").string();
    if (mkdtemp(made.data()) == nullptr) throw std::runtime_error("cannot make a directory for " + made);
  }
  const std::string dir = world->broadcast_bytes(made, 0);
  const std::string path = dir + "/latest";

  // [readme:checkpoint]
  fsdp::CheckpointState state;
  state.model("model", model.ptr()).optimizer("optimizer", optimizer).value("step", int64_t{step});
  fsdp::save_checkpoint(path, state, *world, {fsdp::CheckpointFormat::kSharded});  // or kFull: one file
  auto extra = fsdp::load_checkpoint(path, state, *world);  // any world size; fills "step"
  // [/readme]
  expect_parameters(model.ptr(), trained, "loading the checkpoint");
  if (state.get<int64_t>("step") != step || !extra.empty()) throw std::runtime_error("the checkpoint's values differ");
  const bool sharded = std::filesystem::is_directory(path);
  world->barrier();  // every rank has loaded it
  if (world->rank() == 0) {
    std::filesystem::remove_all(dir);
    std::cout << "example-fsdp-directly: world " << world->size() << ", " << step << " steps; " << weights.size()
              << " tensors in the full state dict, " << opt.state.size() << " in the optimizer's; "
              << (sharded ? "a sharded" : "a") << " checkpoint saved and loaded back at step "
              << state.get<int64_t>("step") << std::endl;
  }
}
