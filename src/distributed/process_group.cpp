// The collectives of fsdp::dist::ProcessGroup and their Work
// (fsdp/distributed/process_group.h): each checks its tensors, issues c10d's
// collective with the group's deadline, and turns a failure or a timeout into
// a CollectiveError naming it. Making groups is rendezvous.cpp.
#include "fsdp/distributed/process_group.h"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/version.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <functional>
#include <mutex>
#include <optional>
#include <sstream>
#include <type_traits>
#include <utility>

#ifdef FSDP_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include "fsdp/error.h"
#include "fsdp/text/enum_names.h"
#include "process_group_impl.h"

namespace fsdp::dist {

namespace {

// Gloo in LibTorch 1.13 moves no bfloat16, int16 or bool; data movement only
// copies bytes, so move them as float16 / uint8 of the same bytes.
at::Tensor wire(const at::Tensor& t, Backend backend) {
  if (backend != Backend::kGloo) return t;
  if (t.scalar_type() == at::kBFloat16) return t.view(at::kHalf);
  if (t.scalar_type() == at::kBool) return t.view(at::kByte);
  return t;
}

// c10d's Gloo group implements the one-tensor all-gather and reduce-scatter
// itself from LibTorch 2.15 on (all_gather_single / reduce_scatter_single,
// which Backend forwards to from the older _allgather_base /
// _reduce_scatter_base names). 1.13's ProcessGroupGloo declares
// _allgather_base only to throw, so only the new names count. Whether
// ProcessGroupGloo declares one is read off the class that owns the member
// (an inherited default belongs to the base class).
template <class C, class R, class... A>
C owner_of(R (C::*)(A...));

#define FSDP_DECLARES(trait, member)                                                                       \
  template <class G, class = void>                                                                       \
  struct trait : std::false_type {};                                                                     \
  template <class G>                                                                                     \
  struct trait<G, std::void_t<decltype(owner_of(&G::member))>>                                           \
      : std::is_same<decltype(owner_of(&G::member)), G> {};
FSDP_DECLARES(DeclaresAllGatherSingle, all_gather_single)
FSDP_DECLARES(DeclaresReduceScatterSingle, reduce_scatter_single)
#undef FSDP_DECLARES

constexpr bool kGlooAllGather = DeclaresAllGatherSingle<c10d::ProcessGroupGloo>::value;
constexpr bool kGlooReduceScatter = DeclaresReduceScatterSingle<c10d::ProcessGroupGloo>::value;

// The one-tensor collectives under this LibTorch's name for them (NCCL's
// _allgather_base before 2.15).
template <class B>
c10::intrusive_ptr<c10d::Work> all_gather_single(B& pg, at::Tensor& out, at::Tensor& in) {
  if constexpr (DeclaresAllGatherSingle<B>::value || kGlooAllGather) {
    return pg.all_gather_single(out, in);
  } else {
    return pg._allgather_base(out, in);
  }
}

template <class B>
c10::intrusive_ptr<c10d::Work> reduce_scatter_single(B& pg, at::Tensor& out, at::Tensor& in,
                                                     const c10d::ReduceScatterOptions& opts) {
  if constexpr (DeclaresReduceScatterSingle<B>::value || kGlooReduceScatter) {
    return pg.reduce_scatter_single(out, in, opts);
  } else {
    return pg._reduce_scatter_base(out, in, opts);
  }
}

c10d::ReduceOp to_c10d(ReduceOp op) {
  return op == ReduceOp::kMax ? c10d::ReduceOp(c10d::ReduceOp::MAX) : c10d::ReduceOp(c10d::ReduceOp::SUM);
}

}  // namespace

namespace {
constexpr text::EnumName<ReduceOp> kReduceOpNames[] = {
    {ReduceOp::kSum, "sum"}, {ReduceOp::kAvg, "avg", "mean"}, {ReduceOp::kMax, "max"}};
}  // namespace

const char* to_string(ReduceOp op) { return text::name_of(kReduceOpNames, op); }

ReduceOp parse_reduce_op(const std::string& name, const std::string& what) {
  if (auto op = text::value_of(kReduceOpNames, text::to_lower(name))) return *op;
  throw ConfigError(what + ": reduce op '" + name + "' is unknown: expected one of " +
                    text::list_names(kReduceOpNames));
}

ChunkRange chunk_range(int64_t numel, int world, int rank) {
  check(world >= 1 && rank >= 0 && rank < world && numel >= 0,
        "chunk_range: expected numel >= 0 and 0 <= rank < world, got numel=" + std::to_string(numel) +
            " world=" + std::to_string(world) + " rank=" + std::to_string(rank));
  const int64_t c = (numel + world - 1) / world;
  const int64_t begin = std::min(numel, c * rank);
  const int64_t end = std::min(numel, c * (rank + 1));
  return ChunkRange{begin, end - begin};
}

// ---------------------------------------------------------------------------
// Work

Work::Work() = default;
Work::~Work() = default;
Work::Work(const Work&) = default;
Work& Work::operator=(const Work&) = default;
Work::Work(std::shared_ptr<State> state) : state_(std::move(state)) {}

void Work::wait() {
  if (!state_) return;
  std::lock_guard<std::mutex> lock(state_->mu);
  if (state_->error) std::rethrow_exception(state_->error);
  if (state_->done) return;
  try {
    // The backend enforces the timeout itself; the bound here is a safety net.
    if (state_->work) state_->work->wait(state_->timeout + std::chrono::seconds(30));
    if (state_->finish) state_->finish();
  } catch (const std::exception& e) {
    state_->error = std::make_exception_ptr(collective_error(state_->op, state_->where, reason(e)));
    state_->work.reset();
    state_->finish = nullptr;
    std::rethrow_exception(state_->error);
  }
  state_->done = true;
  state_->work.reset();
  state_->finish = nullptr;
}

bool Work::is_completed() const {
  if (!state_) return true;
  std::lock_guard<std::mutex> lock(state_->mu);
  if (state_->done || state_->error) return true;
  return !state_->work || state_->work->isCompleted();
}

// ---------------------------------------------------------------------------
// ProcessGroup

ProcessGroup::ProcessGroup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ProcessGroup::~ProcessGroup() {
#if defined(FSDP_WITH_NCCL) && (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 2))
  // PyTorch 2.x's NCCL group runs watchdog threads until it is shut down
  // (destroy_process_group() in Python); ending them here, before the group's
  // memory goes, is what that call does.
  if (impl_ && impl_->backend == Backend::kNccl && impl_->pg) {
    try {
      static_cast<c10d::ProcessGroupNCCL*>(impl_->pg.get())->shutdown();
    } catch (const std::exception&) {
      // shutting down a broken group: nothing more to do
    }
  }
#endif
}

int ProcessGroup::rank() const { return impl_->rank; }
int ProcessGroup::size() const { return impl_->size; }
const std::string& ProcessGroup::name() const { return impl_->name; }
Backend ProcessGroup::backend() const { return impl_->backend; }
std::chrono::milliseconds ProcessGroup::timeout() const { return impl_->timeout; }
at::Device ProcessGroup::device() const { return impl_->device; }
uint64_t ProcessGroup::sequence_number() const { return impl_->seq; }
uint64_t ProcessGroup::bytes_sent() const { return impl_->bytes_sent.load(); }
bool ProcessGroup::native_all_gather() const {
  return impl_->backend == Backend::kNccl || (impl_->backend == Backend::kGloo && kGlooAllGather);
}
bool ProcessGroup::native_reduce_scatter() const {
  return impl_->backend == Backend::kNccl || (impl_->backend == Backend::kGloo && kGlooReduceScatter);
}

Work ProcessGroup::all_gather(const at::Tensor& output, const at::Tensor& input) {
  const char* op = "all_gather";
  impl_->check_pair(op, output, input);
  const int n = impl_->size;
  const int64_t total = output.numel();
  impl_->check_chunk(op, "input", input, "output", total);
  at::Tensor out = output.view({-1});
  at::Tensor in = input.view({-1});
  const int64_t c = (total + n - 1) / n;
  if (n == 1 || c == 0) {
    return impl_->issue(op, nullptr, [out, in] { out.copy_(in); });
  }
  const Backend b = impl_->backend;
  impl_->bytes_sent += static_cast<uint64_t>((n - 1) * c * output.element_size());
  if (total == c * n && native_all_gather()) {
    return impl_->issue(op, [&] {
      at::Tensor o = wire(out, b), i = wire(in, b);
      return all_gather_single(*impl_->pg, o, i);
    });
  }
  // Gloo (or uneven sizes): gather equal chunks of c elements into a padded
  // buffer; when the output is exactly n*c long, into the output itself.
  const bool direct = total == c * n;
  at::Tensor staging = direct ? out : at::empty({c * n}, out.options());
  at::Tensor padded_in = in;
  if (in.numel() != c) {
    padded_in = at::zeros({c}, in.options());
    padded_in.narrow(0, 0, in.numel()).copy_(in);
  }
  std::function<void()> finish;
  if (!direct) finish = [out, staging, total] { out.copy_(staging.narrow(0, 0, total)); };
  return impl_->issue(
      op,
      [&] {
        std::vector<at::Tensor> outs;
        at::Tensor w = wire(staging, b);
        for (int r = 0; r < n; ++r) outs.push_back(w.narrow(0, r * c, c));
        std::vector<std::vector<at::Tensor>> outputs{outs};
        std::vector<at::Tensor> inputs{wire(padded_in, b)};
        return impl_->pg->allgather(outputs, inputs);
      },
      std::move(finish));
}

Work ProcessGroup::reduce_scatter(const at::Tensor& output, const at::Tensor& input, ReduceOp rop) {
  const char* op = "reduce_scatter";
  impl_->check_pair(op, output, input);
  impl_->check_reduce(op, input, rop);
  const int n = impl_->size;
  const int64_t total = input.numel();
  impl_->check_chunk(op, "output", output, "input", total);
  const ChunkRange mine = chunk_range(total, n, impl_->rank);
  at::Tensor out = output.view({-1});
  at::Tensor in = input.view({-1});
  if (n == 1 || total == 0) {
    return impl_->issue(op, nullptr, [out, in] { out.copy_(in); });
  }
  const Backend b = impl_->backend;
  impl_->bytes_sent += static_cast<uint64_t>((total - mine.numel) * input.element_size());
  // The backend's own reduce-scatter for equal chunks: NCCL's for every
  // dtype (16-bit floats reduced by NCCL itself, as PyTorch's FSDP does),
  // Gloo's (LibTorch 2.15 on) for 32- and 64-bit numbers. Neither is asked
  // for an average (a sum, divided here). Gloo's 16-bit floats take the path
  // below, which accumulates them in float32.
  const bool native_dtype =
      in.scalar_type() != at::kBool && (b == Backend::kNccl || !is_low_precision(in.scalar_type()));
  if (native_reduce_scatter() && total == n * mine.numel && native_dtype) {
    std::function<void()> finish;
    if (rop == ReduceOp::kAvg) finish = [out, n] { out.div_(n); };
    return impl_->issue(
        op,
        [&] {
          c10d::ReduceScatterOptions opts;
          opts.reduceOp = to_c10d(rop == ReduceOp::kAvg ? ReduceOp::kSum : rop);
          at::Tensor o = out, i = in;
          return reduce_scatter_single(*impl_->pg, o, i, opts);
        },
        std::move(finish));
  }
  // Received rows: one chunk from each rank, reduced locally (in float32 for
  // 16-bit floats, so the result does not depend on the order of arrival).
  const int64_t k = mine.numel;
  at::Tensor staging = at::empty({n * k}, in.options());
  auto finish = [out, staging, n, k, rop] {
    at::Tensor rows = staging.view({n, k});
    if (is_low_precision(rows.scalar_type())) rows = rows.to(at::kFloat);
    at::Tensor red = rop == ReduceOp::kMax ? std::get<0>(rows.max(0)) : rows.sum(0);
    if (rop == ReduceOp::kAvg) red = red / n;
    out.copy_(red);
  };
  return impl_->issue(
      op,
      [&] {
        std::vector<int64_t> in_splits(n), out_splits(n, k);
        for (int r = 0; r < n; ++r) in_splits[r] = chunk_range(total, n, r).numel;
        at::Tensor o = wire(staging, b), i = wire(in, b);
        return impl_->pg->alltoall_base(o, i, out_splits, in_splits);
      },
      finish);
}

Work ProcessGroup::all_reduce(const at::Tensor& tensor, ReduceOp rop) {
  const char* op = "all_reduce";
  impl_->check_tensor(op, "tensor", tensor, /*any_device=*/true);
  impl_->check_reduce(op, tensor, rop);
  const int n = impl_->size;
  if (n == 1 || tensor.numel() == 0) return impl_->issue(op, nullptr);
  // 16-bit floats travel as float32 so that the sum is accumulated in float32;
  // a tensor on another device travels through a copy on the backend's.
  at::Tensor dev = impl_->on_device(tensor);
  at::Tensor buf = is_low_precision(dev.scalar_type()) ? dev.to(at::kFloat) : dev;
  impl_->bytes_sent += static_cast<uint64_t>(2 * (n - 1) * buf.numel() * buf.element_size() / n);
  std::function<void()> finish;
  if (rop == ReduceOp::kAvg || !buf.is_same(tensor)) {
    finish = [tensor, buf, n, rop] {
      if (rop == ReduceOp::kAvg) buf.div_(n);
      if (!buf.is_same(tensor)) tensor.copy_(buf);
    };
  }
  return impl_->issue(
      op,
      [&] {
        std::vector<at::Tensor> ts{buf};
        c10d::AllreduceOptions opts;
        opts.reduceOp = to_c10d(rop);
        return impl_->pg->allreduce(ts, opts);
      },
      std::move(finish));
}

void ProcessGroup::all_gather_unbuffered(const at::Tensor& output, const at::Tensor& input) {
  const int n = impl_->size;
  const int64_t total = output.numel();
  const int64_t c = (total + n - 1) / n;
  if (n == 1 || c * n != total || input.numel() != c || !output.is_contiguous()) {
    all_gather(output, input).wait();
    return;
  }
  at::Tensor out = output.view({-1});
  {
    at::NoGradGuard no_grad;
    out.narrow(0, static_cast<int64_t>(impl_->rank) * c, c).copy_(input.reshape({-1}));
  }
  for (int r = 0; r < n; ++r) broadcast(out.narrow(0, static_cast<int64_t>(r) * c, c), r).wait();
}

Work ProcessGroup::broadcast(const at::Tensor& tensor, int root) {
  const char* op = "broadcast";
  impl_->check_tensor(op, "tensor", tensor, /*any_device=*/true);
  check(root >= 0 && root < impl_->size, std::string(op) + ": root=" + std::to_string(root) +
                                             " is out of range: expected 0 <= root < " + std::to_string(impl_->size));
  if (impl_->size == 1 || tensor.numel() == 0) return impl_->issue(op, nullptr);
  impl_->bytes_sent += static_cast<uint64_t>(tensor.numel() * tensor.element_size());
  at::Tensor dev = impl_->on_device(tensor);
  std::function<void()> finish;
  if (!dev.is_same(tensor)) finish = [tensor, dev] { tensor.copy_(dev); };
  return impl_->issue(
      op,
      [&] {
        std::vector<at::Tensor> ts{wire(dev, impl_->backend)};
        c10d::BroadcastOptions opts;
        opts.rootRank = root;
        return impl_->pg->broadcast(ts, opts);
      },
      std::move(finish));
}

void ProcessGroup::barrier() {
  if (impl_->size == 1) {
    impl_->issue("barrier", nullptr).wait();
    return;
  }
  impl_->issue("barrier", [&] {
    c10d::BarrierOptions opts;
    if (impl_->device.is_cuda()) opts.device_ids = {impl_->device.index()};  // NCCL: not a guess from the rank
    return impl_->pg->barrier(opts);
  }).wait();
}

std::string ProcessGroup::broadcast_bytes(const std::string& data, int root) {
  const auto cpu_long = at::TensorOptions().dtype(at::kLong);
  at::Tensor len = at::full({1}, static_cast<int64_t>(data.size()), cpu_long).to(impl_->device);
  broadcast(len, root).wait();
  const int64_t n = len.cpu().item<int64_t>();
  at::Tensor buf = at::empty({n}, at::TensorOptions().dtype(at::kByte));
  if (impl_->rank == root && n > 0) std::memcpy(buf.data_ptr(), data.data(), static_cast<size_t>(n));
  buf = buf.to(impl_->device);
  broadcast(buf, root).wait();
  buf = buf.cpu();
  return std::string(static_cast<const char*>(buf.data_ptr()), static_cast<size_t>(n));
}

std::vector<std::string> ProcessGroup::all_gather_bytes(const std::string& data) {
  const int n = impl_->size;
  const auto dev = impl_->device;
  at::Tensor lens = at::empty({n}, at::TensorOptions().dtype(at::kLong).device(dev));
  at::Tensor mine = at::full({1}, static_cast<int64_t>(data.size()), at::TensorOptions().dtype(at::kLong)).to(dev);
  all_gather(lens, mine).wait();
  lens = lens.cpu();
  const int64_t longest = lens.max().item<int64_t>();
  at::Tensor padded = at::zeros({longest}, at::TensorOptions().dtype(at::kByte));
  if (!data.empty()) std::memcpy(padded.data_ptr(), data.data(), data.size());
  at::Tensor all = at::empty({longest * n}, at::TensorOptions().dtype(at::kByte).device(dev));
  all_gather(all, padded.to(dev)).wait();
  all = all.cpu();
  std::vector<std::string> out(n);
  const char* base = static_cast<const char*>(all.data_ptr());
  for (int r = 0; r < n; ++r) {
    out[r].assign(base + r * longest, static_cast<size_t>(lens[r].item<int64_t>()));
  }
  return out;
}

}  // namespace fsdp::dist
