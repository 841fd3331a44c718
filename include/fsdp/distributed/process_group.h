// fsdp/distributed/process_group.h — the distributed runtime: process groups and the
// collectives FSDP uses, on PyTorch's c10d (Gloo over TCP on CPU; NCCL in
// builds against a CUDA LibTorch).
//
// COLLECTIVES. Every call marked [collective] must be made by every rank of the
// group, in the same order, with matching arguments (same sizes and dtypes;
// same root). Calls may be issued from one thread per group at a time; wait()
// may be called from any thread. A rank that never arrives, dies, or issues a
// different sequence makes the others fail with fsdp::CollectiveError after
// the group's timeout; the message names the collective, its sequence number
// in the group, the group and the timeout. It never hangs.
//
// SHARDING CONVENTION. A buffer of `numel` elements is split over a group of
// `world` ranks like torch.chunk: rank r holds chunk_range(numel, world, r),
// elements [r*c, min(numel, (r+1)*c)) with c = ceil(numel / world). Trailing
// ranks may hold fewer elements, or none. all_gather and reduce_scatter use it,
// so sizes need not divide by the world size.
//
// TENSORS. Inputs and outputs must be contiguous, on the group's device (CPU for
// Gloo, the rank's CUDA device for NCCL), of one dtype per call; all_reduce and
// broadcast also take tensors on another device (a loss or norm on CPU under
// NCCL), which travel through a copy on the group's device. Supported:
// float32, float64, bfloat16, float16, int64, int32, uint8, int8, bool (no
// reductions on bool). Reductions of bfloat16/float16 accumulate in float32,
// except NCCL's reduce-scatter (see native_reduce_scatter).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fsdp/launch/env.h"

namespace fsdp::dist {

enum class ReduceOp {
  kSum,
  kAvg,  // sum divided by the group size; floating-point dtypes only
  kMax,
};

// "sum", "avg", "max".
const char* to_string(ReduceOp op);
// Parses those names, or "mean" for kAvg (Lightning's name), case-insensitive.
// Throws ConfigError "<what>: reduce op '<name>' is unknown" listing them otherwise.
ReduceOp parse_reduce_op(const std::string& name, const std::string& what = "reduce op");

// The slice of a flat buffer that one rank holds (see SHARDING CONVENTION).
struct ChunkRange {
  int64_t offset = 0;
  int64_t numel = 0;
};
ChunkRange chunk_range(int64_t numel, int world, int rank);

// Handle on an asynchronous collective, like c10d's Work.
// The output tensors hold the result only after wait() returned; the inputs
// must stay alive and unmodified until then. A default-constructed Work is
// already complete. Copies share one operation.
class Work {
 public:
  Work();
  ~Work();
  Work(const Work&);
  Work& operator=(const Work&);

  // Blocks until the collective completed and its outputs are written.
  // Throws CollectiveError if it failed or timed out (every later call
  // rethrows it). Idempotent; thread-safe.
  void wait();

  // True once the backend finished (wait() may still have local work to do,
  // e.g. summing received chunks). Non-blocking.
  bool is_completed() const;

  struct State;  // implementation detail
  explicit Work(std::shared_ptr<State> state);

