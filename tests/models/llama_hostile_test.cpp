// Hostile Llama configs and model directories (issue 50, items 1-4, 6, 9,
// 11): every key of config.json that sizes a tensor, made huge, ends in a
// ConfigError naming the file, the key and the bytes, through each way in
// (the library's parse and build, an hf: directory's weights, fsdp-hf-load,
// fsdp-train --model hf: and --model llama --config, fsdp-ckpt export
// --config, a checkpoint's config.model.llama); RoPE values that are not
// finite and above 0 are refused by key; files that are not regular files
// are named for what they are. Every hostile case runs in a child whose
// address space is capped (RLIMIT_AS / ulimit -v), so a check that failed
// could not take the machine's memory.
#include <gtest/gtest.h>

#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <torch/torch.h>
#include <torch/version.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "fsdp/checkpoint/hf_storage.h"
#include "fsdp/error.h"
#include "fsdp/formats/safetensors.h"
#include "fsdp/hf/hf_model.h"
#include "fsdp/models/llama.h"
#include "../support/capped_child.h"
#include "../support/errors.h"
#include "../support/index_files.h"
#include "../support/subprocess.h"
#include "hostile_model_dir.h"
#include "../support/warnings.h"

namespace fsdp::testing {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using models::LlamaImpl;

// The weights of `dir` against `config` (headers only), as the programs check them before building.
void check_directory(const std::string& dir, const models::LlamaConfig& config) {
  hf::check_weights(HfStorageReader(dir), config);
}

json base_config() { return hostile_base_config(); }

void write_model(const std::string& dir, const json& config) { write_hostile_model(dir, config); }

// A hostile size: the key, its value, and the keys a message may name for
// it (several where two keys cost the same: heads and KV heads).
struct Hostile {
  std::string key;
  int64_t value;
  std::vector<std::string> named;
};

const std::vector<Hostile>& hostile_sizes() {
  static const std::vector<Hostile> cases = {
      {"vocab_size", 2147483647, {"vocab_size"}},
      {"vocab_size", int64_t{1} << 40, {"vocab_size"}},
      {"hidden_size", int64_t{1} << 40, {"hidden_size"}},
      {"intermediate_size", int64_t{1} << 40, {"intermediate_size"}},
      {"num_hidden_layers", 10000000, {"num_hidden_layers"}},
      {"num_hidden_layers", 100000000, {"num_hidden_layers"}},
      {"num_attention_heads", int64_t{1} << 34, {"num_attention_heads"}},
      {"head_dim", int64_t{1} << 40, {"head_dim"}},
  };
  return cases;
}

json with(json j, const std::string& key, int64_t value) {
  j[key] = value;
  if (key == "num_attention_heads") j["num_key_value_heads"] = 1;
  return j;
}

void expect_names(const std::string& what, const Hostile& h, const std::string& file) {
  const std::string context = h.key + "=" + std::to_string(h.value) + ": " + what;
  EXPECT_EQ(what.rfind("ConfigError: ", 0), 0u) << context;
  EXPECT_NE(what.find(file), std::string::npos) << context;
  bool named = false;
  for (const auto& k : h.named) named = named || what.find("\"" + k) != std::string::npos;
  EXPECT_TRUE(named) << context;
  EXPECT_NE(what.find("bytes"), std::string::npos) << context;
}

// Items 1, 2 (no weights: `--model llama --config FILE`, and the library's
// LlamaImpl): each size key, huge, is refused by key with the bytes, against
// the memory the process has, before LibTorch allocates. Before the fix:
// vocab_size 2^31-1, hidden_size or head_dim 2^40 aborted in LlamaModelImpl
// (SIGABRT, "DefaultCPUAllocator: can't allocate"); num_hidden_layers 10^7
// ended in std::bad_alloc after 1.5 GB, 10^8 in the OOM killer.
TEST(LlamaHostileSizes, EachSizeKeyIsBoundByMemoryBeforeAnythingIsAllocated) {
  for (const auto& h : hostile_sizes()) {
    const json config = with(base_config(), h.key, h.value);
    const std::string what = in_capped_child([&] {
      auto c = models::parse_llama_config(config.dump(), "/m/config.json");
      c.initialize = false;
      fsdp::Unit<LlamaImpl> model(c);
    });
    expect_names(what, h, "/m/config.json");
  }
  // max_position_embeddings sizes no tensor (RoPE is computed per position):
  // 2^62 builds a model of the base's size (LibTorch 2.x: 1.13 builds no Llama).
  if (TORCH_VERSION_MAJOR < 2) return;
  const std::string what = in_capped_child([&] {
    auto c = models::parse_llama_config(with(base_config(), "max_position_embeddings", int64_t{1} << 62).dump(), "m");
    fsdp::Unit<LlamaImpl> model(c);
    if (model->parameters().size() < 10) throw std::runtime_error("not built");
  });
  EXPECT_EQ(what, "ok");
}

// Items 1, 2 (with weights: an hf: directory): the config is checked
// against the safetensors headers before a model is built; a size the
// weights do not have is named by key. Before the fix: the same aborts, as
// the model was built before the weights were looked at.
TEST(LlamaHostileSizes, EachSizeKeyIsCheckedAgainstTheWeightsOnDisk) {
  TempDir tmp;
  int n = 0;
  for (const auto& h : hostile_sizes()) {
    const std::string dir = tmp.path() + "/m" + std::to_string(n++);
    write_model(dir, with(base_config(), h.key, h.value));
    const std::string what = in_capped_child([&] {
      const auto c = hf::read_config(dir);
      check_directory(dir, c);
    });
    expect_names(what, h, dir);
  }
  // The weights' own config passes, and a config with fewer layers than the
  // weights names the tensor that has no place.
  const std::string good = tmp.path() + "/good";
  write_model(good, base_config());
  check_directory(good, hf::read_config(good));
  write_file(good + "/config.json", with(base_config(), "num_hidden_layers", 3).dump());
  const std::string more = config_error([&] { check_directory(good, hf::read_config(good)); });
  EXPECT_NE(more.find("key \"num_hidden_layers\": 3, but " + good + "/model.safetensors holds the tensors of 2 layers"),
            std::string::npos)
      << more;
  write_file(good + "/config.json", with(base_config(), "num_hidden_layers", 1).dump());
  EXPECT_NE(config_error([&] { check_directory(good, hf::read_config(good)); }).find("model.layers.1."),
            std::string::npos);
}

// Item 3: a LoRA rank whose adapters exceed memory is refused with the
// bytes; a rank above a target's smaller dimension is warned about. Before
// the fix: rank 2^40 aborted at once, 10^6 allocated 1.5 GB and aborted.
TEST(LlamaHostileSizes, ALoraRankIsBoundByMemoryAndWarnedAboveATargetsRank) {
  for (int64_t rank : {int64_t{1} << 40, int64_t{1000000000}}) {
    const std::string what = in_capped_child([&] {
      auto c = models::parse_llama_config(base_config().dump(), "/m/config.json");
      c.lora.rank = rank;
      c.lora.targets = {"q_proj", "v_proj"};
      fsdp::Unit<LlamaImpl> model(c);
    });
    EXPECT_EQ(what.rfind("ConfigError: ", 0), 0u) << what;
    EXPECT_NE(what.find("LoRA rank " + std::to_string(rank)), std::string::npos) << what;
    EXPECT_NE(what.find("bytes"), std::string::npos) << what;
  }
  auto c = models::parse_llama_config(base_config().dump(), "config.json");
  c.lora.rank = 6;  // q_proj is [8, 8], v_proj [4, 8]: 6 is above v_proj's 4 only
  c.lora.targets = {"q_proj", "v_proj"};
  const auto w = models::lora_rank_warnings(c, "--lora-rank");
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("--lora-rank 6 is above v_proj's smaller dimension 4"), std::string::npos) << w[0];
  c.lora.rank = 4;
  EXPECT_TRUE(models::lora_rank_warnings(c, "--lora-rank").empty());
}

