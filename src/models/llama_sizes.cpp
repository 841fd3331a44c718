// The memory a Llama of a config would take, counted from the config alone
// (no tensor made), against the memory this process can have: physical RAM,
// or what RLIMIT_AS leaves. What lets a hostile config.json (vocab_size
// 2^31-1, hidden_size 2^40, num_hidden_layers 10^8, --lora-rank 2^40) end in
// a ConfigError naming the file, the key and the bytes, before LibTorch's
// allocator aborts or the OOM killer ends the process.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>

#include "fsdp/error.h"
#include "fsdp/models/llama_sizes.h"

namespace fsdp::models {

namespace {

using Real = long double;  // sizes of hostile configs overflow int64 (2^40 squared): counted here without overflow

// The keys of config.json that size a tensor, and the field each fills.
const std::vector<std::pair<const char*, int64_t LlamaConfig::*>>& size_keys() {
  static const std::vector<std::pair<const char*, int64_t LlamaConfig::*>> keys = {
      {"vocab_size", &LlamaConfig::vocab_size},
      {"hidden_size", &LlamaConfig::hidden_size},
      {"intermediate_size", &LlamaConfig::intermediate_size},
      {"num_hidden_layers", &LlamaConfig::num_hidden_layers},
      {"num_attention_heads", &LlamaConfig::num_attention_heads},
      {"num_key_value_heads", &LlamaConfig::num_key_value_heads},
      {"head_dim", &LlamaConfig::head_dim}};
  return keys;
}

struct Count {
  Real base = 0;      // the model's own parameters (elements)
  Real adapters = 0;  // LoRA's (elements)
  Real layers = 0;
};

Count count(const LlamaConfig& c) {
  const Real H = static_cast<Real>(c.hidden_size), I = static_cast<Real>(c.intermediate_size),
             V = static_cast<Real>(c.vocab_size), L = static_cast<Real>(c.num_hidden_layers),
             q = static_cast<Real>(c.num_attention_heads) * static_cast<Real>(c.head_dim),
             kv = static_cast<Real>(c.num_key_value_heads) * static_cast<Real>(c.head_dim);
  const bool qkv_bias = c.attention_bias || c.qkv_bias;
  Real layer = q * H + 2 * kv * H + H * q + 3 * I * H + 2 * H;
  if (qkv_bias) layer += q + 2 * kv;
  if (c.attention_bias) layer += H;
  if (c.mlp_bias) layer += 2 * I + H;
  Count n;
  n.layers = L;
  n.base = V * H * (c.tie_word_embeddings ? 1 : 2) + H + L * layer;
  if (c.lora.rank > 0) {
    const Real r = static_cast<Real>(c.lora.rank);
    Real per_layer = 0;
    for (const auto& t : c.lora.targets) {
      if (t == "q_proj") per_layer += r * (H + q);
      if (t == "k_proj" || t == "v_proj") per_layer += r * (H + kv);
      if (t == "o_proj") per_layer += r * (q + H);
      if (t == "gate_proj" || t == "up_proj" || t == "down_proj") per_layer += r * (H + I);
    }
    n.adapters = L * per_layer;
  }
  return n;
}

// What a decoder layer costs a process beyond its parameters: its seven
// projections, two norms and their LibTorch module objects (names, parameter
// dictionaries, tensor headers), and the per-layer lists made of a config
// (layer windows, state-dict names). Counted high: 64 KiB is well above what
// these take, and it refuses only layer counts no real model comes near
// (24 GiB allows 393216 layers), while a real model's 80 layers add 5 MiB.
constexpr Real kLayerOverheadBytes = 64 * 1024;

Real bytes_of(const Count& n, Real element_bytes) {
  return (n.base + n.adapters) * element_bytes + n.layers * kLayerOverheadBytes;
}

// The key whose value costs the most: the one whose setting to 1 saves the most bytes.
const char* costliest_key(const LlamaConfig& c, Real element_bytes) {
  const Real all = bytes_of(count(c), element_bytes);
  const char* best = "num_hidden_layers";
  Real saved = -1;
  for (const auto& [name, field] : size_keys()) {
    LlamaConfig one = c;
    one.*field = 1;
    const Real s = all - bytes_of(count(one), element_bytes);
    if (s > saved) saved = s, best = name;
  }
  return best;
}

std::string value_of(const LlamaConfig& c, const char* key) {
  for (const auto& [name, field] : size_keys()) {
    if (std::string(name) == key) return std::to_string(c.*field);
  }
  return "?";
}

// Where the config came from, for messages.
std::string where_of(const LlamaConfig& c, const std::string& where) {
  if (!where.empty()) return where;
  return c.source_path.empty() ? std::string("the Llama config") : c.source_path;
}

int64_t env_int(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return 0;
  char* end = nullptr;
  const long long x = std::strtoll(v, &end, 10);
  return end && *end == '\0' && x > 0 ? static_cast<int64_t>(x) : 0;
}

}  // namespace

std::string byte_text(long double bytes) {
  char buf[96];
  if (bytes < 9.0e18L) {
    const auto b = static_cast<unsigned long long>(bytes);
    const char* unit = b >= (1ull << 30) ? "GiB" : "MiB";
    const double scaled = static_cast<double>(b) / static_cast<double>(b >= (1ull << 30) ? (1ull << 30) : (1ull << 20));
    std::snprintf(buf, sizeof buf, "%llu bytes (%.1f %s)", b, scaled, unit);
  } else {
    std::snprintf(buf, sizeof buf, "about %.3Le bytes", bytes);
  }
  return buf;
}

MemoryBudget memory_budget() {
  MemoryBudget m;
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  m.bytes = pages > 0 && page > 0 ? static_cast<long double>(pages) * static_cast<long double>(page) : 1.0e30L;
  m.what = "this machine's physical memory (" + byte_text(m.bytes) + ")";
  rlimit r{};
  if (::getrlimit(RLIMIT_AS, &r) == 0 && r.rlim_cur != RLIM_INFINITY) {
    long double mapped = 0;
    std::ifstream statm("/proc/self/statm");
    long long vm_pages = 0;
    if (statm >> vm_pages) mapped = static_cast<long double>(vm_pages) * static_cast<long double>(page);
    const long double cap = static_cast<long double>(r.rlim_cur);
    const long double left = cap > mapped ? cap - mapped : 0;
    if (left < m.bytes) {
      m.bytes = left;
      m.what = "the address space RLIMIT_AS (ulimit -v) leaves this process (" + byte_text(left) + " of " +
               byte_text(cap) + ")";
    }
  }
  return m;
}

long double llama_memory_bytes(const LlamaConfig& c, int64_t element_bytes) {
  return bytes_of(count(c), static_cast<Real>(element_bytes));
}

void check_llama_sizes(const LlamaConfig& c, const std::string& where) {
  const std::string w = where_of(c, where);
  // Every number of elements and byte count of the model must be an int64
  // (LibTorch's sizes; the state dict's offsets): 2^62 bytes is more than
  // any machine holds.
  const Count n = count(c);
  const Real limit = static_cast<Real>(int64_t{1} << 62);
  if ((n.base + n.adapters) * 4 > limit) {
    const char* key = costliest_key(c, 4);
    throw ConfigError(w + ": key \"" + key + "\": " + value_of(c, key) + " makes a model of " +
                      byte_text((n.base + n.adapters) * 4) + " in float32, more than any machine holds; expected " +
                      "the sizes of a real model");
  }
  // Every process that lists or builds the layers pays for each of them.
  const MemoryBudget m = memory_budget();
  if (n.layers * kLayerOverheadBytes > m.bytes) {
    throw ConfigError(w + ": key \"num_hidden_layers\": " + std::to_string(c.num_hidden_layers) + " layers would need " +
                      byte_text(n.layers * kLayerOverheadBytes) + " for their modules alone, more than " + m.what +
                      "; expected the number of layers of a real model");
  }
}

void check_llama_memory(const LlamaConfig& c, int64_t element_bytes, const std::string& where,
                        const std::string& rank_name) {
  const std::string w = where_of(c, where);
  const Real e = static_cast<Real>(element_bytes);
  // The part of the parameters this machine holds: 1 on one machine; a
  // fraction of them when a launcher's ranks span machines (sharded).
  Real share = 1;
  const int64_t world = env_int("WORLD_SIZE"), local = env_int("LOCAL_WORLD_SIZE");
  if (world > 0 && local > 0 && local < world) share = static_cast<Real>(local) / static_cast<Real>(world);
  const Count n = count(c);
  const Real layers = n.layers * kLayerOverheadBytes * (local > 0 ? static_cast<Real>(local) : 1);
  const Real base = n.base * e * share + layers, total = base + n.adapters * e * share;
  const MemoryBudget m = memory_budget();
  if (total <= m.bytes) return;
  const std::string share_text =
      share < 1 ? " (this machine's share, " + std::to_string(local) + " of " + std::to_string(world) + " ranks)" : "";
  if (n.adapters > 0 && base <= m.bytes) {
    throw ConfigError(w + ": LoRA rank " + std::to_string(c.lora.rank) + " (" + rank_name + "): its adapters on " +
                      lora_targets_text(c.lora.targets) + " would need " + byte_text(n.adapters * e * share) +
                      share_text + ", and the model " + byte_text(total) + " in all, more than " + m.what +
                      "; expected a smaller rank");
  }
  const char* key = costliest_key(c, e);
  throw ConfigError(w + ": key \"" + key + "\": " + value_of(c, key) + " makes the model need " + byte_text(total) +
                    share_text + " for its parameters (" + std::to_string(element_bytes) +
                    " bytes each) and layers, more than " + m.what + "; expected the sizes of a model that fits");
}

std::vector<std::string> lora_rank_warnings(const LlamaConfig& c, const std::string& rank_name) {
  std::vector<std::string> out;
  if (c.lora.rank <= 0) return out;
  const int64_t H = c.hidden_size, I = c.intermediate_size, q = c.num_attention_heads * c.head_dim,
                kv = c.num_key_value_heads * c.head_dim;
  for (const auto& t : c.lora.targets) {
    int64_t in = H, o = H;
    if (t == "q_proj") o = q;
    if (t == "k_proj" || t == "v_proj") o = kv;
    if (t == "o_proj") in = q;
    if (t == "gate_proj" || t == "up_proj") o = I;
    if (t == "down_proj") in = I;
    const int64_t smaller = std::min(in, o);
    if (c.lora.rank > smaller) {
      out.push_back(rank_name + " " + std::to_string(c.lora.rank) + " is above " + t + "'s smaller dimension " +
                    std::to_string(smaller) + " ([" + std::to_string(o) + ", " + std::to_string(in) +
                    "]): its adapter B A has rank at most " + std::to_string(smaller) +
                    ", so the extra rank costs memory and adds nothing (PEFT accepts it too)");
    }
  }
  return out;
}

}  // namespace fsdp::models
