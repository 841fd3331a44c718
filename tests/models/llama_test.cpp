// fsdp::models::Llama against transformers itself: small random models that
// transformers creates and saves (tests/python/hf_models.py), loaded from
// their Hugging Face directories, give transformers' logits, loss, gradients
// and greedy generation; loaded sharded, each rank reads only its byte
// ranges. Bad configs and directories get errors naming the file and key.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <mutex>

#include "fsdp/checkpoint/checkpoint_io.h"
#include "fsdp/checkpoint/hf_storage.h"
#include "fsdp/core/activation_checkpointing.h"
#include "fsdp/error.h"
#include "fsdp/formats/safetensors.h"
#include "fsdp/fsdp2/fully_shard.h"
#include "fsdp/hf/export.h"
#include "fsdp/hf/hf_model.h"
#include "fsdp/hf/peft.h"
#include "fsdp/models/llama.h"
#include "fsdp/optim/adamw.h"
#include "../support/errors.h"
#include "../support/subprocess.h"
#include "../support/thread_ranks.h"

namespace fsdp::testing {
namespace {

namespace fs = std::filesystem;
using models::LlamaImpl;

#ifdef FSDP_TEST_TRANSFORMERS
// The models and transformers' results, made once for the suite.
class LlamaTransformers : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    auto r = run_program({FSDP_TEST_PYTHON, FSDP_TEST_SOURCE_DIR "/python/hf_models.py", "make", dir_->path()},
                         std::chrono::seconds(240));
    made_ = r.exit_code() == 0;
    output_ = r.output;
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override { ASSERT_TRUE(made_) << output_; }

  static std::string model_dir(const std::string& name) { return dir_->path() + "/" + name; }
  static std::map<std::string, at::Tensor> expected(const std::string& name) {
    const std::string path = dir_->path() + "/" + name + ".expected.safetensors";
    const auto h = formats::read_safetensors_header(path);
    std::map<std::string, at::Tensor> out;
    for (const auto& t : h.tensors) out[t.name] = formats::read_safetensors_tensor(path, h, t);
    return out;
  }
  // The model of directory `name`, loaded on one rank, unsharded.
  static fsdp::Unit<LlamaImpl> load(const std::string& name) {
    const auto config = hf::read_config(model_dir(name));
    fsdp::Unit<LlamaImpl> model(config);
    run_ranks(1, [&](dist::ProcessGroup& pg) { hf::load_weights(model_dir(name), config, model.ptr(), pg); });
    return model;
  }

