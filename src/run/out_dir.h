// src/run/out_dir.h — what fsdp-train's run-directory units share about
// the files beneath --out: the time and host they write into their files,
// the refusal of a symbolic link beneath --out (nothing there is
// followed), and what a killed sharded save leaves. Local file operations
// only; nothing here communicates.
#pragma once

#include <filesystem>
#include <string>

namespace fsdp::run {

// The time now in UTC: "2026-12-01T10:00:00Z", or compact "20261201T100000Z"
// (for file names).
std::string utc_now(bool compact = false);

// This machine's host name ("?" when it cannot be read).
std::string host_name();

// ConfigError when `path` is a symbolic link: nothing beneath --out (`root`)
// is followed. `what`: what fsdp-train writes there.
void refuse_link(const std::string& root, const std::string& path, const std::string& what);

// open(2) of one of fsdp-train's files with O_NOFOLLOW (mode 0644): a
// symbolic link there is refused (ConfigError naming it and `what`); -1 and
// errno for any other failure.
int open_own_file(const std::string& root, const std::string& path, int flags, const std::string& what);

// ConfigError unless the directory `dir` (a folder fsdp-train writes into)
// can be written: created files and folders in it, and entered.
void check_writable_dir(const std::string& root, const std::string& dir, const std::string& what);

// "a directory", "a FIFO (named pipe)", ... for `st`.
std::string kind_of(std::filesystem::file_status st);

// A sharded checkpoint directory that a killed save left before its commit:
// no commit file in it (.metadata, written last; index.json in the older
// layout).
bool incomplete(const std::string& path);

// Whether `name` is a file a sharded save writes into its step-NNNNNNNN
// directory before its commit: a data file, or a temporary of one or of a
// commit file.
bool sharded_save_file(const std::string& name);

// Whether `path` is what a killed sharded save of fsdp-train's leaves: a
// directory (not a link) with no commit file, holding only regular files
// of the names that save writes (or nothing).
bool killed_save(const std::string& path);

}  // namespace fsdp::run
