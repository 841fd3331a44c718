// Reading tokenizer files (private): whole, bounded, regular files only.
#pragma once

#include <cstdint>
#include <string>

namespace fsdp::tokenizers::detail {

// The bytes of the regular file `path`. ConfigError naming it (and `what`
// it should be, e.g. "a tokenizer.json") if it is missing, not a regular
// file (a directory, a FIFO: refused before it is opened), over `max_bytes`,
// or unreadable.
std::string read_tokenizer_file(const std::string& path, const char* what, int64_t max_bytes);

}  // namespace fsdp::tokenizers::detail
