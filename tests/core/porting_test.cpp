// What an ordinary LibTorch model meets when it is ported to FSDP (issue 37,
// items 19-21): fully frozen units between trainable ones, torch::save and
// torch::load on the wrapped model, and the root's module called directly.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <mutex>
#include <set>

#include "../support/thread_ranks.h"
#include "fsdp/error.h"
#include "fsdp/fsdp.h"
#include "../support/models.h"

using namespace fsdp;
using namespace fsdp::testing;

namespace {

constexpr int64_t kSide = 5, kClasses = 3, kGlobal = 6;  // kGlobal divides by 1, 2 and 3

// Conv [+ BatchNorm] + ReLU.
struct ConvBlockImpl : torch::nn::Module {
  explicit ConvBlockImpl(bool batch_norm) {
    conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(4, 4, 3).padding(1)));
    if (batch_norm) bn = register_module("bn", torch::nn::BatchNorm2d(4));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = conv(x);
    return torch::relu(bn ? bn(x) : x);
  }
  torch::nn::Conv2d conv{nullptr};
  torch::nn::BatchNorm2d bn{nullptr};
};
TORCH_MODULE(ConvBlock);

// A small ConvNet: a trainable stem, then frozen and trainable layers in
// turn (a frozen Conv [+ BatchNorm], a frozen LayerNorm, a frozen Linear),
// each layer of `body` its own unit; the head belongs to the root.
struct ConvNetImpl : torch::nn::Module {
  explicit ConvNetImpl(bool batch_norm) {
    body = register_module(
        "body", torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 4, 3).padding(1)),  // 0 stem
                                      ConvBlock(batch_norm),                                            // 1 frozen
                                      torch::nn::Conv2d(torch::nn::Conv2dOptions(4, 4, 3).padding(1)),  // 2
                                      torch::nn::Flatten(),                                             // 3
                                      torch::nn::LayerNorm(torch::nn::LayerNormOptions({4 * kSide * kSide})),  // 4 frozen
                                      torch::nn::Linear(4 * kSide * kSide, 8),                          // 5
                                      torch::nn::Linear(8, 8),                                          // 6 frozen
                                      torch::nn::Tanh()));
    head = register_module("head", torch::nn::Linear(8, kClasses));
    for (const char* frozen : {"body.1.", "body.4.", "body.6."}) {
      for (auto& p : named_parameters()) {
        if (p.key().rfind(frozen, 0) == 0) p.value().set_requires_grad(false);
      }
    }
  }
  torch::Tensor forward(torch::Tensor x) { return head(body->forward(x)); }
  torch::nn::Sequential body{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(ConvNet);

bool is_frozen(const std::string& name) {
  return name.rfind("body.1.", 0) == 0 || name.rfind("body.4.", 0) == 0 || name.rfind("body.6.", 0) == 0;
}

std::shared_ptr<ConvNetImpl> make_convnet(bool batch_norm) {
  std::lock_guard<std::mutex> lock(rng_mutex());
  torch::manual_seed(37);
  return std::make_shared<ConvNetImpl>(batch_norm);
}

AutoWrapPolicy body_layers() {
  return [](const torch::nn::Module&, const std::string& name, int64_t numel) {
    return numel > 0 && name.rfind("body.", 0) == 0 && name.find('.', 5) == std::string::npos;
  };
}

struct Data {
  std::vector<torch::Tensor> x, y;
};
Data make_data(int steps) {
  std::lock_guard<std::mutex> lock(rng_mutex());
  torch::manual_seed(38);
  Data d;
  for (int i = 0; i < steps; ++i) {
    d.x.push_back(torch::randn({kGlobal, 3, kSide, kSide}));
    d.y.push_back(torch::randint(0, kClasses, {kGlobal}));
  }
  return d;
}

std::map<std::string, torch::Tensor> train_plain(const Data& d) {
  auto net = make_convnet(/*batch_norm=*/false);
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  for (size_t i = 0; i < d.x.size(); ++i) {
    opt.zero_grad();
    torch::nn::functional::cross_entropy(net->forward(d.x[i]), d.y[i]).backward();
    opt.step();
  }
  return named_params(*net);
}

// Trains the wrapped ConvNet on this rank's part of each global batch.
std::map<std::string, torch::Tensor> train_wrapped(dist::ProcessGroup& pg, bool batch_norm, bool use_orig,
                                                   const Data& d) {
  FSDPOptions o;
  o.process_group(borrow(pg)).use_orig_params(use_orig).auto_wrap_policy(body_layers());
  FullyShardedDataParallel<ConvNetImpl> model(make_convnet(batch_norm), o);
  EXPECT_EQ(fsdp_modules(model.ptr()).size(), 7u);  // the root and six layers of body
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  const int64_t local = kGlobal / pg.size();
  for (size_t i = 0; i < d.x.size(); ++i) {
    opt.zero_grad();
    auto x = d.x[i].narrow(0, pg.rank() * local, local);
    auto y = d.y[i].narrow(0, pg.rank() * local, local);
    auto loss = torch::nn::functional::cross_entropy(model(x), y);
    EXPECT_TRUE(std::isfinite(loss.item<double>()));
    loss.backward();
    opt.step();
    EXPECT_EQ(memory_stats(model.ptr()).unsharded_param_bytes, 0) << "a unit kept its full parameters after backward";
  }
  return to_map(full_parameters(model.ptr()));
}

// Before the fix: at world 2 and 3, use_orig_params=true failed in
// convolution_backward ("weight should have at least three dimensions": the
// frozen unit had resharded in its post-forward, and the backward through it
// to the stem read the 1-D shard), and use_orig_params=false crashed with
// SIGSEGV (freed storage). World 1 passed.
TEST(Porting, FrozenUnitsBetweenTrainableOnesMatchOneProcess) {
  const Data d = make_data(3);
  const auto reference = train_plain(d);
  const auto initial = named_params(*make_convnet(false));
  for (const auto& [name, value] : reference) {
    EXPECT_EQ(torch::equal(value, initial.at(name)), is_frozen(name)) << name;
  }
  for (int world = 1; world <= 3; ++world) {
    run_ranks(world, [&](dist::ProcessGroup& pg) {
      for (bool use_orig : {false, true}) {
        expect_close(train_wrapped(pg, /*batch_norm=*/false, use_orig, d), reference, 1e-6,
                     "world " + std::to_string(world) + (use_orig ? " orig" : " flat"));
      }
    });
  }
}

// A frozen Conv + BatchNorm unit (the blocks.0): its batch
// statistics are per rank, as in PyTorch, so the run is not the one-process
// run; it trains, stays finite, and leaves the frozen weights alone. Before
// the fix: the same crash as above.
TEST(Porting, FrozenConvBatchNormUnitTrains) {
  const Data d = make_data(3);
  const auto initial = named_params(*make_convnet(true));
  run_ranks(2, [&](dist::ProcessGroup& pg) {
    for (bool use_orig : {false, true}) {
      auto got = train_wrapped(pg, /*batch_norm=*/true, use_orig, d);
      for (const auto& [name, value] : got) {
        EXPECT_TRUE(torch::isfinite(value).all().item<bool>()) << name;
        const bool frozen = is_frozen(name);
        EXPECT_EQ(torch::equal(value, initial.at(name)), frozen) << name << (use_orig ? " orig" : " flat");
      }
    }
  });
}

// Before the fix: torch::save(model, path) wrote rank 0's 1-D shards under
// the full names, and torch::load accepted any file into the shards.
TEST(Porting, TorchSaveAndLoadOnAWrappedModelAreRefused) {
  const auto dir = std::filesystem::temp_directory_path() / ("fsdp_porting_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string plain_file = (dir / "plain.pt").string();
  {
    ConvNet plain(make_convnet(false));
    torch::save(plain, plain_file);  // an unwrapped model saves as LibTorch's do
  }
  run_ranks(2, [&](dist::ProcessGroup& pg) {
    FSDPOptions o;
    o.process_group(borrow(pg)).use_orig_params(true).auto_wrap_policy(body_layers());
    FullyShardedDataParallel<ConvNetImpl> model(make_convnet(false), o);
    const std::string file = (dir / ("wrapped" + std::to_string(pg.rank()) + ".pt")).string();
    try {
      torch::save(model, file);
      ADD_FAILURE() << "torch::save of a wrapped model was accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("fsdp::save_checkpoint"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(std::filesystem::exists(file));
    const auto before = to_map(full_parameters(model.ptr()));
    try {
      torch::load(model, plain_file);
      ADD_FAILURE() << "torch::load into a wrapped model was accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("fsdp::load_checkpoint"), std::string::npos) << e.what();
    }
    expect_close(to_map(full_parameters(model.ptr())), before, 0.0, "after the refused load");
  });
  // A Unit holder whose module is no unit saves and loads as LibTorch's holders do.
  Unit<torch::nn::LinearImpl> lin(torch::nn::LinearOptions(2, 2));
  const std::string lin_file = (dir / "lin.pt").string();
  torch::save(lin, lin_file);
  Unit<torch::nn::LinearImpl> back(torch::nn::LinearOptions(2, 2));
  torch::load(back, lin_file);
  EXPECT_TRUE(torch::equal(back->weight, lin->weight));
  std::filesystem::remove_all(dir);
}

// Before the fix: model->forward(x) ran the model's own layers on their
// shards, and the only message was LibTorch's "weight should have at least
// three dimensions" from the stem's convolution.
TEST(Porting, RootModuleCalledDirectlyIsNamed) {
  const Data d = make_data(1);
  run_ranks(2, [&](dist::ProcessGroup& pg) {
    FSDPOptions o;
    o.process_group(borrow(pg)).use_orig_params(true).auto_wrap_policy(body_layers());
    FullyShardedDataParallel<ConvNetImpl> model(make_convnet(false), o);
    try {
      model->forward(d.x[0]);
      ADD_FAILURE() << "model->forward(x) was not detected";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("not model->forward(x)"), std::string::npos) << e.what();
    }
    // The wrapped model still works through its holder afterwards.
    EXPECT_EQ(model(d.x[0]).sizes(), (std::vector<int64_t>{kGlobal, kClasses}));
  });
}

}  // namespace
