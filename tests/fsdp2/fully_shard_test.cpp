// fully_shard (FSDP2, fsdp/fsdp2/fully_shard.h): what it refuses, how it
// shards, frozen parameters without gradient memory, FSDP1 and FSDP2 on the
// same run, and — the reference — torch's own fully_shard over Gloo
// (tests/python/fully_shard_oracle.py): the same model, initial values and
// batches, AdamW on both sides (fsdp::optim::AdamW here), one thread per rank;
// losses and every local shard bitwise equal, at worlds 2, 3 and 4 (HSDP).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "../support/errors.h"
#include "../support/subprocess.h"
#include "../support/thread_ranks.h"
#include "fsdp/error.h"
#include "fsdp/fsdp.h"
#include "fsdp/fsdp2/fully_shard.h"
#include "fsdp/optim/adamw.h"
#include "fsdp/state_dict/distributed_state_dict.h"
#include "fsdp/state_dict/state_dict.h"

using namespace fsdp;
using namespace fsdp::testing;
namespace F = torch::nn::functional;

namespace {

// fully_shard_oracle.py's model and run, to the letter.
constexpr int64_t kVocab = 11, kDim = 8, kHidden = 13, kRankLora = 2;
constexpr int64_t kGlobalBatch = 12, kSeq = 3;
constexpr int kSteps = 3;
constexpr double kLr = 0.01, kWeightDecay = 0.1;

// sin(arange * a + b) * 0.5, made in float64 and rounded to float32.
at::Tensor values_of(at::IntArrayRef shape, double a, double b) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return at::arange(n, at::kDouble).mul(a).add(b).sin().mul(0.5).to(at::kFloat).reshape(shape);
}

struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(bool lora) : lora(lora) {
    if (lora) {
      lora_a = register_parameter("lora_a", torch::zeros({kRankLora, kDim}));
      lora_b = register_parameter("lora_b", torch::zeros({kHidden, kRankLora}));
    }
    fc1 = register_module("fc1", torch::nn::Linear(kDim, kHidden));
    fc2 = register_module("fc2", torch::nn::Linear(kHidden, kDim));
  }
  at::Tensor forward(at::Tensor x) {
    ++forwards;
    at::Tensor h = fc1(x);
    if (lora) h = h + F::linear(F::linear(x, lora_a), lora_b);
    return x + fc2(torch::tanh(h));
  }
  static thread_local int forwards;  // on this thread (a CPU backward runs on the caller's)
  bool lora;
  at::Tensor lora_a, lora_b;
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

thread_local int BlockImpl::forwards = 0;

struct TinyLMImpl : torch::nn::Module {
  explicit TinyLMImpl(bool lora) {
    offset = register_parameter("offset", torch::zeros({1, kDim}));  // one row: empty shards from world 2 on
    mix = register_parameter("mix", torch::zeros({2}));              // two rows: an empty shard at world 3
    emb = register_module("emb", Unit<torch::nn::EmbeddingImpl>(kVocab, kDim));
    b0 = register_module("b0", Unit<BlockImpl>(lora));
    b1 = register_module("b1", Unit<BlockImpl>(lora));
    head = register_module("head", Unit<torch::nn::LinearImpl>(kDim, kVocab));
  }
  at::Tensor forward(at::Tensor tokens) {
    at::Tensor h = emb(tokens).mean(1) + offset;
    h = b1(b0(h));
    h = h * mix[0] + mix[1];
    return skip_head ? h : head(h);
  }
  at::Tensor offset, mix;
  // emb and head in Unit holders, so that fully_shard can take them as a list.
  Unit<torch::nn::EmbeddingImpl> emb{nullptr};
  Unit<BlockImpl> b0{nullptr}, b1{nullptr};
  Unit<torch::nn::LinearImpl> head{nullptr};
  bool skip_head = false;  // forward stops before the head (a chunked loss calls it)
};

// The model with fully_shard_oracle.py's initial values (and, for LoRA,
// everything but the adapters frozen).
std::shared_ptr<TinyLMImpl> make_model(bool lora) {
  auto m = std::make_shared<TinyLMImpl>(lora);
  torch::NoGradGuard no_grad;
  int i = 0;
  for (auto& p : m->named_parameters()) {
    p.value().copy_(values_of(p.value().sizes(), 0.37 + 0.1 * i, 0.2 * i));
    if (lora && p.key().find("lora") == std::string::npos) p.value().requires_grad_(false);
    ++i;
  }
  return m;
}

