// The tools: inspect, verify, consolidate, convert and export checkpoints (fsdp-ckpt).
#include <algorithm>
#include <filesystem>

#include "fsdp/checkpoint/checkpoint_io.h"
#include "fsdp/checkpoint/storage_registry.h"
#include "fsdp/error.h"
#include "loading.h"
#include "parts.h"
#include "readers.h"

namespace fsdp {

namespace fs = std::filesystem;

namespace {

// The storage of `path` as the tools open it: a checkpoint's state
// (DetectOptions' default), any registered format.
std::unique_ptr<StorageReader> open_for_tools(const std::string& path) { return open_checkpoint_storage(path, {}); }

// A checkpoint of one file is of the full format; a directory's are sharded.
bool is_one_file(const std::string& path) {
  std::error_code ec;
  return !fs::is_directory(path, ec);
}

}  // namespace

CheckpointInfo inspect_checkpoint(const std::string& path) {
  auto src = open_for_tools(path);
  const formats::Index& ix = src->index();
  CheckpointInfo info;
  info.format = is_one_file(path) ? CheckpointFormat::kFull : CheckpointFormat::kSharded;
  info.version = ix.version;
  info.world_size = ix.world_size;
  for (const auto& e : ix.entries) {
    if (e.is_state_dict()) continue;
    info.values[e.name] = e.type == formats::EntryType::kTensor ? "<tensor>" : formats::value_text(e);
    info.value_types[e.name] = formats::entry_type_name(e.type);
  }
  for (const auto& key : ix.tensor_order) {
    const auto& t = ix.tensors.at(key);
    CheckpointTensorInfo ti{key, formats::dtype_name(t.dtype), t.shape, 0, static_cast<int>(t.chunks.size())};
    for (const auto& c : t.chunks) ti.nbytes += c.nbytes;
    info.tensors.push_back(std::move(ti));
  }
  return info;
}

std::vector<std::string> verify_checkpoint(const std::string& path) {
  std::vector<std::string> problems;
  std::unique_ptr<StorageReader> src;
  try {
    src = open_for_tools(path);
  } catch (const std::exception& e) {
    return {e.what()};
  }
  for (const auto& f : src->index().files) {
    if (formats::file_size((fs::path(path) / f).string()) < 0) problems.push_back("missing data file " + f);
  }
  if (auto* builtin = dynamic_cast<const detail::IndexedReader*>(src.get())) {
    builtin->verify(problems);
    return problems;
  }
  // Another storage (a Hugging Face directory, a registered format): every tensor read whole.
  for (const auto& key : src->index().tensor_order) {
    try {
      detail::read_whole(*src, key);
    } catch (const std::exception& e) {
      problems.push_back(e.what());
    }
  }
  return problems;
}

namespace {

// ConfigError if `out` is `in` or inside it (symbolic links resolved).
void refuse_inside(const std::string& in, const std::string& out, const char* caller) {
  std::error_code ec, ec2;
  const fs::path a = fs::weakly_canonical(in, ec), b = fs::weakly_canonical(out, ec2);
  if (ec || ec2)
    throw ConfigError(std::string(caller) + ": cannot resolve " + in + " or " + out + ": " + (ec ? ec : ec2).message());
  for (fs::path p = b; !p.empty(); p = p.parent_path()) {
    if (p == a) {
      throw ConfigError(std::string(caller) + ": the output " + out +
                        (p == b ? " is the checkpoint " : " is inside the checkpoint ") + in + "; write it elsewhere");
    }
    if (p == p.parent_path()) break;
  }
}

// ConfigError unless `out_file` is absent or a regular file (issue 37 item
// 4: a device, a FIFO or a symbolic link there would be replaced by the
// renamed temporary); a directory is named as such.
void check_output_file(const std::string& out_file, const char* caller) {
  if (formats::entry_kind(out_file) == "a directory") {
    throw ConfigError(std::string(caller) + ": the output " + out_file + " is a directory; give a file name");
  }
  formats::check_file_destination(out_file, caller);
}

void write_full(const StorageReader& src, const std::string& out_file) {
  detail::FullFileWriter out(out_file, src.index().world_size);
  for (const auto& key : src.index().tensor_order) out.add(key, detail::read_whole(src, key));  // one tensor in memory at a time
  out.finish(src.index().entries);
  if (!out.error().empty()) {
    throw Error("consolidate: writing " + out_file + " failed: " + dist::failure_message(out.error()));
  }
}

}  // namespace

void convert_checkpoint(const std::string& src_path, const std::string& dst, CheckpointFormat format) {
  refuse_inside(src_path, dst, "convert");
  if (format == CheckpointFormat::kFull) check_output_file(dst, "convert");
  auto src = open_for_tools(src_path);
  if (format == CheckpointFormat::kFull) {
    write_full(*src, dst);
  } else {
    detail::copy_to_sharded(*src, dst);
  }
}

void consolidate_checkpoint(const std::string& sharded_dir, const std::string& out_file) {
  refuse_inside(sharded_dir, out_file, "consolidate");
  check_output_file(out_file, "consolidate");
  auto src = open_for_tools(sharded_dir);
  if (is_one_file(sharded_dir)) throw ConfigError("consolidate: " + sharded_dir + " is already a full checkpoint");
  write_full(*src, out_file);
}


void export_safetensors(const std::string& path, const std::string& out_file) {
  refuse_inside(path, out_file, "export");
  check_output_file(out_file, "export");
  auto src = open_for_tools(path);
  const formats::EntryRecord& model = detail::the_model(*src, "export", path);
  std::vector<formats::SafetensorsTensor> plan;
  for (const auto& key : model.keys) {
    const auto& t = detail::find_tensor(*src, model.name + "/" + key);
    plan.push_back({key, t.dtype, t.shape, 0, 0});
  }
  formats::SafetensorsWriter out(out_file, plan, {{"format", "pt"}, {"producer", "fsdp-cpp"}, {"fsdp_entry", model.name}});
  for (const auto& t : out.layout())
    out.write(detail::read_whole(*src, model.name + "/" + t.name));  // one tensor in memory at a time
  out.commit();
}

}  // namespace fsdp
