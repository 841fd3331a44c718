// The fsdp-train configuration the trainer tests start from: the tiny preset,
// `steps` steps of `batch` samples per rank into `out`, no progress lines
// (log_every past any run). Tests set what else they need on the copy.
#pragma once

#include <cstdint>
#include <string>

#include "fsdp/train/train_config.h"

namespace fsdp::testing {

inline train::TrainConfig tiny_train_config(const std::string& out, int64_t steps, int64_t batch) {
  train::TrainConfig c;
  c.preset = "tiny";
  c.model = train::preset("tiny");
  c.steps = steps;
  c.batch = batch;
  c.out = out;
  c.log_every = 1000;
  return c;
}

}  // namespace fsdp::testing