// torch::nn::Module keeps its parameters in a protected member; a pointer to
// it, formed in a derived class, reaches it on any module.
struct ParameterSlots : torch::nn::Module {
  static torch::OrderedDict<std::string, at::Tensor>& of(torch::nn::Module& m) {
    return m.*(&ParameterSlots::parameters_);
  }
};

// The head's weight becomes the embedding's (fully_shard_oracle.py's
// head.weight = emb.weight): one tensor registered under both names.
void tie_head_to_embedding(TinyLMImpl& m) {
  ParameterSlots::of(*m.head)["weight"] = m.emb->weight;
  m.head->weight = m.emb->weight;
}

// Global batch `step`, micro-batch `micro`: this rank's rows.
std::pair<at::Tensor, at::Tensor> batch(int step, int micro, int rank, int world) {
  const int64_t t = step * 2 + micro;
  at::Tensor i = at::arange(kGlobalBatch).reshape({-1, 1});
  at::Tensor j = at::arange(kSeq).reshape({1, -1});
  at::Tensor tokens = (i * 7 + j * 3 + t * 5 + 1) % kVocab;
  at::Tensor target = (at::arange(kGlobalBatch) * 5 + t * 2) % kVocab;
  const int64_t n = kGlobalBatch / world;
  return {tokens.narrow(0, rank * n, n), target.narrow(0, rank * n, n)};
}

std::set<std::string> flags_of(const std::string& c) {
  std::set<std::string> out;
  std::stringstream s(c);
  for (std::string part; std::getline(s, part, '+');) out.insert(part);
  return out;
}

// The model fully_shard made for a case: blocks first, then the root.
struct Sharded {
  std::shared_ptr<TinyLMImpl> net;
  Unit<TinyLMImpl> root{nullptr};
  FSDPModule fsdp, b0, b1;
};

Sharded shard(dist::ProcessGroup& pg, const std::set<std::string>& flags) {
  Sharded s;
  s.net = make_model(flags.count("lora") > 0);
  if (flags.count("tied")) tie_head_to_embedding(*s.net);
  s.root = Unit<TinyLMImpl>(s.net);
  if (flags.count("ckpt")) apply_activation_checkpointing(s.net, checkpoint_module_types<BlockImpl>());
  FullyShardOptions o(flags.count("hsdp") ? Mesh::hybrid(dist::init_device_mesh(borrow(pg), 2, pg.size() / 2))
                                          : Mesh::of(borrow(pg)));
  if (flags.count("raf0")) o.reshard_after_forward(false);
  if (flags.count("raf2")) o.reshard_after_forward(2);
  if (flags.count("bf16")) o.mp_policy(MixedPrecisionPolicy{at::kBFloat16, at::kFloat, std::nullopt, true});
  if (flags.count("bf16p")) o.mp_policy(MixedPrecisionPolicy{at::kBFloat16, std::nullopt, std::nullopt, true});
  if (flags.count("ends")) fully_shard({s.net->emb.ptr(), s.net->head.ptr()}, o);
  if (flags.count("group")) {
    s.b0 = s.b1 = fully_shard({s.net->b0.ptr(), s.net->b1.ptr()}, o);
  } else {
    s.b0 = fully_shard(s.net->b0, o);
    s.b1 = fully_shard(s.net->b1, o);
  }
  s.fsdp = fully_shard(s.root, o);
  return s;
}

void append(std::string& out, const at::Tensor& t) {
  at::Tensor f = t.detach().to(at::kFloat).contiguous();
  out.append(static_cast<const char*>(f.data_ptr()), f.numel() * sizeof(float));
}

