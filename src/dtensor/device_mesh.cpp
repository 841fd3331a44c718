// torch's DeviceMesh from one rank (fsdp/dtensor/device_mesh.h).
#include "fsdp/dtensor/device_mesh.h"

#include <set>

#include "fsdp/error.h"

namespace fsdp {

Mesh Mesh::of(dist::ProcessGroupPtr group, std::string dim_name) {
  Mesh m;
  m.groups = {std::move(group)};
  if (!dim_name.empty()) m.dim_names = {std::move(dim_name)};
  return m;
}

Mesh Mesh::hybrid(const dist::DeviceMesh& mesh, std::vector<std::string> dim_names) {
  Mesh m;
  m.groups = {mesh.replicate_group, mesh.shard_group};
  m.dim_names = std::move(dim_names);
  return m;
}

std::vector<int64_t> Mesh::shape() const {
  std::vector<int64_t> out;
  for (const auto& g : groups) out.push_back(g ? g->size() : 1);
  return out;
}

int64_t Mesh::size() const {
  int64_t n = 1;
  for (int64_t s : shape()) n *= s;
  return n;
}

std::vector<int64_t> Mesh::coordinate() const {
  std::vector<int64_t> out;
  for (const auto& g : groups) out.push_back(g ? g->rank() : 0);
  return out;
}

int Mesh::dim(const std::string& name) const {
  std::string names;
  for (size_t d = 0; d < dim_names.size(); ++d) {
    if (dim_names[d] == name) return static_cast<int>(d);
    names += (d ? ", '" : "'") + dim_names[d] + "'";
  }
  throw ConfigError("mesh: no dimension is named '" + name + "' (the mesh's dimensions: " +
                    (names.empty() ? std::string("unnamed") : names) + ")");
}

Mesh Mesh::operator[](const std::string& name) const { return sub({name}); }

Mesh Mesh::sub(const std::vector<std::string>& names) const {
  Mesh m;
  std::set<std::string> seen;
  for (const auto& n : names) {
    if (!seen.insert(n).second) throw ConfigError("mesh: dimension '" + n + "' is named twice in a sub-mesh");
    const int d = dim(n);
    m.groups.push_back(groups[d]);
    m.dim_names.push_back(n);
  }
  return m;
}

const dist::ProcessGroupPtr& Mesh::shard_group() const {
  if (groups.empty()) throw ConfigError("fully_shard: the mesh has no dimension: give FullyShardOptions a mesh");
  return groups.back();
}

dist::ProcessGroupPtr Mesh::replicate_group() const { return groups.size() == 2 ? groups.front() : nullptr; }

Mesh init_device_mesh(const dist::ProcessGroupPtr& world, const std::vector<int>& shape,
                      const std::vector<std::string>& names) {
  std::vector<std::string> dims = names;
  if (dims.empty() && shape.size() == 1) dims = {"dim0"};
  std::set<std::string> distinct(dims.begin(), dims.end());
  if (distinct.size() != dims.size()) throw ConfigError("init_device_mesh: the dimension names must be distinct");
  Mesh m;
  m.groups = dist::mesh_groups(world, shape, dims);
  if (!names.empty()) m.dim_names = names;
  return m;
}

}  // namespace fsdp