  static TempDir* dir_;
  static bool made_;
  static std::string output_;
};
TempDir* LlamaTransformers::dir_ = nullptr;
bool LlamaTransformers::made_ = false;
std::string LlamaTransformers::output_;

const std::vector<std::string> kModels = {"llama", "qwen2", "tied", "mistral", "legacy"};

double max_diff(const at::Tensor& a, const at::Tensor& b) { return (a.to(at::kFloat) - b).abs().max().item<double>(); }

TEST_F(LlamaTransformers, LogitsEqualTransformersInFloat32) {
  for (const auto& name : kModels) {
    auto want = expected(name);
    auto model = load(name);
    model->eval();
    torch::NoGradGuard no_grad;
    auto logits = model(want.at("tokens"));
    ASSERT_EQ(logits.sizes(), want.at("logits").sizes()) << name;
    EXPECT_LE(max_diff(logits, want.at("logits")), 1e-5) << name;
    // The comparison sees the weights: a model left at its initialisation differs.
    fsdp::Unit<LlamaImpl> fresh(hf::read_config(model_dir(name)));
    EXPECT_GT(max_diff(fresh(want.at("tokens")), want.at("logits")), 1e-2) << name;
  }
}

// Also with every decoder layer under activation checkpointing (its forward
// re-run in backward): the same loss and gradients.
TEST_F(LlamaTransformers, OneStepLossAndGradientsEqualTransformers) {
  for (const auto& name : kModels) {
    for (const bool checkpointed : {false, true}) {
      if (checkpointed && name != "llama" && name != "qwen2") continue;
      auto want = expected(name);
      auto model = load(name);
      if (checkpointed) {
        EXPECT_EQ(apply_activation_checkpointing(model.ptr(), checkpoint_module_types<models::LlamaDecoderLayerImpl>()),
                  model->config().num_hidden_layers);
      }
      model->train();
      const auto tokens = want.at("tokens");
      auto logits = model(tokens);
      auto V = logits.size(-1);
      auto loss = torch::nn::functional::cross_entropy(logits.slice(1, 0, -1).reshape({-1, V}),
                                                       tokens.slice(1, 1).reshape({-1}));
      loss.backward();
      const std::string what = name + (checkpointed ? " (checkpointed)" : "");
      EXPECT_LE(std::abs(loss.item<double>() - want.at("loss").item<double>()), 1e-5) << what;
      size_t compared = 0;
      for (const auto& p : model->named_parameters()) {
        auto it = want.find("grad." + p.key());
        ASSERT_NE(it, want.end()) << what << ": transformers has no parameter " << p.key();
        EXPECT_LE(max_diff(p.value().grad(), it->second), 1e-5) << what << " " << p.key();
        ++compared;
      }
      size_t theirs = 0;
      for (const auto& [k, v] : want) theirs += k.rfind("grad.", 0) == 0;
      // transformers lists a tied lm_head once, as the embedding.
      EXPECT_EQ(compared, theirs) << what;
    }
  }
}

TEST_F(LlamaTransformers, GreedyGenerationEqualsTransformersFor32Tokens) {
  for (const auto& name : kModels) {
    auto want = expected(name);
    auto model = load(name);
    model->eval();
    auto out = models::llama_generate(model, want.at("prompt"), 32);
    EXPECT_TRUE(out.equal(want.at("generated"))) << name << "\nours:   " << out << "\ntheirs: " << want.at("generated");
  }
}

// Sharded at world 2 by fully_shard (each layer, then the root), or by FSDP1
// (flat parameters: a layer per unit): each rank reads its rows (plus at
// most two partial chunks per tensor), holds one chunk at a time, and the
// logits are transformers'.
TEST_F(LlamaTransformers, ShardedLoadReadsOnlyEachRanksBytes) {
  for (const std::string name : {"llama", "tied", "fsdp1:llama"}) {
    const bool fsdp1 = name.rfind("fsdp1:", 0) == 0;
    const std::string dir_name = fsdp1 ? name.substr(6) : name;
    auto want = expected(dir_name);
    const auto config = hf::read_config(model_dir(dir_name));
    HfStorageReader whole(model_dir(dir_name), 256);
    int64_t total = 0, tensors = 0, largest_chunk = 0;
    for (const auto& [k, t] : whole.index().tensors) {
      for (const auto& c : t.chunks) {
        total += c.nbytes;
        largest_chunk = std::max(largest_chunk, c.nbytes);
      }
      ++tensors;
    }
    std::mutex mu;
    std::vector<hf::LoadStats> stats(2);
    std::vector<at::Tensor> logits(2);
    run_ranks(2, [&](dist::ProcessGroup& pg) {
      fsdp::Unit<LlamaImpl> model(nullptr);
      if (fsdp1) {
        model = FullyShardedDataParallel<LlamaImpl>(
            std::make_shared<LlamaImpl>(config),
            FSDPOptions()
                .process_group(borrow(pg))
                .use_orig_params(true)
                .auto_wrap_policy(transformer_auto_wrap_policy<models::LlamaDecoderLayerImpl>()));
      } else {
        model = fsdp::Unit<LlamaImpl>(config);
        Mesh mesh = Mesh::of(borrow(pg));
        for (auto& layer : model->model->layers) fully_shard(layer, mesh);
        fully_shard(model, mesh);
      }
      auto s = hf::load_weights(model_dir(dir_name), config, model.ptr(), pg, 256);
      torch::NoGradGuard no_grad;
      model->eval();
      auto l = model(want.at("tokens"));
      std::lock_guard<std::mutex> lock(mu);
      stats[pg.rank()] = s;
      logits[pg.rank()] = l;
    });
    for (int r = 0; r < 2; ++r) {
      EXPECT_LE(max_diff(logits[r], want.at("logits")), 1e-5) << name << " rank " << r;
      // Half of every tensor's rows (torch.chunk's: the first rank the larger
      // half), and at most two chunks more per tensor.
      EXPECT_LE(stats[r].bytes_read, total / 2 + 2 * 256 * tensors) << name << " rank " << r;
      EXPECT_GE(stats[r].bytes_read, total / 4) << name << " rank " << r;
      EXPECT_LE(stats[r].peak_buffer_bytes, largest_chunk) << name << " rank " << r;
    }
  }
}
// 20 AdamW steps (fsdp::optim::AdamW) sharded by fully_shard at worlds 2
// and 3, each rank on its rows of the global batch, give the losses that
// transformers and torch.optim.AdamW give in one process on the same batches
// (zero_grad between forward and backward, as the Python loop has it).
TEST_F(LlamaTransformers, TwentyAdamWStepsAtWorlds2And3FollowTransformers) {
  for (const std::string name : {"llama", "tied"}) {
    const std::string ref = dir_->path() + "/" + name + ".train.safetensors";
    auto r = run_program({FSDP_TEST_PYTHON, FSDP_TEST_SOURCE_DIR "/python/hf_models.py", "train", model_dir(name), ref},
                         std::chrono::seconds(240));
    ASSERT_EQ(r.exit_code(), 0) << r.output;
    const auto h = formats::read_safetensors_header(ref);
    std::map<std::string, at::Tensor> want;
    for (const auto& t : h.tensors) want[t.name] = formats::read_safetensors_tensor(ref, h, t);
    const auto config = hf::read_config(model_dir(name));
    for (const int world : {2, 3}) {
      std::vector<double> losses(20);
      double first_again = 0;
      run_ranks(world, [&](dist::ProcessGroup& pg) {
        fsdp::Unit<LlamaImpl> model(config);
        Mesh mesh = Mesh::of(borrow(pg));
        for (auto& layer : model->model->layers) fully_shard(layer, mesh);
        fully_shard(model, mesh);
        hf::load_weights(model_dir(name), config, model.ptr(), pg);
        model->train();
        optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-3).betas({0.9, 0.95}).weight_decay(0.1));
        const int64_t rows = 6 / world;
        for (int64_t step = 0; step < 20; ++step) {
          auto tokens = want.at("batches")[step].slice(0, pg.rank() * rows, (pg.rank() + 1) * rows);
          auto logits = model(tokens);
          auto loss = torch::nn::functional::cross_entropy(logits.slice(1, 0, -1).reshape({-1, logits.size(-1)}),
                                                           tokens.slice(1, 1).reshape({-1}));
          opt.zero_grad();
          loss.backward();
          opt.step();
          auto mean = loss.detach().reshape({1}).clone();
          pg.all_reduce(mean).wait();
          if (pg.rank() == 0) losses[step] = mean.item<double>() / world;
        }
        // The first batch again, after training: the comparison sees the updates.
        torch::NoGradGuard no_grad;
        auto tokens = want.at("batches")[0].slice(0, pg.rank() * rows, (pg.rank() + 1) * rows);
        auto logits = model(tokens);
        auto again = torch::nn::functional::cross_entropy(logits.slice(1, 0, -1).reshape({-1, logits.size(-1)}),
                                                          tokens.slice(1, 1).reshape({-1}))
                         .reshape({1});
        pg.all_reduce(again).wait();
        if (pg.rank() == 0) first_again = again.item<double>() / world;
      });
      for (int64_t step = 0; step < 20; ++step) {
        EXPECT_NEAR(losses[step], want.at("losses")[step].item<double>(), 1e-4)
            << name << " at world " << world << ", step " << step;
      }
      EXPECT_LT(first_again, losses[0] - 0.05) << name << " at world " << world;
    }
  }
}