// Runs case `c` on this rank; returns what fully_shard_oracle.py writes.
// libtorch_adamw: LibTorch's own AdamW instead of fsdp::optim::AdamW.
std::string run_case(dist::ProcessGroup& pg, const std::string& c, bool libtorch_adamw = false) {
  const auto flags = flags_of(c);
  Sharded s = shard(pg, flags);
  if (flags.count("prefetch")) {
    s.fsdp.set_modules_to_forward_prefetch({s.b0});
    s.b0.set_modules_to_forward_prefetch({s.b1});
    s.b1.set_modules_to_backward_prefetch({s.b0});
  }
  if (flags.count("sum")) {
    for (FSDPModule* m : {&s.fsdp, &s.b0, &s.b1}) {
      m->set_gradient_divide_factor(pg.size());
      m->set_force_sum_reduction_for_comms(true);
    }
  }
  const auto adamw_options = torch::optim::AdamWOptions(kLr).weight_decay(kWeightDecay);
  std::unique_ptr<torch::optim::Optimizer> opt =
      libtorch_adamw ? std::make_unique<torch::optim::AdamW>(unique_parameters(s.net), adamw_options)
                     : std::make_unique<optim::AdamW>(unique_parameters(s.net), adamw_options);
  std::string out;
  for (int step = 0; step < kSteps; ++step) {
    opt->zero_grad();
    const int micros = flags.count("accum") || flags.count("noar") ? 2 : 1;
    for (int micro = 0; micro < micros; ++micro) {
      if (flags.count("accum")) s.fsdp.set_requires_gradient_sync(micro == micros - 1);
      if (flags.count("noar")) s.fsdp.set_requires_all_reduce(micro == micros - 1);
      if (flags.count("prefetch")) s.fsdp.unshard(/*async_op=*/true);
      auto [tokens, target] = batch(step, micro, pg.rank(), pg.size());
      at::Tensor loss = F::cross_entropy(s.root(tokens), target);
      loss.backward();
      append(out, loss);
    }
    if (flags.count("clip")) append(out, clip_grad_norm_(s.fsdp, 0.5));
    opt->step();
    if (flags.count("prefetch")) {
      s.fsdp.unshard();  // gathers the stepped shards, which reshard() shows again
      s.fsdp.reshard();
    }
  }
  for (const auto& p : unique_parameters(s.net)) append(out, p);  // torch's named_parameters(): a tied one once
  return out;
}

// Names the first difference between this rank's result and the oracle's.
std::string first_difference(const std::string& mine, const std::string& want, const std::string& c, int rank,
                             int world) {
  if (mine == want) return "";
  std::ostringstream msg;
  msg << c << " rank " << rank << "/" << world << ": ";
  if (mine.size() != want.size()) {
    msg << mine.size() << " bytes here, " << want.size() << " from torch";
    return msg.str();
  }
  auto at = [](const std::string& s, size_t i) {
    float f;
    std::memcpy(&f, s.data() + i * 4, 4);
    return f;
  };
  for (size_t i = 0; i < mine.size() / 4; ++i) {
    if (std::memcmp(mine.data() + i * 4, want.data() + i * 4, 4) != 0) {
      msg.precision(9);
      msg << "float " << i << " is " << at(mine, i) << " here, " << at(want, i) << " from torch";
      return msg.str();
    }
  }
  return "";
}

#ifdef FSDP_TEST_TORCH_ORACLE
// torch's results for `cases` at `world`: one run of the oracle (one Python
// start per rank).
void run_oracle(const TempDir& dir, int world, const std::vector<std::string>& cases) {
  std::vector<std::string> argv = {FSDP_TEST_PYTHON, FSDP_TEST_SOURCE_DIR "/python/fully_shard_oracle.py", dir.path(),
                                   std::to_string(world)};
  argv.insert(argv.end(), cases.begin(), cases.end());
  auto r = run_program(argv, std::chrono::seconds(240));
  ASSERT_EQ(r.exit_code(), 0) << r.output;
}

void expect_equal_to_torch(int world, const std::vector<std::string>& cases) {
  at::set_num_threads(1);
  TempDir dir;
  run_oracle(dir, world, cases);
  if (::testing::Test::HasFatalFailure()) return;
  std::mutex mu;
  std::vector<std::string> differences;
  run_ranks(world, [&](dist::ProcessGroup& pg) {
    for (const auto& c : cases) {
      const std::string mine = run_case(pg, c);
      const std::string want = read_file(dir.path() + "/" + c + ".r" + std::to_string(pg.rank()) + ".bin");
      const std::string d = first_difference(mine, want, c, pg.rank(), world);
      std::lock_guard<std::mutex> lock(mu);
      if (!d.empty()) differences.push_back(d);
    }
    // The comparison can fail: LibTorch's AdamW (mul_ and add_ where torch
    // uses lerp_) is not torch's to the bit.
    const std::string c = cases.front();
    const std::string other = run_case(pg, c, /*libtorch_adamw=*/true);
    const std::string want = read_file(dir.path() + "/" + c + ".r" + std::to_string(pg.rank()) + ".bin");
    std::lock_guard<std::mutex> lock(mu);
    if (first_difference(other, want, c, pg.rank(), world).empty()) {
      differences.push_back(c + ": LibTorch's AdamW gave torch's result too: the comparison sees nothing");
    }
  });
  for (const auto& d : differences) ADD_FAILURE() << d;
}

