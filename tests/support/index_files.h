// tests/support/index_files.h — re-sealing checkpoint indexes in tests that
// damage or edit them on purpose, and hand-made safetensors files.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdio>
#include <string>

#include "fsdp/formats/format.h"
#include "subprocess.h"

namespace fsdp::testing {

// The checksum an index with the fields of `without_checksum` carries, as
// docs/checkpoint-format.md defines it: "crc32:<8 hex digits>" of their
// compact JSON, in the file's order.
inline std::string index_checksum(const nlohmann::ordered_json& without_checksum) {
  const std::string text = without_checksum.dump();
  char hex[16];
  std::snprintf(hex, sizeof hex, "%08x", fsdp::formats::crc32(text.data(), text.size()));
  return std::string("crc32:") + hex;
}

// An index (fsdp_index.json, index.json) edited on purpose gets a matching
// checksum again, so that an edit meets the checks behind the checksum.
inline void reseal(const std::string& index_file) {
  auto j = nlohmann::ordered_json::parse(read_file(index_file));
  j.erase("checksum");
  j["checksum"] = index_checksum(j);
  write_file(index_file, j.dump(1));
}

// A safetensors file's bytes: the header's length (`length`, or the header's
// own), the header, the data.
inline std::string st_bytes(const std::string& header, const std::string& data, int64_t length = -1) {
  const auto n = static_cast<uint64_t>(length < 0 ? static_cast<int64_t>(header.size()) : length);
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  return out + header + data;
}

// The header of a file with one F32 tensor "a" of shape [2] (8 bytes).
inline const std::string kA = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";

}  // namespace fsdp::testing
