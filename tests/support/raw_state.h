// Test helpers for module state dicts that other programs wrote (torch.save
// files, safetensors files): the values tests/python/write_state_dict.py
// gives the test Net's tensors, the suites' files that Python scripts write,
// and checks on what a model holds after a load.
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "errors.h"
#include "subprocess.h"
#include "fsdp/error.h"
#include "fsdp/state_dict/state_dict.h"
#include "trainer.h"

namespace fsdp::testing {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

// The value write_state_dict.py gives the j-th tensor.
inline torch::Tensor expected_value(const std::vector<int64_t>& shape, int64_t j) {
  int64_t n = 1;
  for (auto s : shape) n *= s;
  return (torch::arange(n, torch::kFloat32).remainder(97) * 0.25 + j).reshape(shape);
}

// The model's full state (every rank gets it): key -> tensor, in order.
inline NamedTensors full_state(const std::shared_ptr<torch::nn::Module>& model) {
  StateDictTypeGuard guard(model, StateDictType::kFull);
  NamedTensors out;
  for (const auto& [k, v] : state_dict(model)) out.emplace_back(k, std::get<torch::Tensor>(v).clone());
  return out;
}

// The test Net's state, as write_state_dict.py expects it.
inline NamedTensors plain_state() {
  auto net = make_net(1);
  NamedTensors out;
  for (const auto& [k, v] : state_dict(net)) out.emplace_back(k, std::get<torch::Tensor>(v));
  return out;
}

// The spec write_state_dict.py (and write_safetensors.py) reads: [[key, sizes, is_buffer], ...].
inline void write_spec(const std::string& path) {
  nlohmann::json spec = nlohmann::json::array();
  auto net = make_net(1);
  std::set<std::string> buffers;
  for (const auto& b : net->named_buffers()) buffers.insert(b.key());
  for (const auto& [k, t] : plain_state()) spec.push_back({k, t.sizes().vec(), buffers.count(k) > 0});
  std::ofstream(path) << spec.dump();
}

// `state` holds write_state_dict.py's values (every key but `except`), in the model's dtypes.
inline void expect_written_values(const NamedTensors& state, const std::string& what, const std::string& except = "") {
  ASSERT_EQ(state.size(), plain_state().size()) << what;
  for (size_t j = 0; j < state.size(); ++j) {
    const auto& [k, t] = state[j];
    if (k == except) continue;
    EXPECT_TRUE(torch::equal(t, expected_value(t.sizes().vec(), static_cast<int64_t>(j)).to(t.scalar_type())))
        << what << ": " << k;
  }
}

// A suite's files, written once for it by a script of tests/python/ that
// takes the spec (write_spec) and a folder: `SCRIPT SPEC.json DIR`.
template <const char* Script>
class PythonWrittenFiles : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir;
    write_spec(dir_->path() + "/spec.json");
    auto r = run_program({FSDP_TEST_PYTHON, std::string(FSDP_TEST_SOURCE_DIR "/python/") + Script,
                          dir_->path() + "/spec.json", dir_->path()},
                         std::chrono::seconds(120));
    ASSERT_EQ(r.status, 0) << r.output;
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static std::string file(const std::string& name) { return dir_->path() + "/" + name; }
  static inline TempDir* dir_ = nullptr;
};

}  // namespace fsdp::testing
