// The start-up check of --save-hf's destination (hf_destination.h).
#include "hf_destination.h"

#include <unistd.h>

#include <filesystem>
#include <string>

#include "fsdp/error.h"

namespace fsdp::train {

namespace fs = std::filesystem;

namespace {

// `p` absolute, symbolic links of its existing part resolved.
fs::path resolved(const std::string& p) {
  std::error_code ec;
  fs::path r = fs::weakly_canonical(fs::absolute(p, ec), ec);
  if (ec) r = fs::absolute(p, ec).lexically_normal();
  if (r.has_parent_path() && r.filename().empty()) r = r.parent_path();  // "a/b/" is "a/b"
  return r;
}

// Whether `a` is `b` or lies inside it (both resolved).
bool within(fs::path a, const fs::path& b) {
  for (; !a.empty(); a = a.parent_path()) {
    if (a == b) return true;
    if (a == a.parent_path()) break;
  }
  return false;
}

}  // namespace

void check_save_hf_destination(const std::string& save_hf, const std::string& out_flag, const std::string& hf) {
  if (save_hf.empty()) return;
  const std::string flag = "--save-hf " + save_hf;
  std::error_code ec;
  if (fs::exists(fs::symlink_status(save_hf, ec))) {
    throw ConfigError(flag + " already exists: the export writes a new directory and never writes over one: "
                      "expected a path that does not exist yet");
  }
  const fs::path dest = resolved(save_hf), out = resolved(out_flag), checkpoints = out / "checkpoints";
  const std::string later = ": the run's export at its end would refuse it, after the whole run trained";
  if (within(dest, checkpoints)) {
    throw ConfigError(flag + " is --out's checkpoints directory or inside it (" + checkpoints.string() +
                      "), where the run writes and prunes its checkpoints" + later +
                      ": expected a path outside it, e.g. " + (out / "hf").string());
  }
  if (within(out, dest)) {
    throw ConfigError(flag + (dest == out ? std::string(" is --out ") : std::string(" holds --out ")) + out_flag +
                      ", which the run creates before its export, and the export writes only a directory that does "
                      "not exist yet" + later + ": expected another path, e.g. " + (out / "hf").string());
  }
  if (!hf.empty() && within(dest, resolved(hf))) {
    throw ConfigError(flag + " is the --model hf: directory " + hf + " or inside it, and the export never writes "
                      "into the model it was read from" + later + ": expected a path outside " + hf);
  }
  // The export creates the missing directories: the nearest existing one must take them.
  fs::path parent = dest.parent_path();
  while (!parent.empty() && !fs::exists(fs::symlink_status(parent, ec)) && parent != parent.parent_path()) {
    parent = parent.parent_path();
  }
  if (!fs::is_directory(parent, ec) || ::access(parent.c_str(), W_OK | X_OK) != 0) {
    throw ConfigError(flag + ": " + parent.string() + (fs::is_directory(parent, ec) ? " is a directory this process "
                      "may not write into" : " is not a directory") + later + ": expected a path under a writable "
                      "directory");
  }
}

}  // namespace fsdp::train