// tied+bf16+accum: a token embedding tied to the head, bf16 compute with
// float32 reduction, two micro-batches, the first without gradient sync.
// torch 2.15 gives the unsharded parameter grad_dtype float32 in a no-sync
// backward that finds no gradient, so the tied weight's two uses are each
// cast to float32 and summed there; and the weight's AccumulateGrad node
// that a graph made before a reshard holds gets it too (ends+tied). Before:
// summed in bfloat16, then cast ("tied+bf16+accum rank 0/2: float 6 is
// -0.0298477001 here, -0.0298470221 from torch", the same for
// ends+tied+bf16+accum); untied, or syncing every micro-batch, it was equal.
TEST(FullyShardTorch, World2EqualsTorchBitwise) {
  expect_equal_to_torch(2, {"base", "raf0", "bf16", "lora", "accum", "bf16+accum", "prefetch", "sum", "clip", "group",
                            "ends", "ends+bf16", "tied+bf16+accum", "ends+tied+bf16+accum", "bf16p", "bf16p+accum"});
}

TEST(FullyShardTorch, World3EqualsTorchBitwise) {
  expect_equal_to_torch(3, {"base", "raf0", "sum", "clip", "group+ends"});
}

// HSDP 2x2, and resharding to groups of 2 after forward at a 1-D world of 4.
TEST(FullyShardTorch, World4HsdpAndReshardToTwoEqualTorchBitwise) {
  expect_equal_to_torch(4, {"hsdp", "raf2", "hsdp+clip", "hsdp+noar"});
}
#else
TEST(FullyShardTorch, NeedsTheWheelBuild) {
  GTEST_SKIP() << "the torch oracle runs where the test Python's torch is this LibTorch (the wheel build)";
}
#endif

// ---------------------------------------------------------------------------

struct ScalarImpl : torch::nn::Module {
  ScalarImpl() { s = register_parameter("temperature", torch::ones({})); }
  at::Tensor forward(at::Tensor x) { return x * s; }
  at::Tensor s;
};

// torch's sharded parameters are apart from the unsharded ones, so an
// optimizer's zero_grad clears the sharded gradient wherever it is called:
// `loss = model(x); opt.zero_grad(); loss.backward()` trains as zero_grad
// before the forward does. Here the root stays unsharded from its forward to
// its backward (as torch's root does); its parameters' .grad is the sharded
// gradient meanwhile, and zero_grad clears it.
TEST(FullyShard, ZeroGradBetweenForwardAndBackwardClearsTheShardedGradient) {
  std::vector<std::vector<at::Tensor>> after(2);
  for (int order = 0; order < 2; ++order) {
    std::mutex mu;
    run_ranks(2, [&](dist::ProcessGroup& pg) {
      auto net = make_model(false);
      Mesh mesh = Mesh::of(borrow(pg));
      fully_shard(net->b0, mesh);
      fully_shard(net->b1, mesh);
      Unit<TinyLMImpl> root(net);
      fully_shard(root, mesh);
      optim::AdamW opt(net->parameters(), torch::optim::AdamWOptions(1e-2));
      for (int step = 0; step < 4; ++step) {
        auto [tokens, target] = batch(step, 0, pg.rank(), 2);
        if (order == 0) opt.zero_grad();
        auto loss = F::cross_entropy(root(tokens), target);
        if (order == 1) {
          opt.zero_grad();
          // None (LibTorch 2's set_to_none) or zeros (1.13's zero_grad): the sharded gradient, cleared.
          for (const auto& p : net->parameters()) {
            EXPECT_TRUE(!p.grad().defined() || p.grad().eq(0).all().item<bool>());
          }
        }
        loss.backward();
        opt.step();
      }
      std::lock_guard<std::mutex> lock(mu);
      if (pg.rank() == 0) {
        for (const auto& p : net->parameters()) after[order].push_back(p.detach().clone());
      }
    });
  }
  ASSERT_EQ(after[0].size(), after[1].size());
  for (size_t i = 0; i < after[0].size(); ++i) EXPECT_TRUE(after[0][i].equal(after[1][i])) << "parameter " << i;
}

