#include "new_directory.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <regex>

#include "fsdp/error.h"
#include "fsdp/formats/format.h"

namespace fsdp::hf::detail {

namespace fs = std::filesystem;

namespace {

// Whether `name` is a file that a staging directory of export_hf or
// save_peft_adapter holds: one of their outputs, or its temporary
// ("<output>.tmp-<save id>", fsdp::formats::AtomicFile's).
bool staged_file_name(std::string name) {
  if (const auto tmp = name.rfind(".tmp-"); tmp != std::string::npos && formats::is_save_id(name.substr(tmp + 5))) {
    name.resize(tmp);
  }
  static const std::regex shard("model-[0-9]{5}-of-[0-9]{5}\\.safetensors");
  for (const char* f : {"model.safetensors", "model.safetensors.index.json", "config.json", "generation_config.json",
                        "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                        "adapter_model.safetensors", "adapter_config.json"}) {
    if (name == f) return true;
  }
  return std::regex_match(name, shard);
}

// An exclusive flock on the directory `dir` (opened without following a
// link), the descriptor returned; -1 if it cannot be opened or another
// process holds the lock (a live writer).
int lock_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return -1;
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

std::vector<std::string> remove_stale_staging(const std::string& path) {
  std::vector<std::string> removed;
  const fs::path p(path);
  const fs::path parent = p.parent_path().empty() ? fs::path(".") : p.parent_path();
  const std::string prefix = "." + p.filename().string() + ".tmp-";
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(parent, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) != 0 || !formats::is_save_id(name.substr(prefix.size()))) continue;
    const std::string dir = e.path().string();
    if (formats::entry_kind(dir) != "a directory") continue;  // never a link, a file or a device
    const int fd = lock_directory(dir);  // a writer alive holds its own: left alone
    if (fd < 0) continue;
    bool ours = true;
    std::error_code ec2;
    for (const auto& f : fs::directory_iterator(dir, ec2)) {
      if (formats::entry_kind(f.path().string()) != "a regular file" ||
          !staged_file_name(f.path().filename().string())) {
        ours = false;  // something the export never writes: not provably ours
        break;
      }
    }
    if (ours && !ec2) {
      for (const auto& f : fs::directory_iterator(dir, ec2)) fs::remove(f.path(), ec2);
      if (fs::remove(dir, ec2)) removed.push_back(dir);
    }
    ::close(fd);
  }
  return removed;
}

NewDirectory::NewDirectory(const std::string& path, const std::string& caller) : path_(path), caller_(caller) {
  if (!formats::entry_kind(path).empty()) {
    throw ConfigError(caller + ": the output " + path + " exists (" + formats::entry_kind(path) + "); " + caller +
                      " writes a new directory: remove it or choose another name");
  }
  remove_stale_staging(path);  // what a killed write of the same output left (issue 50 item 8)
  const fs::path p(path);
  const fs::path parent = p.parent_path().empty() ? fs::path(".") : p.parent_path();
  staging_ = (parent / ("." + p.filename().string() + ".tmp-" + formats::new_save_id())).string();
  std::error_code ec;
  fs::create_directories(staging_, ec);
  if (ec) throw Error(caller + ": cannot create " + staging_ + ": " + ec.message());
  lock_fd_ = lock_directory(staging_);  // held until destroyed: tells the staging directory alive
  if (lock_fd_ < 0) {
    const std::string why = std::strerror(errno);
    fs::remove_all(staging_, ec);
    throw Error(caller + ": cannot lock " + staging_ + ": " + why);
  }
}

NewDirectory::~NewDirectory() {
  if (!committed_) {
    std::error_code ec;
    fs::remove_all(staging_, ec);
  }
  if (lock_fd_ >= 0) ::close(lock_fd_);
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
