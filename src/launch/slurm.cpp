// SLURM (fsdp/launch/env.h): its node lists, its tasks per node, and the
// job's place read from srun's variables.
#include <algorithm>
#include <cctype>
#include <sstream>

#include "env_impl.h"

namespace fsdp::launch {

using detail::kMaxInt;
using detail::nodes_of;
using detail::parse_int;
using detail::Reader;

namespace {

constexpr size_t kMaxHosts = 1000000;

// A bracketed range of a node list: lo..hi, zero-padded to `width`.
struct NodeRange {
  long lo = 0, hi = 0;
  size_t width = 0;
};
// A part of one comma-free item: literal text, or (ranges non-empty) a
// bracket ("gpu-[01-04,07]x": "gpu-", [01-04,07], "x").
struct NodePart {
  std::string text;
  std::vector<NodeRange> ranges;
};

// A node list, parsed and checked but not expanded.
struct NodeList {
  std::vector<std::vector<NodePart>> items;
  size_t hosts = 0;  // how many it names; at most kMaxHosts
};

// Parses and checks `list` and counts its hosts before any is made, so that
// a list of 40 ranges of a million hosts fails at once, naming the variable
// and the limit (it used to expand first: 2.1 GB, then std::bad_alloc; issue
// 37, item 17). Memory: linear in the list's length.
NodeList parse_nodelist(const std::string& list, const std::string& what) {
  const std::string shown = list.size() > 200 ? list.substr(0, 200) + "..." : list;
  const std::string bad = what + "='" + shown + "' is not a SLURM node list (expected host names separated by "
                          "commas, each with optional [N-M,K] ranges, e.g. gpu-[01-04,07],cpu7): it has ";
  if (list.empty()) throw ConfigError(bad + "no hosts");
  std::vector<std::string> texts;
  std::string item;
  int depth = 0;
  for (char c : list) {
    if (std::isspace(static_cast<unsigned char>(c))) throw ConfigError(bad + "a space");
    if (c == '[' && ++depth > 1) throw ConfigError(bad + "nested '['");
    if (c == ']' && --depth < 0) throw ConfigError(bad + "a ']' without '['");
    if (c == ',' && depth == 0) {
      if (item.empty()) throw ConfigError(bad + "an empty host name");
      texts.push_back(std::move(item));
      item.clear();
    } else {
      item += c;
    }
  }
  if (depth != 0) throw ConfigError(bad + "an unclosed '['");
  if (item.empty()) throw ConfigError(bad + "an empty host name");
  texts.push_back(std::move(item));

  NodeList out;
  const auto over = [&] { return ConfigError(bad + "more than 1000000 hosts, the most fsdp-cpp reads"); };
  for (const std::string& text : texts) {
    std::vector<NodePart> parts;
    size_t count = 1;  // hosts of this item: the product of its brackets' sizes
    size_t i = 0;
    while (i < text.size()) {
      if (text[i] != '[') {
        const size_t next = std::min(text.find('[', i), text.size());
        parts.push_back({text.substr(i, next - i), {}});
        i = next;
        continue;
      }
      const size_t close = text.find(']', i);
      if (close == std::string::npos) throw ConfigError(bad + "an unclosed '['");
      const std::string body = text.substr(i + 1, close - i - 1);
      if (body.empty()) throw ConfigError(bad + "an empty range '[]'");
      NodePart part;
      size_t size = 0;
      std::stringstream ss(body);
      std::string range;
      while (std::getline(ss, range, ',')) {
        const size_t dash = range.find('-');
        const std::string lo = range.substr(0, dash);
        const std::string hi = dash == std::string::npos ? lo : range.substr(dash + 1);
        auto digits = [](const std::string& d) {
          return !d.empty() && d.size() <= 9 &&
                 std::all_of(d.begin(), d.end(), [](unsigned char c) { return std::isdigit(c) != 0; });
        };
        if (!digits(lo) || !digits(hi)) {
          throw ConfigError(bad + "the range '" + range + "': expected N or N-M of up to 9 digits");
        }
        const long a = std::stol(lo), z = std::stol(hi);
        if (a > z) throw ConfigError(bad + "the range '" + range + "': expected N <= M");
        size += static_cast<size_t>(z - a + 1);  // at most kMaxHosts + 10^9: no overflow
        if (size > kMaxHosts) throw over();
        part.ranges.push_back({a, z, lo.size()});
      }
      if (body.back() == ',') throw ConfigError(bad + "an empty range in '[" + body + "]'");
      count *= size;  // both <= kMaxHosts: no overflow in 64 bits
      if (count > kMaxHosts) throw over();
      parts.push_back(std::move(part));
      i = close + 1;
    }
    out.hosts += count;
    if (out.hosts > kMaxHosts) throw over();
    out.items.push_back(std::move(parts));
  }
  return out;
}

// A range's k-th number, zero-padded to its width.
std::string number_of(const NodeRange& r, long k) {
  std::string s = std::to_string(k);
  if (s.size() < r.width) s.insert(0, r.width - s.size(), '0');
  return s;
}

// The first host of a parsed list.
std::string first_host(const NodeList& list) {
  std::string host;
  for (const NodePart& part : list.items.front()) {
    host += part.ranges.empty() ? part.text : number_of(part.ranges.front(), part.ranges.front().lo);
  }
  return host;
}


// This node's entry of SLURM_TASKS_PER_NODE ("2(x3),1": 2 tasks on each of
// nodes 0-2, 1 on node 3). Throws ConfigError naming the variable for text
// that is not such a list, or one with no entry for `node` (SLURM_NODEID).
int tasks_on_node(Reader& in, const std::string& spec, int node) {
  const std::string bad = "SLURM_TASKS_PER_NODE='" + spec + "' is not SLURM's tasks per node: expected counts "
                          "separated by commas, each with an optional (xN) repeat, e.g. 2(x3),1";
  auto number = [&](const std::string& text, const std::string& what) {
    const bool digits = !text.empty() && text.size() <= 9 &&
                        std::all_of(text.begin(), text.end(), [](unsigned char c) { return std::isdigit(c) != 0; });
    const long v = digits ? std::stol(text) : 0;
    if (v < 1) throw in.fail(bad + " (" + what + " '" + text + "' is not a number >= 1)");
    return v;
  };
  long first = 0;
  int found = 0;
  size_t at = 0;
  while (at <= spec.size()) {
    size_t comma = spec.find(',', at);
    if (comma == std::string::npos) comma = spec.size();
    const std::string item = spec.substr(at, comma - at);
    const size_t open = item.find('(');
    long repeat = 1;
    if (open != std::string::npos) {
      if (item.size() < open + 4 || item.compare(open, 2, "(x") != 0 || item.back() != ')') {
        throw in.fail(bad + " (the entry '" + item + "')");
      }
      repeat = number(item.substr(open + 2, item.size() - open - 3), "the repeat");
    }
    const long count = number(item.substr(0, open), "the count");
    if (found == 0 && node >= first && node < first + repeat) found = static_cast<int>(std::min<long>(count, kMaxInt));
    first = std::min<long>(first + repeat, kMaxInt);
    at = comma + 1;
  }
  if (found == 0) {
    throw in.fail(bad + " (it lists " + std::to_string(first) + " node(s), none for SLURM_NODEID=" +
                  std::to_string(node) + ")");
  }
  return found;
}

}  // namespace

namespace detail {

bool is_slurm_job(Reader& in) {
  if (!in.has("SLURM_NTASKS")) return false;
  auto name = in.get("SLURM_JOB_NAME");
  return !(name && (*name == "bash" || *name == "interactive"));
}

void read_slurm(Reader& in, DistEnv& env) {
  auto ntasks = in.get("SLURM_NTASKS");
  if (!ntasks) throw in.fail("FSDP_CLUSTER=slurm, but SLURM_NTASKS is not set: expected a task started by srun");
  env.world_size = static_cast<int>(parse_int("SLURM_NTASKS", *ntasks, 1, kMaxInt, "an integer >= 1"));
  const std::string ws = std::to_string(env.world_size);
  auto procid = in.get("SLURM_PROCID");
  if (!procid && env.world_size > 1) {
    throw in.fail("SLURM_NTASKS=" + ws + " says this job has " + ws +
                  " tasks, but SLURM_PROCID is not set, so this process is not one of them: expected the tasks "
                  "started by srun (srun fsdp-train ...); to run one process alone in a batch script or salloc "
                  "shell, set FSDP_CLUSTER=none");
  }
  env.rank = procid ? static_cast<int>(parse_int("SLURM_PROCID", *procid, 0, env.world_size - 1,
                                                 "0 <= SLURM_PROCID < SLURM_NTASKS=" + ws))
                    : 0;
  // The node lists: each one set is checked, even when an earlier one or
  // MASTER_ADDR is used instead; the first set names the address. Counted,
  // never expanded.
  std::optional<NodeList> hosts;
  std::string list_var;
  for (const char* var : {"SLURM_STEP_NODELIST", "SLURM_NODELIST", "SLURM_JOB_NODELIST"}) {
    if (auto v = in.get(var)) {
      NodeList parsed = parse_nodelist(*v, var);
      if (!hosts) {
        hosts = std::move(parsed);
        list_var = var;
      }
    }
  }
  int nodes = in.number("SLURM_NNODES", 1, env.world_size, "1 <= SLURM_NNODES <= SLURM_NTASKS=" + ws, 0);
  if (nodes == 0) nodes = in.number("SLURM_JOB_NUM_NODES", 1, kMaxInt, "an integer >= 1", 0);
  if (nodes == 0) nodes = !hosts ? 1 : static_cast<int>(std::min<size_t>(hosts->hosts, env.world_size));
  env.num_nodes = nodes;
  int local_size = in.number("SLURM_NTASKS_PER_NODE", 1, env.world_size,
                             "1 <= SLURM_NTASKS_PER_NODE <= SLURM_NTASKS=" + ws, 0);
  // Checked whenever set, used when SLURM_NTASKS_PER_NODE is not.
  if (auto spec = in.get("SLURM_TASKS_PER_NODE")) {
    const int node = in.number("SLURM_NODEID", 0, kMaxInt, "an integer >= 0", 0);
    const int on_node = std::min(tasks_on_node(in, *spec, node), env.world_size);
    if (local_size == 0) local_size = on_node;
  }
  if (local_size == 0) local_size = nodes_of(env.world_size, nodes);
  env.local_world_size = local_size;
  env.local_rank = in.number("SLURM_LOCALID", 0, local_size - 1,
                             "0 <= SLURM_LOCALID < " + std::to_string(local_size) + " (tasks on this node)",
                             env.rank % local_size);
  if (env.world_size == 1) return;
  if (auto addr = in.get("MASTER_ADDR"); addr && !addr->empty()) {
    env.master_addr = *addr;
    env.master_addr_from = "MASTER_ADDR";
  } else if (hosts) {
    env.master_addr = first_host(*hosts);
    env.master_addr_from = "first host of " + list_var;
  } else {
    throw in.fail("SLURM_NTASKS=" + ws +
                  ", but neither SLURM_NODELIST (SLURM_STEP_NODELIST, SLURM_JOB_NODELIST) nor MASTER_ADDR is set: "
                  "expected srun's node list, or MASTER_ADDR=<the host of SLURM_PROCID 0>");
  }
  if (auto port = in.get("MASTER_PORT")) {
    env.master_port = static_cast<int>(parse_int("MASTER_PORT", *port, 1, 65535, "a TCP port number in 1..65535"));
    env.master_port_from = "MASTER_PORT";
  } else if (auto job = in.get("SLURM_JOB_ID")) {
    const bool digits = !job->empty() && std::all_of(job->begin(), job->end(), [](unsigned char c) {
      return std::isdigit(c) != 0;
    });
    if (!digits) {
      throw ConfigError("SLURM_JOB_ID='" + *job + "' is not a job id: expected digits (MASTER_PORT is derived "
                        "from its last 4), or set MASTER_PORT");
    }
    env.master_port = 15000 + std::stoi(job->substr(job->size() > 4 ? job->size() - 4 : 0));
    env.master_port_from = "15000 + the last 4 digits of SLURM_JOB_ID";
  } else {
    env.master_port = 12910;
    env.master_port_from = "12910 (no SLURM_JOB_ID; Lightning's default)";
  }
}

}  // namespace detail

std::vector<std::string> expand_slurm_nodelist(const std::string& list, const std::string& what) {
  const NodeList parsed = parse_nodelist(list, what);
  std::vector<std::string> hosts;
  hosts.reserve(parsed.hosts);
  for (const auto& item : parsed.items) {
    std::vector<std::string> partial{""};
    for (const NodePart& part : item) {
      if (part.ranges.empty()) {
        for (auto& p : partial) p += part.text;
        continue;
      }
      std::vector<std::string> next;
      for (const auto& p : partial) {
        for (const NodeRange& r : part.ranges) {
          for (long k = r.lo; k <= r.hi; ++k) next.push_back(p + number_of(r, k));
        }
      }
      partial = std::move(next);
    }
    hosts.insert(hosts.end(), partial.begin(), partial.end());
  }
  return hosts;
}

}  // namespace fsdp::launch
