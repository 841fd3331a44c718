// export_hf: a checkpoint's model as a directory that transformers'
// from_pretrained loads (fsdp/hf/export.h), written beside its final name
// and renamed into place once complete.
#include "fsdp/hf/export.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>

#include "fsdp/checkpoint/storage.h"
#include "fsdp/error.h"
#include "fsdp/formats/format.h"
#include "fsdp/formats/safetensors.h"
#include "fsdp/hf/hf_model.h"
#include "new_directory.h"

namespace fsdp::hf {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// The tensor `key` of `reader`, whole: its chunks copied into place.
at::Tensor read_whole(const StorageReader& reader, const std::string& key) {
  const auto& t = reader.index().tensors.at(key);
  auto out = at::empty(t.shape, at::TensorOptions().dtype(t.dtype));
  const auto boxes = reader.chunks(key);
  int64_t covered = 0;
  for (size_t i = 0; i < boxes.size(); ++i) {
    auto chunk = reader.read_chunk(key, i);
    auto view = out;
    for (size_t d = 0; d < boxes[i].offsets.size(); ++d) {
      view = view.narrow(static_cast<int64_t>(d), boxes[i].offsets[d], boxes[i].sizes[d]);
    }
    view.copy_(chunk.reshape(view.sizes()));
    covered += view.numel();
  }
  if (covered != out.numel()) {
    throw ConfigError("export: " + reader.location() + ": tensor '" + key + "' is not wholly stored (" +
                      std::to_string(covered) + " of " + std::to_string(out.numel()) + " elements)");
  }
  return out;
}

at::ScalarType dtype_of(const std::string& name) {
  if (name == "float32") return at::kFloat;
  if (name == "bfloat16") return at::kBFloat16;
  if (name == "float16") return at::kHalf;
  throw ConfigError("export: dtype \"" + name + "\" is not one of float32, bfloat16, float16");
}

std::string dtype_text(at::ScalarType t) {
  return t == at::kBFloat16 ? "bfloat16" : t == at::kHalf ? "float16" : "float32";
}

// ConfigError if `out` is `in` or inside it (symbolic links resolved).
void refuse_inside(const std::string& in, const std::string& out, const std::string& what) {
  std::error_code ec, ec2;
  const fs::path a = fs::weakly_canonical(in, ec), b = fs::weakly_canonical(out, ec2);
  if (ec || ec2) throw ConfigError("export: cannot resolve " + in + " or " + out);
  for (fs::path p = b; !p.empty(); p = p.parent_path()) {
    if (p == a) throw ConfigError("export: the output " + out + " is " + what + " " + in + " or inside it; write it elsewhere");
    if (p == p.parent_path()) break;
  }
}

std::string read_small_file(const std::string& path) {
  const int64_t size = formats::file_size(path);
  if (size > int64_t{1} << 31) throw ConfigError("export: " + path + " is over 2 GiB; not a tokenizer file");
  return formats::read_range(path, 0, size);
}

// The model entry of `reader`: its only one.
const formats::EntryRecord& model_entry(const StorageReader& reader) {
  const formats::EntryRecord* found = nullptr;
  int n = 0;
  for (const auto& e : reader.index().entries) {
    if (e.type == formats::EntryType::kModel) found = &e, ++n;
  }
  if (n != 1) {
    throw ConfigError("export: " + reader.location() + " holds " + std::to_string(n) +
                      " models; export needs a checkpoint with one");
  }
  return *found;
}

}  // namespace

int64_t parse_shard_size(const std::string& text, const std::string& what) {
  static const std::vector<std::pair<std::string, double>> units = {
      {"KIB", 1024.0}, {"MIB", 1048576.0}, {"GIB", 1073741824.0}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"B", 1.0}};
  std::string upper;
  for (char ch : text) upper += static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  double scale = 1.0;
  std::string number = upper;
  for (const auto& [u, s] : units) {
    if (upper.size() > u.size() && upper.compare(upper.size() - u.size(), u.size(), u) == 0) {
      number = upper.substr(0, upper.size() - u.size());
      scale = s;
      break;
    }
  }
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(number, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != number.size() || !(v > 0) || !std::isfinite(v * scale) || v * scale > 9e18) {
    throw ConfigError(what + ": \"" + text + "\" is not a size; expected bytes or a number with KB, MB, GB, KiB, MiB or GiB");
  }
  return static_cast<int64_t>(v * scale);
}

