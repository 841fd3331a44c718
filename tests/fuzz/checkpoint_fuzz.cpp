// libFuzzer targets for every parser of checkpoint files (issue 9):
//   FSDP_FUZZ_INDEX    the index (index.json / the full file's fsdp/index.json):
//                      the input as it is (its checksum), then resealed (a
//                      matching checksum) to reach the checks behind it; an
//                      index it accepts must encode back into one it accepts
//   FSDP_FUZZ_FULL     a whole full checkpoint file (PyTorch zip: LibTorch's
//                      reader and miniz, then our index, records, checksums)
//   FSDP_FUZZ_SHARDED  a whole sharded checkpoint directory (index + data files;
//                      for inputs whose last byte is odd, the index resealed
//                      and its .metadata checksum made to match)
//   FSDP_FUZZ_PICKLE   the pickle of a torch.save file (the restricted unpickler
//                      that reads module state dicts written by Python)
//   FSDP_FUZZ_SAFETENSORS  a safetensors file (its header's parser, every
//                      tensor read from it, and load_checkpoint(path, module))
//   FSDP_FUZZ_DCP      a DCP directory's .metadata (the unpickler's DCP mode and
//                      the typed records built from it)
// Full and sharded inputs are inspected, verified and loaded into a small
// model and optimizer, and into the model alone (a full input without
// fsdp-cpp's index is read as a module state dict, torch.save's). An fsdp::Error (ConfigError or Error: the refusal of
// bad bytes, naming the file) is the expected outcome; a crash, a hang, an
// out-of-bounds access (AddressSanitizer), any other exception, or an
// allocation beyond libFuzzer's -malloc_limit_mb is a finding. Built by scripts/fuzz.sh with clang; see docs/reliability.md.
//
// Memory (issue 28 item 5): the pickle, dcp, index and safetensors targets
// count the heap their parser takes (ASan's malloc and free hooks, on the
// fuzzing thread) and report a finding when its peak exceeds twice the
// parser's budget for the input's size (torch_pickle.h's parse_budget,
// format.h's json_budget): the budget is an estimate of the
// allocator's bytes, and a vector's growth holds its old and new storage at
// once. The pickle target also checks the bytes the parse charged against
// the budget itself.
//
// With FSDP_FUZZ_SEEDS=<dir> in the environment, the target first writes real
// checkpoints of its model (the seed corpus) into <dir>.
#include <nlohmann/json.hpp>
#include <sanitizer/allocator_interface.h>
#include <torch/torch.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>

#include "fsdp/formats/dcp.h"
#include "fsdp/formats/format.h"
#include "fsdp/formats/safetensors.h"
#include "fsdp/formats/torch_pickle.h"
#include "../support/index_files.h"
#include "fsdp/checkpoint/checkpoint_io.h"
#include "fsdp/distributed/process_group.h"
#include "fsdp/error.h"
#include "fsdp/fsdp.h"
#include "fsdp/state_dict/state_dict.h"

namespace fs = std::filesystem;
using fsdp::testing::read_file;
using fsdp::testing::write_file;