 private:
  std::shared_ptr<State> state_;
};

// How to create the world group.
struct InitOptions {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;            // NCCL: the CUDA device index
  std::string master_addr;       // rank 0's TCPStore; ignored when `store` is set
  int master_port = 0;
  Backend backend = Backend::kAuto;
  std::chrono::milliseconds timeout = kDefaultTimeout;  // per collective
  // How long the ranks wait for each other to join (and a rank for rank 0's
  // store to accept it); the error names the missing ranks (the first 16 and
  // their count, in bounded time whatever world_size). A store that takes
  // the connection and never answers (its server stopped) fails after this
  // plus at most 5 s, naming master_addr:master_port.
  std::chrono::milliseconds rendezvous_timeout = kDefaultRendezvousTimeout;
  // An existing store shared by all ranks (a c10d HashStore for ranks that are
  // threads of one process, a FileStore, ...). When set, no TCPStore is made;
  // with world_size == 1 and no store, none is needed.
  c10::intrusive_ptr<c10d::Store> store;
  // Name used in error messages and as the store prefix.
  std::string group_name = "world";
  // Who serves the TCPStore at master_addr:master_port (ignored when `store`
  // is set). kRank0: rank 0 serves it. kLauncher: a launcher does (torchrun's
  // agent, TORCHELASTIC_USE_AGENT_STORE=True); every rank connects as a
  // client, and the group's keys go under a prefix that rank 0 makes fresh
  // for this attempt and hands to the others through the store: the agent's
  // store outlives a restart, so the keys of the attempt before (its Gloo
  // addresses) are still in it. The handshake, and why it is not
  // TORCHELASTIC_RESTART_COUNT: process_group.cpp, agree_on_attempt.
  StoreHost store_host = StoreHost::kRank0;

  static InitOptions from_env(const DistEnv& env);
};

class ProcessGroup;
using ProcessGroupPtr = std::shared_ptr<ProcessGroup>;

// [collective: rendezvous of all ranks] Creates the world group: connects to
// (rank 0: serves, unless store_host is kLauncher) the TCPStore at
// master_addr:master_port unless `store` is given, then connects every pair
// of ranks. Rank 0's store listens on
// master_addr only (its first address, if a name), not on every interface
// as LibTorch's TCPStore would (how, on each LibTorch: docs/runtime.md); a
// warning is printed if a LibTorch binds elsewhere. Throws ConfigError
// for bad options (unbuilt backend, rank out of range; on rank 0, a
// master_addr that does not resolve), CollectiveError when rendezvous does
// not complete within the timeout (or, on rank 0, when master_addr is not
// an address of this host). Rendezvous is bounded by rendezvous_timeout,
// collectives afterwards by timeout. Cost: O(world) connections per rank.
ProcessGroupPtr init_process_group(const InitOptions& options);

// init_process_group(InitOptions::from_env(read_dist_env())).
ProcessGroupPtr init_process_group_from_env();

class ProcessGroup {
 public:
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const;
  int size() const;
  const std::string& name() const;
  Backend backend() const;  // kGloo or kNccl, never kAuto
  std::chrono::milliseconds timeout() const;
  // Device that collective tensors must live on.
  at::Device device() const;

  // [collective] Every rank contributes `input`, its chunk of the flat
  // `output` (input.numel() == chunk_range(output.numel(), size(), rank()).numel);
  // every rank receives the whole of `output`. Traffic per rank: about
  // (size-1)/size of output.
  Work all_gather(const at::Tensor& output, const at::Tensor& input);

  // [collective, blocking] all_gather without staging memory: each rank's
  // chunk is broadcast straight into its place of `output` (size() broadcasts;
  // the same traffic, more round trips). Gloo's all-gather otherwise stages
  // a second output-sized buffer; checkpoints use this to stay within one
  // unit of extra memory. Falls back to all_gather when output is not
  // exactly size() equal chunks.
  void all_gather_unbuffered(const at::Tensor& output, const at::Tensor& input);

  // [collective] Reduces `input` (same numel on every rank) element-wise over
  // the ranks and leaves this rank's chunk in `output`
  // (output.numel() == chunk_range(input.numel(), size(), rank()).numel).
  // Traffic per rank: about (size-1)/size of input (no all-reduce inside).
  Work reduce_scatter(const at::Tensor& output, const at::Tensor& input,
                      ReduceOp op = ReduceOp::kSum);

