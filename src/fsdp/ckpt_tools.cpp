// The tools: inspect, verify and consolidate checkpoints (fsdp-ckpt).
#include <filesystem>

#include "ckpt_parts.h"
#include "fsdp/error.h"

namespace fsdp {

namespace ck = detail::ckpt;
namespace fs = std::filesystem;

CheckpointInfo inspect_checkpoint(const std::string& path) {
  auto src = detail::open_source(path);
  CheckpointInfo info;
  info.format = src->full ? CheckpointFormat::kFull : CheckpointFormat::kSharded;
  info.version = src->ix.version;
  info.world_size = src->ix.world_size;
  for (const auto& e : src->ix.entries) {
    if (e.is_state_dict()) continue;
    info.values[e.name] = e.type == ck::EntryType::kTensor ? "<tensor>" : ck::value_text(e);
  }
  for (const auto& key : src->ix.tensor_order) {
    const auto& t = src->ix.tensors.at(key);
    CheckpointTensorInfo ti{key, ck::dtype_name(t.dtype), t.shape, 0, static_cast<int>(t.chunks.size())};
    for (const auto& c : t.chunks) ti.nbytes += c.nbytes;
    info.tensors.push_back(std::move(ti));
  }
  return info;
}

std::vector<std::string> verify_checkpoint(const std::string& path) {
  std::vector<std::string> problems;
  std::unique_ptr<detail::Source> src;
  try {
    src = detail::open_source(path);
  } catch (const std::exception& e) {
    return {e.what()};
  }
  for (const auto& f : src->ix.files) {
    if (ck::file_size((fs::path(path) / f).string()) < 0) problems.push_back("missing data file " + f);
  }
  for (const auto& key : src->ix.tensor_order) {
    const auto& t = src->ix.tensors.at(key);
    int64_t covered = 0;
    if (auto p = src->pickled.find(key); p != src->pickled.end()) {  // written by PyTorch: no checksums of its own
      try {
        detail::pickle::read_tensor(*src->full, p->second, "tensor '" + key + "'");
      } catch (const std::exception& e) {
        problems.push_back(e.what());
      }
      continue;
    }
    for (const auto& c : t.chunks) {
      try {
        ck::read_chunk(c, key, src->full.get(), src->dir);
        covered += c.nbytes;
      } catch (const std::exception& e) {
        problems.push_back(e.what());
      }
    }
    int64_t want = static_cast<int64_t>(c10::elementSize(t.dtype));
    for (auto d : t.shape) want *= d;
    if (covered < want && problems.empty()) problems.push_back("tensor '" + key + "': its chunks do not cover it");
  }
  return problems;
}

void consolidate_checkpoint(const std::string& sharded_dir, const std::string& out_file) {
  auto src = detail::open_source(sharded_dir);
  if (src->full) throw ConfigError("consolidate: " + sharded_dir + " is already a full checkpoint");
  detail::FullFileWriter out(out_file, src->ix.world_size);
  for (const auto& key : src->ix.tensor_order) out.add(key, src->read_whole(key));  // one tensor in memory at a time
  out.finish(src->ix.entries);
  if (!out.error().empty()) {
    throw Error("consolidate: writing " + out_file + " failed: " + detail::failure_message(out.error()));
  }
}

}  // namespace fsdp