namespace {

// The heap taken on this thread while a HeapPeak lives: net bytes allocated
// (frees of older blocks count against it), and their peak.
thread_local bool heap_counting = false;
thread_local int64_t heap_live = 0, heap_peak = 0;

void on_malloc(const volatile void*, size_t n) {
  if (!heap_counting) return;
  heap_live += static_cast<int64_t>(n);
  heap_peak = std::max(heap_peak, heap_live);
}
void on_free(const volatile void* p) {
  if (heap_counting && p) heap_live -= static_cast<int64_t>(__sanitizer_get_allocated_size(const_cast<const void*>(p)));
}

class HeapPeak {
 public:
  HeapPeak() {
    heap_live = heap_peak = 0;
    heap_counting = true;
  }
  ~HeapPeak() { heap_counting = false; }
  // A finding when the peak exceeds `limit` bytes.
  void check(size_t limit, const char* what, size_t input) {
    heap_counting = false;
    if (heap_peak > static_cast<int64_t>(limit)) {
      std::cerr << "fuzz: " << what << " took " << heap_peak << " bytes of heap for an input of " << input
                << " bytes, over its bound of " << limit << "\n";
      std::abort();
    }
  }
};

struct TinyImpl : torch::nn::Module {
  TinyImpl() {
    a = register_module("a", torch::nn::Linear(4, 3));
    b = register_module("b", torch::nn::Linear(3, 2));
  }
  torch::Tensor forward(torch::Tensor x) { return b(a(x)); }
  torch::nn::Linear a{nullptr}, b{nullptr};
};

struct World {
  fsdp::dist::ProcessGroupPtr group;
  std::unique_ptr<fsdp::FullyShardedDataParallel<TinyImpl>> fsdp;
  std::shared_ptr<torch::nn::Module> model;
  std::unique_ptr<torch::optim::Adam> optimizer;
  fs::path scratch;
};

World& world() {
  static World* w = [] {
    auto* w = new World;
    fsdp::dist::InitOptions o;
    o.backend = fsdp::launch::Backend::kGloo;
    w->group = fsdp::dist::init_process_group(o);
    torch::manual_seed(3);
    fsdp::FSDPOptions fo;
    fo.process_group(w->group);
    w->fsdp = std::make_unique<fsdp::FullyShardedDataParallel<TinyImpl>>(std::make_shared<TinyImpl>(), fo);
    w->model = w->fsdp->ptr();
    w->optimizer = std::make_unique<torch::optim::Adam>(w->model->parameters(), torch::optim::AdamOptions(1e-3));
    // One step so that the optimizer has state to save and load.
    w->optimizer->zero_grad();
    (*w->fsdp)(torch::ones({2, 4})).sum().backward();
    w->optimizer->step();
    const char* shm = std::getenv("FSDP_FUZZ_TMP");
    w->scratch = fs::path(shm ? shm : (fs::exists("/dev/shm") ? "/dev/shm" : "/tmp")) /
                 ("fsdp-fuzz-" + std::to_string(::getpid()));
    fs::create_directories(w->scratch);
    return w;
  }();
  return *w;
}

fsdp::CheckpointState state_of(World& w) {
  fsdp::CheckpointState s;
  s.model("model", w.model).optimizer("optimizer", *w.optimizer).value("step", int64_t{7}).value("name", std::string("x"));
  return s;
}

// Everything a user can do with a checkpoint from disk.
void exercise(const std::string& path) {
  World& w = world();
  try {
    fsdp::inspect_checkpoint(path);
  } catch (const fsdp::Error&) {
  }
  try {
    fsdp::verify_checkpoint(path);
  } catch (const fsdp::Error&) {
  }
  try {
    auto s = state_of(w);
    fsdp::load_checkpoint(path, s, *w.group);
  } catch (const fsdp::Error&) {
  }
  try {
    fsdp::load_checkpoint(path, w.model, *w.group);
  } catch (const fsdp::Error&) {
  }
}

// The model's state dict as torch::pickle_save writes it (a torch.save-able
// zip whose data.pkl is a dict of tensors).
std::string raw_state_dict(World& w) {
  c10::Dict<std::string, at::Tensor> d;
  fsdp::StateDictTypeGuard guard(w.model, fsdp::StateDictType::kFull);
  for (const auto& [k, v] : fsdp::state_dict(w.model)) d.insert(k, std::get<at::Tensor>(v).clone());
  const auto bytes = torch::pickle_save(d);
  return std::string(bytes.begin(), bytes.end());
}

// A sharded directory as one input: records of [u8 name length][name][u32 LE size][bytes].
std::string pack_dir(const fs::path& dir) {
  std::string out;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    const std::string bytes = read_file(e.path());
    out.push_back(static_cast<char>(name.size()));
    out += name;
    const auto n = static_cast<uint32_t>(bytes.size());
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
    out += bytes;
  }
  return out;
}

// `text` with a "checksum" matching its other fields (as to_json writes it),
// when it is a JSON object; "" otherwise.
std::string resealed(const std::string& text, const fs::path& metadata = {}) {
  nlohmann::ordered_json j;
  try {
    j = nlohmann::ordered_json::parse(text);
  } catch (const std::exception&) {
    return "";
  }
  if (!j.is_object()) return "";
  j.erase("checksum");
  if (!metadata.empty() && j.contains("metadata_crc32") && fs::exists(metadata)) {
    const std::string md = read_file(metadata);
    j["metadata_crc32"] = fsdp::formats::crc32(md.data(), md.size());
  }
  j["checksum"] = fsdp::testing::index_checksum(j);
  return j.dump(1);
}