TEST(FullyShard, RefusesWhatTorchRefusesByName) {
  run_ranks(2, [](dist::ProcessGroup& pg) {
    Mesh mesh = Mesh::of(borrow(pg));
    {
      auto net = make_model(false);
      fully_shard(net->b0, mesh);
      EXPECT_NE(config_error([&] { fully_shard(net->b0, mesh); }).find("BlockImpl is already sharded by fully_shard"),
                std::string::npos);
    }
    EXPECT_NE(config_error([&] { fully_shard(std::make_shared<torch::nn::ModuleListImpl>(), mesh); })
                  .find("without a forward of its own"),
              std::string::npos);
    {
      Unit<ScalarImpl> m(std::make_shared<ScalarImpl>());
      EXPECT_NE(config_error([&] { fully_shard(m, mesh); }).find("parameter temperature is a scalar (0-d)"),
                std::string::npos);
    }
    {
      auto net = make_model(false);
      Mesh three;
      three.groups = {borrow(pg), borrow(pg), borrow(pg)};
      EXPECT_NE(config_error([&] { fully_shard(net->b0, three); }).find("1-D or 2-D mesh, but the mesh has 3"),
                std::string::npos);
      Mesh unnamed;
      unnamed.groups = {borrow(pg), borrow(pg)};
      EXPECT_NE(config_error([&] { fully_shard(net->b0, unnamed); }).find("needs its dimension names"),
                std::string::npos);
      EXPECT_NE(config_error([&] { fully_shard(net->b0, FullyShardOptions(mesh).reshard_after_forward(3)); })
                    .find("must be a factor of 2"),
                std::string::npos);
    }
    {
      // A parameter shared by two groups (torch 2.15 refuses it at the
      // first forward); sharded together, as a list, it is accepted.
      auto net = make_model(false);
      fully_shard(net->emb, mesh);
      net->head->register_parameter("tied", net->emb->weight);
      EXPECT_NE(config_error([&] { fully_shard(net->head, mesh); })
                    .find("parameter tied is shared with a parameter that another fully_shard group already manages "
                          "(module torch::nn::EmbeddingImpl)"),
                std::string::npos);
      auto tied = make_model(false);
      tied->head->register_parameter("tied", tied->emb->weight);
      FSDPModule ends = fully_shard({tied->emb.ptr(), tied->head.ptr()}, mesh);
      EXPECT_EQ(ends.sharded_params().size(), 3u);  // emb.weight once, head.weight, head.bias
      EXPECT_EQ(ends.modules().size(), 2u);
      EXPECT_EQ(fsdp_module_of(*tied->head)->group(), ends.group());
      // A list runs under the model that calls it, never as the root.
      auto list = make_model(false);
      fully_shard({list->b0.ptr(), list->b1.ptr()}, mesh);
      EXPECT_NE(config_error([&] { list->b0(torch::zeros({2, kDim})); }).find("but a root is one module"),
                std::string::npos);
      // A listed module that another listed one holds is not a member of its own.
      auto nested = make_model(false);
      Unit<TinyLMImpl> holder(nested);
      FSDPModule all = fully_shard({nested->b0.ptr(), std::shared_ptr<torch::nn::Module>(nested)}, mesh);
      EXPECT_EQ(all.modules(), std::vector<torch::nn::Module*>{nested.get()});
    }
    {
      // A module no holder can interpose (LibTorch has no module hooks).
      auto bare = std::make_shared<BlockImpl>(false);
      EXPECT_NE(config_error([&] { fully_shard(bare, mesh); }).find("held by no fsdp::Unit holder"), std::string::npos);
    }
    {
      // One model, one engine, both ways round.
      auto net = make_model(false);
      FullyShardedDataParallel<BlockImpl> fsdp1(net->b0.ptr(), FSDPOptions().process_group(borrow(pg)));
      EXPECT_NE(config_error([&] { fully_shard(net->b0, mesh); }).find("FullyShardedDataParallel"), std::string::npos);
      auto other = make_model(false);
      fully_shard(other->b1, mesh);
      EXPECT_NE(config_error([&] {
                  FullyShardedDataParallel<TinyLMImpl> m(other, FSDPOptions().process_group(borrow(pg)));
                }).find("one model takes one engine"),
                std::string::npos);
    }
  });
}

// torch.chunk's rows on dim 0, uneven and empty shards, the local tensors
// the module's parameters hold outside forward, and full_tensor().
// torch::save / torch::load would write or read each parameter's rows under
// its full name; LBFGS's global dot products cannot run on shards.
TEST(FullyShard, RefusesTorchSaveTorchLoadAndLbfgsByName) {
  TempDir dir;
  run_ranks(2, [&](dist::ProcessGroup& pg) {
    FullyShard<TinyLMImpl> model(make_model(false), FullyShardOptions(Mesh::of(borrow(pg))));
    const std::string file = dir.path() + "/m" + std::to_string(pg.rank()) + ".pt";
    EXPECT_NE(config_error([&] { torch::save(model, file); }).find("which fully_shard sharded"), std::string::npos);
    EXPECT_FALSE(std::filesystem::exists(file));
    Unit<TinyLMImpl> plain(make_model(false));
    torch::save(plain, file);  // an unsharded model saves as LibTorch's do
    EXPECT_NE(config_error([&] { torch::load(model, file); }).find("get_model_state_dict"), std::string::npos);
    torch::optim::LBFGS lbfgs(model->parameters());
    EXPECT_NE(config_error([&] { check_optimizer(model.ptr(), lbfgs); }).find("LBFGS"), std::string::npos);
    EXPECT_NE(config_error([&] { get_optimizer_state_dict(model.ptr(), lbfgs); }).find("LBFGS"), std::string::npos);
    fsdp::optim::AdamW adamw(model->parameters(), torch::optim::AdamWOptions(kLr));
    EXPECT_NO_THROW(check_optimizer(model.ptr(), adamw));
  });
}

