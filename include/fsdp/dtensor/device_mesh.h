// fsdp/dtensor/device_mesh.h — torch's DeviceMesh as one rank sees it: an
// N-D arrangement of ranks with one process group per dimension, named
// dimensions, and sub-meshes by name (mesh["tp"]). fully_shard takes it
// (1-D: FSDP; 2-D (replicate, shard): HSDP), tensor parallelism takes its
// "tp" dimension, and DTensor (fsdp/dtensor/dtensor.h) lays tensors on it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fsdp/distributed/process_group.h"

namespace fsdp {

// One process group per dimension, outermost first. A mesh built by
// init_device_mesh has its ranks row-major: a rank's coordinate along
// dimension d is its rank in groups[d]. Copies share the groups.
struct Mesh {
  std::vector<dist::ProcessGroupPtr> groups;
  std::vector<std::string> dim_names;

  // [local] A 1-D mesh over `group`.
  static Mesh of(dist::ProcessGroupPtr group, std::string dim_name = "");
  // [local] The 2-D (replicate, shard) mesh of a DeviceMesh (fsdp/distributed/process_group.h).
  static Mesh hybrid(const dist::DeviceMesh& mesh, std::vector<std::string> dim_names = {"replicate", "shard"});

  int ndim() const { return static_cast<int>(groups.size()); }
  // The number of ranks along each dimension, and in all.
  std::vector<int64_t> shape() const;
  int64_t size() const;
  // This rank's index along each dimension (its rank in each group).
  std::vector<int64_t> coordinate() const;
  // The dimension called `name`; ConfigError listing the names otherwise.
  int dim(const std::string& name) const;
  // [local] torch's mesh["tp"] and mesh["dp", "tp"]: the sub-mesh of the
  // named dimensions, in the order given (the same groups).
  Mesh operator[](const std::string& name) const;
  Mesh sub(const std::vector<std::string>& names) const;

  // FSDP's view: the group parameters are sharded over (the last
  // dimension's), and the group gradients are all-reduced over (the first
  // dimension's of a 2-D mesh; null for 1-D).
  const dist::ProcessGroupPtr& shard_group() const;
  dist::ProcessGroupPtr replicate_group() const;
};

// [collective over `world`] torch's init_device_mesh: the ranks of `world`
// arranged row-major in `shape` (the last dimension fastest), one
// sub-group per dimension (dist::mesh_groups). `names` may be empty for a
// 1-D mesh; otherwise one distinct name per dimension. ConfigError when
// the sizes do not multiply to world->size() or the names are wrong.
Mesh init_device_mesh(const dist::ProcessGroupPtr& world, const std::vector<int>& shape,
                      const std::vector<std::string>& names = {});

}  // namespace fsdp