// Item 6: RoPE values that are not finite and above 0 are refused by key,
// wherever they are given. Before the fix: rope_theta 0.0 or -1.0 was
// accepted (training stopped at step 1 with "the run diverged").
TEST(LlamaHostileRope, NonPositiveRopeValuesAreRefusedByKey) {
  struct Case {
    const char* rope;  // JSON members added to the base
    const char* key;
  };
  const std::vector<Case> cases = {
      {R"("rope_theta": 0.0)", "\"rope_theta\""},
      {R"("rope_theta": -1.0)", "\"rope_theta\""},
      {R"("rope_theta": 1e400)", "1e400"},  // past a double: the JSON reader refuses the number, naming it
      {R"("rope_parameters": {"rope_type": "default", "rope_theta": 0})", "\"rope_parameters.rope_theta\""},
      {R"("rope_parameters": {"rope_type": "linear", "factor": 0.0})", "\"rope_parameters.factor\""},
      {R"("rope_scaling": {"type": "linear", "factor": -2.0})", "\"rope_scaling.factor\""},
      {R"("rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 0.0, "high_freq_factor": 4.0})",
       "\"rope_scaling.low_freq_factor\""},
      {R"("rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": -4.0})",
       "\"rope_scaling.high_freq_factor\""},
  };
  for (const auto& c : cases) {
    std::string text = base_config().dump();
    text.insert(text.size() - 1, std::string(", ") + c.rope);
    const std::string e = config_error([&] { models::parse_llama_config(text, "/m/config.json"); });
    EXPECT_NE(e.find("/m/config.json"), std::string::npos) << c.rope << ": " << e;
    EXPECT_NE(e.find(c.key), std::string::npos) << c.rope << ": " << e;
  }
}