// LoRA at world 2 under fully_shard: the base stays frozen (no gradient,
// unchanged), the adapters train, and the adapters saved as PEFT's files
// load onto the transformers model with peft, whose merged logits are
// fsdp-cpp's.
TEST_F(LlamaTransformers, LoraAdaptersLoadInPeftWithTheSameMergedLogits) {
  auto want = expected("llama");
  auto config = hf::read_config(model_dir("llama"));
  config.lora.rank = 4;
  config.lora.alpha = 8;
  config.lora.targets = {"q_proj", "v_proj", "down_proj"};
  const std::string adapter = dir_->path() + "/adapter";
  at::Tensor ours;
  std::mutex mu;
  run_ranks(2, [&](dist::ProcessGroup& pg) {
    fsdp::Unit<LlamaImpl> model(config);
    Mesh mesh = Mesh::of(borrow(pg));
    for (auto& layer : model->model->layers) fully_shard(layer, mesh);
    fully_shard(model, mesh);
    hf::load_weights(model_dir("llama"), config, model.ptr(), pg);
    std::map<std::string, at::Tensor> before;
    int64_t trainable = 0;
    for (const auto& p : model->named_parameters()) {
      before[p.key()] = p.value().detach().clone();
      const bool adapter_param = p.key().find(".lora_") != std::string::npos;
      EXPECT_EQ(p.value().requires_grad(), adapter_param) << p.key();
      trainable += adapter_param;
    }
    EXPECT_EQ(trainable, 2 * 3 * config.num_hidden_layers);
    optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-2));
    const auto tokens = want.at("tokens").slice(0, pg.rank(), pg.rank() + 1);
    for (int step = 0; step < 3; ++step) {
      opt.zero_grad();
      auto logits = model(tokens);
      torch::nn::functional::cross_entropy(logits.slice(1, 0, -1).reshape({-1, logits.size(-1)}),
                                           tokens.slice(1, 1).reshape({-1}))
          .backward();
      for (const auto& p : model->named_parameters()) {
        if (!p.value().requires_grad()) EXPECT_FALSE(p.value().grad().defined()) << p.key();
      }
      opt.step();
    }
    for (const auto& p : model->named_parameters()) {
      const bool moved = !p.value().detach().equal(before.at(p.key()));
      // The base stays; B moves off zero (A's first gradient is zero: B is).
      if (!p.value().requires_grad()) EXPECT_FALSE(moved) << p.key();
      if (p.key().find(".lora_B.") != std::string::npos && p.value().numel() > 0) EXPECT_TRUE(moved) << p.key();
    }
    hf::save_peft_adapter(model.ptr(), config, adapter, model_dir("llama"), pg);
    torch::NoGradGuard no_grad;
    model->eval();
    auto l = model(want.at("tokens"));
    std::lock_guard<std::mutex> lock(mu);
    if (pg.rank() == 0) ours = l;
  });
  EXPECT_TRUE(fs::exists(adapter + "/adapter_model.safetensors"));
  EXPECT_TRUE(fs::exists(adapter + "/adapter_config.json"));
  const std::string ours_file = dir_->path() + "/adapter.ours.safetensors";
  formats::SafetensorsWriter w(ours_file,
                               {{"logits", at::kFloat, ours.sizes().vec(), 0, 0},
                                {"tokens", at::kLong, want.at("tokens").sizes().vec(), 0, 0}},
                               {});
  for (const auto& t : w.layout()) w.write(t.name == "logits" ? ours : want.at("tokens"));
  w.commit();
  auto r = run_program({FSDP_TEST_PYTHON, FSDP_TEST_SOURCE_DIR "/python/hf_models.py", "check-peft", model_dir("llama"),
                        adapter, ours_file},
                       std::chrono::seconds(240));
  EXPECT_EQ(r.exit_code(), 0) << r.output;
}

