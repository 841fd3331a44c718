// Checkpoints on disk: save and load in the full and sharded formats.
#include "fsdp/checkpoint_io.h"

#include <ATen/ATen.h>
#include <caffe2/serialize/inline_container.h>
#include <nlohmann/json.hpp>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <fcntl.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <future>
#include <mutex>
#include <filesystem>
#include <regex>
#include <set>
#include <sstream>

#include "ckpt_format.h"
#include "fsdp/error.h"
#include "fsdp/fsdp.h"
#include "fsdp/optim_state_dict.h"
#include "fsdp/state_dict.h"
#include "model_index.h"
#include "optim_state_dict_visit.h"
#include "shard_geometry.h"
#include "state_dict_visit.h"
#include "rank_errors.h"
#include "torch_pickle.h"

namespace fsdp {

namespace ck = detail::ckpt;
using detail::agree;
using detail::capture;
using detail::Failure;
namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

const char* to_string(CheckpointFormat format) {
  return format == CheckpointFormat::kFull ? "full" : "sharded";
}

CheckpointFormat parse_checkpoint_format(const std::string& name, const std::string& what) {
  std::string n;
  for (char c : name) n += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (auto f : {CheckpointFormat::kFull, CheckpointFormat::kSharded}) {
    if (n == to_string(f)) return f;
  }
  throw ConfigError("Unknown " + what + ": " + name + " (expected one of \"full\", \"sharded\")");
}

// ---------------------------------------------------------------------------
// CheckpointState.

void CheckpointState::add(Entry::Kind kind, const std::string& name) {
  if (name.empty() || name.find('/') != std::string::npos) {
    throw ConfigError("CheckpointState: entry name '" + name + "' must be non-empty and contain no '/'");
  }
  for (const auto& e : entries_) {
    if (e.name == name && e.kind != kind) {
      throw ConfigError("CheckpointState: entry '" + name + "' is already a " +
                        (e.kind == Entry::kModel ? "model" : e.kind == Entry::kOptimizer ? "optimizer" : "value"));
    }
    if (e.name == name) return;
  }
  entries_.push_back({kind, name});
}

CheckpointState& CheckpointState::model(const std::string& name, std::shared_ptr<torch::nn::Module> module) {
  if (!module) throw ConfigError("CheckpointState: model '" + name + "' is null");
  add(Entry::kModel, name);
  models_[name] = std::move(module);
  return *this;
}

CheckpointState& CheckpointState::optimizer(const std::string& name, torch::optim::Optimizer& optimizer) {
  add(Entry::kOptimizer, name);
  optimizers_[name] = &optimizer;
  return *this;
}

CheckpointState& CheckpointState::value(const std::string& name, CheckpointValue value) {
  add(Entry::kValue, name);
  values_[name] = std::move(value);
  return *this;
}

const CheckpointValue& CheckpointState::value(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) throw ConfigError("CheckpointState: no value '" + name + "'");
  return it->second;
}

void CheckpointState::throw_wrong_type(const std::string& name) const {
  static const char* names[] = {"int64_t", "double", "bool", "std::string", "at::Tensor"};
  throw ConfigError("CheckpointState: value '" + name + "' holds a " + names[value(name).index()] +
                    ", not the type asked for");
}

namespace {

bool has_fsdp_units(const std::shared_ptr<torch::nn::Module>& m) { return !fsdp_modules(m).empty(); }

// Lightning's rule: exactly one model with FSDP units; optimizers belong to it.
std::pair<std::string, std::shared_ptr<torch::nn::Module>> the_fsdp_model(const CheckpointState& state,
                                                                          const char* verb) {
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> found;
  for (const auto& [name, m] : state.models()) {
    if (has_fsdp_units(m)) found.emplace_back(name, m);
  }
  if (found.empty()) {
    throw ConfigError(std::string("Could not find a FSDP model in the provided checkpoint state. Please provide the "
                                  "model as part of the state like so: `") +
                      verb + "_checkpoint(path, fsdp::CheckpointState().model(\"model\", model.ptr()), ...)`. Make "
                      "sure you wrap the model (and build optimizers on it) before " + verb + "ing the checkpoint.");
  }
  if (found.size() > 1) {
    throw ConfigError(std::string("Found multiple FSDP models in the given state. ") +
                      (verb[0] == 's' ? "Saving" : "Loading") +
                      " checkpoints with FSDP is currently limited to a single model per checkpoint. To " + verb +
                      " multiple models, call the " + verb + " function for each model separately with a different path.");
  }
  return found.front();
}

bool keep(const CheckpointOptions& o, const std::string& entry, const std::string& key) {
  return !o.filter() || o.filter()(entry, key);
}

std::string json_number(double v) {
  if (std::isfinite(v)) return Json(v).dump();
  return Json(std::isnan(v) ? "nan" : v > 0 ? "inf" : "-inf").dump();
}

// Fills the index entry of a user value (scalars only; tensors are data).
ck::EntryRecord value_record(const std::string& name, const CheckpointValue& v) {
  ck::EntryRecord e;
  e.name = name;
  switch (v.index()) {
    case 0: e.type = "int"; e.value = std::to_string(std::get<int64_t>(v)); break;
    case 1: e.type = "float"; e.value = json_number(std::get<double>(v)); break;
    case 2: e.type = "bool"; e.value = std::get<bool>(v) ? "true" : "false"; break;
    case 3: e.type = "str"; e.value = std::get<std::string>(v); break;
    default: e.type = "tensor";
  }
  return e;
}

std::string groups_json(const std::vector<OptimParamGroup>& groups) {
  Json a = Json::array();
  for (const auto& g : groups) a.push_back(Json{{"params", g.params}, {"options", g.options}});
  return a.dump();
}

bool is_sharded_checkpoint(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) && fs::is_regular_file(fs::path(path) / ck::kIndexFile, ec);
}