// Items 4 and 9: config.json, the index, model.safetensors and a shard that
// are not regular files are named for what they are (a FIFO is never
// opened for a blocking read); a NUL in a weight_map name is escaped.
// Before the fix: a FIFO config.json hung until killed; a directory said
// "9223372036854775807 bytes; a config.json is expected under 16 MiB";
// model.safetensors as a FIFO, a directory or a link to /dev/zero said "not
// a Hugging Face model directory"; a shard FIFO or /dev/urandom said
// "missing"; the NUL cut the message.
TEST(LlamaHostileFiles, FilesThatAreNotRegularAreNamedForWhatTheyAre) {
  TempDir tmp;
  const std::string fifo = tmp.path() + "/fifo";
  fs::create_directories(fifo);
  ASSERT_EQ(mkfifo((fifo + "/config.json").c_str(), 0600), 0);
  std::string e = config_error([&] { hf::read_config(fifo); });
  EXPECT_NE(e.find(fifo + "/config.json is a FIFO (named pipe), not a regular file"), std::string::npos) << e;
  const std::string dir = tmp.path() + "/dir";
  fs::create_directories(dir + "/config.json");
  e = config_error([&] { hf::read_config(dir); });
  EXPECT_NE(e.find(dir + "/config.json is a directory, not a regular file"), std::string::npos) << e;
  e = config_error([&] { hf::read_config(tmp.path() + "/none"); });
  EXPECT_NE(e.find("No such file"), std::string::npos) << e;
  EXPECT_NE(e.find("config.json was expected there"), std::string::npos) << e;
  // model.safetensors that is not a regular file.
  const std::vector<std::pair<std::string, std::function<void(const std::string&)>>> weights = {
      {"a FIFO (named pipe)", [](const std::string& p) { ASSERT_EQ(mkfifo(p.c_str(), 0600), 0); }},
      {"a directory", [](const std::string& p) { fs::create_directories(p); }},
      {"a symbolic link to a character device (/dev/zero)", [](const std::string& p) { fs::create_symlink("/dev/zero", p); }},
  };
  int n = 0;
  for (const auto& [kind, make] : weights) {
    const std::string d = tmp.path() + "/w" + std::to_string(n++);
    write_model(d, base_config());
    fs::remove(d + "/model.safetensors");
    make(d + "/model.safetensors");
    EXPECT_TRUE(is_hf_model_dir(d)) << kind;
    e = config_error([&] { HfStorageReader r(d); });
    EXPECT_NE(e.find(d + "/model.safetensors is " + kind + ", not a regular file"), std::string::npos) << e;
  }
  // A shard that is a FIFO or /dev/urandom; a weight_map name with a NUL.
  const std::string s = tmp.path() + "/shards";
  write_model(s, base_config());
  fs::rename(s + "/model.safetensors", s + "/model-00001-of-00003.safetensors");
  ASSERT_EQ(mkfifo((s + "/model-00002-of-00003.safetensors").c_str(), 0600), 0);
  fs::create_symlink("/dev/urandom", s + "/model-00003-of-00003.safetensors");
  for (const char* shard : {"model-00002-of-00003.safetensors", "model-00003-of-00003.safetensors"}) {
    write_file(s + "/model.safetensors.index.json",
               json({{"weight_map", {{"model.norm.weight", shard}}}}).dump());
    e = config_error([&] { HfStorageReader r(s); });
    EXPECT_EQ(e.find("missing"), std::string::npos) << e;
    EXPECT_NE(e.find(s + "/" + shard + " is a"), std::string::npos) << e;
    EXPECT_NE(e.find("not a regular file"), std::string::npos) << e;
  }
  write_file(s + "/model.safetensors.index.json",
             json({{"weight_map", {{std::string("model.norm\0.weight", 18), "model-00001-of-00003.safetensors"}}}}).dump());
  e = config_error([&] { HfStorageReader r(s); });
  EXPECT_NE(e.find("weight_map.model.norm\\u0000.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("which holds no tensor \"model.norm\\u0000.weight\""), std::string::npos) << e;
  EXPECT_EQ(e.find('\0'), std::string::npos);
}


