// Uses the installed headers and libraries: started by the installed
// fsdp-run (fsdp::fsdp-run) as 2 ranks, it joins their world from the
// launcher's environment and checks an all_reduce; it also calls the
// launcher library's argument parser, and fsdp::gpt's train::prepare on a
// small tokenizer.json (FSDP_CONSUMER_PREPARE: it tokenizes, and the program
// links fsdp::tokenizers too and calls a tokenizer; otherwise, with Debian's
// LibTorch 1.13, prepare must refuse, naming why).
#include <ATen/ATen.h>
#include <fsdp/distributed/process_group.h>
#include <fsdp/error.h>
#include <fsdp/launch/launcher.h>
#include <fsdp/train/prepare.h>
#ifdef FSDP_CONSUMER_PREPARE
#include <fsdp/tokenizers/tokenizer.h>
#endif

#include <cstdlib>
#include <iostream>
#include <string>

#include "tokenizer_fixture.h"

namespace {

// prepare() through the package: "ok" or what went wrong.
std::string check_prepare() {
  const std::string dir = write_tokenizer_dir();
  fsdp::train::PrepareOptions o;
  o.tokenizer = dir;
  o.out = dir + "/out.bin";
  o.inputs = {dir + "/in.txt"};
  std::string verdict;
  try {
    const fsdp::train::PrepareResult r = fsdp::train::prepare(o);
#ifdef FSDP_CONSUMER_PREPARE
    const auto ids = fsdp::tokenizers::load_tokenizer(dir)->encode("ababa", false);
    verdict = r.tokens == 3 && r.vocab_size == 3 && ids.size() == 3 ? "ok"
                                                                    : "prepare wrote " + std::to_string(r.tokens) + " tokens";
#else
    verdict = "prepare ran, where this LibTorch was expected to refuse it (" + std::to_string(r.tokens) + " tokens)";
#endif
  } catch (const fsdp::ConfigError& e) {
    const std::string what = e.what();
#ifdef FSDP_CONSUMER_PREPARE
    verdict = "prepare refused: " + what;
#else
#ifdef FSDP_CONSUMER_TOKENIZERS
    const char* const expected = "prepare: this fsdp-train is built on Debian's LibTorch 1.13";
#else
    const char* const expected = "prepare: this fsdp-train was built without fsdp::tokenizers";
#endif
    verdict = what.find(expected) != std::string::npos
                  ? "ok"
                  : "prepare refused, but not by name: " + what;
#endif
  }
  std::system(("rm -rf '" + dir + "'").c_str());
  return verdict;
}

}  // namespace

int main() {
  auto launch = fsdp::launch::parse_launch_args({"--nproc-per-node", "2", "prog"});
  auto pg = fsdp::dist::init_process_group_from_env();  // RANK, WORLD_SIZE, MASTER_ADDR, ... from fsdp-run
  at::Tensor t = at::ones({4});
  pg->all_reduce(t).wait();  // sum over 2 ranks: 2 in every element
  const std::string prepared = check_prepare();
  const bool ok = launch.nproc_per_node == 2 && pg->size() == 2 && t.eq(2).all().item<bool>() && prepared == "ok";
  std::cout << "consumer rank " << pg->rank() << " of " << pg->size() << ": " << (ok ? "ok" : "WRONG")
            << " (prepare: " << prepared << ")" << std::endl;
  return ok ? 0 : 1;
}