// ---------------------------------------------------------------------------
// What a state turns into: entries, with their tensors handed to `put`.

using Put = std::function<void(const std::string& tensor_key, const StateValue& value)>;

// Visits the state in entry order. Collective (FULL gathers) on every rank alike.
std::vector<ck::EntryRecord> visit_state(const CheckpointState& state, const std::shared_ptr<torch::nn::Module>& fsdp_model,
                                         StateDictType type, const CheckpointOptions& options, const Put& put) {
  std::vector<ck::EntryRecord> entries;
  const StateDictConfig config = type == StateDictType::kFull ? StateDictConfig{FullStateDictConfig{true, true}}
                                                              : StateDictConfig{ShardedStateDictConfig{}};
  for (const auto& e : state.entries()) {
    ck::EntryRecord rec;
    rec.name = e.name;
    if (e.kind == CheckpointState::Entry::kModel) {
      rec.type = "model";
      const auto& model = state.models().at(e.name);
      StateDictTypeGuard guard(model, type, config);
      // No copies: every tensor is written (or copied, when async) as it comes.
      auto keys = detail::visit_state_dict(
          model, "", [&](const std::string& key, StateValue v) {
            if (keep(options, e.name, key)) put(e.name + "/" + key, v);
          },
          /*copy=*/false);
      for (auto& k : keys) {
        if (keep(options, e.name, k)) rec.keys.push_back(k);
      }
    } else if (e.kind == CheckpointState::Entry::kOptimizer) {
      rec.type = "optimizer";
      StateDictTypeGuard guard(fsdp_model, type, config);
      auto groups = detail::visit_optim_state_dict(
          fsdp_model, *state.optimizers().at(e.name), [&](const std::string& key, StateValue v) {
            if (!keep(options, e.name, key)) return;
            rec.keys.push_back(key);
            put(e.name + "/" + key, v);
          },
          /*copy=*/false);
      rec.param_groups = groups_json(groups);
    } else {
      const auto& v = state.values().at(e.name);
      if (!keep(options, e.name, "")) continue;
      rec = value_record(e.name, v);
      if (std::holds_alternative<at::Tensor>(v)) put(e.name, std::get<at::Tensor>(v).detach());
    }
    entries.push_back(std::move(rec));
  }
  return entries;
}

at::Tensor cpu_contiguous(const at::Tensor& t) { return t.detach().cpu().contiguous(); }

// ---------------------------------------------------------------------------
// Full format.

// Gives freed heap memory back to the system. glibc keeps freed blocks of a
// few MiB in its heaps (its mmap threshold grows with the blocks freed), so
// without this the unit-sized buffers of a streamed save pile up in rank 0's
// resident memory although only one is alive at a time.
void release_free_memory() {
#ifdef __GLIBC__
  malloc_trim(0);
#endif
}

// Writes a full checkpoint file: tensor records as they come (streaming),
// then the pickle, the index and the zip directory; commits by rename. The
// first error is kept (error()) and everything after it is skipped.
class FullFileWriter {
 public:
  FullFileWriter(const std::string& path, int world_size) {
    ix_.kind = "full";
    ix_.world_size = world_size;
    ix_.save_id = ck::new_save_id();
    keep_first_error(capture([&] {
      fs::path parent = fs::path(path).parent_path();
      if (!parent.empty()) fs::create_directories(parent);
      file_ = std::make_unique<ck::AtomicFile>(path);
      // Write errors are remembered and the rest is discarded (the zip writer
      // must not see a failure: it would throw from its destructor).
      zip_ = std::make_unique<caffe2::serialize::PyTorchStreamWriter>([this](const void* data, size_t n) -> size_t {
        if (error_.empty()) keep_first_error(capture([&] { file_->write(data, n); }));
        return n;
      });
    }));
  }
  ~FullFileWriter() {
    zip_.reset();
    file_.reset();
  }
  void add(const std::string& key, const at::Tensor& tensor) {
    if (!error_.empty()) return;
    keep_first_error(capture([&] {
      const at::Tensor t = cpu_contiguous(tensor);
      ck::dtype_name(t.scalar_type());  // refuses dtypes the format has no name for
      const auto nbytes = static_cast<int64_t>(t.numel() * t.element_size());
      const std::string record = "data/" + std::to_string(next_++);
      ck::Chunk c{record, 0, nbytes, std::vector<int64_t>(t.sizes().size(), 0), t.sizes().vec(),
                  ck::crc32(t.data_ptr(), static_cast<size_t>(nbytes))};
      zip_->writeRecord(record, t.data_ptr(), static_cast<size_t>(nbytes));
      if (next_ == 1) ck::crash_point("full-after-first-record", 0);
      release_free_memory();
      ix_.tensors.emplace(key, ck::TensorEntry{t.scalar_type(), t.sizes().vec(), {c}});
      ix_.tensor_order.push_back(key);
      record_of_[key] = record;
    }));
  }
  void finish(std::vector<ck::EntryRecord> entries) {
    if (!error_.empty()) return;
    ix_.entries = std::move(entries);
    keep_first_error(capture([&] {
      const std::string pickle = ck::full_pickle(ix_, record_of_);
      zip_->writeRecord("data.pkl", pickle.data(), pickle.size());
      const std::string index = ck::to_json(ix_);
      zip_->writeRecord(ck::kFullIndexRecord, index.data(), index.size());
      zip_->writeEndOfFile();
    }));
    ck::crash_point("full-before-commit", 0);
    if (error_.empty()) keep_first_error(capture([&] { file_->commit(); }));
  }
  const Failure& error() const { return error_; }

