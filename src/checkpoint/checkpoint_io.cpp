// Saving checkpoints (fsdp/checkpoint/checkpoint_io.h): the format chosen, a checkpoint
// of the other format replaced crash-safely, async saves kept until
// wait_for_checkpoint. The writers, the loader and the tools are the other
// files of the module (parts.h).
#include "fsdp/checkpoint/checkpoint_io.h"

#include <fcntl.h>
#include <stdio.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <mutex>

#include "fsdp/formats/dcp.h"
#include "parts.h"
#include "fsdp/fault_points/fault_points.h"
#include "fsdp/error.h"
#include "fsdp/text/enum_names.h"

namespace fsdp {

namespace fs = std::filesystem;

namespace {
constexpr text::EnumName<CheckpointFormat> kCheckpointFormatNames[] = {{CheckpointFormat::kFull, "full"},
                                                                       {CheckpointFormat::kSharded, "sharded"}};
}  // namespace

const char* to_string(CheckpointFormat format) { return text::name_of(kCheckpointFormatNames, format); }

CheckpointFormat parse_checkpoint_format(const std::string& name, const std::string& what) {
  if (auto f = text::value_of(kCheckpointFormatNames, text::to_lower(name))) return *f;
  throw ConfigError("Unknown " + what + ": " + name + " (expected one of " +
                    text::list_names(kCheckpointFormatNames, ", ", "\"") + ")");
}

namespace detail {

namespace {

std::mutex& pending_mutex() {
  static std::mutex mu;
  return mu;
}
std::map<const dist::ProcessGroup*, PendingSave>& pending_saves() {
  static std::map<const dist::ProcessGroup*, PendingSave> p;
  return p;
}

}  // namespace

void set_pending_save(dist::ProcessGroup& group, PendingSave save) {
  std::lock_guard<std::mutex> lock(pending_mutex());
  pending_saves()[&group] = std::move(save);
}

}  // namespace detail

namespace {

bool is_sharded_checkpoint(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) && (fs::is_regular_file(fs::path(path) / formats::kDcpMetadataFile, ec) ||
                                        fs::is_regular_file(fs::path(path) / formats::kIndexFile, ec));
}

// Removes what a killed replacement left beside `path`: the staging names
// "<name>.fsdp-new-<save id>" (and their temporaries "….tmp-<save id>")
// that replace_other_format gives, each a regular file or a directory of
// fsdp-cpp's own files (remove_own_directory); anything else, whatever its
// name, stays (issue 37 item 2).
void remove_stale_replacements(const std::string& path) {
  namespace ck = formats;
  std::error_code ec;
  const fs::path target(path);
  const std::string stale = target.filename().string() + ".fsdp-new-";
  const fs::path parent = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  for (const auto& e : fs::directory_iterator(parent, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(stale, 0) != 0) continue;
    std::string id = name.substr(stale.size());
    const auto tmp = id.find(".tmp-");
    if (tmp != std::string::npos && ck::is_save_id(id.substr(tmp + 5))) id = id.substr(0, tmp);
    if (!ck::is_save_id(id)) continue;
    const std::string kind = ck::entry_kind(e.path().string());
    if (kind == "a regular file") {
      fs::remove(e.path(), ec);
    } else if (kind == "a directory") {
      ck::remove_own_directory(e.path().string());
    }
  }
}

// [local] Refuses what a save of `format` may not write over at `path`
// (issue 37 item 4): a full checkpoint replaces only a regular file (or a
// sharded checkpoint's directory); a sharded one is a directory (the path
// may be a symbolic link to one) or replaces a regular file. Never a
// symbolic link where a file belongs, a device, a FIFO or a socket.
void check_destination(const std::string& path, CheckpointFormat format) {
  namespace ck = formats;
  const std::string kind = ck::entry_kind(path);
  if (kind.empty() || kind == "a regular file" || kind == "a directory") return;
  std::error_code ec;
  if (format == CheckpointFormat::kSharded && kind == "a symbolic link" && fs::is_directory(path, ec)) return;
  ck::check_file_destination(path, "save_checkpoint");
  throw ConfigError("save_checkpoint: " + path + " is " + kind + ": refusing to write a checkpoint there");
}

// [collective: broadcast from rank 0] Whether `path` holds a checkpoint of
// the other format than `format` (rank 0 looks, and clears stale
// replacements); a destination that may not be written is refused on every
// rank. A sharded checkpoint that a full one would replace must hold only
// fsdp-cpp's own files: they are all removed then.
bool other_format_at(const std::string& path, CheckpointFormat format, dist::ProcessGroup& group) {
  std::string other;
  dist::Failure failure;
  if (group.rank() == 0) {
    failure = dist::capture([&] {
      check_destination(path, format);
      remove_stale_replacements(path);
      std::error_code ec;
      const bool full = format == CheckpointFormat::kFull;
      if (full ? is_sharded_checkpoint(path) : (fs::exists(path, ec) && !fs::is_directory(path, ec))) other = "1";
      if (full && !other.empty()) formats::refuse_foreign_entries(path, "save_checkpoint");
    });
  }
  const std::string agreed = group.broadcast_bytes(dist::outcome(other, failure), 0);
  if (dist::outcome_failed(agreed)) dist::rethrow(dist::outcome_failure(agreed));
  return !dist::outcome_payload(agreed).empty();
}

// Swaps what `a` and `b` name, atomically (a file and a directory included:
// Linux's renameat2 RENAME_EXCHANGE), then syncs their directory.
void exchange_paths(const std::string& a, const std::string& b) {
  if (::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE) != 0) {
    const int err = errno;
    throw Error("save_checkpoint: cannot swap " + a + " and " + b + " in one step (renameat2 RENAME_EXCHANGE: " +
                std::strerror(err) + ")" +
                (err == EINVAL || err == ENOSYS ? ": this file system cannot; remove the old checkpoint first" : ""));
  }
  formats::sync_dir(fs::path(b).parent_path().empty() ? "." : fs::path(b).parent_path().string());
}