TEST(FullyShard, ShardsEachParameterByRowsAsTorchChunk) {
  const auto reference = make_model(false);
  std::map<std::string, at::Tensor> initial;
  for (const auto& p : reference->named_parameters()) initial[p.key()] = p.value().detach().clone();
  run_ranks(3, [&](dist::ProcessGroup& pg) {
    Sharded s = shard(pg, {"base"});
    const auto params = s.fsdp.sharded_params();
    // The root's own: torch's order (modules children first, then each module's own parameters).
    std::vector<std::string> names;
    for (const auto& p : params) names.push_back(p.name);
    EXPECT_EQ(names, (std::vector<std::string>{"emb.weight", "head.weight", "head.bias", "offset", "mix"}));
    for (const auto& p : params) {
      const int64_t rows = p.global_shape[0];
      const int64_t per = (rows + 2) / 3;
      const int64_t begin = std::min(rows, per * pg.rank());
      const int64_t end = std::min(rows, begin + per);
      EXPECT_EQ(p.row_offset, begin) << p.name;
      EXPECT_EQ(p.local.size(0), end - begin) << p.name;
      EXPECT_TRUE(p.param.is_same(s.net->named_parameters()[p.name])) << p.name;
      EXPECT_EQ(p.param.sizes(), p.local.sizes()) << p.name << ": outside forward the parameter shows its shard";
      EXPECT_TRUE(at::equal(p.local, initial[p.name].narrow(0, begin, end - begin))) << p.name;
      EXPECT_TRUE(at::equal(p.full_tensor(), initial[p.name])) << p.name;
    }
    // offset has one row, mix two: at world 3 the last ranks hold none.
    EXPECT_EQ(s.net->offset.size(0), pg.rank() == 0 ? 1 : 0);
    EXPECT_EQ(s.net->mix.size(0), pg.rank() < 2 ? 1 : 0);
    // unshard() and reshard() by hand.
    s.fsdp.unshard();
    EXPECT_TRUE(at::equal(s.net->head->weight, initial["head.weight"]));
    s.fsdp.reshard();
    EXPECT_EQ(s.net->head->weight.size(0), pg.rank() < 2 ? 4 : 3);
  });
}

// Activation checkpointing of the blocks: backward re-runs their forwards
// on the gathered parameters; the result is the same to the bit (torch's
// itself is the reference through the "base" case above).
TEST(FullyShard, ActivationCheckpointingChangesNoBit) {
  at::set_num_threads(1);
  run_ranks(2, [&](dist::ProcessGroup& pg) {
    BlockImpl::forwards = 0;
    const std::string plain = run_case(pg, "base");
    EXPECT_EQ(BlockImpl::forwards, 2 * kSteps);
    const std::string checkpointed = run_case(pg, "base+ckpt");
    EXPECT_EQ(BlockImpl::forwards, 2 * kSteps + 4 * kSteps) << "backward re-runs each block's forward";
    EXPECT_EQ(first_difference(checkpointed, plain, "ckpt", pg.rank(), 2), "");
    EXPECT_EQ(plain.size(), checkpointed.size());
  });
}