 private:
  // A write error caught inside the zip writer's callback comes first; the
  // call that triggered it may itself end normally and must not clear it.
  void keep_first_error(const Failure& e) {
    if (error_.empty()) error_ = e;
  }
  Failure error_;
  std::unique_ptr<ck::AtomicFile> file_;
  std::unique_ptr<caffe2::serialize::PyTorchStreamWriter> zip_;
  ck::Index ix_;
  std::map<std::string, std::string> record_of_;
  int next_ = 0;
};

// ---------------------------------------------------------------------------
// Async saves: the write runs in the background; the commit (a collective)
// runs at wait_for_checkpoint, which every rank calls at the same point (the
// next save or load does it for them).

struct PendingSave {
  std::future<std::string> write;                     // the report of the write
  std::function<void(const std::string&)> commit;    // [collective]
};

std::mutex& pending_mutex() {
  static std::mutex mu;
  return mu;
}
std::map<const dist::ProcessGroup*, PendingSave>& pending_saves() {
  static std::map<const dist::ProcessGroup*, PendingSave> p;
  return p;
}

void save_full(const std::string& path, const CheckpointState& state,
               const std::shared_ptr<torch::nn::Module>& fsdp_model, dist::ProcessGroup& group,
               const CheckpointOptions& options) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {  // (a sharded checkpoint there was replaced by save_checkpoint)
    throw ConfigError("save_checkpoint: The checkpoint path exists and is a directory: " + path);
  }
  const bool writer = group.rank() == 0;
  auto finish_on_all = [path, &group](const Failure& error) {
    detail::agree_from(group, 0, error, "save_checkpoint: saving " + path + " failed: ");  // [collective]
  };
  if (options.async_save()) {
    // Rank 0 keeps a copy of the gathered state and writes it in the background.
    auto staged = std::make_shared<std::vector<std::pair<std::string, at::Tensor>>>();
    auto entries = std::make_shared<std::vector<ck::EntryRecord>>();
    Failure error = capture([&] {
      *entries = visit_state(state, fsdp_model, StateDictType::kFull, options, [&](const std::string& k, const StateValue& v) {
        if (writer) staged->emplace_back(k, std::get<at::Tensor>(v).detach().to(at::kCPU, false, /*copy=*/true));
      });
    });
    if (!error.empty()) return finish_on_all(error);
    const int world = group.size();
    PendingSave pending;
    pending.write = std::async(std::launch::async, [path, world, writer, staged, entries] {
      if (!writer) return std::string();
      FullFileWriter out(path, world);
      for (const auto& [k, t] : *staged) out.add(k, t);
      out.finish(std::move(*entries));
      return out.error();
    });
    pending.commit = [path, g = &group](const std::string& report) {
      detail::agree_from(*g, 0, report, "save_checkpoint: saving " + path + " failed: ");
    };
    std::lock_guard<std::mutex> lock(pending_mutex());
    pending_saves()[&group] = std::move(pending);
    return;
  }
  std::unique_ptr<FullFileWriter> out;
  if (writer) out = std::make_unique<FullFileWriter>(path, group.size());
  auto put = [&](const std::string& key, const StateValue& v) {
    if (out) out->add(key, std::get<at::Tensor>(v));
  };
  // [collective] gathers run on every rank; only rank 0 writes, as they come.
  std::vector<ck::EntryRecord> entries;
  Failure error = capture([&] { entries = visit_state(state, fsdp_model, StateDictType::kFull, options, put); });
  if (out) {
    if (error.empty()) out->finish(std::move(entries));
    if (error.empty()) error = out->error();
    out.reset();  // an uncommitted temporary is removed
  }
  finish_on_all(error);
}

// ---------------------------------------------------------------------------
// Sharded format.

struct Piece {
  std::string key;
  at::ScalarType dtype;
  std::vector<int64_t> shape, offsets;
  at::Tensor tensor;
};

std::string data_file_name(const std::string& save_id, int rank) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%05d", rank);
  return "data-" + save_id + "-" + buf + ".bin";
}

// A sharded save in three steps: stage (collective: who writes which piece),
// write (local: this rank's data file), commit (collective: rank 0 writes the
// index). An async save runs the write in the background.
struct ShardedJob {
  std::string path, save_id, file_name;
  int rank = 0, world = 1;
  std::vector<ck::EntryRecord> entries;
  std::vector<Piece> owned;  // the pieces this rank writes
};

ShardedJob stage_sharded(const std::string& path, const CheckpointState& state,
                         const std::shared_ptr<torch::nn::Module>& fsdp_model, dist::ProcessGroup& group,
                         const CheckpointOptions& options, bool copy) {
  Failure error;  // (a file at `path` was replaced by save_checkpoint)
  if (group.rank() == 0) error = capture([&] { fs::create_directories(path); });
  agree(group, error, "save_checkpoint: creating " + path);
  ShardedJob job;
  job.path = path;
  job.rank = group.rank();
  job.world = group.size();
  job.save_id = group.broadcast_bytes(ck::new_save_id(), 0);
  job.file_name = data_file_name(job.save_id, job.rank);

  // This rank's pieces: views of its shards, no gather.
  std::vector<Piece> pieces;
  auto put = [&](const std::string& key, const StateValue& v) {
    if (std::holds_alternative<at::Tensor>(v)) {
      const auto& t = std::get<at::Tensor>(v);
      pieces.push_back({key, t.scalar_type(), t.sizes().vec(), std::vector<int64_t>(t.sizes().size(), 0), t});
      return;
    }
    const auto& st = std::get<ShardedTensor>(v);
    for (const auto& s : st.local_shards) pieces.push_back({key, st.dtype, st.global_shape, s.offsets, s.tensor});
  };
  error = capture([&] { job.entries = visit_state(state, fsdp_model, StateDictType::kSharded, options, put); });

  // [collective] Who writes what: a box held by several ranks (replicas,
  // tensors every rank has) is written by the lowest one.
  Json mine = Json::array();
  for (const auto& p : pieces) mine.push_back(Json{{"key", p.key}, {"offsets", p.offsets}, {"sizes", p.tensor.sizes().vec()}});
  const auto everyone = detail::gather_agreed(group, mine.dump(), error, "save_checkpoint: saving " + path);
  std::set<std::string> taken;  // key + box of lower ranks
  auto box_id = [](const Json& x) { return x["key"].get<std::string>() + "|" + x["offsets"].dump() + "|" + x["sizes"].dump(); };
  for (int r = 0; r < group.rank(); ++r) {
    for (const auto& x : Json::parse(everyone[static_cast<size_t>(r)])) taken.insert(box_id(x));
  }
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (!taken.insert(box_id(mine[i])).second) continue;
    Piece p = std::move(pieces[i]);
    p.tensor = copy ? p.tensor.detach().to(at::kCPU, /*non_blocking=*/false, /*copy=*/true).contiguous()
                    : p.tensor;  // async: a snapshot, training goes on
    job.owned.push_back(std::move(p));
  }
  return job;
}

