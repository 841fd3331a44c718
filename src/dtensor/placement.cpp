// Placements' names and equality (fsdp/dtensor/placement.h).
#include "fsdp/dtensor/placement.h"

namespace fsdp::placement {

std::string to_string(const Placement& p) {
  if (const auto* s = std::get_if<Shard>(&p)) return "Shard(dim=" + std::to_string(s->dim) + ")";
  if (const auto* q = std::get_if<Partial>(&p)) return std::string("Partial(") + dist::to_string(q->op) + ")";
  return "Replicate()";
}

bool operator==(const Placement& a, const Placement& b) {
  if (a.index() != b.index()) return false;
  if (const auto* s = std::get_if<Shard>(&a)) return s->dim == std::get<Shard>(b).dim;
  if (const auto* q = std::get_if<Partial>(&a)) return q->op == std::get<Partial>(b).op;
  return true;
}

}  // namespace fsdp::placement
