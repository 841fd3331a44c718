#include "new_directory.h"

#include <fcntl.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "fsdp/error.h"
#include "fsdp/formats/format.h"

namespace fsdp::hf::detail {

namespace fs = std::filesystem;

NewDirectory::NewDirectory(const std::string& path, const std::string& caller) : path_(path), caller_(caller) {
  if (!formats::entry_kind(path).empty()) {
    throw ConfigError(caller + ": the output " + path + " exists (" + formats::entry_kind(path) + "); " + caller +
                      " writes a new directory: remove it or choose another name");
  }
  const fs::path p(path);
  const fs::path parent = p.parent_path().empty() ? fs::path(".") : p.parent_path();
  staging_ = (parent / ("." + p.filename().string() + ".tmp-" + formats::new_save_id())).string();
  std::error_code ec;
  fs::create_directories(staging_, ec);
  if (ec) throw Error(caller + ": cannot create " + staging_ + ": " + ec.message());
}

NewDirectory::~NewDirectory() {
  if (committed_) return;
  std::error_code ec;
  fs::remove_all(staging_, ec);
}

void NewDirectory::write_text(const std::string& name, const std::string& text) const {
  formats::AtomicFile f(staging_ + "/" + name);
  f.write(text.data(), text.size());
  f.commit();
}

void NewDirectory::commit() {
  formats::sync_dir(staging_);
  if (::renameat2(AT_FDCWD, staging_.c_str(), AT_FDCWD, path_.c_str(), RENAME_NOREPLACE) != 0) {
    throw Error(caller_ + ": cannot rename " + staging_ + " to " + path_ + ": " + std::strerror(errno));
  }
  committed_ = true;
  const fs::path parent = fs::path(path_).parent_path();
  formats::sync_dir(parent.empty() ? "." : parent.string());
}

}  // namespace fsdp::hf::detail
