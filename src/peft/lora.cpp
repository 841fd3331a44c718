// LoRA as an adapter pass (fsdp/peft/lora.h): the config's checks, PEFT's
// target matching, the adapters' initial values, and inject_lora's walk.
#include "fsdp/peft/lora.h"

#include <torch/nn/functional/linear.h>
#include <torch/nn/init.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <memory>
#include <unordered_set>
#include <utility>

#include <unistd.h>

#include "fsdp/error.h"

namespace fsdp::peft {

namespace {

std::string joined(const std::vector<std::string>& names, const std::string& sep) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : sep) + n;
  return out;
}

// Adapters of rank `rank` on modules whose in + out add up to `in_plus_out`,
// of `element_bytes` each: ConfigError naming `what`, the rank and the bytes
// when they exceed int64 sizes (2^62 bytes) or this machine's physical
// memory, before LibTorch's allocator is asked for them.
void check_adapters_fit(int64_t rank, long double in_plus_out, int64_t element_bytes, const std::string& what) {
  const long double bytes = static_cast<long double>(rank) * in_plus_out * static_cast<long double>(element_bytes);
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  const long double memory = pages > 0 && page > 0 ? static_cast<long double>(pages) * static_cast<long double>(page)
                                                   : static_cast<long double>(int64_t{1} << 62);
  const long double max_bytes = static_cast<long double>(int64_t{1} << 62);  // past that, int64 sizes overflow
  if (bytes <= std::min(memory, max_bytes)) return;
  char text[64];
  std::snprintf(text, sizeof text, "%.4Lg", bytes);
  throw ConfigError(what + ": LoRA rank " + std::to_string(rank) + " needs " + text + " bytes of adapters, more than " +
                    (bytes > max_bytes ? std::string("any machine holds")
                                       : "this machine's memory (" + std::to_string(static_cast<long long>(memory)) + " bytes)") +
                    "; expected the rank of a real adapter (PEFT's r is typically 4 to 256)");
}

}  // namespace

void check_lora_config(const LoraConfig& lora, const std::vector<std::string>& known, const std::string& known_what) {
  if (lora.rank < 0) throw ConfigError("LoRA: rank " + std::to_string(lora.rank) + " is negative; expected 0 (none) or more");
  if (lora.rank == 0) return;
  if (!(lora.alpha > 0) || !std::isfinite(lora.alpha)) {
    throw ConfigError("LoRA: alpha " + std::to_string(lora.alpha) + " must be a positive number");
  }
  if (lora.targets.empty()) throw ConfigError("LoRA: rank " + std::to_string(lora.rank) + " but no target projections");
  std::unordered_set<std::string> seen;  // a set: a file's list of 100k names is checked in linear time
  for (const auto& t : lora.targets) {
    if (known.empty() && t.empty()) throw ConfigError("LoRA: an empty target name (targets \"" + lora_targets_text(lora.targets) + "\")");
    if (!known.empty() && std::find(known.begin(), known.end(), t) == known.end()) {
      throw ConfigError("LoRA: target \"" + t + "\" is not " + known_what + "; expected some of " + joined(known, ", "));
    }
    if (!seen.insert(t).second) throw ConfigError("LoRA: target \"" + t + "\" is given twice");
  }
}

std::string lora_targets_text(const std::vector<std::string>& targets) { return joined(targets, ","); }

std::vector<std::string> parse_lora_targets(const std::string& text) {
  std::vector<std::string> out;
  for (size_t at = 0; at <= text.size();) {
    const size_t comma = std::min(text.find(',', at), text.size());
    out.push_back(text.substr(at, comma - at));
    at = comma + 1;
  }
  return out;
}

bool matches_target(const std::string& name, const std::string& target) {
  if (name == target) return true;
  return name.size() > target.size() && name.compare(name.size() - target.size(), target.size(), target) == 0 &&
         name[name.size() - target.size() - 1] == '.';
}

at::Tensor LoraLayer::with_lora(const at::Tensor& x, at::Tensor y) {
  if (lora_A) y = y + lora_B(lora_A(x)) * scaling;
  return y;
}

