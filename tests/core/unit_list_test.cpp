// fsdp::UnitList: a ModuleList whose elements are units. Its names are
// ModuleList's, the loop over it goes through the units once they are FSDP
// units, and a sharded model built with it computes what the same model
// unwrapped computes.
#include <gtest/gtest.h>

#include <cmath>
#include <mutex>

#include "../support/thread_ranks.h"
#include "fsdp/error.h"
#include "fsdp/core/unit_list.h"
#include "../support/models.h"

using namespace fsdp;
using namespace fsdp::testing;

namespace {

// The same model twice: blocks in a torch::nn::ModuleList (the usual LibTorch
// way) and in an fsdp::UnitList.
struct ListNetImpl : torch::nn::Module {
  ListNetImpl() {
    for (int i = 0; i < 3; ++i) blocks->push_back(Block());
    register_module("blocks", blocks);
    head = register_module("head", torch::nn::Linear(kDim, kVocab));
  }
  torch::Tensor forward(torch::Tensor x) {
    for (const auto& block : *blocks) x = block->as<BlockImpl>()->forward(x);
    return head(x);
  }
  torch::nn::ModuleList blocks;
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(ListNet);

struct UnitListNetImpl : torch::nn::Module {
  UnitListNetImpl() {
    for (int i = 0; i < 3; ++i) blocks->emplace_back();
    register_module("blocks", blocks);
    head = register_module("head", torch::nn::Linear(kDim, kVocab));
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& block : *blocks) x = block(x);
    return head(x);
  }
  UnitList<BlockImpl> blocks;
  torch::nn::Linear head{nullptr};
};

std::vector<std::string> names_of(torch::nn::Module& m) {
  std::vector<std::string> out;
  for (auto& p : m.named_parameters()) out.push_back(p.key());
  for (auto& b : m.named_buffers()) out.push_back(b.key());
  return out;
}

}  // namespace

TEST(UnitList, NamesAreModuleListsAndAShardedModelComputesWhatTheUnwrappedOneDoes) {
  std::shared_ptr<ListNetImpl> reference;
  std::vector<std::shared_ptr<UnitListNetImpl>> nets;
  {
    std::lock_guard<std::mutex> lock(rng_mutex());
    torch::manual_seed(3);
    reference = std::make_shared<ListNetImpl>();
    for (int r = 0; r < 2; ++r) {
      torch::manual_seed(3);  // the same values as the reference
      nets.push_back(std::make_shared<UnitListNetImpl>());
    }
  }
  EXPECT_EQ(names_of(*nets[0]), names_of(*reference));  // "blocks.0.fc1.weight", ...
  ASSERT_EQ(nets[0]->blocks->size(), 3u);
  EXPECT_THROW(nets[0]->blocks->at(3), ConfigError);
  const auto x = torch::randn({4, kDim});
  const auto y = reference->forward(x);
  y.sum().backward();
  double squares = 0;
  for (auto& p : reference->parameters()) squares += p.grad().pow(2).sum().item<double>();
  const double expected_norm = std::sqrt(squares);

  run_ranks(2, [&](dist::ProcessGroup& pg) {
    FSDPOptions o;
    o.process_group(borrow(pg));
    o.use_orig_params(true);
    o.auto_wrap_policy(transformer_auto_wrap_policy<BlockImpl>());
    FullyShardedDataParallel<UnitListNetImpl> model(nets[static_cast<size_t>(pg.rank())], o);
    for (auto& block : *model->blocks) EXPECT_TRUE(block.is_fsdp_unit());
    EXPECT_EQ(names_of(*model), names_of(*reference));
    const auto out = model(x);
    EXPECT_TRUE(torch::allclose(out, y, 1e-6, 1e-6));
    out.sum().backward();
    // Each rank holds its shard of each gradient: their global norm is the
    // reference's.
    const double norm = clip_grad_norm_(model.ptr(), 1e9).item<double>();
    EXPECT_NEAR(norm, expected_norm, 1e-5 * expected_norm);
    // The same blocks in a ModuleList, called as modules: refused at wrap
    // time, pointing to UnitList.
    try {
      FullyShardedDataParallel<ListNetImpl> refused(std::make_shared<ListNetImpl>(), o);
      ADD_FAILURE() << "a ModuleList's blocks were wrapped";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("selected module 'blocks.0'"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("but fsdp-cpp cannot run code around its forward"), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("use a fsdp::UnitList<"), std::string::npos) << e.what();
    }
  });
}
