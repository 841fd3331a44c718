// The full format's writer: one PyTorch zip file that rank 0 writes as the
// state is gathered unit by unit (docs/checkpoint-format.md).
#include <ATen/ATen.h>
#include <caffe2/serialize/inline_container.h>

#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <filesystem>

#include "fsdp/checkpoint/checkpoint_io.h"
#include "parts.h"
#include "fsdp/fault_points/fault_points.h"
#include "fsdp/error.h"

namespace fsdp::detail {

namespace fs = std::filesystem;

namespace {

// Gives freed heap memory back to the system. glibc keeps freed blocks of a
// few MiB in its heaps (its mmap threshold grows with the blocks freed), so
// without this the unit-sized buffers of a streamed save pile up in rank 0's
// resident memory although only one is alive at a time.
void release_free_memory() {
#ifdef __GLIBC__
  malloc_trim(0);
#endif
}

}  // namespace

FullFileWriter::FullFileWriter(const std::string& path, int world_size) {
  ix_.kind = formats::Index::Kind::kFull;
  ix_.world_size = world_size;
  ix_.save_id = formats::new_save_id();
  keep_first_error(capture([&] {
    fs::path parent = fs::path(path).parent_path();
    if (!parent.empty()) fs::create_directories(parent);
    file_ = std::make_unique<formats::AtomicFile>(path);
    // Write errors are remembered and the rest is discarded (the zip writer
    // must not see a failure: it would throw from its destructor).
    zip_ = std::make_unique<caffe2::serialize::PyTorchStreamWriter>([this](const void* data, size_t n) -> size_t {
      if (error_.empty()) keep_first_error(capture([&] { file_->write(data, n); }));
      return n;
    });
  }));
}

FullFileWriter::~FullFileWriter() {
  zip_.reset();
  file_.reset();
}

void FullFileWriter::add(const std::string& key, const at::Tensor& tensor) {
  if (!error_.empty()) return;
  keep_first_error(capture([&] {
    const at::Tensor t = tensor.detach().cpu().contiguous();
    formats::dtype_name(t.scalar_type());  // refuses dtypes the format has no name for
    const auto nbytes = static_cast<int64_t>(t.numel() * t.element_size());
    const std::string record = "data/" + std::to_string(next_++);
    formats::Chunk c{record, 0, nbytes, std::vector<int64_t>(t.sizes().size(), 0), t.sizes().vec(),
                formats::crc32(t.data_ptr(), static_cast<size_t>(nbytes))};
    zip_->writeRecord(record, t.data_ptr(), static_cast<size_t>(nbytes));
    if (next_ == 1) fault_point("full-after-first-record", 0);
    release_free_memory();
    ix_.tensors.emplace(key, formats::TensorEntry{t.scalar_type(), t.sizes().vec(), {c}});
    ix_.tensor_order.push_back(key);
    record_of_[key] = record;
  }));
}

void FullFileWriter::finish(std::vector<formats::EntryRecord> entries) {
  if (!error_.empty()) return;
  ix_.entries = std::move(entries);
  keep_first_error(capture([&] {
    const std::string pickle = full_pickle(ix_, record_of_);
    zip_->writeRecord("data.pkl", pickle.data(), pickle.size());
    const std::string index = formats::to_json(ix_);
    zip_->writeRecord(formats::kFullIndexRecord, index.data(), index.size());
    zip_->writeEndOfFile();
  }));
  fault_point("full-before-commit", 0);
  if (error_.empty()) keep_first_error(capture([&] { file_->commit(); }));
}

// A write error caught inside the zip writer's callback comes first; the
// call that triggered it may itself end normally and must not clear it.
void FullFileWriter::keep_first_error(const Failure& e) {
  if (error_.empty()) error_ = e;
}

namespace {

std::string save_failed(const std::string& path) { return "save_checkpoint: saving " + path + " failed: "; }

// Rank 0 keeps a copy of the gathered state and writes it in the background.
void start_async_full(const std::string& path, const CheckpointState& state,
                      const std::shared_ptr<torch::nn::Module>& fsdp_model, dist::ProcessGroup& group,
                      const CheckpointOptions& options) {
  const bool writer = group.rank() == 0;
  auto staged = std::make_shared<std::vector<std::pair<std::string, at::Tensor>>>();
  auto entries = std::make_shared<std::vector<formats::EntryRecord>>();
  auto stage = [&](const std::string& k, const StateValue& v) {
    if (writer) staged->emplace_back(k, std::get<at::Tensor>(v).detach().to(at::kCPU, false, /*copy=*/true));
  };
  const Failure error = capture([&] { *entries = visit_state(state, fsdp_model, StateDictType::kFull, options, stage); });
  if (!error.empty()) return agree_from(group, 0, error, save_failed(path));  // [collective]
  const int world = group.size();
  auto report = std::make_shared<Failure>();
  PendingSave pending;
  pending.write = std::async(std::launch::async, [path, world, writer, staged, entries, report] {
    if (!writer) return;
    FullFileWriter out(path, world);
    for (const auto& [k, t] : *staged) out.add(k, t);
    out.finish(std::move(*entries));
    *report = out.error();
  });
  pending.commit = [path, report, g = &group] { agree_from(*g, 0, *report, save_failed(path)); };
  set_pending_save(group, std::move(pending));
}

}  // namespace

void save_full(const std::string& path, const CheckpointState& state,
               const std::shared_ptr<torch::nn::Module>& fsdp_model, dist::ProcessGroup& group,
               const CheckpointOptions& options) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {  // (a sharded checkpoint there was replaced by save_checkpoint)
    throw ConfigError("save_checkpoint: The checkpoint path exists and is a directory: " + path);
  }
  if (options.async_save()) return start_async_full(path, state, fsdp_model, group, options);
  std::unique_ptr<FullFileWriter> out;
  if (group.rank() == 0) out = std::make_unique<FullFileWriter>(path, group.size());
  auto put = [&](const std::string& key, const StateValue& v) {
    if (out) out->add(key, std::get<at::Tensor>(v));
  };
  // [collective] gathers run on every rank; only rank 0 writes, as they come.
  std::vector<formats::EntryRecord> entries;
  Failure error = capture([&] { entries = visit_state(state, fsdp_model, StateDictType::kFull, options, put); });
  if (out) {
    if (error.empty()) out->finish(std::move(entries));
    if (error.empty()) error = out->error();
    out.reset();  // an uncommitted temporary is removed
  }
  agree_from(group, 0, error, save_failed(path));  // [collective]
}

}  // namespace fsdp::detail
