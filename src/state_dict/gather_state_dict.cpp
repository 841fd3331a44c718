// [collective] gather_state_dict: every rank's pieces of every sharded
// entry, assembled into full tensors (fsdp/state_dict/state_dict.h).
#include <ATen/ATen.h>

#include <cstring>
#include <string>
#include <vector>

#include "fsdp/error.h"
#include "fsdp/state_dict/state_dict.h"
#include "shard_geometry.h"

namespace fsdp {

using detail::product;
using detail::shape_str;

namespace {

void put_i64(std::string& s, int64_t v) { s.append(reinterpret_cast<const char*>(&v), sizeof v); }

struct Reader {
  const std::string& s;
  size_t pos = 0;
  int64_t i64() {
    if (pos + sizeof(int64_t) > s.size()) throw CollectiveError("gather_state_dict: short metadata", "all_gather_bytes");
    int64_t v;
    std::memcpy(&v, s.data() + pos, sizeof v);
    pos += sizeof v;
    return v;
  }
  std::string str() {
    const int64_t n = i64();
    if (n < 0 || pos + static_cast<size_t>(n) > s.size()) {
      throw CollectiveError("gather_state_dict: bad metadata", "all_gather_bytes");
    }
    std::string out = s.substr(pos, static_cast<size_t>(n));
    pos += static_cast<size_t>(n);
    return out;
  }
};

struct PieceMeta {
  std::vector<int64_t> offsets, sizes;
};

}  // namespace

StateDict gather_state_dict(const StateDict& state, dist::ProcessGroup& group) {
  // Metadata of every sharded entry: key, then each local piece's box.
  std::string meta;
  std::vector<std::string> sharded_keys;
  for (const auto& [key, v] : state) {
    if (!std::holds_alternative<ShardedTensor>(v)) continue;
    sharded_keys.push_back(key);
    const auto& st = std::get<ShardedTensor>(v);
    put_i64(meta, static_cast<int64_t>(key.size()));
    meta += key;
    put_i64(meta, static_cast<int64_t>(st.local_shards.size()));
    for (const auto& s : st.local_shards) {
      put_i64(meta, s.tensor.dim());
      for (int64_t d = 0; d < s.tensor.dim(); ++d) put_i64(meta, s.offsets.at(static_cast<size_t>(d)));
      for (int64_t d = 0; d < s.tensor.dim(); ++d) put_i64(meta, s.tensor.size(d));
    }
  }
  const auto all = group.all_gather_bytes(meta);  // [collective]
  const int world = group.size();
  // pieces[rank][entry] = boxes
  std::vector<std::vector<std::vector<PieceMeta>>> pieces(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    Reader rd{all[static_cast<size_t>(r)]};
    for (const auto& key : sharded_keys) {
      if (rd.str() != key) {
        throw ConfigError("gather_state_dict: rank " + std::to_string(r) + " has other sharded keys than rank " +
                          std::to_string(group.rank()) + " (expected '" + key +
                          "'): every rank must pass the state dict of the same model");
      }
      std::vector<PieceMeta> boxes(static_cast<size_t>(rd.i64()));
      for (auto& b : boxes) {
        const int64_t nd = rd.i64();
        b.offsets.resize(static_cast<size_t>(nd));
        b.sizes.resize(static_cast<size_t>(nd));
        for (auto& x : b.offsets) x = rd.i64();
        for (auto& x : b.sizes) x = rd.i64();
      }
      pieces[static_cast<size_t>(r)].push_back(std::move(boxes));
    }
  }
  StateDict out;
  size_t entry = 0;
  at::NoGradGuard no_grad;
  for (const auto& [key, v] : state) {
    if (!std::holds_alternative<ShardedTensor>(v)) {
      out.insert(key, v);
      continue;
    }
    const auto& st = std::get<ShardedTensor>(v);
    int64_t max_numel = 0;
    for (int r = 0; r < world; ++r) {
      int64_t n = 0;
      for (const auto& b : pieces[static_cast<size_t>(r)][entry]) n += product(b.sizes);
      max_numel = std::max(max_numel, n);
    }
    auto options = at::TensorOptions().dtype(st.dtype);
    at::Tensor full = at::zeros(st.global_shape, options);
    at::Tensor covered = at::zeros(st.global_shape, at::TensorOptions().dtype(at::kBool));
    if (max_numel > 0) {
      at::Tensor local = at::zeros({max_numel}, options);
      int64_t cursor = 0;
      for (const auto& s : st.local_shards) {
        local.narrow(0, cursor, s.tensor.numel()).copy_(s.tensor.reshape({-1}));
        cursor += s.tensor.numel();
      }
      at::Tensor gathered = at::empty({max_numel * world}, options);
      group.all_gather(gathered, local).wait();  // [collective]
      for (int r = 0; r < world; ++r) {
        int64_t c = static_cast<int64_t>(r) * max_numel;
        for (const auto& b : pieces[static_cast<size_t>(r)][entry]) {
          const int64_t n = product(b.sizes);
          at::Tensor dst = full, mask = covered;
          for (size_t d = 0; d < b.sizes.size(); ++d) {
            dst = dst.narrow(static_cast<int64_t>(d), b.offsets[d], b.sizes[d]);
            mask = mask.narrow(static_cast<int64_t>(d), b.offsets[d], b.sizes[d]);
          }
          dst.copy_(gathered.narrow(0, c, n).view(b.sizes));
          mask.fill_(true);
          c += n;
        }
      }
    }
    if (full.numel() > 0 && !covered.all().item<bool>()) {
      throw ConfigError("gather_state_dict: the pieces of '" + key + "' on the " + std::to_string(world) +
                        " ranks do not cover its shape " + shape_str(st.global_shape));
    }
    out.insert(key, full);
    ++entry;
  }
  return out;
}

}  // namespace fsdp
