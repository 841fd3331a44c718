// Trains a small GPT on 2+ ranks through fsdp::FSDPStrategy, then saves a
// sharded checkpoint and loads it back. Run:
//   build/bin/fsdp-run --nproc-per-node 2 -- build/bin/example-strategy [CHECKPOINT_DIR]
#include <fsdp/models/gpt.h>
#include <fsdp/strategy/registry.h>
#include <fsdp/strategy/strategy.h>
#include <torch/torch.h>

// This rank's part of a batch of random text (the strategy seeds every rank
// alike, so the batch is the same everywhere): inputs and next-byte targets.
static std::pair<torch::Tensor, torch::Tensor> this_ranks_batch(const fsdp::FSDPStrategy& strategy,
                                                                const fsdp::models::GPTConfig& config) {
  auto text = torch::randint(0, 256, {16, config.context + 1});  // same on every rank (seeded)
  const auto [replicas, rank] = strategy.distributed_sampler_kwargs();
  auto mine = text.chunk(static_cast<int64_t>(replicas))[static_cast<int64_t>(rank)].to(strategy.root_device());
  return {mine.narrow(1, 0, config.context), mine.narrow(1, 1, config.context)};
}

int main(int argc, char** argv) {
  const std::string path = argc > 1 ? argv[1] : "example-checkpoint";
  // The README's strategy example (scripts/check_readme_snippets.py keeps them equal).
  // [readme:strategy]
  using namespace fsdp;
  FSDPStrategy strategy(StrategyRegistry::instance()
                            .options("fsdp")  // or "fsdp_cpu_offload", picked by name
                            .auto_wrap_module_types<models::GPTBlockImpl>()
                            .activation_checkpointing_module_types<models::GPTBlockImpl>()
                            .precision("bf16-mixed")
                            .state_dict_type(CheckpointFormat::kSharded));
  strategy.setup_environment();  // joins the job fsdp-run started
  models::GPTConfig config{256, 32, 64, 2, 4};
  std::shared_ptr<models::GPTImpl> net;
  {
    auto init = strategy.module_init_context(/*empty_init=*/true);  // blocks get memory unit by unit at setup
    net = std::make_shared<models::GPTImpl>(config);
  }
  auto model = strategy.setup_module(net);
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(3e-3));
  strategy.setup_optimizer(optimizer);
  auto [x, y] = this_ranks_batch(strategy, config);  // with strategy.distributed_sampler_kwargs()
  for (int step = 0; step < 20; ++step) {
    optimizer.zero_grad();
    auto loss = models::gpt_loss(model(x), y);
    strategy.backward(loss);  // loss.backward(), scaled under "16-mixed"
    strategy.clip_gradients_norm(model.ptr(), optimizer, 1.0);
    strategy.optimizer_step(optimizer);
    auto mean = strategy.all_reduce(loss.detach().to(torch::kFloat));  // the mean over the ranks
    if (step % 5 == 0) strategy.print("step " + std::to_string(step) + " loss " + std::to_string(mean.item<float>()));
  }
  CheckpointState state;
  state.model("model", model.ptr()).optimizer("optimizer", optimizer).value("step", int64_t{20});
  strategy.save_checkpoint(path, state);  // and strategy.load_checkpoint(path, state), at any world size
  // [/readme]
  strategy.load_checkpoint(path, state);
  strategy.print("saved and reloaded " + path + " at step " + std::to_string(state.get<int64_t>("step")));
}
