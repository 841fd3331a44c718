// fsdp/fault_points/fault_points.h — named points where a test may inject a fault
// (kill the process, exhaust its memory) from outside the library. The
// library calls fault_point() at each; it does nothing unless a hook is
// installed, which only test support does (tests/support/fault_injector.cpp,
// preloaded into the processes under test). The points and the injector are
// described in docs/reliability.md. Private to the library, except the hook
// installer, which libfsdp.so exports.
#pragma once

extern "C" {

// A fault hook: called with the point's name and the caller's rank.
typedef void (*fsdp_fault_hook)(const char* point, int rank);

// Installs `hook` (null: none) for every later fault_point() of the process
// and returns the previous one. Safe to call before the library's static
// initialisers have run (a preloaded library's do), and from any thread.
__attribute__((visibility("default"))) fsdp_fault_hook fsdp_set_fault_hook(fsdp_fault_hook hook);

}  // extern "C"

namespace fsdp::detail {

// Calls the installed hook with `point` and `rank`, if there is one; costs
// one atomic load otherwise. The hook may end the process.
void fault_point(const char* point, int rank);

}  // namespace fsdp::detail