// Writes the records of `data` into `dir`; names that are not plain file
// names are skipped (the fuzzer must not write outside its scratch folder).
void unpack_dir(const uint8_t* data, size_t size, const fs::path& dir) {
  size_t pos = 0;
  while (pos < size) {
    const size_t len = data[pos++];
    if (pos + len + 4 > size) return;
    std::string name(reinterpret_cast<const char*>(data + pos), len);
    pos += len;
    uint32_t n = 0;
    for (int i = 0; i < 4; ++i) n |= static_cast<uint32_t>(data[pos + i]) << (8 * i);
    pos += 4;
    const size_t take = std::min<size_t>(n, size - pos);
    if (!name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
        name.find('\0') == std::string::npos) {
      write_file(dir / name, std::string(reinterpret_cast<const char*>(data + pos), take));
    }
    pos += take;
  }
}

void write_seeds(const fs::path& seeds) {
  World& w = world();
  fs::create_directories(seeds);
  const fs::path tmp = w.scratch / "seeds";
  fs::remove_all(tmp);
  for (auto format : {fsdp::CheckpointFormat::kSharded, fsdp::CheckpointFormat::kFull}) {
    fsdp::CheckpointOptions o;
    o.format(format);
    const bool full = format == fsdp::CheckpointFormat::kFull;
    const fs::path path = tmp / (full ? "ckpt.pt" : "ckpt");
    fsdp::save_checkpoint(path.string(), state_of(w), *w.group, o);
#if defined(FSDP_FUZZ_INDEX)
    if (!full) write_file(seeds / "index.json", read_file(path / "fsdp_index.json"));
#elif defined(FSDP_FUZZ_DCP)
    if (!full) write_file(seeds / "metadata", read_file(path / ".metadata"));
#elif defined(FSDP_FUZZ_FULL)
    if (full) write_file(seeds / "ckpt.pt", read_file(path));
    if (full) write_file(seeds / "raw.pt", raw_state_dict(w));
#elif defined(FSDP_FUZZ_PICKLE)
    if (full) {
      write_file(tmp / "raw.pt", raw_state_dict(w));
      fsdp::formats::FullReader raw((tmp / "raw.pt").string());
      write_file(seeds / "raw.pkl", raw.read("data.pkl"));
      fsdp::formats::FullReader ours(path.string());
      write_file(seeds / "ckpt.pkl", ours.read("data.pkl"));
    }
#elif defined(FSDP_FUZZ_SHARDED)
    if (!full) write_file(seeds / "ckpt.dir", pack_dir(path));
#elif defined(FSDP_FUZZ_SAFETENSORS)
    // The model's weights as fsdp-ckpt export writes them (from either format).
    fsdp::export_safetensors(path.string(), (seeds / (full ? "from-full.safetensors" : "from-sharded.safetensors")).string());
    if (full) {  // every dtype, a 0-d and an empty tensor, metadata
      const std::vector<at::Tensor> values = {
          torch::arange(6, torch::kFloat32).reshape({2, 3}), torch::tensor({1.5, 2.0}).to(torch::kBFloat16),
          torch::tensor({0.5}).to(torch::kHalf), torch::tensor(3.0, torch::kFloat64), torch::tensor({int64_t{-7}}),
          torch::tensor({1, 2}, torch::kInt32), torch::tensor({3}, torch::kInt16), torch::tensor({-4}, torch::kInt8),
          torch::tensor({5}, torch::kUInt8), torch::tensor({true, false}), torch::zeros({0, 3})};
      std::vector<fsdp::formats::SafetensorsTensor> plan;
      for (size_t i = 0; i < values.size(); ++i) {
        plan.push_back({"t" + std::to_string(i), values[i].scalar_type(), values[i].sizes().vec(), 0, 0});
      }
      fsdp::formats::SafetensorsWriter st((seeds / "dtypes.safetensors").string(), plan, {{"format", "pt"}});
      for (const auto& t : st.layout()) st.write(values[std::stoul(t.name.substr(1))]);
      st.commit();
    }
#endif
  }
  fs::remove_all(tmp);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  __sanitizer_install_malloc_and_free_hooks(on_malloc, on_free);
  world();
  if (const char* seeds = std::getenv("FSDP_FUZZ_SEEDS")) write_seeds(seeds);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  World& w = world();
#if defined(FSDP_FUZZ_INDEX)
  (void)w;
  const std::string text(reinterpret_cast<const char*>(data), size);
  {
    HeapPeak heap;
    try {
      fsdp::formats::parse_index(text, "fuzz/index.json");
    } catch (const fsdp::Error&) {
    }
    heap.check(2 * fsdp::formats::json_budget(size), "parse_index", size);
  }
  const std::string sealed = resealed(text);
  if (!sealed.empty()) {
    bool accepted = false;
    fsdp::formats::Index ix;
    try {
      ix = fsdp::formats::parse_index(sealed, "fuzz/index.json (resealed)");
      accepted = true;
    } catch (const fsdp::Error&) {
    }
    // Outside the try: a refusal of its own encoding is a finding.
    if (accepted) fsdp::formats::parse_index(fsdp::formats::to_json(ix), "fuzz: the index encoded back");
  }
#elif defined(FSDP_FUZZ_FULL)
  const fs::path path = w.scratch / "input.pt";
  write_file(path, std::string(reinterpret_cast<const char*>(data), size));
  exercise(path.string());
#elif defined(FSDP_FUZZ_PICKLE)
  (void)w;
  namespace pk = fsdp::formats::pickle;
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  HeapPeak heap;
  try {
    const pk::Pickle p = pk::parse(bytes, "fuzz/data.pkl");
    if (p.charged_bytes() > pk::parse_budget(size)) {
      std::cerr << "fuzz: the parse charged " << p.charged_bytes() << " bytes, over its budget\n";
      std::abort();
    }
  } catch (const fsdp::Error&) {
  }
  heap.check(2 * pk::parse_budget(size), "pickle::parse", size);
#elif defined(FSDP_FUZZ_DCP)
  (void)w;
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  HeapPeak heap;
  try {
    fsdp::formats::parse_dcp_metadata(bytes, "fuzz/.metadata");
  } catch (const fsdp::Error&) {
  }
  heap.check(2 * fsdp::formats::pickle::parse_budget(size), "parse_dcp_metadata", size);
#elif defined(FSDP_FUZZ_SHARDED)
  const fs::path dir = w.scratch / "input";
  fs::remove_all(dir);
  fs::create_directories(dir);
  unpack_dir(data, size, dir);
  if (size > 0 && (data[size - 1] & 1)) {
    for (const char* name : {"fsdp_index.json", "index.json"}) {
      if (!fs::exists(dir / name)) continue;
      const std::string sealed = resealed(read_file(dir / name), dir / ".metadata");
      if (!sealed.empty()) write_file(dir / name, sealed);
    }
  }
  exercise(dir.string());
#elif defined(FSDP_FUZZ_SAFETENSORS)
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  {
    HeapPeak heap;
    try {
      fsdp::formats::parse_safetensors(bytes, static_cast<int64_t>(size), "fuzz.safetensors");
    } catch (const fsdp::Error&) {
    }
    heap.check(2 * fsdp::formats::json_budget(size), "parse_safetensors", size);
  }
  try {
    const auto h = fsdp::formats::parse_safetensors(bytes, static_cast<int64_t>(size), "fuzz.safetensors");
    for (const auto& t : h.tensors) fsdp::formats::safetensors_tensor_from(bytes, h, t).sum();
  } catch (const fsdp::Error&) {
  }
  const fs::path path = w.scratch / "input.safetensors";
  write_file(path, std::string(bytes));
  exercise(path.string());
  try {
    fsdp::load_checkpoint(path.string(), w.model, *w.group, /*strict=*/false);
  } catch (const fsdp::Error&) {
  }
#else
#error "define FSDP_FUZZ_INDEX, FSDP_FUZZ_FULL, FSDP_FUZZ_SHARDED, FSDP_FUZZ_PICKLE, FSDP_FUZZ_SAFETENSORS or FSDP_FUZZ_DCP"
#endif
  return 0;
}