void add_lora(torch::nn::Module& module, int64_t rank, double alpha) {
  auto* layer = dynamic_cast<LoraLayer*>(&module);
  if (!layer) throw ConfigError("LoRA: module " + module.name() + " has no LoRA seam (fsdp::peft::LoraLayer)");
  if (layer->lora_A) throw ConfigError("LoRA: module " + module.name() + " has adapters already");
  if (rank <= 0) throw ConfigError("LoRA: rank " + std::to_string(rank) + " must be positive to add adapters");
  const auto own = module.named_parameters(/*recurse=*/false);
  const at::Tensor* found = own.find("weight");
  if (!found || found->dim() != 2) {
    throw ConfigError("LoRA: module " + module.name() + " has no 2-D parameter \"weight\" [out, in] to adapt");
  }
  const at::Tensor weight = *found;
  const int64_t out = weight.size(0), in = weight.size(1);
  check_adapters_fit(rank, static_cast<long double>(in) + static_cast<long double>(out),
                     static_cast<int64_t>(weight.element_size()), "LoRA: module " + module.name());
  // PEFT's reset_lora_parameters: A Kaiming-uniform (a = sqrt(5)), B zeros;
  // drawn in the default dtype on CPU, then placed as the weight is.
  torch::nn::Linear A(torch::nn::LinearOptions(in, rank).bias(false));
  torch::nn::Linear B(torch::nn::LinearOptions(rank, out).bias(false));
  {
    torch::NoGradGuard no_grad;
    torch::nn::init::kaiming_uniform_(A->weight, std::sqrt(5.0));
    B->weight.zero_();
  }
  if (A->weight.device() != weight.device() || A->weight.scalar_type() != weight.scalar_type()) {
    A->to(weight.device(), weight.scalar_type());
    B->to(weight.device(), weight.scalar_type());
  }
  layer->lora_A = module.register_module("lora_A", A);
  layer->lora_B = module.register_module("lora_B", B);
  layer->scaling = alpha / static_cast<double>(rank);
}

LinearImpl::LinearImpl(const torch::nn::LinearOptions& options) : torch::nn::LinearImpl(options) {}

at::Tensor LinearImpl::forward(const at::Tensor& input) {
  return with_lora(input, torch::nn::functional::linear(input, weight, bias));
}

std::vector<std::string> inject_lora(torch::nn::Module& model, const LoraConfig& config) {
  check_lora_config(config);
  if (config.rank == 0) throw ConfigError("inject_lora: rank 0 adds no adapters; expected a rank of 1 or more");
  // Every match is checked before any module changes.
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> found;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    const std::string& name = item.key();
    const bool wanted = std::any_of(config.targets.begin(), config.targets.end(),
                                    [&](const std::string& t) { return matches_target(name, t); });
    if (!wanted) continue;
    const auto* layer = dynamic_cast<const LoraLayer*>(item.value().get());
    if (!layer) {
      const bool plain = dynamic_cast<const torch::nn::LinearImpl*>(item.value().get()) != nullptr;
      throw ConfigError("inject_lora: module '" + name + "' (" + item.value()->name() + ") matches the targets " +
                        lora_targets_text(config.targets) + " but " +
                        (plain ? "is LibTorch's torch::nn::Linear, whose forward cannot take adapters in place: build "
                                 "it as fsdp::peft::Linear (the same module, with LoRA's seam)"
                               : "is not a linear module with LoRA's seam (fsdp::peft::LoraLayer)"));
    }
    if (layer->lora_A) throw ConfigError("inject_lora: module '" + name + "' has LoRA adapters already");
    found.emplace_back(name, item.value());
  }
  if (found.empty()) {
    throw ConfigError("inject_lora: no module of the model matches the targets " + lora_targets_text(config.targets) +
                      " (PEFT's rule: a module's name equals a target or ends with \".\" + target)");
  }
  // Every adapter's bytes together, before the first is allocated (and
  // every weight checked, so that nothing changes when one is refused).
  long double in_plus_out = 0;
  int64_t element_bytes = 1;
  for (const auto& [name, module] : found) {
    const auto own = module->named_parameters(/*recurse=*/false);
    const at::Tensor* weight = own.find("weight");
    if (!weight || weight->dim() != 2) {
      throw ConfigError("inject_lora: module '" + name + "' has no 2-D parameter \"weight\" [out, in] to adapt");
    }
    in_plus_out += static_cast<long double>(weight->size(0)) + static_cast<long double>(weight->size(1));
    element_bytes = std::max<int64_t>(element_bytes, static_cast<int64_t>(weight->element_size()));
  }
  check_adapters_fit(config.rank, in_plus_out, element_bytes,
                     "inject_lora: " + std::to_string(found.size()) + " modules matching " + lora_targets_text(config.targets));
  std::vector<std::string> names;
  for (auto& [name, module] : found) {
    add_lora(*module, config.rank, config.alpha);
    names.push_back(name);
  }
  mark_only_lora_trainable(model);
  return names;
}

bool is_lora_key(const std::string& key) {
  return key.find("lora_A.") != std::string::npos || key.find("lora_B.") != std::string::npos;
}

void mark_only_lora_trainable(torch::nn::Module& model) {
  for (auto& p : model.named_parameters()) {
    if (p.key().find("lora_") == std::string::npos) p.value().requires_grad_(false);
  }
}

}  // namespace fsdp::peft
