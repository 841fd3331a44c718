// Starting a job in a run directory (fsdp/run/run_start.h).
#include "fsdp/run/run_start.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "fsdp/distributed/rank_errors.h"
#include "fsdp/error.h"
#include "out_dir.h"
#include "fsdp/run/run_directory.h"
#include "fsdp/run/rotation.h"  // remove_own_files

namespace fsdp::run {

namespace fs = std::filesystem;

namespace {

using Json = nlohmann::json;

// run.json; "legacy_checkpoints" when a --resume adopted a directory written
// before fsdp-train recorded run identities (RunIdentity::legacy).
void write_identity(const std::string& path, const RunIdentity& id) {
  Json j;
  j["run_id"] = id.id;
  j["config_digest"] = id.digest;
  j["started"] = utc_now();
  j["host"] = host_name();
  j["pid"] = static_cast<int64_t>(::getpid());
  if (id.legacy) j["legacy_checkpoints"] = true;
  if (!id.job.empty()) j["job"] = id.job;
  const std::string tmp = path + ".tmp";
  const std::string text = j.dump(1) + "\n";
  const std::string root = fs::path(path).parent_path().string();
  const int fd = open_own_file(root, tmp, O_WRONLY | O_CREAT | O_TRUNC, "the run's identity (run.json's temporary)");
  bool ok = fd >= 0;
  int err = ok ? 0 : errno;
  for (size_t done = 0; ok && done < text.size();) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      err = n < 0 ? errno : ENOSPC;
      ok = false;
    } else {
      done += static_cast<size_t>(n);
    }
  }
  if (fd >= 0) ::close(fd);
  if (!ok) {
    ::unlink(tmp.c_str());
    throw Error("--out: cannot write " + tmp + ": " + std::strerror(err));
  }
  fs::rename(tmp, path);  // whole or not at all; a link at `path` would be replaced, never followed
}

std::string new_run_id() {
  std::random_device rd;
  std::ostringstream os;
  os << utc_now(true) << "-" << std::hex << std::setw(8) << std::setfill('0') << rd();
  return os.str();
}

// [local] The run recorded in run.json; none when there is no run.json.
// ConfigError naming the file when it is not what begin() writes.
std::optional<RunIdentity> read_identity(const RunDirectory& directory) {
  const std::string path = directory.identity_path();
  std::error_code ec;
  const auto st = fs::symlink_status(path, ec);
  if (!fs::exists(st)) return std::nullopt;
  refuse_link(directory.root(), path, "the run's identity (run.json)");
  if (!fs::is_regular_file(st)) throw ConfigError(path + " is not a regular file; refusing to read it");
  std::ifstream in(path);
  try {
    const Json j = Json::parse(in);
    RunIdentity id;
    id.id = j.at("run_id").get<std::string>();
    id.digest = j.at("config_digest").get<std::string>();
    id.legacy = j.value("legacy_checkpoints", false);
    id.job = j.value("job", std::string());
    if (id.id.empty()) throw std::invalid_argument("empty run_id");
    return id;
  } catch (const std::exception& e) {
    throw ConfigError("--out " + directory.root() + ": " + path + " is not the run identity fsdp-train writes (" + e.what() +
                      "): expected a JSON object with \"run_id\" and \"config_digest\" strings; --overwrite "
                      "starts a new run there");
  }
}

// The value of the environment variable `name`, if set.
std::optional<std::string> env_var(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::optional<std::string>(v) : std::nullopt;
}

// The start time of process `pid` (field 22 of /proc/<pid>/stat, in clock
// ticks since boot): with the pid, who a process is (a pid is reused).
std::string start_time_of(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto close = stat.rfind(')');  // the command name may hold spaces
  if (close == std::string::npos) return "";
  std::istringstream fields(stat.substr(close + 2));
  std::string field;
  for (int i = 3; i <= 22 && fields >> field; ++i) {
    if (i == 22) return field;
  }
  return "";
}

}  // namespace

