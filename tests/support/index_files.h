// tests/support/index_files.h — reading, writing and re-sealing checkpoint
// files in tests that damage or edit them on purpose.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>

#include "../../src/fsdp/ckpt_format.h"

namespace fsdp::testing {

inline std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline void write_all(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

// An index (fsdp_index.json, index.json) edited on purpose gets a matching
// checksum again, computed as docs/checkpoint-format.md says ("crc32:<8 hex
// digits>" of the compact JSON of the other fields, in the file's order), so
// that an edit meets the checks behind the checksum.
inline void reseal(const std::string& index_file) {
  auto j = nlohmann::ordered_json::parse(read_all(index_file));
  j.erase("checksum");
  const std::string text = j.dump();
  char hex[16];
  std::snprintf(hex, sizeof hex, "%08x", fsdp::detail::ckpt::crc32(text.data(), text.size()));
  j["checksum"] = std::string("crc32:") + hex;
  write_all(index_file, j.dump(1));
}

}  // namespace fsdp::testing