// fully_shard at world 2 over a model of `config`: the decoder layers' groups, then the root's (last).
std::vector<FSDPModule> shard_llama(fsdp::Unit<LlamaImpl>& model, dist::ProcessGroup& pg) {
  Mesh mesh = Mesh::of(borrow(pg));
  std::vector<FSDPModule> groups;
  for (auto& layer : model->model->layers) groups.push_back(fully_shard(layer, mesh));
  groups.push_back(fully_shard(model, mesh));
  return groups;
}

optim::AdamW llama_adamw(fsdp::Unit<LlamaImpl>& model) {
  return optim::AdamW(model->parameters(), torch::optim::AdamWOptions(1e-3).betas({0.9, 0.95}).weight_decay(0.1));
}

// [collective] One step on this rank's rows of `tokens` [6, T]; the mean loss over the ranks.
double llama_step(fsdp::Unit<LlamaImpl>& model, torch::optim::Optimizer& opt, const at::Tensor& tokens,
                  dist::ProcessGroup& pg) {
  const int64_t rows = tokens.size(0) / pg.size();
  auto mine = tokens.slice(0, pg.rank() * rows, (pg.rank() + 1) * rows);
  auto logits = model(mine);
  auto loss = torch::nn::functional::cross_entropy(logits.slice(1, 0, -1).reshape({-1, logits.size(-1)}),
                                                   mine.slice(1, 1).reshape({-1}));
  opt.zero_grad();
  loss.backward();
  opt.step();
  auto mean = loss.detach().reshape({1}).clone();
  pg.all_reduce(mean).wait();
  return mean.item<double>() / pg.size();
}

// [collective] The weights ("w."), AdamW's moments ("m.", "v.") and step
// counts ("step.") of a sharded model, whole, by transformers' names.
std::map<std::string, at::Tensor> full_training_state(const std::vector<FSDPModule>& groups,
                                                      torch::optim::Optimizer& opt) {
  std::map<std::string, at::Tensor> out;
  for (size_t g = 0; g < groups.size(); ++g) {
    const std::string prefix = g + 1 < groups.size() ? "model.layers." + std::to_string(g) + "." : "";
    for (const auto& sp : groups[g].sharded_params()) {
      const std::string name = prefix + sp.name;
      out["w." + name] = sp.full_tensor();
      auto& st = static_cast<torch::optim::AdamWParamState&>(*opt.state().at(sp.param.unsafeGetTensorImpl()));
      out["m." + name] = sp.gather(st.exp_avg());
      out["v." + name] = sp.gather(st.exp_avg_sq());
      out["step." + name] = at::full({1}, static_cast<double>(st.step()), at::kDouble);
    }
  }
  return out;
}

std::map<std::string, at::Tensor> read_tensors(const std::string& path) {
  const auto h = formats::read_safetensors_header(path);
  std::map<std::string, at::Tensor> out;
  for (const auto& t : h.tensors) out[t.name] = formats::read_safetensors_tensor(path, h, t);
  return out;
}

