// The tools: inspect, verify, consolidate, convert and export checkpoints (fsdp-ckpt).
#include <algorithm>
#include <filesystem>
#include <tuple>

#include "fsdp/formats/dcp.h"
#include "fsdp/checkpoint/checkpoint_io.h"
#include "loading.h"
#include "parts.h"
#include "fsdp/error.h"

namespace fsdp {

namespace fs = std::filesystem;

CheckpointInfo inspect_checkpoint(const std::string& path) {
  auto src = detail::open_source(path);
  CheckpointInfo info;
  info.format = src->full ? CheckpointFormat::kFull : CheckpointFormat::kSharded;
  info.version = src->ix.version;
  info.world_size = src->ix.world_size;
  for (const auto& e : src->ix.entries) {
    if (e.is_state_dict()) continue;
    info.values[e.name] = e.type == formats::EntryType::kTensor ? "<tensor>" : formats::value_text(e);
    info.value_types[e.name] = formats::entry_type_name(e.type);
  }
  for (const auto& key : src->ix.tensor_order) {
    const auto& t = src->ix.tensors.at(key);
    CheckpointTensorInfo ti{key, formats::dtype_name(t.dtype), t.shape, 0, static_cast<int>(t.chunks.size())};
    for (const auto& c : t.chunks) ti.nbytes += c.nbytes;
    info.tensors.push_back(std::move(ti));
  }
  return info;
}

namespace {

bool same_chunks(std::vector<formats::Chunk> a, std::vector<formats::Chunk> b) {
  auto key = [](const formats::Chunk& c) { return std::tie(c.file, c.offset, c.nbytes, c.offsets, c.sizes, c.crc); };
  auto less = [&](const formats::Chunk& x, const formats::Chunk& y) { return key(x) < key(y); };
  std::sort(a.begin(), a.end(), less);
  std::sort(b.begin(), b.end(), less);
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [&](const auto& x, const auto& y) {
           return key(x) == key(y);
         });
}

// A DCP directory beyond its tensor bytes: every item's other records
// against the zip's CRC-32s, and fsdp-cpp's index against .metadata (what
// Python reads).
void verify_dcp(const detail::Source& src, std::vector<std::string>& problems) {
  try {
    const std::string metadata = (fs::path(src.dir) / formats::kDcpMetadataFile).string();
    const formats::DcpMetadata md = formats::parse_dcp_metadata(formats::read_range(metadata, 0, formats::file_size(metadata)), metadata);
    for (const auto& it : md.items) {
      std::vector<formats::DcpStorage> items;
      if (it.is_bytes) items.push_back(it.bytes);
      for (const auto& c : it.chunks) items.push_back(c.storage);
      for (const auto& s : items) {
        formats::FullReader zip((fs::path(src.dir) / s.file).string(), s.offset, s.length);
        for (const auto& record : zip.records()) {
          if (record.rfind("data/", 0) == 0) continue;  // tensor bytes: the chunks' checksums, above
          const std::string bytes = zip.read(record);
          if (formats::crc32(bytes.data(), bytes.size()) != zip.record_crc(record)) {
            problems.push_back("checksum mismatch in " + zip.where() + " (record " + record + " of '" + it.key +
                               "'): the file is damaged");
          }
        }
      }
    }
    const formats::Index built = formats::dcp_index(md, src.dir);
    if (src.where == metadata) return;  // the index is .metadata's own
    for (const auto& [key, t] : built.tensors) {
      auto own = src.ix.tensors.find(key);
      if (own == src.ix.tensors.end() || !same_chunks(own->second.chunks, t.chunks)) {
        problems.push_back(std::string(formats::kDcpMetadataFile) + " and " + formats::kDcpIndexFile + " disagree on tensor '" +
                           key + "'");
      }
    }
    if (built.tensors.size() != src.ix.tensors.size()) {
      problems.push_back(std::string(formats::kDcpMetadataFile) + " and " + formats::kDcpIndexFile + " list different tensors");
    }
  } catch (const std::exception& e) {
    problems.push_back(e.what());
  }
}

}  // namespace

