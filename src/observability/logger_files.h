// src/observability/logger_files.h — what the loggers (fsdp/observability/loggers.h) share about
// files. Local.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace fsdp::detail {

std::string errno_text(int error);

// root/name/version, or root/name/version_N with N one past the largest
// version_N there (0 if none) when `version` is nullopt. ConfigError (`who`
// first) when root/name exists and cannot be listed.
std::string versioned_dir(const std::string& root, const std::string& name, const std::optional<std::string>& version,
                          const char* who);

// Creates `dir` and its parents; ConfigError naming it and the reason when it
// cannot be made or written, except on a full disk (ENOSPC, EDQUOT): then
// false, and the caller logs nothing until it can (a full disk must not stop
// a run).
bool make_log_dir(const std::string& dir, const char* who);

// Whether `error` means the disk (or the quota) is full.
bool disk_full(int error);

// Writes all of `bytes` to `fd`. On failure (`error` = errno; ENOSPC for a
// write of 0 bytes) the file is truncated back to `undo_to` if part was
// written, and false is returned.
bool write_all(int fd, const std::string& bytes, int64_t undo_to, int& error);

}  // namespace fsdp::detail
