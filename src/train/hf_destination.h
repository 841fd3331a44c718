// src/train/hf_destination.h — the start-up check of fsdp-train's --save-hf
// destination (issue 50 item 7). Local: reads the file system only.
#pragma once

#include <string>


namespace fsdp::train {

// ConfigError naming --save-hf and what it collides with, for a destination
// that the export at the end of the run (hf::export_hf, or
// hf::save_peft_adapter under --lora-rank) would refuse or could not
// write, so that a run never trains to lose its export:
//  - it exists (the export writes a new directory only);
//  - it is --out, holds --out (the run creates them), or is --out's
//    checkpoints directory or inside it (the run writes and prunes there);
//  - it is the --model hf: directory or inside it (the export never writes
//    into its source);
//  - its nearest existing ancestor is not a directory this process may
//    write into.
// Symbolic links are resolved before comparing. Nothing when --save-hf is
// empty.
// `save_hf`, `out` and `hf_dir` are TrainConfig's save_hf and out and
// hf_directory(config) (empty: no hf: source).
void check_save_hf_destination(const std::string& save_hf, const std::string& out, const std::string& hf_dir);

}  // namespace fsdp::train
