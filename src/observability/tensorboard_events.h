// src/observability/tensorboard_events.h — the bytes of TensorBoard's event files:
// TFRecord framing and the few protobuf messages a scalar logger writes.
// Pure functions, local.
//
// Encoded by hand: a logger writes six message types with a dozen fields
// (tensorflow/core/util/event.proto, summary.proto, and the hparams plugin's
// api.proto and plugin_data.proto), and the encoding of a field is a tag
// varint plus its value. Generating them with protoc and linking Debian's
// libprotobuf would add a code generator to the build and a second protobuf
// runtime to processes whose LibTorch may carry its own. The tests read
// every record back with TensorBoard's own reader (tests/python).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fsdp/observability/loggers.h"

namespace fsdp::detail::tensorboard {

// CRC-32C (Castagnoli), as TFRecord uses it, and its masked form
// ((crc >> 15 | crc << 17) + 0xa282ead8).
uint32_t crc32c(const void* data, size_t size);
uint32_t masked_crc32c(const void* data, size_t size);

// One TFRecord: length (uint64, little-endian), its masked CRC-32C, `data`,
// and the data's masked CRC-32C.
std::string record(const std::string& data);

// Event messages (serialized, not framed).
// The first event of a file: file_version "brain.Event:2".
std::string file_version_event(double wall_time);
// A scalar: Summary.Value{tag, simple_value (float32)} at `step`.
std::string scalar_event(double wall_time, int64_t step, const std::string& tag, float value);
// A session START (SessionLog{status: START}) at `step`: a restart, after
// which TensorBoard drops earlier events at steps >= `step`.
std::string session_start_event(double wall_time, int64_t step);
// The hparams plugin's three summaries, as torch.utils.tensorboard's
// hparams() builds them (what Lightning's log_hyperparams writes): the
// experiment (an HParamInfo per parameter, a MetricInfo per metric tag), the
// session start (the values), and the session end with `status` (1 success,
// 2 failure, 3 running).
std::vector<std::string> hparams_events(double wall_time, int64_t step, const Hyperparameters& params,
                                        const std::vector<std::string>& metric_tags, int status = 1);

}  // namespace fsdp::detail::tensorboard
