// An ordinary ConvNet ported to FSDP, with the habits of docs/porting.md's
// "LibTorch habits that break" section: BatchNorm (its statistics stay per
// rank), a frozen block after trainable layers (in a unit of its own),
// gradient accumulation without communication, a learning-rate schedule
// that resumes,
// evaluation in eval mode, and checkpoints in both formats, resumed. Run:
//   build/bin/fsdp-run --nproc-per-node 2 -- build/bin/example-convnet-resume OUT_DIR
// It trains 6 steps without a break, then 3 steps, saves OUT_DIR/full.pt
// and OUT_DIR/sharded, resumes from each in a fresh model and trains the
// last 3 steps: both resumed runs must end where the unbroken one did.
// tests/python/check_convnet_checkpoints.py then opens both checkpoints
// with PyTorch. Without a launcher it runs as rank 0 of 1.
#include <ATen/CPUGeneratorImpl.h>
#include <fsdp/checkpoint/checkpoint_io.h>
#include <fsdp/distributed/process_group.h>
#include <fsdp/fsdp.h>
#include <torch/torch.h>

#include <cmath>
#include <iostream>
#include <optional>
#include <stdexcept>
#include <string>

constexpr int64_t kClasses = 4, kBatch = 8;  // kBatch: one micro-batch of one rank
constexpr int kMicroBatches = 2, kSteps = 6, kBreak = 3;

// conv -> BatchNorm -> ReLU, as a module of its own so that it can be a unit.
struct ConvBlockImpl : torch::nn::Module {
  ConvBlockImpl(int64_t in, int64_t out) {
    conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 3).padding(1).bias(false)));
    bn = register_module("bn", torch::nn::BatchNorm2d(out));
  }
  torch::Tensor forward(torch::Tensor x) { return torch::relu(bn(conv(x))); }
  torch::nn::Conv2d conv{nullptr};
  torch::nn::BatchNorm2d bn{nullptr};
};
TORCH_MODULE(ConvBlock);

struct ConvNetImpl : torch::nn::Module {
  ConvNetImpl() {
    // A Sequential of blocks: FSDP runs each element's forward itself, so an
    // auto-wrap policy can make any of them a unit with no change here.
    blocks = register_module("blocks", torch::nn::Sequential(ConvBlock(3, 8), ConvBlock(8, 8), ConvBlock(8, 16)));
    head = register_module("head", torch::nn::Linear(16, kClasses));
    // FSDP: the frozen block is a unit of its own (a flat parameter has one
    // requires_grad); gradients still flow through it to the stem.
    for (auto& p : blocks[1]->parameters()) p.set_requires_grad(false);
  }
  torch::Tensor forward(torch::Tensor x) {
    x = blocks->forward(x);
    return head(torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1));
  }
  torch::nn::Sequential blocks{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(ConvNet);

// The micro-batch `micro` of step `step` on rank `rank`: images whose class
// is the brightest of four quadrants. A function of its indices only, so a
// resumed run sees the batches the unbroken run saw.
std::pair<torch::Tensor, torch::Tensor> batch(int step, int micro, int rank, int world) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 * (step + 2) + 100 * micro + 10 * world + rank);
  auto x = at::randn({kBatch, 3, 8, 8}, gen);
  auto y = at::randint(0, kClasses, {kBatch}, gen);
  for (int64_t i = 0; i < kBatch; ++i) {
    const int64_t q = y[i].item<int64_t>();
    x[i].narrow(1, (q / 2) * 4, 4).narrow(2, (q % 2) * 4, 4).add_(1.5);
  }
  return {x, y};
}

// The learning-rate schedule: halved every 2 steps. LibTorch's schedulers
// (torch::optim::StepLR, ...) keep their step count to themselves and have no
// state dict; a schedule computed from the step resumes with the step.
double lr_at(int step) { return 3e-3 * std::pow(0.5, step / 2); }

struct Run {
  ConvNet net{nullptr};
  std::optional<fsdp::FullyShardedDataParallel<ConvNetImpl>> model;
  std::optional<torch::optim::AdamW> optimizer;
};

// A fresh model (the same initial weights on every rank) and its optimizer.
void build(Run& r, const fsdp::dist::ProcessGroupPtr& world) {
  torch::manual_seed(0);
  r.net = ConvNet();
  // FSDP: each ConvBlock becomes a unit; the head belongs to the root.
  r.model.emplace(r.net.ptr(), fsdp::FSDPOptions().process_group(world).auto_wrap_policy(
                                   fsdp::transformer_auto_wrap_policy<ConvBlockImpl>()));
  // FSDP: built on the wrapped model's parameters (this rank's shards; the
  // frozen block's never get a gradient, and AdamW skips them).
  r.optimizer.emplace((*r.model)->parameters(), torch::optim::AdamWOptions(lr_at(0)));
}

