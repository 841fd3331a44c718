// A torch.save zip as a storage (readers.h, FullPickleReader): fsdp-cpp's
// full file (its index record), a full checkpoint that PyTorch or Lightning
// wrote (its pickle: pickled.cpp), or a module's state dict (a raw source).
#include <ATen/ATen.h>

#include <filesystem>

#include "fsdp/error.h"
#include "readers.h"

namespace fsdp::detail {

namespace {

// The tensors of a raw source's pickle, by key and in order; ConfigError
// naming the file when it is not a module's state dict.
struct RawTensors {
  std::map<std::string, const formats::pickle::TensorRef*> by_key;
  std::vector<std::string> order;
};
RawTensors raw_tensors(const formats::FullReader& zip, const formats::pickle::Value& root) {
  using Kind = formats::pickle::Value::Kind;
  if (root.kind != Kind::kDict) {
    throw ConfigError("load_checkpoint: " + zip.path() + " holds " + formats::pickle::describe(root) +
                      ", not a state dict (a dict from names to tensors, as torch.save(model.state_dict()) writes)");
  }
  RawTensors out;
  for (const auto& [k, v] : root.entries) {
    if (k->kind != Kind::kString) {
      throw ConfigError("load_checkpoint: " + zip.path() + " holds a dict with the key " +
                        formats::pickle::describe(*k) + ": not a state dict (its keys are parameter and buffer names)");
    }
    if (v->kind != Kind::kTensor) {
      throw ConfigError("load_checkpoint: " + zip.path() + ": '" + k->text + "' is " + formats::pickle::describe(*v) +
                        ", not a tensor: the file is not a module's state dict" +
                        (v->kind == Kind::kDict ? " (a checkpoint holding one? Load it with a CheckpointState, or "
                                                  "save model.state_dict() alone)"
                                                : ""));
    }
    out.by_key[k->text] = &v->tensor();
    out.order.push_back(k->text);
  }
  return out;
}

}  // namespace

bool FullPickleReader::claims(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return false;
  try {
    formats::FullReader zip(path);  // reads the zip's directory
    return true;
  } catch (const ConfigError&) {
    return false;
  }
}

FullPickleReader::~FullPickleReader() = default;

// Lightning's load_raw: a torch.save'd module state dict as a raw source.
// Parses the file's pickle.
void FullPickleReader::index_raw() {
  const auto parsed = formats::pickle::parse(full_->read("data.pkl"), where_);
  const RawTensors tensors = raw_tensors(*full_, parsed.root());
  formats::pickle::check_byte_order(*full_);
  add_module_entry(ix_);
  for (const auto& k : tensors.order) {
    const auto& ref = *tensors.by_key.at(k);
    add_module_tensor(ix_, k, ref.dtype, ref.sizes);
    pickled_.emplace("model/" + k, ref);
  }
}

FullPickleReader::FullPickleReader(const std::string& path, bool module_state) {
  path_ = path;
  try {
    full_ = std::make_unique<formats::FullReader>(path);
  } catch (const ConfigError& e) {
    not_a_checkpoint(path, e.what());  // (it opened when detected: the file changed since)
  }
  if (module_state && !full_->has(formats::kFullIndexRecord) && full_->has("data.pkl")) {
    if (full_->has("constants.pkl")) {
      throw ConfigError("load_checkpoint: " + path + " is a TorchScript archive (torch.jit.save, or torch::save of a "
                        "module), not a state dict: load it with torch::load(module, path), or save "
                        "model.state_dict() with torch.save");
    }
    raw_ = true;
    where_ = path + " (record data.pkl)";
    index_raw();
    return;
  }
  if (!full_->has(formats::kFullIndexRecord)) {
    if (!full_->has("data.pkl") || full_->has("constants.pkl")) {
      not_a_checkpoint(path, "a zip file that is neither a checkpoint nor a torch.save file");
    }
    where_ = path + " (record data.pkl)";
    index_pickled();  // written by PyTorch or Lightning
    return;
  }
  where_ = path + " (record " + formats::kFullIndexRecord + ")";
  ix_ = formats::parse_index(full_->read(formats::kFullIndexRecord), where_);
  if (ix_.kind != formats::Index::Kind::kFull) {
    throw ConfigError("checkpoint: " + where_ + ": a file's index must be of kind \"full\"");
  }
}

at::Tensor FullPickleReader::read_chunk(const std::string& key, size_t chunk) const {
  if (auto p = pickled_.find(key); p != pickled_.end()) {  // written by PyTorch: a view of a storage record
    const std::string name = raw_ ? key.substr(key.find('/') + 1) : key;  // a raw source's keys are the module's
    return formats::pickle::read_tensor(*full_, p->second, "tensor '" + name + "'");
  }
  return read_indexed_chunk(key, chunk, full_.get(), "");
}

// Every record against the zip's CRC-32 (tensor data: with the chunks,
// verify_tensors), then the tensors.
void FullPickleReader::verify(std::vector<std::string>& problems) const {
  try {
    for (const auto& record : full_->records()) {
      if (record.rfind("data/", 0) != 0) full_->read(record);
    }
  } catch (const std::exception& e) {
    problems.push_back(e.what());
  }
  verify_tensors(*this, problems);
}

}  // namespace fsdp::detail
