// fsdp-cpp's earlier sharded layout as a storage (readers.h,
// ShardedDirReader): index.json of kind "sharded" and data-*.bin files.
#include <ATen/ATen.h>

#include <filesystem>

#include "fsdp/error.h"
#include "readers.h"

namespace fsdp::detail {

ShardedDirReader::ShardedDirReader(const std::string& dir) {
  path_ = dir;
  where_ = (std::filesystem::path(dir) / formats::kIndexFile).string();
  ix_ = formats::parse_index(read_small(where_), where_);
  if (ix_.kind != formats::Index::Kind::kSharded) {
    throw ConfigError("checkpoint: " + where_ + ": a directory's index must be of kind \"sharded\"");
  }
}

at::Tensor ShardedDirReader::read_chunk(const std::string& key, size_t chunk) const {
  return read_indexed_chunk(key, chunk, nullptr, path_);
}

}  // namespace fsdp::detail
