// fsdp::optim::AdamW (fsdp/optim/adamw.h) against torch.optim.AdamW, bit for
// bit: tests/python/adamw_oracle.py makes the same parameters and gradients
// with the same ATen operations, steps torch's AdamW, and writes the result;
// here the C++ optimizer does the same and every byte must agree. Where the
// test Python's torch is not the LibTorch under test (the Debian build), the
// oracle is skipped and the rest still runs.
#include "fsdp/optim/adamw.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "../support/subprocess.h"
#include "fsdp/error.h"
#include "fsdp/optim/detail/state_key.h"
#include "fsdp/state_dict/optim_state_dict.h"

using namespace fsdp::testing;

namespace {

struct Case {
  const char* name;
  int steps;
  double lr, beta1, beta2, eps, weight_decay;
  bool amsgrad;
};

// Uneven shapes, a 1-element parameter, a vector and a matrix.
const std::vector<std::vector<int64_t>> kShapes = {{7, 5}, {13}, {1}, {4, 3, 2}};

std::string shapes_arg() {
  std::string s;
  for (const auto& shape : kShapes) {
    if (!s.empty()) s += ",";
    for (size_t d = 0; d < shape.size(); ++d) s += (d ? "x" : "") + std::to_string(shape[d]);
  }
  return s;
}

// adamw_oracle.py's values_of: sin(arange * a + b) * 0.5 in float64, rounded to float32.
at::Tensor values_of(const std::vector<int64_t>& shape, double a, double b) {
  int64_t n = 1;
  for (auto s : shape) n *= s;
  return torch::arange(n, torch::kFloat64).mul(a).add(b).sin().mul(0.5).to(torch::kFloat32).reshape(shape);
}

// Runs `opt_of(params)` for c.steps steps with adamw_oracle.py's gradients;
// returns what the oracle writes, in its layout.
template <class Optimizer>
std::string run(const Case& c) {
  std::vector<at::Tensor> params;
  for (size_t i = 0; i < kShapes.size(); ++i) {
    params.push_back(values_of(kShapes[i], 0.37 + static_cast<double>(i), 0.1 * static_cast<double>(i)).requires_grad_());
  }
  Optimizer opt(params, torch::optim::AdamWOptions(c.lr)
                            .betas({c.beta1, c.beta2})
                            .eps(c.eps)
                            .weight_decay(c.weight_decay)
                            .amsgrad(c.amsgrad));
  for (int t = 0; t < c.steps; ++t) {
    for (size_t i = 0; i < params.size(); ++i) {
      const bool skip = i == 1 && t % 2 == 1;
      params[i].mutable_grad() =
          skip ? at::Tensor()
               : values_of(kShapes[i], 0.11 * (t + 1) + 0.7 * static_cast<double>(i), 0.3 * t).mul(std::pow(10.0, t % 5 - 3));
    }
    opt.step();
  }
  std::string out;
  auto put = [&](const at::Tensor& t) {
    at::Tensor x = t.detach().to(torch::kFloat32).contiguous();
    out.append(static_cast<const char*>(x.data_ptr()), static_cast<size_t>(x.numel()) * sizeof(float));
  };
  for (const auto& p : params) {
    auto& s = static_cast<torch::optim::AdamWParamState&>(*opt.state().at(fsdp::detail::state_key(p)));
    put(p);
    put(s.exp_avg());
    put(s.exp_avg_sq());
    if (c.amsgrad) put(s.max_exp_avg_sq());
    put(torch::full({1}, static_cast<double>(s.step()), torch::kFloat32));
  }
  return out;
}

const Case kCases[] = {
    {"defaults_with_weight_decay", 20, 1e-3, 0.9, 0.999, 1e-8, 1e-2, false},
    {"nanogpt_betas_large_lr", 25, 3e-3, 0.9, 0.95, 1e-8, 0.1, false},
    {"amsgrad_no_weight_decay", 20, 1e-2, 0.8, 0.99, 1e-6, 0.0, true},
};

// torch.optim.AdamW's result for case `c`: adamw_oracle.py runs every case
// at the first call (one Python start, about 5 s), into a folder kept for
// the process.
std::string oracle(const Case& c) {
  static TempDir* dir = [] {
    auto* d = new TempDir;
    auto num = [](double v) {
      std::ostringstream s;
      s.precision(17);
      s << v;
      return s.str();
    };
    std::vector<std::string> argv = {FSDP_TEST_PYTHON, FSDP_TEST_SOURCE_DIR "/python/adamw_oracle.py", d->path(),
                                     shapes_arg()};
    for (const Case& k : kCases) {
      for (const std::string& a : {std::string(k.name), std::to_string(k.steps), num(k.lr), num(k.beta1), num(k.beta2),
                                   num(k.eps), num(k.weight_decay), std::string(k.amsgrad ? "1" : "0")}) {
        argv.push_back(a);
      }
    }
    auto r = run_program(argv, std::chrono::seconds(120));
    EXPECT_EQ(r.status, 0) << r.output;
    return d;
  }();
  std::ifstream f(dir->path() + "/" + c.name + ".bin", std::ios::binary);
  EXPECT_TRUE(f.good()) << "adamw_oracle.py wrote no result for " << c.name;
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// One test for every case (ctest runs each test in a process of its own:
// this way Python starts once). The last check is the reason this optimizer
// exists, and proof that the comparison can fail: LibTorch's own AdamW, in
// its order of operations, is not torch's to the bit.
TEST(AdamWOracle, EveryParameterAndStateIsBitwiseTorchsInEveryCaseAndLibTorchsOwnIsNot) {
#ifndef FSDP_TEST_TORCH_ORACLE
  GTEST_SKIP() << "the test Python's torch is not this LibTorch (the Debian build): no bitwise reference";
#else
  at::set_num_threads(1);
  for (const Case& c : kCases) {
    const std::string want = oracle(c);
    const std::string got = run<fsdp::optim::AdamW>(c);
    ASSERT_EQ(got.size(), want.size()) << c.name;
    EXPECT_TRUE(got == want) << c.name << ": fsdp::optim::AdamW differs from torch.optim.AdamW";
  }
  EXPECT_FALSE(run<torch::optim::AdamW>(kCases[0]) == oracle(kCases[0]));
#endif
}

// On every build: the same update as LibTorch's AdamW up to rounding, the
// same state (so state dicts and checkpoints take it as an AdamW), and
// sparse gradients refused.
TEST(AdamW, MatchesLibTorchsAdamWUpToRoundingWithTheSameState) {
  const Case& c = kCases[1];
  const std::string ours = run<fsdp::optim::AdamW>(c);
  const std::string theirs = run<torch::optim::AdamW>(c);
  ASSERT_EQ(ours.size(), theirs.size());
  const auto* a = reinterpret_cast<const float*>(ours.data());
  const auto* b = reinterpret_cast<const float*>(theirs.data());
  for (size_t i = 0; i < ours.size() / sizeof(float); ++i) {
    EXPECT_NEAR(a[i], b[i], 1e-4 * (1 + std::abs(b[i]))) << "element " << i;
  }
}

TEST(AdamW, IsALibTorchAdamWAndRefusesSparseGradients) {
  auto p = torch::zeros({4}).requires_grad_();
  fsdp::optim::AdamW opt({p}, torch::optim::AdamWOptions(0.1));
  EXPECT_NE(dynamic_cast<torch::optim::AdamW*>(&opt), nullptr);
  p.mutable_grad() = torch::sparse_coo_tensor(torch::tensor({{1}}, torch::kLong), torch::ones({1}), {4});
  try {
    opt.step();
    FAIL() << "a sparse gradient was accepted";
  } catch (const fsdp::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("sparse gradient"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(torch::equal(p, torch::zeros({4})));  // nothing stepped
}

// Its state goes through fsdp-cpp's optimizer state dicts as an AdamW's:
// saved after two steps, loaded into a new optimizer on a copy of the
// model, both continue to the same bits.
TEST(AdamW, StateDictsTakeItAsAnAdamWAndAResumedRunContinuesBitwise) {
  torch::manual_seed(0);
  auto make = [] { return std::make_shared<torch::nn::LinearImpl>(6, 3); };
  auto model = make();
  fsdp::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
  const auto x = torch::randn({5, 6});
  auto step = [&](const std::shared_ptr<torch::nn::LinearImpl>& m, torch::optim::Optimizer& o) {
    o.zero_grad();
    m->forward(x).pow(2).sum().backward();
    o.step();
  };
  step(model, opt);
  step(model, opt);
  const fsdp::OptimStateDict saved = fsdp::optim_state_dict(model, opt);
  ASSERT_EQ(saved.param_groups.size(), 1u);
  EXPECT_EQ(saved.param_groups[0].options.at("weight_decay"), 0.1);

  auto copy = make();
  {
    torch::NoGradGuard no_grad;
    copy->weight.copy_(model->weight);
    copy->bias.copy_(model->bias);
  }
  fsdp::optim::AdamW resumed(copy->parameters(), torch::optim::AdamWOptions(1.0));
  fsdp::load_optim_state_dict(copy, resumed, saved);
  step(model, opt);
  step(copy, resumed);
  EXPECT_TRUE(torch::equal(model->weight, copy->weight));
  EXPECT_TRUE(torch::equal(model->bias, copy->bias));
}

}  // namespace
