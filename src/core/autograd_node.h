// Autograd nodes across LibTorch versions: 1.x and early 2.x hold a
// torch::autograd::Node in a std::shared_ptr; newer 2.x (2.15) in a
// c10::intrusive_ptr. NodePtr is whichever this LibTorch uses (the type that
// grad_accumulator() returns), and make_node builds a node of type T in it.
#pragma once

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

#include <memory>
#include <type_traits>
#include <utility>

namespace fsdp::detail {

using NodePtr = decltype(torch::autograd::impl::grad_accumulator(std::declval<const at::Tensor&>()));

template <class T, class... Args>
auto make_node(Args&&... args) {
  if constexpr (std::is_same_v<NodePtr, std::shared_ptr<torch::autograd::Node>>) {
    return std::make_shared<T>(std::forward<Args>(args)...);
  } else {
    return c10::make_intrusive<T>(std::forward<Args>(args)...);
  }
}

}  // namespace fsdp::detail
