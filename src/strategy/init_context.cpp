// ModuleInitContext (fsdp/strategy/init_context.h): deferred initialisation
// and LibTorch's default dtype while a model is built.
#include "fsdp/strategy/init_context.h"

#include <c10/core/DefaultDtype.h>

namespace fsdp {

ModuleInitContext::ModuleInitContext(bool empty_init, std::optional<at::ScalarType> dtype) : empty_(empty_init) {
  if (dtype) {
    previous_dtype_ = c10::get_default_dtype();
    c10::set_default_dtype(c10::scalarTypeToTypeMeta(*dtype));
  }
}

ModuleInitContext::~ModuleInitContext() {
  if (previous_dtype_) c10::set_default_dtype(*previous_dtype_);
}

}  // namespace fsdp
