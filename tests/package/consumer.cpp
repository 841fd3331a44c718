// Uses the installed headers and libraries: a one-rank group, an all_reduce,
// and the launcher's argument parser.
#include <ATen/ATen.h>
#include <fsdp/dist/process_group.h>
#include <fsdp/launch/launcher.h>

#include <iostream>

int main() {
  auto launch = fsdp::launch::parse_launch_args({"--nproc-per-node", "2", "prog"});
  fsdp::dist::InitOptions options;  // world_size 1: no rendezvous needed
  auto pg = fsdp::dist::init_process_group(options);
  at::Tensor t = at::ones({4});
  pg->all_reduce(t).wait();
  const bool ok = launch.nproc_per_node == 2 && pg->size() == 1 && t.sum().item<float>() == 4.0f;
  std::cout << (ok ? "consumer ok" : "consumer WRONG") << std::endl;
  return ok ? 0 : 1;
}
