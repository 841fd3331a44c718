// A directory written whole or not at all (private to the hf module): its
// files go into a hidden sibling, which commit() syncs and renames to the
// final name with RENAME_NOREPLACE, never over anything; destroyed before
// commit(), the sibling is removed.
#pragma once

#include <string>

namespace fsdp::hf::detail {

class NewDirectory {
 public:
  // ConfigError naming `caller` if `path` exists. Creates the sibling.
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
};

}  // namespace fsdp::hf::detail
