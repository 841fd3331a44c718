// One safetensors file as a storage (readers.h, SafetensorsFileReader): a
// module's weights, its tensors the one model entry "model", each read whole.
#include <ATen/ATen.h>

#include <algorithm>
#include <filesystem>

#include "readers.h"

namespace fsdp::detail {

bool SafetensorsFileReader::claims(const std::string& path, bool module_state) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return false;
  // By content; loading a module, also by name (a name ending in
  // .safetensors gets the safetensors reader's errors when its content is not right).
  if (module_state && std::filesystem::path(path).extension() == ".safetensors") return true;
  const int64_t size = formats::file_size(path);
  return formats::looks_like_safetensors(formats::read_range(path, 0, std::min<int64_t>(size, 64)), size);
}

SafetensorsFileReader::SafetensorsFileReader(const std::string& path)
    : header_(formats::read_safetensors_header(path)) {
  path_ = path;
  where_ = path;
  add_module_entry(ix_);
  for (size_t i = 0; i < header_.tensors.size(); ++i) {
    const auto& t = header_.tensors[i];
    add_module_tensor(ix_, t.name, t.dtype, t.shape);
    at_["model/" + t.name] = i;
  }
}

at::Tensor SafetensorsFileReader::read_chunk(const std::string& key, size_t) const {
  return formats::read_safetensors_tensor(path_, header_, header_.tensors.at(at_.at(key)));
}

}  // namespace fsdp::detail