// A model built under fsdp::EmptyInitGuard holds no parameter memory until
// fully_shard materialises each group, with an eager build's values.
TEST(FullyShard, MaterialisesDeferredModulesWithEagerValues) {
  std::map<std::string, at::Tensor> eager;
  {
    torch::manual_seed(42);
    Unit<TinyLMImpl> m(false);
    for (const auto& p : m->named_parameters()) eager[p.key()] = p.value().detach().clone();
  }
  // Built before the ranks start: ranks that are threads share LibTorch's
  // generator, and no rank may draw from it while another materialises.
  std::vector<Unit<TinyLMImpl>> models;
  for (int r = 0; r < 2; ++r) {
    EmptyInitGuard guard;
    torch::manual_seed(42);
    models.emplace_back(false);
  }
  run_ranks(2, [&](dist::ProcessGroup& pg) {
    Unit<TinyLMImpl>& lazy = models[pg.rank()];
    for (const auto& p : lazy->named_parameters()) {
      EXPECT_EQ(p.value().storage().nbytes(), 0u) << p.key() << " holds memory before fully_shard";
    }
    const Mesh mesh = Mesh::of(borrow(pg));
    FSDPModule b0 = fully_shard(lazy->b0, mesh), b1 = fully_shard(lazy->b1, mesh), root = fully_shard(lazy, mesh);
    for (const FSDPModule* m : {&b0, &b1, &root}) {
      const std::string prefix = m == &b0 ? "b0." : m == &b1 ? "b1." : "";
      for (const auto& p : m->sharded_params()) {
        EXPECT_TRUE(at::equal(p.full_tensor(), eager.at(prefix + p.name))) << prefix + p.name;
      }
    }
  });
}

// fully_shard([emb, head]) with a forward that stops before the head (a
// chunked loss calls it afterwards): the root's post-forward ends the
// group's forward (its parameters are their rows again), the head's
// standalone call gathers them anew, and training gives the bits of the
// same group with the head inside the forward.
TEST(FullyShard, AGroupModuleCalledAfterTheForwardTrainsAsInside) {
  at::set_num_threads(1);
  run_ranks(2, [](dist::ProcessGroup& pg) {
    auto run = [&](bool outside) {
      Sharded s = shard(pg, {"ends"});
      s.net->skip_head = outside;
      optim::AdamW opt(s.net->parameters(), torch::optim::AdamWOptions(kLr).weight_decay(kWeightDecay));
      std::string out;
      for (int step = 0; step < kSteps; ++step) {
        opt.zero_grad();
        auto [tokens, target] = batch(step, 0, pg.rank(), pg.size());
        at::Tensor logits = s.root(tokens);
        if (outside) {
          EXPECT_EQ(s.net->head->weight.size(0), kVocab / 2 + (pg.rank() == 0)) << "the head's rows after the root's forward";
          logits = s.net->head(logits);
        }
        at::Tensor loss = F::cross_entropy(logits, target);
        loss.backward();
        append(out, loss);
        opt.step();
      }
      for (const auto& p : s.net->named_parameters()) append(out, p.value());
      return out;
    };
    const std::string inside = run(false), outside = run(true);
    EXPECT_EQ(first_difference(outside, inside, "head outside", pg.rank(), pg.size()), "");
  });
}

// LoRA: frozen parameters get no gradient memory, sharded or full; the
// gradient bytes after backward are the adapters' shards alone.
TEST(FullyShard, FrozenParametersHaveNoGradientMemory) {
  run_ranks(2, [](dist::ProcessGroup& pg) {
    Sharded s = shard(pg, {"lora"});
    auto [tokens, target] = batch(0, 0, pg.rank(), pg.size());
    F::cross_entropy(s.root(tokens), target).backward();
    int64_t grad_bytes = 0, adapter_bytes = 0;
    for (const auto& p : s.net->named_parameters()) {
      const bool adapter = p.key().find("lora") != std::string::npos;
      if (adapter) adapter_bytes += p.value().numel() * 4;
      if (p.value().grad().defined()) {
        EXPECT_TRUE(adapter) << p.key() << " is frozen and has a gradient";
        EXPECT_EQ(p.value().grad().sizes(), p.value().sizes()) << p.key() << ": the gradient is sharded";
        grad_bytes += p.value().grad().numel() * p.value().grad().element_size();
      } else {
        EXPECT_FALSE(adapter && p.value().numel() > 0) << p.key() << " trains and has no gradient";
      }
    }
    EXPECT_EQ(grad_bytes, adapter_bytes);
    EXPECT_GT(grad_bytes, 0);
  });
}