// Writes this rank's data file; returns its outcome (detail::outcome): its
// chunks (JSON), or its failure.
std::string write_sharded(const ShardedJob& job) {
  Json chunks = Json::array();
  Failure error = capture([&] {
    ck::AtomicFile file((fs::path(job.path) / job.file_name).string());
    for (const Piece& p : job.owned) {
      const at::Tensor t = cpu_contiguous(p.tensor);
      const auto nbytes = static_cast<int64_t>(t.numel() * t.element_size());
      chunks.push_back(Json{{"key", p.key},
                            {"dtype", ck::dtype_name(p.dtype)},
                            {"shape", p.shape},
                            {"file", job.file_name},
                            {"offset", file.size()},
                            {"nbytes", nbytes},
                            {"offsets", p.offsets},
                            {"sizes", t.sizes().vec()},
                            {"crc32", ck::crc32(t.data_ptr(), static_cast<size_t>(nbytes))}});
      file.write(t.data_ptr(), static_cast<size_t>(nbytes));
      if (chunks.size() == 1) ck::crash_point("sharded-mid-data", job.rank);
    }
    file.commit();  // synced before the index can name it
  });
  return detail::outcome(chunks.dump(), error);
}

// [collective] Every rank's chunks to rank 0, which commits the index.
void commit_sharded(const ShardedJob& job, const std::string& report, dist::ProcessGroup& group) {
  const auto reports = group.all_gather_bytes(report);
  Failure failed;
  for (size_t r = 0; r < reports.size() && failed.empty(); ++r) {
    if (detail::outcome_failed(reports[r])) {
      failed = detail::prefixed(detail::outcome_failure(reports[r]), "rank " + std::to_string(r) + ": ");
    }
  }
  if (group.rank() == 0 && failed.empty()) {
    failed = capture([&] {
      ck::Index ix;
      ix.kind = "sharded";
      ix.world_size = job.world;
      ix.save_id = job.save_id;
      ix.entries = job.entries;
      for (int r = 0; r < job.world; ++r) ix.files.push_back(data_file_name(job.save_id, r));
      for (const auto& rep : reports) {
        for (const auto& c : Json::parse(detail::outcome_payload(rep))) {
          const std::string key = c["key"].get<std::string>();
          auto it = ix.tensors.find(key);
          if (it == ix.tensors.end()) {
            it = ix.tensors
                     .emplace(key, ck::TensorEntry{ck::parse_dtype(c["dtype"].get<std::string>(), "save"),
                                                   c["shape"].get<std::vector<int64_t>>(), {}})
                     .first;
            ix.tensor_order.push_back(key);
          }
          it->second.chunks.push_back(ck::Chunk{c["file"].get<std::string>(), c["offset"].get<int64_t>(),
                                                c["nbytes"].get<int64_t>(), c["offsets"].get<std::vector<int64_t>>(),
                                                c["sizes"].get<std::vector<int64_t>>(), c["crc32"].get<uint32_t>()});
        }
      }
      const std::string text = ck::to_json(ix);
      ck::AtomicFile index((fs::path(job.path) / ck::kIndexFile).string());
      index.write(text.data(), text.size());
      ck::crash_point("sharded-before-index", 0);
      index.commit();  // the commit point: the new index replaces the old one atomically
      ck::crash_point("sharded-after-index", 0);
      // The previous save's data files are no longer referenced; neither are
      // temporaries left by saves that were killed.
      static const std::regex stale("data-.*\\.bin|data-.*\\.bin\\.tmp-.*|index\\.json\\.tmp-.*");
      for (const auto& f : fs::directory_iterator(job.path)) {
        const std::string name = f.path().filename().string();
        if (std::regex_match(name, stale) && std::find(ix.files.begin(), ix.files.end(), name) == ix.files.end()) {
          fs::remove(f.path());
        }
      }
    });
  }
  failed = group.broadcast_bytes(failed, 0);
  if (!failed.empty()) {
    std::error_code ec;
    fs::remove(fs::path(job.path) / job.file_name, ec);  // never referenced by an index
    detail::rethrow(failed, "save_checkpoint: saving " + job.path + " failed (the previous checkpoint there is intact): ");
  }
}

// ---------------------------------------------------------------------------
// Loading.

struct Source {
  std::string path;
  std::string where;  // the index file, for messages
  ck::Index ix;
  std::unique_ptr<ck::FullReader> full;  // full format (and raw)
  std::string dir;                       // sharded format
  bool raw = false;  // a module state dict from torch.save (open_source's accept_raw): `full` only, no index