std::vector<std::string> verify_checkpoint(const std::string& path) {
  std::vector<std::string> problems;
  std::unique_ptr<detail::Source> src;
  try {
    src = detail::open_source(path);
  } catch (const std::exception& e) {
    return {e.what()};
  }
  for (const auto& f : src->ix.files) {
    if (formats::file_size((fs::path(path) / f).string()) < 0) problems.push_back("missing data file " + f);
  }
  if (src->full) {  // every record against the zip's CRC-32 (tensor data: with the chunks, below)
    try {
      for (const auto& record : src->full->records()) {
        if (record.rfind("data/", 0) != 0) src->full->read(record);
      }
    } catch (const std::exception& e) {
      problems.push_back(e.what());
    }
  }
  for (const auto& key : src->ix.tensor_order) {
    const auto& t = src->ix.tensors.at(key);
    int64_t covered = 0;
    if (auto p = src->pickled.find(key); p != src->pickled.end()) {  // written by PyTorch: no checksums of its own
      try {
        formats::pickle::read_tensor(*src->full, p->second, "tensor '" + key + "'");
      } catch (const std::exception& e) {
        problems.push_back(e.what());
      }
      continue;
    }
    for (const auto& c : t.chunks) {
      try {
        formats::read_chunk(c, key, src->full.get(), src->dir);
        covered += c.nbytes;
      } catch (const std::exception& e) {
        problems.push_back(e.what());
      }
    }
    int64_t want = static_cast<int64_t>(c10::elementSize(t.dtype));
    for (auto d : t.shape) want *= d;
    bool overlap = false;
    for (size_t i = 0; i < t.chunks.size() && !overlap; ++i) {
      for (size_t j = i + 1; j < t.chunks.size() && !overlap; ++j) {
        bool meet = true;
        for (size_t d = 0; d < t.shape.size(); ++d) {
          const auto &a = t.chunks[i], &b = t.chunks[j];
          meet &= std::max(a.offsets[d], b.offsets[d]) < std::min(a.offsets[d] + a.sizes[d], b.offsets[d] + b.sizes[d]);
        }
        overlap = meet && t.chunks[i].nbytes > 0 && t.chunks[j].nbytes > 0;
      }
    }
    if (overlap) problems.push_back("tensor '" + key + "': two of its chunks overlap");
    if (covered != want && problems.empty()) problems.push_back("tensor '" + key + "': its chunks do not cover it exactly");
  }
  if (!src->dir.empty() && formats::file_size((fs::path(path) / formats::kDcpMetadataFile).string()) >= 0) {
    verify_dcp(*src, problems);
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

void write_full(const detail::Source& src, const std::string& out_file) {
  detail::FullFileWriter out(out_file, src.ix.world_size);
  for (const auto& key : src.ix.tensor_order) out.add(key, src.read_whole(key));  // one tensor in memory at a time
  out.finish(src.ix.entries);
  if (!out.error().empty()) {
    throw Error("consolidate: writing " + out_file + " failed: " + dist::failure_message(out.error()));
  }
}

}  // namespace

void convert_checkpoint(const std::string& src_path, const std::string& dst, CheckpointFormat format) {
  refuse_inside(src_path, dst, "convert");
  if (format == CheckpointFormat::kFull) check_output_file(dst, "convert");
  auto src = detail::open_source(src_path);
  if (format == CheckpointFormat::kFull) {
    write_full(*src, dst);
  } else {
    detail::copy_to_sharded(*src, dst);
  }
}

void consolidate_checkpoint(const std::string& sharded_dir, const std::string& out_file) {
  refuse_inside(sharded_dir, out_file, "consolidate");
  check_output_file(out_file, "consolidate");
  auto src = detail::open_source(sharded_dir);
  if (src->full) throw ConfigError("consolidate: " + sharded_dir + " is already a full checkpoint");
  write_full(*src, out_file);
}


void export_safetensors(const std::string& path, const std::string& out_file) {
  refuse_inside(path, out_file, "export");
  check_output_file(out_file, "export");
  auto src = detail::open_source(path);
  const formats::EntryRecord& model = src->the_model("export");
  std::vector<formats::SafetensorsTensor> plan;
  for (const auto& key : model.keys) {
    const auto& t = src->tensor(model.name + "/" + key);
    plan.push_back({key, t.dtype, t.shape, 0, 0});
  }
  formats::SafetensorsWriter out(out_file, plan, {{"format", "pt"}, {"producer", "fsdp-cpp"}, {"fsdp_entry", model.name}});
  for (const auto& t : out.layout())
    out.write(src->read_whole(model.name + "/" + t.name));  // one tensor in memory at a time
  out.commit();
}

}  // namespace fsdp
