// fsdp/dtensor/detail/boxes.h — arithmetic on shapes and boxes (an offset and
// a size per dimension), below the pieces of tensors (fsdp/dtensor/shards.h),
// DTensor and state_dict's geometry of a rank. The library's door for them,
// not an API for users; local, no tensor data touched.
#pragma once

#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace fsdp::detail {

// The number of elements of a shape (1 for a 0-dim shape).
int64_t product(const std::vector<int64_t>& v);
// "[2, 3]".
std::string shape_str(c10::IntArrayRef shape);

// The intersection of box (a_offsets, a_sizes) with box (b_offsets,
// b_sizes), one [lo, hi) per dimension (global coordinates); false if they
// do not meet or differ in their number of dimensions.
bool intersect(const std::vector<int64_t>& a_offsets, c10::IntArrayRef a_sizes, const std::vector<int64_t>& b_offsets,
               c10::IntArrayRef b_sizes, std::vector<std::pair<int64_t, int64_t>>& out);

}  // namespace fsdp::detail