  const ck::EntryRecord* entry(const std::string& name) const {
    for (const auto& e : ix.entries) {
      if (e.name == name) return &e;
    }
    return nullptr;
  }
  const ck::TensorEntry& tensor(const std::string& key) const {
    auto it = ix.tensors.find(key);
    if (it == ix.tensors.end()) {
      throw ConfigError("checkpoint: " + where + ": the index lists '" + key + "' in an entry but has no tensor for it");
    }
    return it->second;
  }
  // Copies into `targets` (boxes of the tensor `key`) what the checkpoint
  // holds of them; returns the elements copied.
  int64_t fill(const std::string& key, std::vector<Shard>& targets) const {
    const auto& t = tensor(key);
    int64_t covered = 0;
    for (const auto& c : t.chunks) {
      bool needed = false;
      for (const auto& target : targets) {
        bool overlap = true;
        for (size_t d = 0; d < c.offsets.size(); ++d) {
          overlap &= std::max(c.offsets[d], target.offsets[d]) <
                     std::min(c.offsets[d] + c.sizes[d], target.offsets[d] + target.tensor.size(static_cast<int64_t>(d)));
        }
        needed |= overlap;
      }
      if (!needed) continue;
      std::string bytes = ck::read_chunk(c, key, full.get(), dir);
      at::Tensor src = at::from_blob(bytes.data(), c.sizes, at::TensorOptions().dtype(t.dtype));
      for (auto& target : targets) covered += copy_overlap(target.tensor, target.offsets, {Shard{c.offsets, src}});
    }
    return covered;
  }
  at::Tensor read_whole(const std::string& key) const {
    const auto& t = tensor(key);
    std::vector<Shard> target{Shard{std::vector<int64_t>(t.shape.size(), 0), at::empty(t.shape, at::TensorOptions().dtype(t.dtype))}};
    if (fill(key, target) != target[0].tensor.numel()) {
      throw ConfigError("checkpoint: " + where + ": the chunks of tensor '" + key +
                        "' do not cover it (a shard is missing from the index)");
    }
    return target[0].tensor;
  }
};

[[noreturn]] void not_a_checkpoint(const std::string& path, const std::string& why = "") {
  throw ConfigError("The path '" + path + "' does not point to a valid checkpoint. Make sure the path points to either "
                    "a directory with FSDP checkpoint shards, or a single file with a full checkpoint." +
                    (why.empty() ? "" : " (" + why + ")"));
}

// accept_raw: a PyTorch zip file without fsdp-cpp's index whose pickle may
// be a module's state dict (torch.save(model.state_dict()), torch::pickle_save
// of a dict) opens as a raw source; PyTorch's legacy format and TorchScript
// archives are then named as such.
std::unique_ptr<Source> open_source(const std::string& path, bool accept_raw = false) {
  auto s = std::make_unique<Source>();
  s->path = path;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    const fs::path index = fs::path(path) / ck::kIndexFile;
    if (!fs::is_regular_file(index, ec)) {
      for (const auto& f : fs::directory_iterator(path, ec)) {
        const std::string name = f.path().filename().string();
        if (name.rfind("data-", 0) == 0 || name.rfind("index.json.tmp", 0) == 0) {
          throw ConfigError("checkpoint: " + path + " holds an incomplete sharded checkpoint: it has data files but no "
                            "index.json (the save was interrupted before its commit); load an earlier checkpoint");
        }
      }
      not_a_checkpoint(path, "a directory without index.json");
    }
    s->where = index.string();
    const int64_t size = ck::file_size(s->where);
    if (size > (int64_t{1} << 30)) throw ConfigError("checkpoint: " + s->where + " is implausibly large");
    s->ix = ck::parse_index(ck::read_range(s->where, 0, size), s->where);
    if (s->ix.kind != "sharded") throw ConfigError("checkpoint: " + s->where + ": a directory's index must be of kind \"sharded\"");
    s->dir = path;
    return s;
  }
  if (!fs::is_regular_file(path, ec)) not_a_checkpoint(path);
  try {
    s->full = std::make_unique<ck::FullReader>(path);
  } catch (const ConfigError& e) {
    // torch.save(..., _use_new_zipfile_serialization=False): a bare pickle
    // that starts with the legacy format's magic number (a LONG1 of 10 bytes).
    if (accept_raw &&
        ck::read_range(path, 0, std::min<int64_t>(ck::file_size(path), 4)) == std::string("\x80\x02\x8a\x0a", 4)) {
      throw ConfigError("load_checkpoint: " + path + " is in PyTorch's legacy format (torch.save with "
                        "_use_new_zipfile_serialization=False), which fsdp-cpp does not read; save it again with "
                        "torch.save's default format");
    }
    not_a_checkpoint(path, e.what());
  }
  if (accept_raw && !s->full->has(ck::kFullIndexRecord) && s->full->has("data.pkl")) {
    if (s->full->has("constants.pkl")) {
      throw ConfigError("load_checkpoint: " + path + " is a TorchScript archive (torch.jit.save, or torch::save of a "
                        "module), not a state dict: load it with torch::load(module, path), or save "
                        "model.state_dict() with torch.save");
    }
    s->raw = true;
    s->where = path + " (record data.pkl)";
    return s;
  }
  if (!s->full->has(ck::kFullIndexRecord)) {
    not_a_checkpoint(path, "a PyTorch file without fsdp-cpp's index (not written by fsdp-cpp); a module's state "
                            "dict (torch.save(model.state_dict())) loads with load_checkpoint(path, module)");
  }
  s->where = path + " (record " + ck::kFullIndexRecord + ")";
  s->ix = ck::parse_index(s->full->read(ck::kFullIndexRecord), s->where);
  if (s->ix.kind != "full") throw ConfigError("checkpoint: " + s->where + ": a file's index must be of kind \"full\"");
  return s;
}

