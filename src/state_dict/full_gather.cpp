// Each engine's gather for FULL state dicts (full_gather.h).
#include "full_gather.h"

#include <ATen/ATen.h>

#include "fsdp/core/detail/unit_view.h"
#include "fsdp/distributed/process_group.h"
#include "fsdp/dtensor/device_mesh.h"
#include "fsdp/error.h"
#include "fsdp/fsdp2/fully_shard.h"
#include "shard_geometry.h"

namespace fsdp::detail {

namespace {

// FSDP1: a unit's flat parameter gathered once, each original parameter a
// view of it; optimizer state laid out as the flat shard and gathered the
// same way. The unit's "which state exists" flags travel in one all-gather
// of their own.
class UnitGather final : public FullGather, public FlagExchange {
 public:
  explicit UnitGather(const UnitView* u) : u_(u) {}

  std::vector<at::Tensor> gather() const override {
    const at::Tensor flat = u_->gather_master();  // [collective] one all-gather per unit
    std::vector<at::Tensor> out;
    for (const auto& p : u_->params()) out.push_back(param_view(flat, p));
    return out;
  }

  std::vector<at::Tensor> gather_state(const std::vector<StatePart>& parts) const override {
    at::Tensor local = laid_out(parts);
    at::Tensor full = local;
    if (u_->shard_size() > 1) {  // [collective] one all-gather per call
      full = at::empty({u_->padded_numel()}, local.options());
      u_->shard_group()->all_gather_unbuffered(full, local);
    }
    std::vector<at::Tensor> out;
    for (const auto& part : parts) out.push_back(param_view(full, u_->params().at(part.member)));
    return out;
  }

  bool views() const override { return true; }
  const FlagExchange& flags() const override { return *this; }

  at::Tensor max_over_ranks(const at::Tensor& flags, const std::vector<FlagMember>&) const override {
    if (u_->shard_size() <= 1) return flags;
    at::Tensor all = at::empty({flags.numel() * u_->shard_size()}, flags.options());
    u_->shard_group()->all_gather(all, flags).wait();  // [collective] every rank's flags
    return all.view({-1, flags.numel()}).amax(0);
  }

 private:
  // This rank's part of the state, laid out as the flat shard: the
  // optimizer's own tensor where it steps the flat shard (one source of the
  // shard's size holding every member at its place), else the members'
  // elements put in place in zeros.
  at::Tensor laid_out(const std::vector<StatePart>& parts) const {
    const at::Tensor& shard = u_->flat_shard();
    const auto& params = u_->params();
    bool in_place = !parts.empty() && parts.size() == params.size() && parts.front().source.defined() &&
                    parts.front().source.numel() == shard.numel();
    for (size_t i = 0; i < parts.size() && in_place; ++i) {
      const ParamInfo& p = params.at(parts[i].member);
      auto [lo, hi] = local_range(*u_, p);
      in_place = parts[i].source.is_same(parts.front().source) && (hi == lo || parts[i].at == shard_index(*u_, p, lo));
    }
    if (in_place) return parts.front().source;
    at::Tensor local = at::zeros({shard.numel()}, shard.options().requires_grad(false));
    for (const auto& part : parts) {
      if (!part.source.defined()) continue;
      const ParamInfo& p = params.at(part.member);
      auto [lo, hi] = local_range(*u_, p);
      if (hi > lo) local.narrow(0, shard_index(*u_, p, lo), hi - lo).copy_(part.source.narrow(0, part.at, hi - lo));
    }
    return local;
  }

  const UnitView* u_;
};

// FSDP2: every parameter's flags in one MAX all-reduce over their shard
// group, which must be one.
class RowsFlags final : public FlagExchange {
 public:
  at::Tensor max_over_ranks(const at::Tensor& flags, const std::vector<FlagMember>& members) const override {
    if (members.empty()) return flags;
    const auto& group = members.front().mesh->shard_group();
    for (const FlagMember& m : members) {
      if (m.mesh->shard_group() != group) {
        throw ConfigError("optim_state_dict: the fully_shard parameters " + *members.front().key + " and " + *m.key +
                          " are sharded over different meshes; a FULL optimizer state dict needs one mesh");
      }
    }
    if (group->size() > 1) group->all_reduce(flags, dist::ReduceOp::kMax).wait();  // [collective]
    return flags;
  }
};

// FSDP2: one parameter gathered from its rows.
class RowsGather final : public FullGather {
 public:
  explicit RowsGather(const ShardedParam* p) : p_(p) {}
  std::vector<at::Tensor> gather() const override { return {p_->full_tensor()}; }  // [collective]
  std::vector<at::Tensor> gather_state(const std::vector<StatePart>& parts) const override {
    std::vector<at::Tensor> out;
    for (const auto& part : parts) {
      const at::Tensor& local = p_->local;
      const at::Tensor rows = part.source.defined()
                                  ? part.source.narrow(0, part.at, local.numel()).reshape(local.sizes())
                                  : at::zeros_like(local);
      out.push_back(p_->gather(rows));  // [collective] one all-gather per part
    }
    return out;
  }
  bool views() const override { return false; }
  const FlagExchange& flags() const override {
    static const RowsFlags shared;  // stateless: the members name their mesh
    return shared;
  }

 private:
  const ShardedParam* p_;
};

}  // namespace

std::shared_ptr<const FullGather> unit_gather(const UnitView* u) { return std::make_shared<UnitGather>(u); }

std::shared_ptr<const FullGather> rows_gather(const ShardedParam* p) { return std::make_shared<RowsGather>(p); }

}  // namespace fsdp::detail
