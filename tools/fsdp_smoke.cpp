// fsdp-smoke: joins the job described by the environment (run it under
// fsdp-run), checks a few collectives against their expected values, and
// prints one line per rank. Exit status 0 when every check held.
#include <ATen/ATen.h>

#include <iostream>

#include "fsdp/distributed/process_group.h"
#include "fsdp/error.h"
#include "fsdp/launch/env.h"  // backend_name

int main() {
  try {
    auto pg = fsdp::dist::init_process_group_from_env();
    const int r = pg->rank(), n = pg->size();
    // all_reduce: sum of (rank + 1) over ranks.
    at::Tensor t = at::full({3}, static_cast<float>(r + 1));
    pg->all_reduce(t).wait();
    const float expect_sum = n * (n + 1) / 2.0f;
    // all_gather / reduce_scatter of 10 elements (need not divide by n).
    at::Tensor full = at::arange(10, at::kFloat);
    auto mine = fsdp::dist::chunk_range(10, n, r);
    at::Tensor gathered = at::empty({10});
    pg->all_gather(gathered, full.narrow(0, mine.offset, mine.numel).clone()).wait();
    at::Tensor shard = at::empty({mine.numel});
    pg->reduce_scatter(shard, full, fsdp::dist::ReduceOp::kAvg).wait();
    const bool ok = at::allclose(t, at::full({3}, expect_sum)) && at::equal(gathered, full) &&
                    at::allclose(shard, full.narrow(0, mine.offset, mine.numel));
    pg->barrier();
    std::cout << "rank " << r << "/" << n << " backend " << fsdp::launch::backend_name(pg->backend())
              << ": all_reduce, all_gather, reduce_scatter " << (ok ? "ok" : "WRONG") << std::endl;
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << e.what() << std::endl;
    return 1;
  }
}