// The boxes this rank holds of every key of `model`'s state (SHARDED view),
// with the key's global shape.
struct LocalBoxes {
  std::string key;
  std::vector<int64_t> shape;
  std::vector<Shard> boxes;
};
std::vector<LocalBoxes> local_boxes(const std::shared_ptr<torch::nn::Module>& model) {
  std::vector<LocalBoxes> out;
  StateDictTypeGuard guard(model, StateDictType::kSharded);
  detail::visit_state_dict(model, "", [&](const std::string& key, StateValue v) {
    if (std::holds_alternative<at::Tensor>(v)) {
      const auto& t = std::get<at::Tensor>(v);
      out.push_back({key, t.sizes().vec(), {Shard{std::vector<int64_t>(static_cast<size_t>(t.dim()), 0), t}}});
    } else {
      const auto& st = std::get<ShardedTensor>(v);
      out.push_back({key, st.global_shape, st.local_shards});
    }
  });
  return out;
}

// Pieces of `key` for `boxes` (fresh tensors of the checkpoint's dtype), read from the source.
ShardedTensor read_pieces(const Source& src, const std::string& key, const std::vector<Shard>& boxes) {
  const auto& t = src.tensor(key);
  ShardedTensor st{t.shape, t.dtype, {}};
  for (const auto& b : boxes) st.local_shards.push_back(Shard{b.offsets, at::empty(b.tensor.sizes(), at::TensorOptions().dtype(t.dtype))});
  int64_t need = 0;
  for (const auto& s : st.local_shards) need += s.tensor.numel();
  if (src.fill(key, st.local_shards) != need) {
    throw ConfigError("checkpoint: " + src.where + ": tensor '" + key +
                      "' lacks elements this rank needs (a shard is missing from the index)");
  }
  return st;
}

void load_model(const Source& src, const std::string& entry, const std::shared_ptr<torch::nn::Module>& model,
                bool strict) {
  const ck::EntryRecord* rec = src.entry(entry);
  StateDict sd;
  std::set<std::string> wanted;
  for (auto& [key, shape, boxes] : local_boxes(model)) {
    wanted.insert(key);
    const std::string tkey = entry + "/" + key;
    if (!src.ix.tensors.count(tkey)) continue;  // missing: load_state_dict reports it
    const auto& t = src.tensor(tkey);
    if (t.shape != shape) {
      sd.insert(key, ShardedTensor{t.shape, t.dtype, {}});  // reported as a size mismatch
      continue;
    }
    sd.insert(key, read_pieces(src, tkey, boxes));
  }
  if (rec) {
    for (const auto& k : rec->keys) {
      if (!wanted.count(k)) sd.insert(k, ShardedTensor{src.tensor(entry + "/" + k).shape, at::kFloat, {}});
    }
  }
  StateDictTypeGuard guard(model, StateDictType::kSharded);
  load_state_dict(model, sd, strict);
}

// Lightning's load_raw: the state dict of a raw source (open_source's
// accept_raw) into `model`, wrapped or not, at any world size. Every rank
// parses the pickle and reads, one tensor at a time, the tensors its shards
// overlap.
void load_raw_model(const Source& src, const std::shared_ptr<torch::nn::Module>& model, bool strict) {
  const ck::FullReader& zip = *src.full;
  const auto pickle = detail::pickle::parse(zip.read("data.pkl"), src.where);
  const auto& root = pickle.root();
  using Kind = detail::pickle::Value::Kind;
  if (root.kind != Kind::kDict) {
    throw ConfigError("load_checkpoint: " + zip.path() + " holds " + detail::pickle::describe(root) +
                      ", not a state dict (a dict from names to tensors, as torch.save(model.state_dict()) writes)");
  }
  std::map<std::string, const detail::pickle::TensorRef*> tensors;
  std::vector<std::string> order;
  for (const auto& [k, v] : root.entries) {
    if (k->kind != Kind::kString) {
      throw ConfigError("load_checkpoint: " + zip.path() + " holds a dict with the key " + detail::pickle::describe(*k) +
                        ": not a state dict (its keys are parameter and buffer names)");
    }
    if (v->kind != Kind::kTensor) {
      throw ConfigError("load_checkpoint: " + zip.path() + ": '" + k->text + "' is " + detail::pickle::describe(*v) +
                        ", not a tensor: the file is not a module's state dict" +
                        (v->kind == Kind::kDict ? " (a checkpoint holding one? Load it with a CheckpointState, or "
                                                  "save model.state_dict() alone)"
                                                : ""));
    }
    tensors[k->text] = &v->tensor;
    order.push_back(k->text);
  }
  detail::pickle::check_byte_order(zip);
  StateDict sd;
  std::set<std::string> wanted;
  for (auto& [key, shape, boxes] : local_boxes(model)) {
    wanted.insert(key);
    auto it = tensors.find(key);
    if (it == tensors.end()) continue;  // missing: load_state_dict reports it
    const auto& ref = *it->second;
    if (ref.sizes != shape) {
      sd.insert(key, ShardedTensor{ref.sizes, ref.dtype, {}});  // reported as a size mismatch
      continue;
    }
    const at::Tensor whole = detail::pickle::read_tensor(zip, ref, "tensor '" + key + "'");
    ShardedTensor st{shape, ref.dtype, {}};
    for (const auto& b : boxes) {
      Shard piece{b.offsets, at::empty(b.tensor.sizes(), at::TensorOptions().dtype(ref.dtype))};
      copy_overlap(piece.tensor, piece.offsets, {Shard{std::vector<int64_t>(shape.size(), 0), whole}});
      st.local_shards.push_back(std::move(piece));
    }
    sd.insert(key, std::move(st));
  }
  for (const auto& k : order) {
    if (!wanted.count(k)) sd.insert(k, ShardedTensor{tensors[k]->sizes, tensors[k]->dtype, {}});
  }
  StateDictTypeGuard guard(model, StateDictType::kSharded);
  load_state_dict(model, sd, strict);
}