// A run trained in C++ continues in PyTorch + transformers, and one trained
// there continues here: the handed-over weights, AdamW moments and step
// counts load bitwise (DCP both ways), one AdamW step on the same gradients
// is bitwise, and 20 continued steps give losses within 1e-4 of the run
// that stayed where it was.
TEST_F(LlamaTransformers, ARunContinuesAcrossCppAndPyTorchBothWays) {
  const auto config = hf::read_config(model_dir("llama"));
  const std::string d = dir_->path() + "/resume";
  fs::create_directories(d);
  auto gen = at::detail::createCPUGenerator(5);
  const at::Tensor batches = at::randint(0, config.vocab_size, {23, 6, 12}, gen, at::TensorOptions().dtype(at::kLong));
  {
    formats::SafetensorsWriter w(d + "/batches.safetensors", {{"batches", at::kLong, batches.sizes().vec(), 0, 0}}, {});
    w.write(batches);
    w.commit();
  }
  // C++ -> PyTorch.
  std::vector<double> cpp_losses(20);
  std::map<std::string, at::Tensor> saved;
  std::mutex mu;
  run_ranks(2, [&](dist::ProcessGroup& pg) {
    fsdp::Unit<LlamaImpl> model(config);
    auto groups = shard_llama(model, pg);
    hf::load_weights(model_dir("llama"), config, model.ptr(), pg);
    auto opt = llama_adamw(model);
    for (int64_t i = 0; i < 3; ++i) llama_step(model, opt, batches[i], pg);
    CheckpointState st;
    st.model("model", model.ptr()).optimizer("optimizer", opt).value("step", int64_t{3});
    save_checkpoint(d + "/cpp_dcp", st, pg, {CheckpointFormat::kSharded});
    auto state = full_training_state(groups, opt);
    std::vector<double> losses;
    for (int64_t i = 3; i < 23; ++i) losses.push_back(llama_step(model, opt, batches[i], pg));
    std::lock_guard<std::mutex> lock(mu);
    if (pg.rank() == 0) saved = state, cpp_losses = losses;
  });
  auto r = run_program({FSDP_TEST_PYTHON, FSDP_TEST_SOURCE_DIR "/python/hf_models.py", "resume-cpp", model_dir("llama"),
                        d + "/cpp_dcp", d + "/batches.safetensors", d + "/py_from_cpp.safetensors"},
                       std::chrono::seconds(240));
  ASSERT_EQ(r.exit_code(), 0) << r.output;
  auto py = read_tensors(d + "/py_from_cpp.safetensors");
  size_t compared = 0;
  for (const auto& [k, v] : saved) {
    auto it = py.find(k);
    ASSERT_NE(it, py.end()) << "PyTorch loaded no " << k;
    EXPECT_TRUE(it->second.to(v.scalar_type()).equal(v)) << k << " is not handed over bitwise";
    ++compared;
  }
  EXPECT_EQ(compared, 4 * models::llama_state_shapes(config).size());
  EXPECT_EQ(py.at("step").item<int64_t>(), 3);
  for (int64_t i = 0; i < 20; ++i) {
    EXPECT_NEAR(py.at("losses")[i].item<double>(), cpp_losses[i], 1e-4) << "C++ -> PyTorch, continued step " << i;
  }
  // One AdamW step on the same gradients, from the handed-over state: bitwise.
  run_ranks(1, [&](dist::ProcessGroup& pg) {
    fsdp::Unit<LlamaImpl> model(config);
    auto groups = shard_llama(model, pg);
    auto opt = llama_adamw(model);
    CheckpointState st;
    st.model("model", model.ptr()).optimizer("optimizer", opt);
    load_checkpoint(d + "/cpp_dcp", st, pg);
    auto named = model->named_parameters();
    std::vector<std::string> names;
    for (const auto& p : named) names.push_back(p.key());
    std::sort(names.begin(), names.end());
    for (size_t i = 0; i < names.size(); ++i) {
      auto& p = named[names[i]];
      // As the Python side writes it: (arange * 0.01) * (i + 1) + 0.3, then sin.
      p.mutable_grad() =
          (at::arange(p.numel(), at::kFloat).reshape(p.sizes()) * 0.01 * static_cast<int64_t>(i + 1) + 0.3).sin();
    }
    opt.step();
    for (const auto& p : model->named_parameters()) {
      EXPECT_TRUE(p.value().equal(py.at("one." + p.key()))) << p.key() << ": one AdamW step differs from torch's";
    }
  });
  // PyTorch -> C++.
  r = run_program({FSDP_TEST_PYTHON, FSDP_TEST_SOURCE_DIR "/python/hf_models.py", "train-save", model_dir("llama"),
                   d + "/batches.safetensors", d},
                  std::chrono::seconds(240));
  ASSERT_EQ(r.exit_code(), 0) << r.output;
  const auto py_state = read_tensors(d + "/py_state.safetensors");
  const auto py_losses = read_tensors(d + "/py_losses.safetensors").at("losses");
  std::vector<double> continued(20);
  std::map<std::string, at::Tensor> loaded;
  int64_t step = -1;
  run_ranks(2, [&](dist::ProcessGroup& pg) {
    fsdp::Unit<LlamaImpl> model(config);
    auto groups = shard_llama(model, pg);
    auto opt = llama_adamw(model);
    CheckpointState st;
    st.model("model", model.ptr()).optimizer("optimizer", opt);
    auto values = load_checkpoint(d + "/py_dcp", st, pg);
    auto state = full_training_state(groups, opt);
    std::vector<double> losses;
    for (int64_t i = 3; i < 23; ++i) losses.push_back(llama_step(model, opt, batches[i], pg));
    std::lock_guard<std::mutex> lock(mu);
    if (pg.rank() == 0) {
      loaded = state, continued = losses;
      step = std::get<int64_t>(values.at("step"));
    }
  });
  EXPECT_EQ(step, 3);
  for (const auto& [k, v] : loaded) {
    auto it = py_state.find(k);
    ASSERT_NE(it, py_state.end()) << "PyTorch saved no " << k;
    EXPECT_TRUE(v.equal(it->second.to(v.scalar_type()))) << k << " is not handed over bitwise";
  }
  for (int64_t i = 0; i < 20; ++i) {
    EXPECT_NEAR(continued[i], py_losses[i].item<double>(), 1e-4) << "PyTorch -> C++, continued step " << i;
  }
}

