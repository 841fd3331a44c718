// A directory written whole or not at all (private to the hf module): its
// files go into a hidden sibling, which commit() syncs and renames to the
// final name with RENAME_NOREPLACE, never over anything; destroyed before
// commit(), the sibling is removed. While it lives, it holds an exclusive
// flock(2) on the sibling: a killed writer's lock is gone with it, which is
// how the next writer of the same output tells its sibling stale.
#pragma once

#include <string>
#include <vector>

namespace fsdp::hf::detail {

// Removes the staging siblings ".<name>.tmp-<save id>" of `path` that a
// killed writer left (issue 50 item 8), each only when proven ours: a
// directory (not a link) of that exact name, no writer alive holding its
// lock, and holding nothing but regular files under the names the export and
// save_peft_adapter write (model*.safetensors, the index, config.json,
// generation_config.json, the tokenizer's files, the adapter's files) or
// their temporaries. Anything else stays. Returns the directories removed.
std::vector<std::string> remove_stale_staging(const std::string& path);

class NewDirectory {
 public:
  // ConfigError naming `caller` if `path` exists. Removes stale staging
  // siblings of `path` (remove_stale_staging), then creates its own.
  NewDirectory(const std::string& path, const std::string& caller);
  ~NewDirectory();
  NewDirectory(const NewDirectory&) = delete;
  NewDirectory& operator=(const NewDirectory&) = delete;

  // Where the files go until commit().
  const std::string& staging() const { return staging_; }
  // A text file into the staging directory, crash-safe.
  void write_text(const std::string& name, const std::string& text) const;
  // Syncs the staging directory and renames it to the final name; Error if
  // the rename fails (e.g. something appeared there meanwhile).
  void commit();

 private:
  std::string path_, staging_, caller_;
  bool committed_ = false;
  int lock_fd_ = -1;
};

}  // namespace fsdp::hf::detail
