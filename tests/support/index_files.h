// tests/support/index_files.h — re-sealing checkpoint indexes in tests that
// damage or edit them on purpose.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdio>
#include <string>

#include "../../src/checkpoint/format.h"
#include "subprocess.h"

namespace fsdp::testing {

// The checksum an index with the fields of `without_checksum` carries, as
// docs/checkpoint-format.md defines it: "crc32:<8 hex digits>" of their
// compact JSON, in the file's order.
inline std::string index_checksum(const nlohmann::ordered_json& without_checksum) {
  const std::string text = without_checksum.dump();
  char hex[16];
  std::snprintf(hex, sizeof hex, "%08x", fsdp::detail::checkpoint::crc32(text.data(), text.size()));
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

}  // namespace fsdp::testing