// A checkpoint of either format (full at world 1, sharded at world 2, of a
// fully_shard model) exported as a Hugging Face directory loads in
// transformers with no missing or unexpected keys and gives fsdp-cpp's logits.
TEST_F(LlamaTransformers, ExportLoadsInTransformersWithTheSameLogits) {
  std::vector<std::string> check = {FSDP_TEST_PYTHON, FSDP_TEST_SOURCE_DIR "/python/hf_models.py", "check-export"};
  for (const std::string name : {"llama", "tied", "qwen2"}) {
    auto want = expected(name);
    const auto config = hf::read_config(model_dir(name));
    const std::string base = dir_->path() + "/export-" + name;
    for (const bool sharded : {false, true}) {
      const std::string ckpt = base + (sharded ? "-sharded" : "-full") + ".ckpt";
      at::Tensor ours;
      std::mutex mu;
      run_ranks(sharded ? 2 : 1, [&](dist::ProcessGroup& pg) {
        fsdp::Unit<LlamaImpl> model(config);
        Mesh mesh = Mesh::of(borrow(pg));
        for (auto& layer : model->model->layers) fully_shard(layer, mesh);
        fully_shard(model, mesh);
        hf::load_weights(model_dir(name), config, model.ptr(), pg);
        CheckpointState state;
        state.model("model", model.ptr());
        save_checkpoint(ckpt, state, pg,
                        {sharded ? CheckpointFormat::kSharded : CheckpointFormat::kFull});
        torch::NoGradGuard no_grad;
        model->eval();
        auto l = model(want.at("tokens"));
        std::lock_guard<std::mutex> lock(mu);
        if (pg.rank() == 0) ours = l;
      });
      hf::ExportOptions o;
      o.config = config;
      o.source_dir = model_dir(name);
      o.max_shard_bytes = 20000;  // several files and an index
      const std::string out = ckpt + ".hf";
      hf::export_hf(ckpt, out, o);
      EXPECT_TRUE(fs::exists(out + "/model.safetensors.index.json")) << out;
      EXPECT_TRUE(fs::exists(out + "/generation_config.json")) << out;
      const std::string ours_file = ckpt + ".ours.safetensors";
      formats::SafetensorsWriter w(ours_file,
                                   {{"logits", at::kFloat, ours.sizes().vec(), 0, 0},
                                    {"tokens", at::kLong, want.at("tokens").sizes().vec(), 0, 0}},
                                   {});
      for (const auto& t : w.layout()) w.write(t.name == "logits" ? ours : want.at("tokens"));
      w.commit();
      check.push_back(out);
      check.push_back(ours_file);
      // Never over an existing directory (its own output included).
      const std::string e = config_error([&] { hf::export_hf(ckpt, out, o); });
      EXPECT_NE(e.find("exists"), std::string::npos) << e;
    }
  }
  auto r = run_program(check, std::chrono::seconds(240));
  EXPECT_EQ(r.exit_code(), 0) << r.output;
  EXPECT_NE(r.output.find("export-qwen2-sharded.ckpt.hf: loads with no missing or unexpected keys"), std::string::npos)
      << r.output;
}

#else
TEST(LlamaTransformers, NeedsTheWheelBuild) {
  GTEST_SKIP() << "transformers is the reference where the test Python's torch is this LibTorch (the wheel build)";
}
#endif

// LibTorch 1.13 has no scaled_dot_product_attention: the model says so.
TEST(Llama, BuildsOnLibTorch2OrRefusesByName) {
  models::LlamaConfig c;
  c.vocab_size = 16, c.hidden_size = 8, c.intermediate_size = 16, c.num_hidden_layers = 1;
  c.num_attention_heads = 2, c.num_key_value_heads = 1, c.head_dim = 4;
  if (TORCH_VERSION_MAJOR >= 2) {
    fsdp::Unit<LlamaImpl> model(c);
    EXPECT_EQ(model(torch::zeros({1, 3}, torch::kLong)).sizes(), (std::vector<int64_t>{1, 3, 16}));
  } else {
    const std::string e = config_error([&] { fsdp::Unit<LlamaImpl> model(c); });
    EXPECT_NE(e.find("scaled_dot_product_attention"), std::string::npos) << e;
  }
}

// --- config.json -------------------------------------------------------------

TEST(LlamaConfig, ReadsLegacyKeysAsTransformersDoes) {
  const auto c = models::parse_llama_config(R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
      "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 100,
      "rope_theta": 500000.0, "torch_dtype": "bfloat16",
      "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                       "original_max_position_embeddings": 8192, "rope_type": "llama3"}})",
                                            "config.json");
  EXPECT_EQ(c.rope_type, "llama3");
  EXPECT_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.rope_original_max_position_embeddings, 8192);
  EXPECT_EQ(c.dtype, "bfloat16");
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.num_key_value_heads, 4);
  const auto m = models::parse_llama_config(R"({"architectures": ["MistralForCausalLM"], "hidden_size": 64,
      "num_attention_heads": 16, "num_hidden_layers": 3, "sliding_window": 16, "rope_scaling": {"type": "linear",
      "factor": 2.0}})",
                                            "config.json");
  EXPECT_EQ(m.num_key_value_heads, 8);  // MistralConfig's default
  EXPECT_EQ(m.rope_type, "linear");
  EXPECT_EQ(m.layer_windows, (std::vector<int64_t>{16, 16, 16}));
}