void export_hf(const std::string& checkpoint, const std::string& out_dir, const ExportOptions& o) {
  refuse_inside(checkpoint, out_dir, "the checkpoint");
  if (!o.source_dir.empty()) refuse_inside(o.source_dir, out_dir, "the source directory");
  if (o.max_shard_bytes <= 0) throw ConfigError("export: max_shard_bytes must be positive");
  detail::NewDirectory staging(out_dir, "export");  // refuses an out_dir that exists
  auto reader = open_checkpoint_storage(checkpoint);
  const auto& entry = model_entry(*reader);
  // A model with LoRA adapters (o.config.lora) is exported merged: its
  // adapters must be exactly those of the config, and are not written.
  std::map<std::string, std::vector<int64_t>> adapters;
  for (const auto& [key, shape] : models::llama_adapter_shapes(o.config)) adapters[key] = shape;
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& key : entry.keys) {
    const auto& shape = reader->index().tensors.at(entry.name + "/" + key).shape;
    const auto a = adapters.find(key);
    if (a == adapters.end()) {
      shapes[key] = shape;
    } else if (a->second != shape) {
      throw ConfigError(reader->location() + ": the LoRA adapter '" + key + "' has another shape than rank " +
                        std::to_string(o.config.lora.rank) + " gives: expected the adapters of the config's LoRA settings");
    }
  }
  for (const auto& [key, shape] : adapters) {
    if (!reader->index().tensors.count(entry.name + "/" + key)) {
      throw ConfigError(reader->location() + ": the LoRA adapter '" + key + "' is missing: expected rank " +
                        std::to_string(o.config.lora.rank) + " adapters on " + std::to_string(o.config.lora.targets.size()) +
                        " projections of every layer");
    }
  }
  check_tensors(shapes, o.config, reader->location(), [&](const std::string&) { return reader->location(); });
  // Files as save_pretrained splits them: state-dict order, a new file when
  // the next tensor would pass the cap.
  struct File {
    std::vector<formats::SafetensorsTensor> tensors;
    int64_t bytes = 0;
  };
  std::vector<File> files;
  int64_t total = 0, parameters = 0;
  for (const auto& [name, shape] : models::llama_state_shapes(o.config)) {
    const auto& t = reader->index().tensors.at(entry.name + "/" + name);
    const at::ScalarType dtype = o.dtype.empty() ? t.dtype : dtype_of(o.dtype);
    int64_t numel = 1;
    for (auto s : shape) numel *= s;
    const int64_t bytes = numel * static_cast<int64_t>(at::elementSize(dtype));
    if (files.empty() || (files.back().bytes > 0 && files.back().bytes + bytes > o.max_shard_bytes)) files.emplace_back();
    files.back().tensors.push_back({name, dtype, shape, 0, 0});
    files.back().bytes += bytes;
    total += bytes;
    parameters += numel;
  }
  json weight_map = json::object();
  const size_t n = files.size();
  std::string first_dtype = files.empty() || files[0].tensors.empty() ? "float32" : dtype_text(files[0].tensors[0].dtype);
  for (size_t i = 0; i < n; ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, n);
    const std::string file = n == 1 ? "model.safetensors" : name;
    formats::SafetensorsWriter w(staging.staging() + "/" + file, files[i].tensors, {{"format", "pt"}});
    for (const auto& t : w.layout()) {
      at::Tensor value = read_whole(*reader, entry.name + "/" + t.name);  // one tensor in memory at a time
      // A projection with adapters: W + B A * alpha / rank, in float32 (peft's merge_and_unload).
      const std::string stem = t.name.size() > 6 ? t.name.substr(0, t.name.size() - 6) : std::string();
      if (t.name.size() > 6 && t.name.compare(t.name.size() - 6, 6, "weight") == 0 && adapters.count(stem + "lora_A.weight")) {
        const at::Tensor A = read_whole(*reader, entry.name + "/" + stem + "lora_A.weight").to(at::kFloat);
        const at::Tensor B = read_whole(*reader, entry.name + "/" + stem + "lora_B.weight").to(at::kFloat);
        value = value.to(at::kFloat) + at::matmul(B, A) * (o.config.lora.alpha / static_cast<double>(o.config.lora.rank));
      }
      w.write(value.to(t.dtype));
      weight_map[t.name] = file;
    }
    w.commit();
  }
  if (n > 1) {
    json index = {{"metadata", {{"total_size", total}, {"total_parameters", parameters}}}, {"weight_map", weight_map}};
    staging.write_text("model.safetensors.index.json", index.dump(2) + "\n");
  }
  staging.write_text("config.json", models::llama_config_json(o.config, o.dtype.empty() ? first_dtype : o.dtype));
  bool has_generation = false;
  if (!o.source_dir.empty()) {
    for (const char* f : {"generation_config.json", "tokenizer.json", "tokenizer_config.json",
                          "special_tokens_map.json", "tokenizer.model"}) {
      const fs::path p = fs::path(o.source_dir) / f;
      if (formats::entry_kind(p.string()) != "a regular file") continue;
      staging.write_text(f, read_small_file(p.string()));
      has_generation |= std::string(f) == "generation_config.json";
    }
  }
  if (!has_generation) {
    json g = {{"_from_model_config", true}};
    if (o.config.bos_token_id) g["bos_token_id"] = *o.config.bos_token_id;
    if (o.config.eos_token_ids.size() == 1) g["eos_token_id"] = o.config.eos_token_ids[0];
    if (o.config.eos_token_ids.size() > 1) g["eos_token_id"] = o.config.eos_token_ids;
    if (o.config.pad_token_id) g["pad_token_id"] = *o.config.pad_token_id;
    staging.write_text("generation_config.json", g.dump(2) + "\n");
  }
  staging.commit();  // into place, never over anything that appeared meanwhile
}

}  // namespace fsdp::hf
