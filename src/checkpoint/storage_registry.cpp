// The registry of storage formats (fsdp/checkpoint/storage_registry.h): the
// built-in formats, one per reader class (readers.h), the formats users
// register, and the detection that asks each of them whether a path is its
// own.
#include "fsdp/checkpoint/storage_registry.h"

#include <algorithm>
#include <filesystem>
#include <mutex>

#include "fsdp/checkpoint/hf_storage.h"
#include "fsdp/error.h"
#include "loading.h"
#include "readers.h"

namespace fsdp {

namespace fs = std::filesystem;

std::vector<StorageBox> StorageReader::chunks(const std::string& key) const {
  std::vector<StorageBox> out;
  auto it = index().tensors.find(key);
  if (it == index().tensors.end()) return out;
  for (const auto& c : it->second.chunks) out.push_back({c.offsets, c.sizes});
  return out;
}

bool StorageReader::keyed_by_ids(const std::string&) const { return false; }

namespace {

// A built-in format: its reader class's claims and constructor.
template <typename Claims, typename Open>
class BuiltinFormat : public StorageFormat {
 public:
  BuiltinFormat(std::string name, Claims claims, Open open)
      : name_(std::move(name)), claims_(std::move(claims)), open_(std::move(open)) {}
  std::string name() const override { return name_; }
  bool claims(const std::string& path, const DetectOptions& o) const override { return claims_(path, o); }
  std::unique_ptr<StorageReader> open(const std::string& path, const DetectOptions& o) const override {
    return open_(path, o);
  }

 private:
  std::string name_;
  Claims claims_;
  Open open_;
};

template <typename Claims, typename Open>
std::shared_ptr<const StorageFormat> builtin(std::string name, Claims claims, Open open) {
  return std::make_shared<BuiltinFormat<Claims, Open>>(std::move(name), std::move(claims), std::move(open));
}

bool is_directory(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec);
}

std::vector<std::shared_ptr<const StorageFormat>> builtin_formats() {
  using detail::not_a_checkpoint;
  return {
      builtin(
          "dcp", [](const std::string& p, const DetectOptions&) { return is_directory(p) && detail::DcpReader::claims(p); },
          [](const std::string& p, const DetectOptions&) { return std::make_unique<detail::DcpReader>(p); }),
      builtin(
          "fsdp-sharded",
          [](const std::string& p, const DetectOptions&) { return is_directory(p) && detail::ShardedDirReader::claims(p); },
          [](const std::string& p, const DetectOptions&) { return std::make_unique<detail::ShardedDirReader>(p); }),
      builtin(
          "hf", [](const std::string& p, const DetectOptions&) { return is_hf_model_dir(p); },
          [](const std::string& p, const DetectOptions&) { return std::make_unique<HfStorageReader>(p); }),
      builtin(
          "safetensors",
          [](const std::string& p, const DetectOptions& o) {
            return detail::SafetensorsFileReader::claims(p, o.module_state);
          },
          [](const std::string& p, const DetectOptions& o) -> std::unique_ptr<StorageReader> {
            if (!o.module_state) {
              not_a_checkpoint(p, "a safetensors file, which holds a model's weights only: it loads with "
                                  "load_checkpoint(path, module)");
            }
            return std::make_unique<detail::SafetensorsFileReader>(p);
          }),
      builtin(
          "full-pickle",
          [](const std::string& p, const DetectOptions& o) {
            // A file named *.safetensors is the safetensors reader's where a
            // module loads (its errors name what is wrong with the file).
            if (o.module_state && fs::path(p).extension() == ".safetensors") return false;
            return detail::FullPickleReader::claims(p);
          },
          [](const std::string& p, const DetectOptions& o) {
            return std::make_unique<detail::FullPickleReader>(p, o.module_state);
          }),
  };
}

struct Registry {
  std::mutex mu;
  std::vector<std::shared_ptr<const StorageFormat>> formats = builtin_formats();
  const size_t builtins = formats.size();
};

Registry& registry() {
  static Registry r;
  return r;
}

std::vector<std::shared_ptr<const StorageFormat>> registered() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.formats;
}

// The error for a path no format claims, saying what is there.
[[noreturn]] void unknown_format(const std::string& path, const DetectOptions& options) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    detail::refuse_incomplete_sharded(path);
    detail::not_a_checkpoint(path, "a directory without .metadata or index.json");
  }
  if (!fs::is_regular_file(path, ec)) detail::not_a_checkpoint(path);
  const int64_t size = formats::file_size(path);
  const std::string head = formats::read_range(path, 0, std::min<int64_t>(size, 64));
  try {
    formats::FullReader zip(path);
  } catch (const ConfigError& e) {
    // torch.save(..., _use_new_zipfile_serialization=False): a bare pickle
    // that starts with the legacy format's magic number (a LONG1 of 10 bytes).
    if (options.module_state && head.compare(0, 4, std::string("\x80\x02\x8a\x0a", 4)) == 0) {
      throw ConfigError("load_checkpoint: " + path + " is in PyTorch's legacy format (torch.save with "
                        "_use_new_zipfile_serialization=False), which fsdp-cpp does not read; save it again with "
                        "torch.save's default format");
    }
    detail::not_a_checkpoint(path, e.what());
  }
  detail::not_a_checkpoint(path);
}

}  // namespace

void register_storage_format(std::shared_ptr<const StorageFormat> format) {
  if (!format) throw ConfigError("register_storage_format: the format is null");
  const std::string name = format->name();
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (const auto& f : r.formats) {
    if (f->name() == name) {
      throw ConfigError("register_storage_format: a storage format named '" + name + "' is already registered");
    }
  }
  r.formats.push_back(std::move(format));
}

bool unregister_storage_format(const std::string& name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (size_t i = 0; i < r.formats.size(); ++i) {
    if (r.formats[i]->name() != name) continue;
    if (i < r.builtins) {
      throw ConfigError("unregister_storage_format: '" + name + "' is a built-in format; it cannot be removed");
    }
    r.formats.erase(r.formats.begin() + static_cast<std::ptrdiff_t>(i));
    return true;
  }
  return false;
}

std::vector<std::string> storage_format_names() {
  std::vector<std::string> out;
  for (const auto& f : registered()) out.push_back(f->name());
  return out;
}

std::shared_ptr<const StorageFormat> detect_storage_format(const std::string& path, const DetectOptions& options) {
  std::vector<std::shared_ptr<const StorageFormat>> claimed;
  for (const auto& f : registered()) {
    if (f->claims(path, options)) claimed.push_back(f);
  }
  if (claimed.empty()) unknown_format(path, options);
  if (claimed.size() > 1) {
    std::string names;
    for (size_t i = 0; i < claimed.size(); ++i) {
      names += (i == 0 ? "" : i + 1 == claimed.size() ? "' and '" : "', '") + claimed[i]->name();
    }
    throw ConfigError("checkpoint: " + path + " is claimed by several storage formats: '" + names +
                      "'. Unregister all but one (unregister_storage_format), or open it with the reader of "
                      "one and load from that (load_checkpoint(reader, ...))");
  }
  return claimed.front();
}

std::unique_ptr<StorageReader> open_checkpoint_storage(const std::string& path, const DetectOptions& options) {
  return detect_storage_format(path, options)->open(path, options);
}

std::unique_ptr<StorageReader> open_checkpoint_storage(const std::string& path) {
  return open_checkpoint_storage(path, DetectOptions{});
}

}  // namespace fsdp
