// What a checkpoint records of its run, from the run settings' table
// (src/train/run_record.h).
#include "run_record.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <iomanip>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "fsdp/error.h"
#include "fsdp/train/run_settings.h"

namespace fsdp::train {

namespace {

// The value of a run setting (see config_name); null if absent.
const std::string* config_value(const CheckpointInfo& info, const std::string& key) {
  const std::string name = config_name(info, key);
  return name.empty() ? nullptr : &info.values.at(name);
}


// The model entry's tensors of a checkpoint ("<entry>/<key>"; fsdp-train's entry is "model"), by key.
std::map<std::string, std::vector<int64_t>> model_tensors(const CheckpointInfo& info) {
  std::map<std::string, std::vector<int64_t>> listed;
  for (const auto& t : info.tensors) {
    if (t.key.rfind("model/", 0) == 0) listed[t.key.substr(6)] = t.shape;
  }
  return listed;
}

std::string shape_text(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

models::GPTConfig gpt_model_config(const CheckpointInfo& info, const std::string& path);

// The recorded value `key` of `info` as text and its type ("int", "float",
// "str"); ConfigError naming the checkpoint when absent.
std::pair<std::string, std::string> recorded(const CheckpointInfo& info, const std::string& path, const std::string& key) {
  const std::string name = config_name(info, key);
  if (name.empty()) throw ConfigError(path + ": its run trained a Llama but it records no 'config." + key + "'");
  const auto t = info.value_types.find(name);
  return {info.values.at(name), t == info.value_types.end() ? "?" : t->second};
}

// A Llama run's model: its config.json and LoRA settings, against the model entry's tensors.
models::LlamaConfig llama_model_config(const CheckpointInfo& info, const std::string& path) {
  const auto [text, text_type] = recorded(info, path, "model.llama");
  if (text_type != "str") throw ConfigError(path + ": its 'config.model.llama' is a " + text_type + "; expected a str (config.json)");
  models::LlamaConfig c = models::parse_llama_config(text, path + " 'config.model.llama'");
  const auto [rank, rank_type] = recorded(info, path, "model.lora_rank");
  const auto [alpha, alpha_type] = recorded(info, path, "model.lora_alpha");
  const auto [targets, targets_type] = recorded(info, path, "model.lora_targets");
  int64_t r = -1;
  const auto [ptr, ec] = std::from_chars(rank.data(), rank.data() + rank.size(), r);
  if (rank_type != "int" || ec != std::errc() || ptr != rank.data() + rank.size() || r < 0 || r > (int64_t{1} << 31)) {
    throw ConfigError(path + ": its 'config.model.lora_rank' = " + rank + " (" + rank_type + "); expected an int from 0 to 2^31");
  }
  c.lora.rank = r;
  char* end = nullptr;
  c.lora.alpha = std::strtod(alpha.c_str(), &end);
  if (alpha_type != "float" || alpha.empty() || end != alpha.c_str() + alpha.size()) {
    throw ConfigError(path + ": its 'config.model.lora_alpha' = " + alpha + " (" + alpha_type + "); expected a float");
  }
  if (targets_type != "str") throw ConfigError(path + ": its 'config.model.lora_targets' is a " + targets_type + "; expected a str");
  c.lora.targets = models::parse_lora_targets(targets);
  try {
    models::check_lora(c.lora);
  } catch (const ConfigError& e) {
    throw ConfigError(path + ": its LoRA settings (config.model.lora_*): " + e.what());
  }
  auto listed = model_tensors(info);
  // The layer count first, from the tensors' names: a tampered
  // num_hidden_layers (10^7) is never listed nor built.
  std::set<int64_t> layers;
  for (const auto& kv : listed) {
    static const std::string prefix = "model.layers.";
    if (kv.first.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string digits = kv.first.substr(prefix.size(), kv.first.find('.', prefix.size()) - prefix.size());
    if (!digits.empty() && digits.size() <= 12 && digits.find_first_not_of("0123456789") == std::string::npos) {
      layers.insert(std::stoll(digits));
    }
  }
  if (c.num_hidden_layers > static_cast<int64_t>(layers.size())) {
    throw ConfigError(path + ": its model configuration (config.model.llama) does not match its tensors: key "
                      "\"num_hidden_layers\" is " + std::to_string(c.num_hidden_layers) + ", but the checkpoint holds " +
                      std::to_string(layers.size()) + " layers' tensors");
  }
  for (const auto& [key, shape] : models::llama_model_shapes(c)) {
    const auto it = listed.find(key);
    if (it == listed.end()) {
      throw ConfigError(path + ": its model configuration (config.model.llama) does not match its tensors: it needs "
                        "'model/" + key + "', which the checkpoint does not hold");
    }
    if (it->second != shape) {
      throw ConfigError(path + ": its model configuration (config.model.llama) does not match its tensors: 'model/" +
                        key + "' is " + shape_text(it->second) + ", the configuration needs " + shape_text(shape));
    }
    listed.erase(it);
  }
  if (!listed.empty()) {
    throw ConfigError(path + ": its model holds 'model/" + listed.begin()->first +
                      "', which its configuration (config.model.llama) has no place for");
  }
  return c;
}

}  // namespace

CheckpointModel checkpoint_model(const CheckpointInfo& info, const std::string& path) {
  CheckpointModel m;
  const std::string name = config_name(info, "model.source");
  if (!name.empty()) m.source = info.values.at(name);
  if (m.source == "gpt") {
    m.gpt = gpt_model_config(info, path);
  } else {
    m.llama = llama_model_config(info, path);
  }
  return m;
}

models::GPTConfig checkpoint_model_config(const CheckpointInfo& info, const std::string& path) {
  const std::string name = config_name(info, "model.source");
  if (!name.empty() && info.values.at(name) != "gpt") {
    throw ConfigError(path + " holds a Llama-family model (--model " + info.values.at(name) +
                      "), not fsdp-train's GPT: expected a checkpoint of --model gpt");
  }
  return gpt_model_config(info, path);
}

namespace {

models::GPTConfig gpt_model_config(const CheckpointInfo& info, const std::string& path) {
  // The recorded numbers are checked (each an int, in range) and then held
  // against the tensors the checkpoint lists, before anything is built from
  // them: a damaged or hostile configuration is an error naming it, never an
  // allocation without bound.
  constexpr int64_t kMax = int64_t{1} << 31;
  auto get = [&](const char* key) -> int64_t {
    const std::string name = config_name(info, key);
    if (name.empty()) throw ConfigError(path + " was not written by fsdp-train: it has no 'config." + key + "'");
    const auto v = info.values.find(name);
    const auto t = info.value_types.find(name);
    const std::string type = t == info.value_types.end() ? "?" : t->second;
    if (type != "int") {
      throw ConfigError(path + ": its model configuration '" + name + "' is a " + type + " (" + v->second +
                        "); expected an int");
    }
    int64_t n = 0;
    const char* end = v->second.data() + v->second.size();
    const auto [ptr, ec] = std::from_chars(v->second.data(), end, n);
    if (ec != std::errc() || ptr != end || n < 1 || n > kMax) {
      throw ConfigError(path + ": its model configuration '" + name + "' = " + v->second + " is out of range; expected 1 to " +
                        std::to_string(kMax));
    }
    return n;
  };
  models::GPTConfig c;
  c.vocab_size = get("model.vocab");
  c.context = get("model.context");
  c.dim = get("model.dim");
  c.layers = get("model.layers");
  c.heads = get("model.heads");
  if (c.dim % c.heads != 0) {
    throw ConfigError(path + ": its model configuration has heads " + std::to_string(c.heads) +
                      " that do not divide dim " + std::to_string(c.dim));
  }
  // Against the model entry's tensors.
  const auto listed = model_tensors(info);
  const std::string layers_text = "'config.model.layers' = " + std::to_string(c.layers);
  if (static_cast<size_t>(c.layers) > listed.size()) {  // before listing O(layers) keys
    throw ConfigError(path + ": its model configuration does not match its tensors: " + layers_text + ", but the model holds " +
                      std::to_string(listed.size()) + " tensors in all");
  }
  const auto want = models::gpt_state_shapes(c);
  for (const auto& [key, shape] : want) {
    const auto it = listed.find(key);
    if (it == listed.end()) {
      throw ConfigError(path + ": its model configuration does not match its tensors: it needs 'model/" + key +
                        "', which the checkpoint does not hold (" + layers_text + ")");
    }
    if (it->second != shape) {
      throw ConfigError(path + ": its model configuration does not match its tensors: 'model/" + key + "' is " +
                        shape_text(it->second) + ", the configuration (vocab " + std::to_string(c.vocab_size) +
                        ", context " + std::to_string(c.context) + ", dim " + std::to_string(c.dim) + ") needs " +
                        shape_text(shape));
    }
  }
  if (listed.size() != want.size()) {
    throw ConfigError(path + ": its model configuration does not match its tensors: the model holds " +
                      std::to_string(listed.size()) + " tensors, the configuration's (" + layers_text + ") has " +
                      std::to_string(want.size()));
  }
  return c;
}

// The recorded rows (those with a key in a checkpoint), in digest order.
std::vector<const RunSetting*> recorded_rows() {
  std::vector<const RunSetting*> rows;
  for (const auto& row : run_settings()) {
    if (row.record) rows.push_back(&row);
  }
  std::stable_sort(rows.begin(), rows.end(),
                   [](const RunSetting* a, const RunSetting* b) { return a->digest_place < b->digest_place; });
  return rows;
}

}  // namespace

std::string config_digest(const TrainConfig& c) {
  std::ostringstream os;
  os << std::setprecision(17) << std::boolalpha;
  bool first = true;
  for (const RunSetting* row : recorded_rows()) {
    if (row->digest_place == 0) continue;
    // The settings added to the digest later (the model's source, LoRA)
    // join it only where the run sets them: earlier configurations keep
    // their digests.
    if (row->digest_when_set && setting_text(row->get(c)) == setting_text(row->get(TrainConfig()))) {
      continue;
    }
    os << (first ? "" : " ") << row->digest_label << " ";
    first = false;
    std::visit([&](const auto& x) { os << x; }, row->get(c));
  }
  uint64_t h = 1469598103934665603ull;  // FNV-1a, 64 bits
  for (unsigned char ch : os.str()) {
    h ^= ch;
    h *= 1099511628211ull;
  }
  std::ostringstream hex;
  hex << std::hex << std::setw(16) << std::setfill('0') << h;
  return hex.str();
}

void put_config(CheckpointState& s, const TrainConfig& run, const RunIdentity& identity) {
  auto put = [&](const std::string& key, CheckpointValue v) { s.value("config." + key, std::move(v)); };
  for (const RunSetting* row : recorded_rows()) {
    std::visit(
        [&](const auto& x) {
          if constexpr (std::is_same_v<std::decay_t<decltype(x)>, uint64_t>) {
            put(row->record, static_cast<int64_t>(x));  // a seed of 2^64 - 1 is the int64 -1
          } else {
            put(row->record, x);
          }
        },
        row->get(run));
  }
  put("run.id", identity.id);
  put("run.digest", identity.digest);
}

std::vector<std::string> overridden_flags(const CheckpointInfo& info, const TrainConfig& c) {
  std::vector<std::string> out;
  for (const RunSetting* row : recorded_rows()) {
    const std::string* v = config_value(info, row->record);
    if (!v || !row->may_change_on_resume) continue;
    const std::string flag = row->flag;
    std::visit(
        [&](const auto& now) {
          using T = std::decay_t<decltype(now)>;
          if constexpr (std::is_same_v<T, double>) {
            const double was = std::strtod(v->c_str(), nullptr);
            if (std::abs(was - now) > 1e-9 * std::max(1.0, std::abs(now))) {
              std::ostringstream os;
              os << flag << " " << was << " -> " << now;
              out.push_back(os.str());
            }
          } else if constexpr (std::is_same_v<T, int64_t> || std::is_same_v<T, uint64_t>) {
            // Integers compare, and print, exactly (a seed of 2^64 - 1 is
            // saved as the int64 -1: the same seed).
            int64_t saved = 0;
            const char* end = v->data() + v->size();
            const auto [ptr, ec] = std::from_chars(v->data(), end, saved);
            const std::string is = std::to_string(now);
            if (ec != std::errc() || ptr != end) {
              out.push_back(flag + " " + *v + " -> " + is);
            } else if (const std::string was = std::to_string(static_cast<T>(saved)); was != is) {
              out.push_back(flag + " " + was + " -> " + is);
            }
          } else {
            // Settings by name; an empty one is its default, said in words.
            const std::string is = setting_text(now);
            if (*v == is) return;
            auto shown = [&](const std::string& x) {
              return x.empty() && row->empty_text ? std::string(row->empty_text) : x;
            };
            out.push_back(flag + " " + shown(*v) + " -> " + shown(is));
          }
        },
        row->get(c));
  }
  return out;
}

std::string llama_shape_change(const models::LlamaConfig& was, const models::LlamaConfig& now) {
  const auto a = models::llama_model_shapes(was), b = models::llama_model_shapes(now);
  auto entry = [](const std::vector<std::pair<std::string, std::vector<int64_t>>>& list, size_t i) {
    return i < list.size() ? "'" + list[i].first + "' " + shape_text(list[i].second) : std::string("nothing");
  };
  for (size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
    if (i < a.size() && i < b.size() && a[i] == b[i]) continue;
    return "the checkpoint holds " + entry(a, i) + " where the run's model has " + entry(b, i);
  }
  return "";
}

std::string fixed_setting_changes(const CheckpointInfo& info, const TrainConfig& c) {
  std::string diff;
  for (const RunSetting* row : recorded_rows()) {
    const std::string* v = config_value(info, row->record);
    if (!v || row->may_change_on_resume) continue;
    const SettingValue value = row->get(c);
    const std::string now = setting_text(value);
    // A number compares as a number (a checkpoint keeps 16 as "16.0").
    if (const double* d = std::get_if<double>(&value)) {
      char* end = nullptr;
      const double was = std::strtod(v->c_str(), &end);
      if (end == v->c_str() + v->size() && !v->empty() && was == *d) continue;
    }
    if (*v != now) diff += " " + short_name(*row) + " " + *v + " (checkpoint) vs " + now + ";";
  }
  return diff;
}

}  // namespace fsdp::train
