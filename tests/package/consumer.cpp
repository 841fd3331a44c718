// Uses the installed headers and libraries: started by the installed
// fsdp-run (fsdp::fsdp-run) as 2 ranks, it joins their world from the
// launcher's environment and checks an all_reduce; it also calls the
// launcher library's argument parser.
#include <ATen/ATen.h>
#include <fsdp/distributed/process_group.h>
#include <fsdp/launch/launcher.h>

#include <iostream>

int main() {
  auto launch = fsdp::launch::parse_launch_args({"--nproc-per-node", "2", "prog"});
  auto pg = fsdp::dist::init_process_group_from_env();  // RANK, WORLD_SIZE, MASTER_ADDR, ... from fsdp-run
  at::Tensor t = at::ones({4});
  pg->all_reduce(t).wait();  // sum over 2 ranks: 2 in every element
  const bool ok = launch.nproc_per_node == 2 && pg->size() == 2 && t.eq(2).all().item<bool>();
  std::cout << "consumer rank " << pg->rank() << " of " << pg->size() << ": " << (ok ? "ok" : "WRONG") << std::endl;
  return ok ? 0 : 1;
}