TEST(LlamaConfig, RefusesWhatItDoesNotImplementByFileAndKey) {
  auto err = [](const std::string& text) {
    return config_error([&] { models::parse_llama_config(text, "/m/config.json"); });
  };
  const std::string base = R"("hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2)";
  std::string e = err(R"({"architectures": ["GPTNeoXForCausalLM"], )" + base + "}");
  EXPECT_NE(e.find("/m/config.json"), std::string::npos) << e;
  EXPECT_NE(e.find("architectures"), std::string::npos) << e;
  EXPECT_NE(e.find("GPTNeoXForCausalLM"), std::string::npos) << e;
  EXPECT_NE(e.find("LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM"), std::string::npos) << e;
  e = err(R"({"model_type": "llama", "rope_parameters": {"rope_type": "yarn", "factor": 4.0}, )" + base + "}");
  EXPECT_NE(e.find("rope_parameters.rope_type"), std::string::npos) << e;
  EXPECT_NE(e.find("yarn"), std::string::npos) << e;
  e = err(R"({"model_type": "llama", "rope_scaling": {"rope_type": "llama3", "factor": 8.0}, )" + base + "}");
  EXPECT_NE(e.find("rope_scaling.low_freq_factor"), std::string::npos) << e;
  e = err(R"({"model_type": "llama", "hidden_act": "gelu", )" + base + "}");
  EXPECT_NE(e.find("hidden_act"), std::string::npos) << e;
  e = err(R"({"model_type": "llama", "num_key_value_heads": 3, )" + base + "}");
  EXPECT_NE(e.find("num_key_value_heads"), std::string::npos) << e;
  e = err(R"({"model_type": "llama", "hidden_size": "64", "num_attention_heads": 4})");
  EXPECT_NE(e.find("\"hidden_size\": expected an integer"), std::string::npos) << e;
  e = err(R"({"model_type": "llama", "partial_rotary_factor": 0.5, )" + base + "}");
  EXPECT_NE(e.find("partial_rotary_factor"), std::string::npos) << e;
  e = err("[1, 2]");
  EXPECT_NE(e.find("expected a JSON object"), std::string::npos) << e;
  e = err("{\"model_type\": ");
  EXPECT_NE(e.find("not valid JSON"), std::string::npos) << e;
  e = err(R"({"model_type": "llama", "dtype": "int8", )" + base + "}");
  EXPECT_NE(e.find("\"dtype\""), std::string::npos) << e;
}

// --- Hugging Face directories ------------------------------------------------

models::LlamaConfig tiny_config() {
  return models::parse_llama_config(R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 16, "hidden_size": 8,
      "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1})",
                                    "config.json");
}

// Writes `tensors` (name -> shape, zeros of `dtype`) into `dir`/`file`.
void write_tensors(const std::string& dir, const std::string& file,
                   const std::vector<std::pair<std::string, std::vector<int64_t>>>& tensors,
                   at::ScalarType dtype = at::kFloat) {
  std::vector<formats::SafetensorsTensor> plan;
  for (const auto& [name, shape] : tensors) plan.push_back({name, dtype, shape, 0, 0});
  formats::SafetensorsWriter w(dir + "/" + file, plan, {{"format", "pt"}});
  for (const auto& t : w.layout()) w.write(torch::zeros(t.shape, at::TensorOptions().dtype(dtype)));
  w.commit();
}

// A directory of the tiny config's tensors in two files and an index.
void write_sharded(const std::string& dir, const std::vector<std::pair<std::string, std::vector<int64_t>>>& tensors) {
  fs::create_directories(dir);
  std::vector<std::pair<std::string, std::vector<int64_t>>> a(tensors.begin(), tensors.begin() + 3),
      b(tensors.begin() + 3, tensors.end());
  write_tensors(dir, "model-00001-of-00002.safetensors", a);
  write_tensors(dir, "model-00002-of-00002.safetensors", b);
  std::string map;
  for (size_t i = 0; i < tensors.size(); ++i) {
    map += std::string(i ? ", " : "") + "\"" + tensors[i].first + "\": \"model-0000" + (i < 3 ? "1" : "2") +
           "-of-00002.safetensors\"";
  }
  write_file(dir + "/model.safetensors.index.json", "{\"metadata\": {}, \"weight_map\": {" + map + "}}");
}

std::string hf_error(const std::string& dir, const models::LlamaConfig& c) {
  return config_error([&] {
    HfStorageReader reader(dir);
    hf::check_weights(reader, c);
  });
}