// [collective] Replaces the checkpoint of the other format at `path`: the
// new one is saved complete beside it, swapped in atomically, and only then
// is the old one removed. An interruption leaves one of the two at `path`,
// whole.
void replace_other_format(const std::string& path, const CheckpointState& state, dist::ProcessGroup& group,
                          const CheckpointOptions& options) {
  if (options.async_save()) {
    throw ConfigError("save_checkpoint: " + path + " holds a checkpoint of the other format; replacing it is done "
                      "synchronously: save with async_save=false (or to another path)");
  }
  const std::string staging = path + ".fsdp-new-" + group.broadcast_bytes(formats::new_save_id(), 0);
  save_checkpoint(staging, state, group, options);  // [collective] complete and committed there
  dist::Failure error;
  if (group.rank() == 0) {
    error = dist::capture([&] {
      detail::fault_point("replace-before-exchange", 0);
      exchange_paths(staging, path);  // the commit point: `path` is the new checkpoint
      detail::fault_point("replace-after-exchange", 0);
      // The old one, now under the staging name: a file, or a directory of
      // fsdp-cpp's own files (refused before, other_format_at).
      if (fs::is_directory(fs::symlink_status(staging))) {
        formats::remove_own_directory(staging);
      } else {
        fs::remove(staging);
      }
    });
  }
  dist::agree(group, error, "save_checkpoint: replacing " + path);
}

}  // namespace

void save_checkpoint(const std::string& path, const CheckpointState& state, dist::ProcessGroup& group,
                     const CheckpointOptions& options) {
  auto model = detail::the_fsdp_model(state, "save").second;
  wait_for_checkpoint(group);  // one save at a time
  if (other_format_at(path, options.format(), group)) {  // [collective]
    replace_other_format(path, state, group, options);
  } else if (options.format() == CheckpointFormat::kFull) {
    detail::save_full(path, state, model, group, options);
  } else {
    detail::save_sharded(path, state, model, group, options);
  }
}

void wait_for_checkpoint(dist::ProcessGroup& group) {
  detail::PendingSave pending;
  {
    std::lock_guard<std::mutex> lock(detail::pending_mutex());
    auto it = detail::pending_saves().find(&group);
    if (it == detail::pending_saves().end()) return;
    pending = std::move(it->second);
    detail::pending_saves().erase(it);
  }
  pending.write.get();
  pending.commit();
}

bool checkpoint_pending(const dist::ProcessGroup& group) {
  std::lock_guard<std::mutex> lock(detail::pending_mutex());
  return detail::pending_saves().count(&group) > 0;
}

}  // namespace fsdp