void load_optimizer(const Source& src, const std::string& entry, const std::shared_ptr<torch::nn::Module>& model,
                    torch::optim::Optimizer& optimizer) {
  const ck::EntryRecord* rec = src.entry(entry);
  std::map<std::string, LocalBoxes> boxes;
  for (auto& b : local_boxes(model)) boxes.emplace(b.key, std::move(b));
  OptimStateDict osd;
  for (const auto& k : rec->keys) {
    const std::string tkey = entry + "/" + k;
    const auto& t = src.tensor(tkey);
    const auto dot = k.rfind('.');
    auto it = dot == std::string::npos ? boxes.end() : boxes.find(k.substr(0, dot));
    if (it == boxes.end()) {
      osd.state.insert(k, ShardedTensor{t.shape, t.dtype, {}});  // not a parameter: reported as unexpected
      continue;
    }
    // State shaped like its parameter: this rank's boxes of it; anything else (step): whole.
    if (t.shape == it->second.shape) {
      osd.state.insert(k, read_pieces(src, tkey, it->second.boxes));
    } else {
      osd.state.insert(k, src.read_whole(tkey));
    }
  }
  for (const auto& g : Json::parse(rec->param_groups)) {
    OptimParamGroup pg;
    pg.params = g["params"].get<std::vector<std::string>>();
    for (const auto& [name, v] : g["options"].items()) pg.options[name] = v.get<double>();
    osd.param_groups.push_back(std::move(pg));
  }
  load_optim_state_dict(model, optimizer, osd);
}

CheckpointValue read_value(const Source& src, const ck::EntryRecord& e) {
  const Json v = e.type == "str" || e.type == "tensor" ? Json() : Json::parse(e.value);
  if (e.type == "int") return v.get<int64_t>();
  if (e.type == "float") return v.is_string() ? std::stod(v.get<std::string>()) : v.get<double>();
  if (e.type == "bool") return v.get<bool>();
  if (e.type == "str") return e.value;
  return src.read_whole(e.name);
}

}  // namespace

namespace {

// Swaps what `a` and `b` name, atomically (a file and a directory included:
// Linux's renameat2 RENAME_EXCHANGE), then syncs their directory.
void exchange_paths(const std::string& a, const std::string& b) {
  if (::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE) != 0) {
    const int err = errno;
    throw Error("save_checkpoint: cannot swap " + a + " and " + b + " in one step (renameat2 RENAME_EXCHANGE: " +
                std::strerror(err) + ")" +
                (err == EINVAL || err == ENOSYS ? ": this file system cannot; remove the old checkpoint first" : ""));
  }
  ck::sync_dir(fs::path(b).parent_path().empty() ? "." : fs::path(b).parent_path().string());
}

}  // namespace

void save_checkpoint(const std::string& path, const CheckpointState& state, dist::ProcessGroup& group,
                     const CheckpointOptions& options) {
  auto [name, model] = the_fsdp_model(state, "save");
  wait_for_checkpoint(group);  // one save at a time
  // A checkpoint of the other format at `path` (Lightning replaces it): the
  // new one is saved complete beside it, swapped in atomically, and only
  // then is the old one removed. An interruption leaves one of the two at
  // `path`, whole.
  std::string other;
  if (group.rank() == 0) {
    std::error_code ec;
    // What a killed replacement left beside `path` is not a checkpoint: gone.
    const fs::path target(path);
    const std::string stale = target.filename().string() + ".fsdp-new-";
    const fs::path parent = target.parent_path().empty() ? fs::path(".") : target.parent_path();
    for (const auto& e : fs::directory_iterator(parent, ec)) {
      if (e.path().filename().string().rfind(stale, 0) == 0) fs::remove_all(e.path(), ec);
    }
    const bool full = options.format() == CheckpointFormat::kFull;
    if (full ? is_sharded_checkpoint(path) : (fs::exists(path, ec) && !fs::is_directory(path, ec))) other = "1";
  }
  if (!group.broadcast_bytes(other, 0).empty()) {  // [collective]
    if (options.async_save()) {
      throw ConfigError("save_checkpoint: " + path + " holds a checkpoint of the other format; replacing it is done "
                        "synchronously: save with async_save=false (or to another path)");
    }
    const std::string staging = path + ".fsdp-new-" + group.broadcast_bytes(ck::new_save_id(), 0);
    save_checkpoint(staging, state, group, options);  // [collective] complete and committed there
    Failure error;
    if (group.rank() == 0) {
      error = capture([&] {
        ck::crash_point("replace-before-exchange", 0);
        exchange_paths(staging, path);  // the commit point: `path` is the new checkpoint
        ck::crash_point("replace-after-exchange", 0);
        fs::remove_all(staging);  // the old one, now under the staging name
      });
    }
    agree(group, error, "save_checkpoint: replacing " + path);
    return;
  }
  if (options.format() == CheckpointFormat::kFull) {
    save_full(path, state, model, group, options);
    return;
  }
  auto job = std::make_shared<ShardedJob>(stage_sharded(path, state, model, group, options, options.async_save()));
  if (!options.async_save()) {
    commit_sharded(*job, write_sharded(*job), group);
    return;
  }
  PendingSave pending;
  pending.write = std::async(std::launch::async, [job] { return write_sharded(*job); });
  pending.commit = [job, g = &group](const std::string& report) { commit_sharded(*job, report, *g); };
  std::lock_guard<std::mutex> lock(pending_mutex());
  pending_saves()[&group] = std::move(pending);
}

