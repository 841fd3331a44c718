// Box arithmetic on shapes (fsdp/dtensor/detail/boxes.h).
#include "fsdp/dtensor/detail/boxes.h"

#include <algorithm>
#include <sstream>

namespace fsdp::detail {

int64_t product(const std::vector<int64_t>& v) {
  int64_t n = 1;
  for (int64_t x : v) n *= x;
  return n;
}

std::string shape_str(c10::IntArrayRef shape) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << "]";
  return os.str();
}

bool intersect(const std::vector<int64_t>& a_offsets, c10::IntArrayRef a_sizes, const std::vector<int64_t>& b_offsets,
               c10::IntArrayRef b_sizes, std::vector<std::pair<int64_t, int64_t>>& out) {
  const size_t nd = a_sizes.size();
  if (a_offsets.size() != nd || b_offsets.size() != nd || b_sizes.size() != nd) return false;
  out.clear();
  for (size_t d = 0; d < nd; ++d) {
    const int64_t lo = std::max(a_offsets[d], b_offsets[d]);
    const int64_t hi = std::min(a_offsets[d] + a_sizes[d], b_offsets[d] + b_sizes[d]);
    if (hi <= lo) return false;
    out.emplace_back(lo, hi);
  }
  return true;
}

}  // namespace fsdp::detail
