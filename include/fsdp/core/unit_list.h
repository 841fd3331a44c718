// fsdp/core/unit_list.h — torch::nn::ModuleList's counterpart for FSDP: a list
// whose elements are fsdp::Unit<M> holders, so that the habitual loop over
// a model's blocks keeps working once the blocks are FSDP units.
//
//   struct NetImpl : torch::nn::Module {
//     NetImpl() {
//       for (int i = 0; i < 4; ++i) blocks->emplace_back(256);   // BlockImpl(256)
//       register_module("blocks", blocks);
//     }
//     at::Tensor forward(at::Tensor x) {
//       for (auto& block : *blocks) x = block(x);   // through the unit: it gathers its parameters
//       return x;
//     }
//     fsdp::UnitList<BlockImpl> blocks;
//   };
//
// With a torch::nn::ModuleList the loop reads `blocks[i]->as<BlockImpl>()->
// forward(x)`, which calls the block's module directly: once the block is an
// FSDP unit its parameters are shards there, and LibTorch fails on their
// shapes (FSDP's error then says to call the unit). A UnitList element is
// called as `block(x)` and goes through the unit. Names are ModuleList's
// ("blocks.0.weight"), so state dicts and checkpoints of the model with a
// ModuleList load unchanged. docs/porting.md walks through a whole model.
//
// Elements become units by the wrapping policy (transformer_auto_wrap_policy
// with M, as for any fsdp::Unit member) or by wrap(); unwrapped, the list
// behaves as a ModuleList. Local; not thread-safe while being built.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/error.h"
#include "fsdp/core/fully_sharded_data_parallel.h"

namespace fsdp {

template <class M>
class UnitListImpl : public torch::nn::Module {
 public:
  UnitListImpl() = default;

  // Appends `unit` as child "<size>" (a std::shared_ptr<M> or an M holder
  // converts to a Unit).
  void push_back(Unit<M> unit) {
    register_module(std::to_string(units_.size()), unit);
    units_.push_back(std::move(unit));
  }
  // Appends Unit<M>(args...): M built from its constructor arguments (built
  // deferred under an EmptyInitGuard, as any Unit, when there are some; with
  // none, M is built at once).
  template <class... Args>
  void emplace_back(Args&&... args) {
    if constexpr (sizeof...(Args) == 0) {
      push_back(Unit<M>(std::make_shared<M>()));
    } else {
      push_back(Unit<M>(std::forward<Args>(args)...));
    }
  }

  size_t size() const noexcept { return units_.size(); }
  bool is_empty() const noexcept { return units_.empty(); }
  Unit<M>& operator[](size_t index) { return units_[index]; }
  const Unit<M>& operator[](size_t index) const { return units_[index]; }
  // ConfigError naming the size when `index` is out of range.
  Unit<M>& at(size_t index) {
    if (index >= units_.size()) {
      throw ConfigError("UnitList::at: index " + std::to_string(index) + " is out of range (the list holds " +
                        std::to_string(units_.size()) + " units)");
    }
    return units_[index];
  }
  auto begin() { return units_.begin(); }
  auto end() { return units_.end(); }
  auto begin() const { return units_.begin(); }
  auto end() const { return units_.end(); }

 private:
  std::vector<Unit<M>> units_;
};

// The holder, as TORCH_MODULE makes for other modules: UnitList<M> list;
// list->push_back(...); for (auto& u : *list) ...
template <class M>
class UnitList : public torch::nn::ModuleHolder<UnitListImpl<M>> {
 public:
  using torch::nn::ModuleHolder<UnitListImpl<M>>::ModuleHolder;
};

}  // namespace fsdp