void wait_for_checkpoint(dist::ProcessGroup& group) {
  PendingSave pending;
  {
    std::lock_guard<std::mutex> lock(pending_mutex());
    auto it = pending_saves().find(&group);
    if (it == pending_saves().end()) return;
    pending = std::move(it->second);
    pending_saves().erase(it);
  }
  pending.commit(pending.write.get());
}

bool checkpoint_pending(const dist::ProcessGroup& group) {
  std::lock_guard<std::mutex> lock(pending_mutex());
  return pending_saves().count(&group) > 0;
}

std::map<std::string, CheckpointValue> load_checkpoint(const std::string& path, CheckpointState& state,
                                                       dist::ProcessGroup& group, bool strict) {
  wait_for_checkpoint(group);
  if (state.entries().empty()) {
    throw ConfigError("Got load_checkpoint(..., state) with an empty state, but a state with at least a model "
                      "instance to reload is required. Pass it in like so: load_checkpoint(path, "
                      "fsdp::CheckpointState().model(\"model\", model.ptr()), group)");
  }
  std::shared_ptr<torch::nn::Module> model;
  std::string model_name;
  bool has_fsdp = false;
  for (const auto& [n, m] : state.models()) has_fsdp |= has_fsdp_units(m);
  if (has_fsdp || state.models().size() != 1) {
    std::tie(model_name, model) = the_fsdp_model(state, "load");
  } else {  // an unwrapped model: loads as well (Lightning requires FSDP here)
    model_name = state.models().begin()->first;
    model = state.models().begin()->second;
  }
  std::map<std::string, CheckpointValue> leftovers;
  Failure error = capture([&] {
    auto src = open_source(path);
    std::vector<std::string> missing;
    for (const auto& e : state.entries()) {
      const ck::EntryRecord* rec = src->entry(e.name);
      if (!rec) {
        missing.push_back(e.name);
        continue;
      }
      const bool is_model = e.kind == CheckpointState::Entry::kModel, is_optim = e.kind == CheckpointState::Entry::kOptimizer;
      if ((is_model && rec->type != "model") || (is_optim && rec->type != "optimizer") ||
          (!is_model && !is_optim && (rec->type == "model" || rec->type == "optimizer"))) {
        throw ConfigError("load_checkpoint: entry '" + e.name + "' is a " + rec->type + " in " + path +
                          ", but the state asks for a " + (is_model ? "model" : is_optim ? "optimizer" : "value"));
      }
    }
    if (strict && !missing.empty()) {
      throw ConfigError("The requested state contains a key '" + missing.front() +
                        "' that does not exist in the loaded checkpoint. To disable strict loading, set strict=False.");
    }
    for (const auto& e : state.entries()) {
      if (!src->entry(e.name)) continue;
      if (e.kind == CheckpointState::Entry::kModel) {
        load_model(*src, e.name, state.models().at(e.name), strict);
      } else if (e.kind == CheckpointState::Entry::kOptimizer) {
        load_optimizer(*src, e.name, model, *state.optimizers().at(e.name));
      } else {
        state.mutable_values()[e.name] = read_value(*src, *src->entry(e.name));
      }
    }
    for (const auto& rec : src->ix.entries) {
      if (rec.type == "model" || rec.type == "optimizer") continue;
      bool requested = false;
      for (const auto& e : state.entries()) requested |= e.name == rec.name;
      if (!requested) leftovers[rec.name] = read_value(*src, rec);
    }
  });
  agree(group, error, "load_checkpoint of " + path);
  return leftovers;
}

void load_checkpoint(const std::string& path, const std::shared_ptr<torch::nn::Module>& module,
                     dist::ProcessGroup& group, bool strict) {
  if (!module) throw ConfigError("load_checkpoint: the module is null");
  wait_for_checkpoint(group);
  Failure error = capture([&] {
    auto src = open_source(path, /*accept_raw=*/true);
    if (src->raw) {
      load_raw_model(*src, module, strict);
      return;
    }
    const ck::EntryRecord* model = nullptr;
    for (const auto& e : src->ix.entries) {
      if (e.type != "model") continue;
      if (model) throw ConfigError("load_checkpoint: " + path + " holds several models; load it with a CheckpointState naming one");
      model = &e;
    }
    if (!model) throw ConfigError("load_checkpoint: " + path + " holds no model");
    load_model(*src, model->name, module, strict);
  });
  agree(group, error, "load_checkpoint of " + path);
}

CheckpointInfo inspect_checkpoint(const std::string& path) {
  auto src = open_source(path);
  CheckpointInfo info;
  info.format = src->full ? CheckpointFormat::kFull : CheckpointFormat::kSharded;
  info.version = src->ix.version;
  info.world_size = src->ix.world_size;
  for (const auto& e : src->ix.entries) {
    if (e.type == "model" || e.type == "optimizer") continue;
    info.values[e.name] = e.type == "tensor" ? "<tensor>" : e.value;
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
  std::unique_ptr<Source> src;
  try {
    src = open_source(path);
  } catch (const std::exception& e) {
    return {e.what()};
  }
  for (const auto& f : src->ix.files) {
    if (ck::file_size((fs::path(path) / f).string()) < 0) problems.push_back("missing data file " + f);
  }
  for (const auto& key : src->ix.tensor_order) {
    const auto& t = src->ix.tensors.at(key);
    int64_t covered = 0;
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
  auto src = open_source(sharded_dir);
  if (src->full) throw ConfigError("consolidate: " + sharded_dir + " is already a full checkpoint");
  FullFileWriter out(out_file, src->ix.world_size);
  for (const auto& key : src->ix.tensor_order) out.add(key, src->read_whole(key));  // one tensor in memory at a time
  out.finish(src->ix.entries);
  if (!out.error().empty()) throw Error("consolidate: writing " + out_file + " failed: " + out.error());
}

}  // namespace fsdp