std::string job_token() {
  const auto run_id = env_var("TORCHELASTIC_RUN_ID"), restarts = env_var("TORCHELASTIC_RESTART_COUNT"),
             max_restarts = env_var("TORCHELASTIC_MAX_RESTARTS"), agent_store = env_var("TORCHELASTIC_USE_AGENT_STORE");
  auto addr = env_var("MASTER_ADDR"), port = env_var("MASTER_PORT");
  if (!restarts || !max_restarts) return "";
  if (run_id) {
    // The store that lives as long as the job: the agent's (MASTER_ADDR:
    // MASTER_PORT), or, when the agents keep it from the workers
    // (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, the elastic setup of
    // docs/launching.md), the c10d rendezvous' own at the agent's
    // --rdzv-endpoint (the parent's command line; torchrun's port 29400 if
    // it names none).
    std::optional<std::string> host = addr, port_text = port;
    if (agent_store != std::optional<std::string>("True")) {
      host.reset();
      std::ifstream in("/proc/" + std::to_string(::getppid()) + "/cmdline");
      std::vector<std::string> args;
      for (std::string a; std::getline(in, a, '\0');) args.push_back(a);
      for (size_t i = 0; i < args.size(); ++i) {
        std::string endpoint;
        for (const char* flag : {"--rdzv-endpoint", "--rdzv_endpoint"}) {
          const std::string f = flag;
          if (args[i] == f && i + 1 < args.size()) endpoint = args[i + 1];
          if (args[i].rfind(f + "=", 0) == 0) endpoint = args[i].substr(f.size() + 1);
        }
        if (endpoint.empty()) continue;
        const auto colon = endpoint.rfind(':');
        host = colon == std::string::npos ? endpoint : endpoint.substr(0, colon);
        port_text = colon == std::string::npos ? std::string("29400") : endpoint.substr(colon + 1);
        if (host->size() > 2 && host->front() == '[' && host->back() == ']') host = host->substr(1, host->size() - 2);
      }
    }
    if (!host || !port_text) return "";
    addr = host;
    port = port_text;
    int p = 0;
    const auto [ptr, ec] = std::from_chars(port->data(), port->data() + port->size(), p);
    if (ec != std::errc() || ptr != port->data() + port->size() || p < 1 || p > 65535) return "";
    try {
      c10d::TCPStoreOptions so;
      so.port = static_cast<std::uint16_t>(p);
      so.isServer = false;
      so.waitWorkers = false;
      so.timeout = std::chrono::seconds(60);
      c10d::TCPStore store(*addr, so);
      const std::string key = "fsdp-train/job";
      if (!store.check({key})) {
        const std::string fresh = new_run_id();
        store.set(key, std::vector<uint8_t>(fresh.begin(), fresh.end()));
      }
      const auto v = store.get(key);
      return "torchrun " + std::string(v.begin(), v.end());
    } catch (const std::exception& e) {
      std::cerr << "fsdp-train: WARNING: cannot reach torchrun's agent store at " << *addr << ":" << *port << " ("
                << e.what() << "): this start cannot be told from a new job; a restart of it will not resume"
                << std::endl;
      return "";
    }
  }
  // fsdp-run: this process's parent, if it is fsdp-run.
  const pid_t parent = ::getppid();
  std::ifstream comm("/proc/" + std::to_string(parent) + "/comm");
  std::string name;
  std::getline(comm, name);
  const std::string started = start_time_of(parent);
  if (name != "fsdp-run" || started.empty()) return "";
  return "fsdp-run " + host_name() + " " + std::to_string(parent) + " " + started;
}

bool records_job(const RunDirectory& directory, const std::string& job) {
  if (job.empty()) return false;
  try {
    const auto had = read_identity(directory);
    return had && had->job == job;
  } catch (const ConfigError&) {  // begin() names a damaged run.json
    return false;
  }
}

RunIdentity begin_run(const RunDirectory& directory, const Strategy& strategy, const RunStart& start,
                      const std::string& job) {
  RunIdentity id;
  const auto failure = dist::capture([&] {
    if (strategy.global_rank() != 0) return;
    directory.check_own_names();
    id = RunIdentity{new_run_id(), start.digest, false, job};
    std::optional<RunIdentity> had;
    try {
      had = read_identity(directory);
    } catch (const ConfigError&) {
      if (!start.overwrite) throw;  // --overwrite replaces a damaged run.json (its checkpoints stay, named)
    }
    if (start.continues) {
      if (had) {
        id.id = had->id;  // the same run; its checkpoints record the configuration that wrote them
        id.legacy = had->legacy;
        if (!id.job.empty() && had->job != id.job) write_identity(directory.identity_path(), id);  // now this job's
      } else {
        id.legacy = !directory.checkpoints().empty();  // a directory from before run identities: its checkpoints are the run's
        write_identity(directory.identity_path(), id);
      }
      return;
    }
    if (start.overwrite) {
      const auto kept = remove_own_files(directory, had);
      if (!kept.empty()) {
        std::string list;
        for (size_t i = 0; i < kept.size(); ++i) list += (i ? ", " : "") + kept[i];
        std::cout << "fsdp-train: --overwrite kept what fsdp-train did not write (or cannot tell as its run's) in "
                  << directory.root() << ": " << list << std::endl;
      }
    } else if (directory.holds_run()) {
      const auto all = directory.checkpoints();
      std::string what = had ? "run " + had->id : std::string("a run");
      what += all.empty() ? ", no checkpoint" : ", newest checkpoint " + all.front().second;
      throw ConfigError("--out " + directory.root() + " already holds " + what +
                        ": expected an empty run directory for a new run; pass --resume to continue that run, "
                        "--overwrite to start over (it removes that run's run.json, metrics.jsonl, train.log, "
                        "loss.svg, event files, csv/ and profile/ files and checkpoints there, nothing else), or another --out");
    }
    write_identity(directory.identity_path(), id);
  });
  const std::string payload = id.id + "\n" + id.digest + "\n" + (id.legacy ? "1" : "0");
  const std::string agreed = strategy.broadcast(dist::outcome(payload, failure), 0);
  if (dist::outcome_failed(agreed)) dist::rethrow(dist::outcome_failure(agreed));
  std::istringstream in(dist::outcome_payload(agreed));
  std::string flag;
  std::getline(in, id.id);
  std::getline(in, id.digest);
  std::getline(in, flag);
  id.legacy = flag == "1";
  return id;
}

}  // namespace fsdp::run
