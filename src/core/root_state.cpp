// The root's state and duties (root_state.h).
#include "root_state.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <chrono>

#include "buffer_pool.h"
#include "fsdp/core/trace_span.h"

namespace fsdp::detail {

RootState::RootState(std::weak_ptr<RootMember> root, torch::nn::Module& root_module,
                     std::optional<at::ScalarType> buffer_dtype)
    : pool(std::make_shared<BufferPool>()), root_(std::move(root)) {
  if (buffer_dtype) {
    at::NoGradGuard no_grad;
    for (auto& b : root_module.buffers(/*recurse=*/true)) {
      if (at::isFloatingType(b.scalar_type()) && b.scalar_type() != *buffer_dtype) {
        cast_buffers.emplace_back(b, b.scalar_type());
        b.set_data(b.to(*buffer_dtype));
      }
    }
  }
}

void RootState::begin_iteration() {
  // A backward that threw never ran the end-of-backward callback: complete
  // what it issued (every rank issued the same), forget the rest.
  drain_reductions();
  callback_queued = false;
  for (auto& weak : tree) {
    if (auto u = weak.lock()) u->abandon_backward();
  }
  if (!order.empty()) last_order = std::move(order);
  order.clear();
  awaiting_backward = false;
}

int RootState::units_unsharded() const {
  auto root = root_.lock();
  if (!root) return 0;
  int live = 0;
  for (auto& weak : tree) {
    auto u = weak.lock();
    if (u && u != root && u->holds_full_params()) ++live;
  }
  return live;
}

void RootState::reshard_tree() {
  for (auto& weak : tree) {
    if (auto u = weak.lock()) u->reshard();
  }
}

void RootState::add_reduction(PendingReduction r, bool communicates, int max_in_flight) {
  ++stats.reductions;
  ++stats.reductions_in_flight;
  if (communicates) stats.reduction_bytes += static_cast<int64_t>(r.input.nbytes());
  pending.push_back(std::move(r));
  while (static_cast<int>(pending.size()) > max_in_flight) complete_oldest_reduction();
  stats.peak_reductions_in_flight = std::max(stats.peak_reductions_in_flight, stats.reductions_in_flight);
}

void RootState::complete_oldest_reduction() {
  PendingReduction r = std::move(pending.front());
  pending.pop_front();
  const auto t0 = std::chrono::steady_clock::now();
  {
    ScopedSpan span(r.wait_span, r.path);
    if (r.replicate_next) start_replicate_stage(r);
    r.work.wait();
  }
  r.input = at::Tensor();  // back to the pool
  stats.reduction_wait_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  --stats.reductions_in_flight;
  r.unit->accept_gradient(std::move(r.output));
}

void RootState::start_replicate_stage(PendingReduction& r) {
  r.work.wait();  // the reduce-scatter over the shard group
  r.input = at::Tensor();
  r.replicate_next = false;
  r.work = r.replicate_group->all_reduce(r.output, dist::ReduceOp::kAvg);
}

void RootState::drain_reductions() {
  if (pending.empty()) return;
  // HYBRID_SHARD: issue every replicate all-reduce before waiting for any,
  // in issue order (the same on every rank).
  for (auto& r : pending) {
    if (r.replicate_next) start_replicate_stage(r);
  }
  while (!pending.empty()) complete_oldest_reduction();
}

void RootState::finish_backward(const std::shared_ptr<RootMember>& caller) {
  callback_queued = false;
  awaiting_backward = false;
  std::vector<std::shared_ptr<RootMember>> units;
  for (auto& weak : tree) {
    if (auto u = weak.lock()) units.push_back(u);
  }
  if (units.empty()) units.push_back(caller);  // a lone unit
  // Units whose gradients never all arrived (unused parameters) reduce what they have.
  for (auto& u : units) u->post_backward();
  drain_reductions();
  for (auto& u : units) u->end_backward();
}

}  // namespace fsdp::detail