// Item 11: config.json with rope_parameters and different legacy
// rope_theta / rope_scaling is read as transformers 5 reads it (a legacy
// rope_scaling replaces rope_parameters whole; the dict's rope_theta wins
// over the top-level one), checked against transformers itself: its
// standardized rope_parameters and LlamaRotaryEmbedding's cos and sin, equal
// to ours bit for bit; and the disagreement is warned about. Before the fix:
// rope_parameters won over rope_scaling (the first case read as theta 5e5
// without llama3 scaling: step-1 loss 7.212495803833008 against
// transformers' 7.219340801239014), silently.
#ifdef FSDP_TEST_TRANSFORMERS
TEST(LlamaRopeKeys, ConflictingRopeKeysAreReadAsTransformersReadsThemAndWarned) {
  const json base = json::parse(R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
      "num_attention_heads": 4, "num_hidden_layers": 1, "vocab_size": 16, "intermediate_size": 16})");
  const json llama3 = json::parse(R"({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
      "high_freq_factor": 4.0, "original_max_position_embeddings": 64})");
  struct Case {
    json extra;
    bool warns;
  };
  const std::vector<Case> cases = {
      {{{"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 500000.0}}}, {"rope_theta", 10000.0},
        {"rope_scaling", llama3}},
       true},
      {{{"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 500000.0}}}, {"rope_theta", 10000.0}}, true},
      {{{"rope_parameters", {{"rope_type", "linear"}, {"factor", 2.0}}}, {"rope_theta", 20000.0}}, false},
      {{{"rope_scaling", {{"type", "linear"}, {"factor", 2.0}}}, {"rope_theta", 20000.0}}, false},
      {{{"rope_scaling", json::object()}, {"rope_parameters", {{"rope_type", "linear"}, {"factor", 3.0}, {"rope_theta", 7.0}}}},
       false},
      {{{"rope_parameters", {{"rope_type", "linear"}, {"type", "default"}, {"factor", 3.0}}}}, false},
      // As fsdp-cpp's export writes them (llama_config_json): the legacy keys
      // agree with rope_parameters, so nothing is warned.
      {{{"rope_parameters", {{"rope_type", "llama3"}, {"rope_theta", 500000.0}, {"factor", 8.0},
                             {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                             {"original_max_position_embeddings", 64}}},
        {"rope_theta", 500000.0},
        {"rope_scaling", llama3}},
       false},
  };
  TempDir tmp;
  json all = json::array();
  for (const auto& c : cases) {
    json j = base;
    for (auto it = c.extra.begin(); it != c.extra.end(); ++it) j[it.key()] = it.value();
    all.push_back(j);
  }
  write_file(tmp.path() + "/cases.json", all.dump());
  constexpr int64_t T = 96;  // past original_max_position_embeddings: llama3's scaled band matters
  const auto r = run_program({FSDP_TEST_PYTHON, FSDP_TEST_SOURCE_DIR "/python/rope_keys.py", tmp.path() + "/cases.json",
                              std::to_string(T)},
                             std::chrono::seconds(120));
  ASSERT_EQ(r.exit_code(), 0) << r.output;
  const json theirs = json::parse(r.output.substr(r.output.find('[')));
  ASSERT_EQ(theirs.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    CapturedWarnings warned;
    const auto c = models::parse_llama_config(all[i].dump(), "config.json");
    const json& p = theirs[i]["rope_parameters"];
    const std::string what = all[i].dump();
    EXPECT_EQ(c.rope_type, p["rope_type"].get<std::string>()) << what;
    EXPECT_EQ(c.rope_theta, p["rope_theta"].get<double>()) << what;
    if (p.contains("factor") && c.rope_type != "default") EXPECT_EQ(c.rope_factor, p["factor"].get<double>()) << what;
    EXPECT_EQ(warned.count("fsdp: config.json: "), cases[i].warns ? 1u : 0u) << what;
    fsdp::Unit<LlamaImpl> model(c);
    const auto [cos, sin] = model->model->rotary(0, T, at::kFloat, at::kCPU);
    std::vector<float> want_cos, want_sin;
    for (const auto& row : theirs[i]["cos"]) for (float x : row.get<std::vector<float>>()) want_cos.push_back(x);
    for (const auto& row : theirs[i]["sin"]) for (float x : row.get<std::vector<float>>()) want_sin.push_back(x);
    const auto ours_cos = cos.contiguous().view({-1}), ours_sin = sin.contiguous().view({-1});
    ASSERT_EQ(ours_cos.numel(), static_cast<int64_t>(want_cos.size())) << what;
    EXPECT_TRUE(at::equal(ours_cos, torch::tensor(want_cos))) << what << ": cos differs by "
                                                              << (ours_cos - torch::tensor(want_cos)).abs().max().item<float>();
    EXPECT_TRUE(at::equal(ours_sin, torch::tensor(want_sin))) << what << ": sin differs by "
                                                              << (ours_sin - torch::tensor(want_sin)).abs().max().item<float>();
  }
  CapturedWarnings warned;
  models::parse_llama_config(all[0].dump(), "/m/config.json");
  ASSERT_EQ(warned.messages().size(), 1u);
  const std::string w = warned.messages()[0];
  EXPECT_NE(w.find("/m/config.json: both \"rope_scaling\" and \"rope_parameters\" are set and differ"), std::string::npos) << w;
  EXPECT_NE(w.find("replaces \"rope_parameters\""), std::string::npos) << w;
  models::parse_llama_config(all[1].dump(), "/m/config.json");
  ASSERT_EQ(warned.messages().size(), 2u);
  EXPECT_NE(warned.messages()[1].find("\"rope_parameters.rope_theta\" (500000.0) and the top-level \"rope_theta\" (10000.0) differ"),
            std::string::npos)
      << warned.messages()[1];
}
#endif

}  // namespace
}  // namespace fsdp::testing