TEST(HfDirectory, ReadsAnIndexedDirectoryInRowChunks) {
  TempDir tmp;
  const auto c = tiny_config();
  const auto shapes = models::llama_state_shapes(c);
  write_sharded(tmp.path() + "/m", shapes);
  ASSERT_TRUE(is_hf_model_dir(tmp.path() + "/m"));
  HfStorageReader reader(tmp.path() + "/m", /*chunk_bytes=*/64);
  hf::check_weights(reader, c);
  EXPECT_EQ(reader.index().tensors.size(), shapes.size());
  // embed_tokens [16, 8] f32: rows of 32 bytes, 2 rows per chunk of 64 bytes.
  const auto& embed = reader.index().tensors.at("model/model.embed_tokens.weight");
  ASSERT_EQ(embed.chunks.size(), 8u);
  EXPECT_EQ(embed.chunks[3].offsets, (std::vector<int64_t>{6, 0}));
  EXPECT_EQ(embed.chunks[3].sizes, (std::vector<int64_t>{2, 8}));
  auto chunk = reader.read_chunk("model/model.embed_tokens.weight", 3);
  EXPECT_EQ(chunk.sizes(), (std::vector<int64_t>{2, 8}));
  EXPECT_EQ(reader.bytes_read(), 64);
}

TEST(HfDirectory, BadDirectoriesNameTheFileAndTheKey) {
  TempDir tmp;
  const auto c = tiny_config();
  auto shapes = models::llama_state_shapes(c);
  // An index that points to a missing shard.
  const std::string d1 = tmp.path() + "/missing-shard";
  write_sharded(d1, shapes);
  fs::remove(d1 + "/model-00002-of-00002.safetensors");
  std::string e = hf_error(d1, c);
  EXPECT_NE(e.find(d1 + "/model.safetensors.index.json"), std::string::npos) << e;
  EXPECT_NE(e.find("model-00002-of-00002.safetensors"), std::string::npos) << e;
  EXPECT_NE(e.find("missing"), std::string::npos) << e;
  // A missing tensor, an extra one, a shape that disagrees with the config.
  const std::string d2 = tmp.path() + "/missing-tensor";
  auto fewer = shapes;
  fewer.erase(fewer.begin() + 4);
  write_sharded(d2, fewer);
  e = hf_error(d2, c);
  EXPECT_NE(e.find("\"" + shapes[4].first + "\" is missing"), std::string::npos) << e;
  EXPECT_NE(e.find("config.json"), std::string::npos) << e;
  const std::string d3 = tmp.path() + "/extra";
  auto more = shapes;
  more.push_back({"model.layers.1.mlp.up_proj.weight", {16, 8}});
  write_sharded(d3, more);
  e = hf_error(d3, c);
  EXPECT_NE(e.find("model-00002-of-00002.safetensors: tensor \"model.layers.1.mlp.up_proj.weight\" has no place"),
            std::string::npos)
      << e;
  const std::string d4 = tmp.path() + "/shape";
  auto bent = shapes;
  bent[0].second = {17, 8};
  write_sharded(d4, bent);
  e = hf_error(d4, c);
  EXPECT_NE(e.find("tensor \"model.embed_tokens.weight\" has shape [17, 8]"), std::string::npos) << e;
  EXPECT_NE(e.find("expects [16, 8]"), std::string::npos) << e;
  // A weight_map entry whose file does not hold the tensor.
  const std::string d5 = tmp.path() + "/wrong-file";
  write_sharded(d5, shapes);
  auto index = read_file(d5 + "/model.safetensors.index.json");
  const std::string from = "\"model.norm.weight\": \"model-00002", to = "\"model.norm.weight\": \"model-00001";
  index.replace(index.find(from), from.size(), to);
  write_file(d5 + "/model.safetensors.index.json", index);
  e = hf_error(d5, c);
  EXPECT_NE(e.find("weight_map.model.norm.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("holds no tensor"), std::string::npos) << e;
  // A safetensors header that lies (data offsets past the buffer).
  const std::string d6 = tmp.path() + "/lying";
  fs::create_directories(d6);
  write_tensors(d6, "model.safetensors", shapes);
  auto bytes = read_file(d6 + "/model.safetensors");
  const auto at = bytes.find("\"data_offsets\":[0,");
  ASSERT_NE(at, std::string::npos);
  bytes[at + 16] = '9';  // the first tensor now starts at 9, leaving a hole
  write_file(d6 + "/model.safetensors", bytes);
  e = hf_error(d6, c);
  EXPECT_NE(e.find(d6 + "/model.safetensors"), std::string::npos) << e;
  // An index that is not an index; a dtype that is not a float.
  const std::string d7 = tmp.path() + "/not-an-index";
  fs::create_directories(d7);
  write_file(d7 + "/model.safetensors.index.json", "{\"weight_map\": [1]}");
  e = hf_error(d7, c);
  EXPECT_NE(e.find("\"weight_map\": expected an object"), std::string::npos) << e;
  const std::string d8 = tmp.path() + "/ints";
  fs::create_directories(d8);
  write_tensors(d8, "model.safetensors", shapes, at::kLong);
  e = hf_error(d8, c);
  EXPECT_NE(e.find("is I64; expected F32, BF16 or F16"), std::string::npos) << e;
  // A name outside the directory.
  const std::string d9 = tmp.path() + "/escape";
  fs::create_directories(d9);
  write_file(d9 + "/model.safetensors.index.json", "{\"weight_map\": {\"a\": \"../x.safetensors\"}}");
  e = hf_error(d9, c);
  EXPECT_NE(e.find("not a file name inside the directory"), std::string::npos) << e;
}

}  // namespace
}  // namespace fsdp::testing
