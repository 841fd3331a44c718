// The index's scalar encodings: CRC-32 (zlib's, as PyTorch's zip and
// fsdp-cpp's index use it) and dtype names.
#include <zlib.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/error.h"
#include "fsdp/formats/format.h"

namespace fsdp::formats {

uint32_t crc32(const void* data, size_t n, uint32_t crc) {
  const auto* p = static_cast<const Bytef*>(data);
  uLong c = crc;
  while (n > 0) {
    const uInt step = static_cast<uInt>(std::min<size_t>(n, 1u << 30));
    c = ::crc32(c, p, step);
    p += step;
    n -= step;
  }
  return static_cast<uint32_t>(c);
}

namespace {

const std::vector<std::pair<at::ScalarType, const char*>>& dtype_names() {
  static const std::vector<std::pair<at::ScalarType, const char*>> names = {
      {at::kFloat, "float32"}, {at::kDouble, "float64"}, {at::kHalf, "float16"}, {at::kBFloat16, "bfloat16"},
      {at::kLong, "int64"},    {at::kInt, "int32"},      {at::kShort, "int16"},  {at::kChar, "int8"},
      {at::kByte, "uint8"},    {at::kBool, "bool"}};
  return names;
}

}  // namespace

std::string dtype_name(at::ScalarType dtype) {
  for (const auto& [t, n] : dtype_names()) {
    if (t == dtype) return n;
  }
  throw ConfigError(std::string("checkpoint: tensors of dtype ") + c10::toString(dtype) +
                    " cannot be saved (expected float32/64, float16, bfloat16, int8/16/32/64, uint8 or bool)");
}

at::ScalarType parse_dtype(const std::string& name, const std::string& where) {
  for (const auto& [t, n] : dtype_names()) {
    if (name == n) return t;
  }
  throw ConfigError("checkpoint: " + where + ": unknown dtype '" + name + "'");
}

}  // namespace fsdp::formats