// Trains steps [from, to): kMicroBatches micro-batches a step, the first ones
// under no_sync (their gradients add up locally; the last backward reduces the sum).
void train(Run& r, const fsdp::dist::ProcessGroupPtr& world, int from, int to) {
  auto& model = *r.model;
  model->train();
  for (int step = from; step < to; ++step) {
    for (auto& group : r.optimizer->param_groups()) {
      static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr_at(step));
    }
    r.optimizer->zero_grad();
    for (int micro = 0; micro < kMicroBatches; ++micro) {
      std::optional<fsdp::NoSync> no_sync;
      if (micro + 1 < kMicroBatches) no_sync.emplace(model.ptr());
      auto [x, y] = batch(step, micro, world->rank(), world->size());
      // FSDP: model(x), never model->forward(x) (docs/porting.md).
      auto loss = torch::nn::functional::cross_entropy(model(x), y) / kMicroBatches;
      loss.backward();
    }
    r.optimizer->step();
  }
}

fsdp::CheckpointState state_of(Run& r, int64_t step) {
  fsdp::CheckpointState s;
  s.model("model", r.model->ptr()).optimizer("optimizer", *r.optimizer).value("step", step);
  return s;
}

// Largest difference between two runs' full parameters and buffers
// ([collective]). BatchNorm's running statistics are each rank's own (FSDP,
// like PyTorch's, never synchronises buffers), and a checkpoint holds rank
// 0's: only rank 0's buffers are the unbroken run's after a resume.
double max_difference(Run& a, Run& b, int rank) {
  auto pa = fsdp::full_parameters(a.model->ptr()), pb = fsdp::full_parameters(b.model->ptr());
  if (pa.size() != pb.size()) throw std::runtime_error("the runs have different parameters");
  double diff = 0;
  for (size_t i = 0; i < pa.size(); ++i) diff = std::max(diff, (pa[i].second - pb[i].second).abs().max().item<double>());
  auto ba = (*a.model)->named_buffers(), bb = (*b.model)->named_buffers();
  for (size_t i = 0; i < ba.size() && rank == 0; ++i) {
    diff = std::max(diff, (ba[i].value().to(torch::kDouble) - bb[i].value().to(torch::kDouble)).abs().max().item<double>());
  }
  return diff;
}

int main(int argc, char** argv) {
  try {
    if (argc != 2) throw std::runtime_error("usage: example-convnet-resume OUT_DIR");
    const std::string out = argv[1];
    auto world = fsdp::dist::init_process_group_from_env();

    Run unbroken;
    build(unbroken, world);
    train(unbroken, world, 0, kSteps);

    Run first;
    build(first, world);
    train(first, world, 0, kBreak);
    // FSDP: not torch::save(model, path) (refused: it would write this
    // rank's shards). Both formats are collectives: every rank calls them.
    fsdp::save_checkpoint(out + "/full.pt", state_of(first, kBreak), *world, {fsdp::CheckpointFormat::kFull});
    fsdp::save_checkpoint(out + "/sharded", state_of(first, kBreak), *world, {fsdp::CheckpointFormat::kSharded});

    for (const char* format : {"full.pt", "sharded"}) {
      Run resumed;
      build(resumed, world);
      auto state = state_of(resumed, 0);
      fsdp::load_checkpoint(out + "/" + format, state, *world);
      const int step = static_cast<int>(state.get<int64_t>("step"));  // the schedule resumes with it
      {
        // FSDP: evaluation in eval mode (BatchNorm uses its running
        // statistics, each rank's own) and without gradients.
        torch::NoGradGuard no_grad;
        (*resumed.model)->eval();
        auto [x, y] = batch(-1, 0, world->rank(), world->size());
        const double accuracy = (*resumed.model)(x).argmax(1).eq(y).to(torch::kFloat).mean().item<double>();
        if (!std::isfinite(accuracy)) throw std::runtime_error("evaluation is not finite");
      }
      train(resumed, world, step, kSteps);
      const double diff = max_difference(resumed, unbroken, world->rank());
      if (world->rank() == 0) {
        std::cout << "resumed from " << format << " at step " << step << ": max difference to the unbroken run "
                  << diff << std::endl;
      }
      if (!(diff <= 1e-6)) throw std::runtime_error(std::string("the run resumed from ") + format + " diverged");
    }
    if (world->rank() == 0) std::cout << "world " << world->size() << ": both checkpoints resumed exactly" << std::endl;
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "example-convnet-resume: " << e.what() << std::endl;
    return 1;
  }
}
