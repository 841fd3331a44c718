// Helper for the checkpoint tests that need processes or Python:
//   checkpoint_helper write DIR
//       (one process, 2 rank threads) trains a small model and saves it to
//       DIR/full.pt and DIR/sharded, with DIR/expected.json (per-tensor sums)
//       for tests/python/check_checkpoint.py;
//   checkpoint_helper crash DIR FORMAT
//       (under fsdp-run) saves DIR/ckpt with step=1, trains, saves again with
//       step=2; the fault injector (FSDP_TEST_FAULT) makes one rank die during the second save.
#include <nlohmann/json.hpp>

#include <fstream>
#include <iostream>

#include "../support/thread_ranks.h"
#include "fsdp/checkpoint/checkpoint_io.h"
#include "fsdp/error.h"
#include "../support/trainer.h"

using namespace fsdp;
using namespace fsdp::testing;

namespace {

CheckpointState state_of(Trainer& job, int64_t step) {
  CheckpointState s;
  s.model("model", job.model.ptr()).optimizer("optimizer", *job.optimizer).value("step", step);
  return s;
}

int write(const std::string& dir) {
  const auto batches = make_batches(2, 4, 1);
  run_ranks(2, [&](dist::ProcessGroup& pg) {
    Trainer job(pg, Opt::kAdamW, 3);
    job.train(pg, batches, 0, 2);
    CheckpointState s = state_of(job, 7);
    s.value("lr", 0.5).value("name", std::string("gpt")).value("ok", true).value("rng", torch::arange(5));
    s.value("config.model.dim", int64_t{7}).value("config.run.lr", 0.25);  // nested dicts in Python
    save_checkpoint(dir + "/full.pt", s, pg, {CheckpointFormat::kFull});
    save_checkpoint(dir + "/sharded", s, pg, {CheckpointFormat::kSharded});
    auto params = full_parameters(job.model.ptr());
    if (pg.rank() == 0) {
      nlohmann::json sums;
      for (auto& [k, t] : params) sums[k] = t.sum().item<double>();
      std::ofstream(dir + "/expected.json") << sums.dump();
    }
  });
  return 0;
}

// format: "full" or "sharded" (both saves), or "sharded-then-full" /
// "full-then-sharded" (the second save replaces the other format).
int crash(const std::string& dir, const std::string& format) {
  auto pg = dist::init_process_group_from_env();
  const auto batches = make_batches(2, 4, 1);
  Trainer job(*pg, Opt::kAdamW, 3);
  const bool second_full = format == "full" || format == "sharded-then-full";
  const bool first_full = format == "full" || format == "full-then-sharded";
  const CheckpointOptions o{second_full ? CheckpointFormat::kFull : CheckpointFormat::kSharded};
  job.train(*pg, batches, 0, 1);
  save_checkpoint(dir + "/ckpt", state_of(job, 1), *pg,
                  {first_full ? CheckpointFormat::kFull : CheckpointFormat::kSharded});
  job.train(*pg, batches, 1, 2);
  save_checkpoint(dir + "/ckpt", state_of(job, 2), *pg, o);  // the injected fault strikes here
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "write" && argc == 3) return write(argv[2]);
    if (mode == "crash" && argc == 4) return crash(argv[2], argv[3]);
    std::cerr << "usage: checkpoint_helper write DIR | crash DIR full|sharded\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "checkpoint_helper: " << e.what() << "\n";
    return 1;
  }
}
