// fsdp/strategy/init_context.h — ModuleInitContext, what
// FSDPStrategy::module_init_context returns (fsdp/strategy/strategy.h):
// deferred initialisation and the model's dtype while a model is built.
#pragma once

#include <optional>

#include <c10/core/ScalarType.h>
#include <c10/util/typeid.h>

#include "fsdp/core/fully_sharded_data_parallel.h"

namespace fsdp {

// What FSDPStrategy::module_init_context returns: while it lives, modules
// built on this thread are deferred (empty_init, see EmptyInitGuard) and,
// under a "-true" precision, created in that dtype (Lightning's
// module_init_context: half the initialisation memory for bf16-true). The
// dtype is LibTorch's default dtype, which is process-wide (as
// torch.set_default_dtype): ranks that are threads of one process see it
// too. It is restored when the context ends.
class ModuleInitContext {
 public:
  ModuleInitContext(bool empty_init, std::optional<at::ScalarType> dtype);
  ~ModuleInitContext();
  ModuleInitContext(const ModuleInitContext&) = delete;
  ModuleInitContext& operator=(const ModuleInitContext&) = delete;

 private:
  EmptyInitGuard empty_;
  std::optional<caffe2::TypeMeta> previous_dtype_;
};

}  // namespace fsdp
