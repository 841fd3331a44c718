// An ordinary LibTorch model and training loop, sharded with FSDP: the
// changes docs/porting.md walks through are marked "FSDP:". Run:
//   build/bin/fsdp-run --nproc-per-node 2 -- build/bin/example-port-a-model
// Without a launcher it runs as rank 0 of 1.
#include <fsdp/distributed/process_group.h>
#include <fsdp/fsdp.h>
#include <fsdp/core/unit_list.h>
#include <torch/torch.h>

#include <iostream>

// A pre-norm residual MLP block: TORCH_MODULE members, as usual.
struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(int64_t dim) {
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})));
    fc1 = register_module("fc1", torch::nn::Linear(dim, 4 * dim));
    fc2 = register_module("fc2", torch::nn::Linear(4 * dim, dim));
  }
  torch::Tensor forward(torch::Tensor x) { return x + fc2(torch::gelu(fc1(norm(x)))); }
  torch::nn::LayerNorm norm{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Block);

// Predicts the next byte from the current one: an embedding, a list of
// blocks, a head.
struct NetImpl : torch::nn::Module {
  NetImpl(int64_t vocab, int64_t dim, int64_t layers) {
    emb = register_module("emb", torch::nn::Embedding(vocab, dim));
    // FSDP: was `torch::nn::ModuleList blocks;` with `blocks->push_back(Block(dim));`.
    for (int64_t i = 0; i < layers; ++i) blocks->emplace_back(dim);
    register_module("blocks", blocks);
    head = register_module("head", torch::nn::Linear(dim, vocab));
  }
  torch::Tensor forward(torch::Tensor tokens) {
    auto x = emb(tokens);
    // FSDP: was `for (const auto& b : *blocks) x = b->as<BlockImpl>()->forward(x);`.
    for (auto& block : *blocks) x = block(x);
    return head(x);
  }
  torch::nn::Embedding emb{nullptr};
  fsdp::UnitList<BlockImpl> blocks;  // FSDP: was torch::nn::ModuleList
  torch::nn::Linear head{nullptr};
};

// Byte pairs (current, next) of a repeated sentence, through torch::data.
struct NextByte : torch::data::datasets::Dataset<NextByte> {
  explicit NextByte(std::string text) : text_(std::move(text)) {}
  torch::data::Example<> get(size_t i) override {
    return {torch::tensor(static_cast<int64_t>(static_cast<unsigned char>(text_[i]))),
            torch::tensor(static_cast<int64_t>(static_cast<unsigned char>(text_[i + 1])))};
  }
  torch::optional<size_t> size() const override { return text_.size() - 1; }
  std::string text_;
};

int main() {
  try {
    // FSDP: the process group from the launcher's environment (fsdp-run,
    // torchrun, srun, mpirun; none: rank 0 of 1).
    auto pg = fsdp::dist::init_process_group_from_env();
    torch::manual_seed(0);  // the same initial weights on every rank
    auto net = std::make_shared<NetImpl>(256, 64, 4);
    // FSDP: wrap; each block becomes a unit (its parameters sharded across
    // the ranks), the rest belongs to the root unit.
    fsdp::FullyShardedDataParallel<NetImpl> model(
        net, fsdp::FSDPOptions().process_group(pg).auto_wrap_policy(fsdp::transformer_auto_wrap_policy<BlockImpl>()));
    // FSDP: the optimizer takes the wrapped model's parameters (this rank's shards).
    torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(3e-3));

    std::string text;
    for (int i = 0; i < 40; ++i) text += "the quick brown fox jumps over the lazy dog. ";
    auto dataset = NextByte(text).map(torch::data::transforms::Stack<>());
    // FSDP: each rank draws its part of every epoch (was a RandomSampler).
    torch::data::samplers::DistributedRandomSampler sampler(*dataset.size(), static_cast<size_t>(pg->size()),
                                                            static_cast<size_t>(pg->rank()));
    double first = 0, last = 0;
    for (size_t epoch = 0; epoch < 3; ++epoch) {
      sampler.set_epoch(epoch);  // a different order each epoch, the same on every rank
      auto loader = torch::data::make_data_loader(dataset, sampler, torch::data::DataLoaderOptions(64));
      for (auto& batch : *loader) {
        optimizer.zero_grad();
        auto loss = torch::nn::functional::cross_entropy(model(batch.data), batch.target);
        loss.backward();
        optimizer.step();
        // FSDP: each rank has its own batch; the mean over the ranks is the loss.
        auto mean = loss.detach().reshape({1});
        pg->all_reduce(mean, fsdp::dist::ReduceOp::kAvg).wait();
        if (first == 0) first = mean.item<double>();
        last = mean.item<double>();
      }
    }
    if (pg->rank() == 0) std::cout << "loss fell from " << first << " to " << last << std::endl;
    return last < first / 2 ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "example-port-a-model: " << e.what() << std::endl;
    return 1;
  }
}