// FSDP1 (flat parameters) and FSDP2 on the same run. At world 2 the
// reductions sum the same values in the same order (FSDP1 divides by 2
// before, FSDP2 by 2 after: both exact), so the weights agree to the bit; at
// world 3 FSDP1 divides by 2 before and 1.5 after, FSDP2 by 3 after.
void expect_fsdp1_equals_fsdp2(int world, double tolerance) {
  at::set_num_threads(1);
  run_ranks(world, [&](dist::ProcessGroup& pg) {
    auto train = [&](const std::function<at::Tensor(at::Tensor)>& forward, std::vector<at::Tensor> params) {
      optim::AdamW opt(std::move(params), torch::optim::AdamWOptions(kLr).weight_decay(kWeightDecay));
      for (int step = 0; step < kSteps; ++step) {
        opt.zero_grad();
        auto [tokens, target] = batch(step, 0, pg.rank(), pg.size());
        F::cross_entropy(forward(tokens), target).backward();
        opt.step();
      }
    };
    Sharded s = shard(pg, {"base"});
    train([&](at::Tensor x) { return s.root(x); }, s.net->parameters());
    std::map<std::string, at::Tensor> fsdp2;
    for (const FSDPModule* m : {&s.b0, &s.b1, &s.fsdp}) {
      const std::string prefix = m == &s.b0 ? "b0." : m == &s.b1 ? "b1." : "";
      for (const auto& p : m->sharded_params()) fsdp2[prefix + p.name] = p.full_tensor();
    }
    FullyShardedDataParallel<TinyLMImpl> fsdp1(
        make_model(false),
        FSDPOptions().process_group(borrow(pg)).auto_wrap_policy(transformer_auto_wrap_policy<BlockImpl>()));
    train([&](at::Tensor x) { return fsdp1(x); }, fsdp1->parameters());
    const auto full1 = full_parameters(fsdp1.ptr());
    ASSERT_EQ(full1.size(), fsdp2.size());
    for (const auto& [name, t] : full1) {
      ASSERT_TRUE(fsdp2.count(name)) << name;
      const double diff = (t - fsdp2[name]).abs().max().item<double>();
      if (tolerance == 0) {
        EXPECT_TRUE(at::equal(t, fsdp2[name])) << name << ": max difference " << diff;
      } else {
        EXPECT_LE(diff, tolerance) << name;
      }
    }
  });
}

TEST(FullyShard, EqualsFsdp1BitwiseAtWorld2) { expect_fsdp1_equals_fsdp2(2, 0); }
TEST(FullyShard, AgreesWithFsdp1Within1e6AtWorld3) { expect_fsdp1_equals_fsdp2(3, 1e-6); }

// fsdp::clip_grad_norm_(model), the one entry point of both engines, runs
// fully_shard's arithmetic (torch.nn.utils.clip_grad_norm_ over DTensors)
// for a model whose root fully_shard sharded: the norm and the clipped
// gradients of clip_grad_norm_(FSDPModule), to the bit.
TEST(FullyShard, TheOneClipGradNormEntryPointRunsTheDTensorArithmetic) {
  run_ranks(2, [](dist::ProcessGroup& pg) {
    std::vector<std::vector<at::Tensor>> results;
    for (bool one_entry : {false, true}) {
      Sharded s = shard(pg, {});
      auto [tokens, target] = batch(0, 0, pg.rank(), pg.size());
      F::cross_entropy(s.root(tokens), target).backward();
      std::vector<at::Tensor> r{one_entry ? clip_grad_norm_(s.root.ptr(), 0.5) : clip_grad_norm_(s.fsdp, 0.5)};
      for (const auto& p : unique_parameters(s.net)) r.push_back(p.grad().defined() ? p.grad().clone() : at::zeros({0}));
      results.push_back(std::move(r));
    }
    ASSERT_EQ(results[0].size(), results[1].size());
    for (size_t i = 0; i < results[0].size(); ++i) EXPECT_TRUE(results[0][i].equal(results[1][i])) << i;
    // One range of norm_type for both engines, as documented (FSDP1's path
    // refused these before; fully_shard's computed them).
    {
      Sharded s = shard(pg, {});
      for (double p : {0.0, -2.0, -std::numeric_limits<double>::infinity(), std::nan("")}) {
        EXPECT_NE(config_error([&] { clip_grad_norm_(s.root.ptr(), 0.5, p); }).find("expected p > 0 or INFINITY"),
                  std::string::npos)
            << p;
      }
    }
    // A model whose fully_shard modules lie under an unsharded root, and one
    // with modules of both engines, are refused by name.
    auto net = make_model(false);
    fully_shard(net->b1, Mesh::of(borrow(pg)));
    EXPECT_NE(config_error([&] { clip_grad_norm_(net, 1.0); }).find("pass the root that fully_shard sharded"),
              std::string::npos);
    FSDPOptions o;
    o.process_group(borrow(pg));
    FullyShardedDataParallel<BlockImpl> b0(net->b0.ptr(), o);
    const std::string mixed = config_error([&] { clip_grad_norm_(net, 1.0); });
    EXPECT_NE(mixed.find("BlockImpl (under "), std::string::npos) << mixed;
    EXPECT_NE(mixed.find("is sharded by fully_shard (FSDP2); one model takes one engine"), std::string::npos) << mixed;
  });
}

}  // namespace