  // Whether all_gather / reduce_scatter of equal chunks go through the
  // backend's own one-tensor collective (c10d's all_gather_single /
  // reduce_scatter_single) instead of fsdp-cpp's fallbacks (an all-gather of
  // chunks; an all-to-all reduced locally). NCCL: both, for every dtype (its
  // reduce-scatter sums 16-bit floats in their own precision, as PyTorch's
  // FSDP does). Gloo: where LibTorch's Gloo has them (2.15 on; not 1.13);
  // its reduce-scatter for 32- and 64-bit numbers only (16-bit floats take
  // the all-to-all, which accumulates in float32).
  bool native_all_gather() const;
  bool native_reduce_scatter() const;

  // [collective] Reduces `tensor` in place over the ranks.
  Work all_reduce(const at::Tensor& tensor, ReduceOp op = ReduceOp::kSum);

  // [collective] Copies root's `tensor` into `tensor` on every rank.
  Work broadcast(const at::Tensor& tensor, int root);

  // [collective] Returns when every rank has called it. Blocking.
  void barrier();

  // [collective, blocking] Returns root's `data` on every rank (other ranks'
  // `data` is ignored). Raw bytes, no pickling. Two collectives.
  std::string broadcast_bytes(const std::string& data, int root);

  // [collective, blocking] Returns every rank's `data`, indexed by rank.
  // Two collectives.
  std::vector<std::string> all_gather_bytes(const std::string& data);

  // [collective over this group] Creates a sub-group of `ranks` (ranks of this
  // group, in the order they get in the sub-group). Every rank of this group
  // must call it with the same `ranks`, in the same order relative to other
  // new_group calls; members rendezvous, others get nullptr. Throws ConfigError
  // for an empty list, repeated or out-of-range ranks.
  ProcessGroupPtr new_group(const std::vector<int>& ranks, const std::string& name = "");

  // Number of collectives issued on this group so far.
  uint64_t sequence_number() const;

  // Bytes this rank has sent through this group's collectives so far, as
  // the algorithms move them: all_gather (ring) (N-1)/N of the output,
  // reduce_scatter the other ranks' chunks of the input, all_reduce (ring)
  // 2(N-1)/N of the tensor (float32 for 16-bit floats), broadcast the tensor.
  uint64_t bytes_sent() const;

  struct Impl;  // implementation detail
  explicit ProcessGroup(std::unique_ptr<Impl> impl);

 private:
  std::unique_ptr<Impl> impl_;
};

// A 2-D (replicate, shard) arrangement of the ranks of a group, PyTorch's
// DeviceMesh for HYBRID_SHARD: group rank = replicate_index * shard_size +
// shard_index. The shard group holds consecutive ranks; the replicate group
// holds the ranks with the same shard_index.
struct DeviceMesh {
  int replicate_size = 1;
  int shard_size = 1;
  int replicate_index = 0;
  int shard_index = 0;
  ProcessGroupPtr shard_group;
  ProcessGroupPtr replicate_group;
};

// [collective over `group`] Builds the mesh; needs replicate_size * shard_size
// == group->size() (ConfigError otherwise). Creates every sub-group on every
// rank in the same order. The 2-D case of mesh_groups (and of
// fsdp::init_device_mesh, fsdp/dtensor/device_mesh.h, its N-D form).
DeviceMesh init_device_mesh(const ProcessGroupPtr& group, int replicate_size, int shard_size);

// [collective over `group`] The ranks of `group` arranged row-major in
// `shape` (rank = sum of coordinate[d] * stride[d], the last dimension
// fastest, as torch's init_device_mesh): for each dimension d, the sub-group
// of the ranks that differ from this rank only in coordinate d, in the order
// of that coordinate, named "<group>/<names[d]><i>" (i: the index of the
// sub-group among dimension d's). Every rank creates every sub-group, the
// last dimension's first, so all ranks call new_group in the same order.
// ConfigError when the product of `shape` is not group->size(), a size is
// below 1, or `names` has another length than `shape`.
std::vector<ProcessGroupPtr> mesh_groups(const ProcessGroupPtr& group, const std::vector<int>& shape,
                                         const std::vector<std::string>& names);

}  // namespace fsdp::dist
