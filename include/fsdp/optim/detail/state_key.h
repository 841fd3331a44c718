// fsdp/optim/detail/state_key.h — the key of a parameter's state in a
// LibTorch optimizer (Optimizer::state()), which differs between LibTorch
// versions. For the optimizers and the optimizer state dicts; not for
// applications (namespace fsdp::detail, no stability promise).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

#include <sstream>
#include <string>
#include <type_traits>
#include <utility>

namespace fsdp::detail {

// The key of a parameter's state in Optimizer::state(): its TensorImpl's
// address, printed (LibTorch 1.x, std::string keys) or as is (2.2+, void*).
using StateKey = std::decay_t<decltype(std::declval<torch::optim::Optimizer&>().state())>::key_type;
template <class Key = StateKey>
Key state_key(const at::Tensor& t) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream key;  // how LibTorch 1.x prints it (c10::guts::to_string)
    key << static_cast<const void*>(t.unsafeGetTensorImpl());
    return key.str();
  } else {
    return static_cast<Key>(t.unsafeGetTensorImpl());
  }
}

}  // namespace fsdp::detail
