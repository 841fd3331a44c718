#include "tensorboard_events.h"

#include <array>
#include <cstring>
#include <variant>

namespace fsdp::detail::tensorboard {

namespace {

// Protobuf's wire format: a field is varint(number << 3 | wire type), then
// a varint (0), 8 bytes little-endian (1), a length-delimited payload (2) or
// 4 bytes little-endian (5).
void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out += static_cast<char>((v & 0x7f) | 0x80);
    v >>= 7;
  }
  out += static_cast<char>(v);
}
void key(std::string& out, int field, int wire) { varint(out, static_cast<uint64_t>(field) << 3 | static_cast<uint64_t>(wire)); }
void int_field(std::string& out, int field, int64_t v) {
  key(out, field, 0);
  varint(out, static_cast<uint64_t>(v));  // negative int64: ten bytes, as protobuf does
}
void bytes_field(std::string& out, int field, const std::string& v) {
  key(out, field, 2);
  varint(out, v.size());
  out += v;
}
// A message of one length-delimited field: field `number` holding `payload`.
std::string wrap(int number, const std::string& payload) {
  std::string out;
  bytes_field(out, number, payload);
  return out;
}
template <class T>
void little_endian(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // x86-64 and aarch64 Linux are little-endian
  out.append(b, sizeof(T));
}
void double_field(std::string& out, int field, double v) {
  key(out, field, 1);
  little_endian(out, v);
}
void float_field(std::string& out, int field, float v) {
  key(out, field, 5);
  little_endian(out, v);
}

// Event{wall_time = 1, step = 2, file_version = 3, summary = 5, session_log = 7}
// (6 is the deprecated log_message).
std::string event(double wall_time, int64_t step) {
  std::string e;
  double_field(e, 1, wall_time);
  if (step != 0) int_field(e, 2, step);
  return e;
}

// Summary{value = 1: Summary.Value{tag = 1, metadata = 9}} carrying the
// hparams plugin's HParamsPluginData (version 0) in
// SummaryMetadata{plugin_data = 1: PluginData{plugin_name = 1, content = 2}}.
std::string plugin_summary(const std::string& tag, const std::string& plugin_data) {
  std::string plugin = wrap(1, "hparams");
  bytes_field(plugin, 2, plugin_data);
  std::string value = wrap(1, tag);
  bytes_field(value, 9, wrap(1, plugin));
  return wrap(1, value);
}

const std::array<uint32_t, 256>& crc_table() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0x82f63b78u ^ (c >> 1) : c >> 1;  // reflected Castagnoli
      t[i] = c;
    }
    return t;
  }();
  return table;
}

}  // namespace

uint32_t crc32c(const void* data, size_t size) {
  const auto& t = crc_table();
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = 0xffffffffu;
  for (size_t i = 0; i < size; ++i) c = t[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

uint32_t masked_crc32c(const void* data, size_t size) {
  const uint32_t c = crc32c(data, size);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::string record(const std::string& data) {
  std::string out;
  std::string length;
  little_endian(length, static_cast<uint64_t>(data.size()));
  out += length;
  little_endian(out, masked_crc32c(length.data(), length.size()));
  out += data;
  little_endian(out, masked_crc32c(data.data(), data.size()));
  return out;
}

std::string file_version_event(double wall_time) {
  std::string e = event(wall_time, 0);
  bytes_field(e, 3, "brain.Event:2");
  return e;
}

std::string scalar_event(double wall_time, int64_t step, const std::string& tag, float value) {
  std::string v = wrap(1, tag);
  float_field(v, 2, value);
  std::string e = event(wall_time, step);
  bytes_field(e, 5, wrap(1, v));
  return e;
}

std::string session_start_event(double wall_time, int64_t step) {
  std::string log;
  int_field(log, 1, 1);  // SessionLog.status = START
  std::string e = event(wall_time, step);
  bytes_field(e, 7, log);
  return e;
}

std::vector<std::string> hparams_events(double wall_time, int64_t step, const Hyperparameters& params,
                                        const std::vector<std::string>& metric_tags, int status) {
  // Experiment{hparam_infos = 4: HParamInfo{name = 1, type = 4 (1 string,
  // 2 bool, 3 float64)}, (a bool as a bool: torch's hparams() writes it as
  // the number 1.0 or 0.0, since Python's bool is an int; TensorBoard shows
  // either) metric_infos = 5: MetricInfo{name = 1:
  // MetricName{tag = 2}}}; SessionStartInfo{hparams = 1: map entries
  // {key = 1, value = 2: google.protobuf.Value{number_value = 2,
  // string_value = 3, bool_value = 4}}}; SessionEndInfo{status = 1};
  // HParamsPluginData{version = 1 (0: omitted), experiment = 2,
  // session_start_info = 3, session_end_info = 4}.
  std::string experiment, start;
  for (const auto& [name, v] : params) {
    std::string value;
    int type = 3;
    if (const auto* b = std::get_if<bool>(&v)) {
      int_field(value, 4, *b ? 1 : 0);
      type = 2;
    } else if (const auto* i = std::get_if<int64_t>(&v)) {
      double_field(value, 2, static_cast<double>(*i));
    } else if (const auto* d = std::get_if<double>(&v)) {
      double_field(value, 2, *d);
    } else {
      bytes_field(value, 3, std::get<std::string>(v));
      type = 1;
    }
    std::string info = wrap(1, name);
    int_field(info, 4, type);
    bytes_field(experiment, 4, info);
    std::string entry = wrap(1, name);
    bytes_field(entry, 2, value);
    bytes_field(start, 1, entry);
  }
  for (const auto& tag : metric_tags) bytes_field(experiment, 5, wrap(1, wrap(2, tag)));
  std::string end;
  int_field(end, 1, status);
  std::vector<std::string> out;
  for (const auto& [tag, content] : {std::pair<std::string, std::string>{"_hparams_/experiment", wrap(2, experiment)},
                                     {"_hparams_/session_start_info", wrap(3, start)},
                                     {"_hparams_/session_end_info", wrap(4, end)}}) {
    std::string e = event(wall_time, step);
    bytes_field(e, 5, plugin_summary(tag, content));
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace fsdp::detail::tensorboard
