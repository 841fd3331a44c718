// src/formats/files/file_kind.h — what the files of the formats module share about
// file types. Private to the module (files.cpp, readers.cpp).
#pragma once

#include <sys/types.h>

namespace fsdp::formats {

// "a regular file", "a symbolic link", "a FIFO (named pipe)", "a socket", "a
// character device", "a block device", "a directory", or "not a regular
// file": what the mode of stat(2) says an entry is.
const char* file_kind(mode_t mode);

}  // namespace fsdp::formats
