// fsdp/dtensor/dtensor.h — a tensor laid out over a mesh, torch's DTensor
// contract: a mesh, one placement per mesh dimension, the global shape and
// stride, and this rank's local tensor; or, where placements cannot say it
// (a rank's slice of FSDP1's flat parameter covers up to 2·ndim−1 boxes of
// a parameter), only this rank's boxes with their global offsets. Both
// kinds always give their local boxes (what DCP's ChunkStorageMetadata and
// fsdp-cpp's checkpoints record).
//
// FSDP2's parameters are Shard(0) on the shard dimension (Replicate on the
// replicate dimension of HSDP); FSDP1's original parameters describe their
// part of the flat shard as boxes, no bytes moved.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "fsdp/dtensor/device_mesh.h"
#include "fsdp/dtensor/placement.h"
#include "fsdp/dtensor/shards.h"

namespace fsdp {

// [local] torch's compute_local_shape_and_global_offset for the rank at
// `coordinate` of a mesh of `mesh_shape`: the shape of its local tensor and
// where that begins in the global tensor. Shard placements apply left to
// right; a tensor dimension sharded by several mesh dimensions is cut again
// inside the previous chunk. An empty chunk starts at the dimension's
// global size, as torch's does. ConfigError for a Shard dimension outside
// the shape or mismatched lengths.
struct LocalChunk {
  std::vector<int64_t> shape;
  std::vector<int64_t> offset;
};
LocalChunk local_chunk(const std::vector<int64_t>& global_shape, const std::vector<int64_t>& mesh_shape,
                       const std::vector<int64_t>& coordinate, const std::vector<placement::Placement>& placements);

class DTensor {
 public:
  DTensor() = default;

  // [local] torch's DTensor.from_local with the global shape given: `local`
  // is this rank's chunk under `placements` (one per mesh dimension); its
  // shape must be local_chunk's (ConfigError naming both otherwise). The
  // DTensor shares `local`'s storage.
  static DTensor from_local(at::Tensor local, Mesh mesh, std::vector<placement::Placement> placements,
                            std::vector<int64_t> global_shape);
  // [local] This rank's chunk of `full` (the same tensor on every rank) under
  // `placements`, as a view of `full` (Partial is refused: a full tensor is
  // not a part).
  static DTensor from_full(const at::Tensor& full, Mesh mesh, std::vector<placement::Placement> placements);
  // [local] Boxes only: this rank holds `boxes` (global offsets, views or
  // tensors), and the ranks along the mesh's last dimension together hold
  // every element once; the other dimensions replicate. No placements.
  static DTensor from_boxes(Mesh mesh, std::vector<int64_t> global_shape, at::ScalarType dtype,
                            std::vector<Shard> boxes);

  const Mesh& mesh() const { return mesh_; }
  // Empty for a DTensor of boxes.
  const std::vector<placement::Placement>& placements() const { return placements_; }
  bool has_placements() const { return !placements_.empty(); }
  const std::vector<int64_t>& shape() const { return global_shape_; }
  // The contiguous (row-major) stride of the global shape.
  std::vector<int64_t> stride() const;
  at::ScalarType dtype() const { return dtype_; }
  // The local tensor (placements; undefined for boxes).
  const at::Tensor& to_local() const { return local_; }
  // This rank's boxes with their global offsets: one for placements (none
  // when its chunk is empty), the given ones for boxes.
  const std::vector<Shard>& local_shards() const { return boxes_; }
  // The same pieces as a ShardedTensor (a state dict's value).
  ShardedTensor sharded() const;

  // [collective over every dimension of the mesh that is not Replicate;
  // allocates the global tensor] The whole tensor on every rank, as torch's
  // full_tensor(): all-gathers along Shard dimensions (the last mesh
  // dimension first), all-reduces Partial ones. Boxes: gathers the boxes
  // over the mesh's last dimension (their offsets first).
  at::Tensor full_tensor() const;
  // [collective over the mesh dimensions whose placement changes] torch's
  // redistribute: Shard→Replicate all-gathers, Partial→Replicate
  // all-reduces, Replicate→Shard takes the local chunk, Partial→Shard
  // reduce-scatters (as all-reduce then chunk); Shard(d)→Shard(e) goes
  // through Replicate. Boxes: ConfigError (they have no placements).
  DTensor redistribute(const std::vector<placement::Placement>& placements) const;

 private:
  Mesh mesh_;
  std::vector<placement::Placement> placements_;
  std::vector<int64_t> global_shape_;
  at::ScalarType dtype_ = at::kFloat;
  at::Tensor local_;
  std::vector<Shard> boxes_;
};

}  // namespace fsdp
