// The one-line port (fsdp/fsdp2/fully_shard.h, FullyShard): the FSDP1 test
// model (tests/support/models.h: blocks in a torch::nn::Sequential, a Unit
// member, a buffer, an embedding tied to the head) trained with FSDP1 and
// with FSDP2 under the same auto-wrap policy gives the same weights.
#include <gtest/gtest.h>

#include "../support/models.h"
#include "../support/thread_ranks.h"
#include "fsdp/error.h"
#include "fsdp/fsdp2/fully_shard.h"
#include "fsdp/optim/adamw.h"

using namespace fsdp;
using namespace fsdp::testing;

namespace {

template <class Model>
void train(Model& model, dist::ProcessGroup& pg, const std::vector<Batch>& batches) {
  optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(0.01).weight_decay(0.1));
  const int64_t local = batches[0].tokens.size(0) / pg.size();
  for (const auto& b : batches) {
    opt.zero_grad();
    auto tokens = b.tokens.narrow(0, pg.rank() * local, local);
    auto target = b.target.narrow(0, pg.rank() * local, local);
    torch::nn::functional::cross_entropy(model(tokens), target).backward();
    opt.step();
  }
}

TEST(FullyShardPort, OneLineChangeFromFsdp1GivesTheSameWeights) {
  at::set_num_threads(1);
  const auto batches = make_batches(4, 12, 7);
  run_ranks(2, [&](dist::ProcessGroup& pg) {
    const auto policy = transformer_auto_wrap_policy<BlockImpl>();
    FullyShardedDataParallel<NetImpl> fsdp1(make_net(1234), FSDPOptions().process_group(borrow(pg)).auto_wrap_policy(policy));
    FullyShard<NetImpl> fsdp2(make_net(1234), FullyShardOptions(Mesh::of(borrow(pg))), policy);
    // The policy made the Sequential's blocks groups of their own, and the
    // Unit member (a BlockImpl too); the root keeps the tied embedding once.
    int groups = 0;
    for (const auto& m : fsdp2->modules()) groups += fsdp_module_of(*m).has_value();
    EXPECT_EQ(groups, 4);
    train(fsdp1, pg, batches);
    train(fsdp2, pg, batches);
    std::map<std::string, at::Tensor> full2;
    for (const auto& item : fsdp2->named_modules()) {
      auto g = fsdp_module_of(*item.value());
      if (!g) continue;
      for (const auto& p : g->sharded_params()) {
        full2[item.key().empty() ? p.name : item.key() + "." + p.name] = p.full_tensor();
      }
    }
    const auto full1 = full_parameters(fsdp1.ptr());
    ASSERT_EQ(full1.size(), full2.size());
    for (const auto& [name, t] : full1) {
      ASSERT_TRUE(full2.count(name)) << name;
      EXPECT_TRUE(at::equal(t, full2[name])) << name;
    }
  });
}

}  // namespace
