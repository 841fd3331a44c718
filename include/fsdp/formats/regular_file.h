// fsdp/formats/regular_file.h — reading a small file whole (a model's
// config.json, ...) through the same regular-file check as a checkpoint's
// data files (src/formats/files/readers.cpp): a FIFO is refused, never opened for
// a blocking read; a directory or a device is named for what it is.
#pragma once

#include <cstdint>
#include <string>

namespace fsdp::formats {

// The whole of the file `path`: ConfigError naming the file and what it is
// when it is not a regular file, when it cannot be opened (with "`what` was
// expected there", e.g. what = "a model's config.json"), or when it holds
// more than `max_bytes`.
std::string read_regular_file(const std::string& path, int64_t max_bytes, const std::string& what);

}  // namespace fsdp::formats
