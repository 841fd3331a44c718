// Hostile PEFT adapter directories (fsdp/hf/peft.h): every bad
// adapter_config.json or adapter_model.safetensors ends in a ConfigError that
// names the file, the key (or tensor) and what was expected, before anything
// of the model is written and before a size from the file reaches LibTorch's
// allocator. Cases that could allocate run in a child whose address space is
// capped, so a missed check is reported, not paid for.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "fsdp/error.h"
#include "fsdp/hf/peft.h"
#include "fsdp/peft/lora.h"
#include "../support/capped_child.h"
#include "../support/errors.h"
#include "../support/index_files.h"
#include "../support/subprocess.h"
#include "../support/thread_ranks.h"

namespace fsdp::testing {
namespace {

using json = nlohmann::json;

// One linear layer "proj" [6, 4] with rank-2 adapters: lora_A [2, 4], lora_B [6, 2].
struct NetImpl : torch::nn::Module {
  NetImpl() { proj = register_module("proj", peft::Linear(4, 6)); }
  peft::Linear proj{nullptr};
};

std::shared_ptr<NetImpl> adapted_net(int64_t rank = 2, double alpha = 4) {
  auto net = std::make_shared<NetImpl>();
  peft::inject_lora(*net, {rank, alpha, {"proj"}});
  return net;
}

json good_config() { return {{"peft_type", "LORA"}, {"r", 2}, {"lora_alpha", 4}, {"target_modules", {"proj"}}}; }

const std::string kA = "base_model.model.proj.lora_A.weight", kB = "base_model.model.proj.lora_B.weight";

// A header of A [2, 4] then B [6, 2], float32, with `a` / `b` replacing an entry.
std::string header(const json& a = {{"dtype", "F32"}, {"shape", {2, 4}}, {"data_offsets", {0, 32}}},
                   const json& b = {{"dtype", "F32"}, {"shape", {6, 2}}, {"data_offsets", {32, 80}}}) {
  return json{{kA, a}, {kB, b}}.dump();
}

// A directory `dir` holding `config` and a weights file of `weights` bytes.
std::string adapter_dir(const TempDir& tmp, const std::string& name, const json& config, const std::string& weights) {
  const std::string dir = tmp.path() + "/" + name;
  mkdir(dir.c_str(), 0755);
  write_file(dir + "/adapter_config.json", config.dump());
  write_file(dir + "/adapter_model.safetensors", weights);
  return dir;
}

std::string good_weights() { return st_bytes(header(), std::string(80, '\0')); }

// `f` throws a ConfigError whose message holds each of `parts`.
void expect_named(const std::function<void()>& f, const std::vector<std::string>& parts, const std::string& label) {
  const std::string e = config_error(f);
  for (const auto& p : parts) EXPECT_NE(e.find(p), std::string::npos) << label << ": expected \"" << p << "\" in: " << e;
}

TEST(PeftHostile, TheGoodDirectoryLoads) {
  TempDir tmp;
  const std::string dir = adapter_dir(tmp, "good", good_config(), good_weights());
  auto net = adapted_net();
  hf::load_peft_adapter(net, dir);
  EXPECT_TRUE(net->proj->lora_A->weight.eq(0).all().item<bool>());
}

// adapter_config.json's settings, each wrong: named by file and key.
TEST(PeftHostile, ConfigValuesAreNamedByKey) {
  TempDir tmp;
  struct Case {
    std::string key;
    json value;  // null: the key removed
    std::string expected;
  };
  const std::vector<Case> cases = {
      {"r", 0, "an integer >= 1"},
      {"r", -3, "an integer >= 1"},
      {"r", 2.5, "an integer >= 1"},
      {"r", "8", "an integer >= 1"},
      {"r", json(uint64_t{1} << 63), "an integer >= 1"},
      {"r", json(~uint64_t{0}), "an integer >= 1"},
      {"r", 1e300, "an integer >= 1"},
      {"r", nullptr, "an integer >= 1"},
      {"lora_alpha", 0, "a finite number > 0"},
      {"lora_alpha", -16, "a finite number > 0"},
      {"lora_alpha", "16", "a finite number > 0"},
      {"lora_alpha", nullptr, "a finite number > 0"},
      {"target_modules", "q_proj|v_proj", "a list of module names"},
      {"target_modules", json::array(), "a list of module names"},
      {"target_modules", json::array({1}), "a list of module names"},
      {"target_modules", json::array({""}), "a list of module names"},
      {"target_modules", json::array({"proj", "proj"}), "given twice"},
      {"target_modules", json::object(), "a list of module names"},
      {"target_modules", nullptr, "a list of module names"},
      {"peft_type", "IA3", "\"LORA\""},
  };
  int n = 0;
  for (const auto& c : cases) {
    json config = good_config();
    if (c.value.is_null()) {
      config.erase(c.key);
    } else {
      config[c.key] = c.value;
    }
    const std::string dir = adapter_dir(tmp, "c" + std::to_string(n++), config, good_weights());
    const std::string label = c.key + "=" + c.value.dump();
    expect_named([&] { hf::read_peft_config(dir); }, {dir + "/adapter_config.json", "\"" + c.key + "\"", c.expected}, label);
    auto net = adapted_net();
    expect_named([&] { hf::load_peft_adapter(net, dir); }, {"adapter_config.json", "\"" + c.key + "\""}, label);
  }
  // Python's json writes NaN and Infinity, which are not JSON: named by file.
  for (const std::string text : {R"({"peft_type":"LORA","r":2,"lora_alpha":NaN,"target_modules":["proj"]})",
                                 R"({"peft_type":"LORA","r":2,"lora_alpha":1e999,"target_modules":["proj"]})",
                                 "[1, 2]", "", "{\"r\": 2"}) {
    const std::string dir = adapter_dir(tmp, "t" + std::to_string(n++), good_config(), good_weights());
    write_file(dir + "/adapter_config.json", text);
    expect_named([&] { hf::read_peft_config(dir); }, {dir + "/adapter_config.json"}, text);
  }
}

// A rank the model's adapters do not have, the largest first: named by key
// against the model's module, before a byte of the weights is read.
TEST(PeftHostile, ARankOrAlphaOtherThanTheModelsIsNamed) {
  TempDir tmp;
  for (const json& r : {json(int64_t{1} << 31), json(int64_t{1} << 62), json(3)}) {
    json config = good_config();
    config["r"] = r;
    config["lora_alpha"] = 2 * r.get<double>();  // the same scaling as the model's (4 / 2)
    const std::string dir = adapter_dir(tmp, "r" + r.dump(), config, good_weights());
    auto net = adapted_net();
    expect_named([&] { hf::load_peft_adapter(net, dir); },
                 {dir + "/adapter_config.json", "\"r\"", r.dump(), "module 'proj'", "rank 2"}, r.dump());
  }
  json config = good_config();
  config["lora_alpha"] = 8;
  const std::string dir = adapter_dir(tmp, "alpha", config, good_weights());
  auto net = adapted_net();
  expect_named([&] { hf::load_peft_adapter(net, dir); }, {dir + "/adapter_config.json", "\"lora_alpha\"", "module 'proj'"},
               "alpha");
}

// save_peft_adapter writes the LoraConfig it is given as the file's r and
// lora_alpha: one the model's adapters are not of is refused by key, on
// every rank, before anything is gathered or written.
TEST(PeftHostile, SavingWithAnotherRankOrAlphaIsRefusedByKey) {
  TempDir tmp;
  run_ranks(1, [&](dist::ProcessGroup& pg) {
    auto net = adapted_net();
    expect_named([&] { hf::save_peft_adapter(net, {3, 6, {"proj"}}, tmp.path() + "/r", "base", pg); },
                 {"save_peft_adapter", "\"r\"", "module 'proj'", "rank 2"}, "r");
    expect_named([&] { hf::save_peft_adapter(net, {2, 8, {"proj"}}, tmp.path() + "/alpha", "base", pg); },
                 {"save_peft_adapter", "\"lora_alpha\"", "module 'proj'"}, "alpha");
  });
  EXPECT_FALSE(std::filesystem::exists(tmp.path() + "/r"));
}

// A module whose weight is not 2-D among the matches: refused before any
// module gets adapters.
TEST(PeftHostile, InjectLoraChangesNothingWhenAMatchIsRefused) {
  struct Odd : torch::nn::Module, peft::LoraLayer {
    Odd() { register_parameter("weight", torch::zeros({4})); }
  };
  struct Two : torch::nn::Module {
    Two() {
      register_module("a_proj", peft::Linear(4, 4));
      register_module("b_proj", std::make_shared<Odd>());
    }
  };
  Two two;
  expect_config_error([&] { peft::inject_lora(two, {2, 4, {"a_proj", "b_proj"}}); }, "'b_proj' has no 2-D parameter");
  for (const auto& p : two.named_parameters()) EXPECT_FALSE(peft::is_lora_key(p.key())) << p.key();
}

// read_peft_config's rank goes to inject_lora, which allocates the adapters:
// a rank no machine holds is refused by inject_lora with the bytes, before
// LibTorch's allocator sees it.
TEST(PeftHostile, AHugeRankIsRefusedBeforeTheAdaptersAreAllocated) {
  TempDir tmp;
  for (const int64_t r : {int64_t{1} << 31, int64_t{1} << 40, int64_t{1} << 62}) {
    json config = good_config();
    config["r"] = r;
    const std::string dir = adapter_dir(tmp, "r" + std::to_string(r), config, good_weights());
    const std::string what = in_capped_child([&] {
      NetImpl net;
      peft::inject_lora(net, hf::read_peft_config(dir));
    });
    EXPECT_EQ(what.rfind("ConfigError: ", 0), 0u) << what;
    EXPECT_NE(what.find("rank " + std::to_string(r)), std::string::npos) << what;
    EXPECT_NE(what.find("bytes"), std::string::npos) << what;
  }
}

// The weights file, each wrong: named by file (and tensor), nothing loaded.
TEST(PeftHostile, WeightsAreNamedByFileAndTensor) {
  TempDir tmp;
  const json f32 = {{"dtype", "F32"}, {"shape", {2, 4}}, {"data_offsets", {0, 32}}};
  auto a_with = [&](const std::string& field, const json& v) {
    json a = f32;
    a[field] = v;
    return a;
  };
  const std::string zeros(80, '\0');
  struct Case {
    std::string label, bytes;
    std::vector<std::string> named;
  };
  const std::vector<Case> cases = {
      {"shape 2^31", st_bytes(header(a_with("shape", {int64_t{1} << 31, 4})), zeros), {kA}},
      {"shape 2^62", st_bytes(header(a_with("shape", {int64_t{1} << 62, 4})), zeros), {kA, "too large"}},
      {"shape/offsets", st_bytes(header(a_with("shape", {3, 4})), zeros), {kA}},
      {"dtype", st_bytes(header(a_with("dtype", "Q7")), zeros), {kA, "dtype 'Q7'"}},
      {"overlap", st_bytes(header(f32, {{"dtype", "F32"}, {"shape", {6, 2}}, {"data_offsets", {16, 64}}}), zeros), {}},
      {"past the file", st_bytes(header(f32, {{"dtype", "F32"}, {"shape", {6, 2}}, {"data_offsets", {32, 80}}}),
                                 zeros.substr(0, 60)), {}},
      {"truncated", good_weights().substr(0, 50), {}},
      {"header length", st_bytes(header(), zeros, int64_t{1} << 40), {"header length"}},
      {"header length past the file", st_bytes(header(), zeros, 90'000), {"past the end of the file"}},
      {"empty", "", {}},
      {"not an adapter",
       st_bytes(json{{"base_model.model.fc.lora_A.weight", f32},
                     {kB, {{"dtype", "F32"}, {"shape", {6, 2}}, {"data_offsets", {32, 80}}}}}
                    .dump(),
                zeros),
       {"'base_model.model.fc.lora_A.weight' is no adapter of the model", "'proj.lora_A.weight' is missing"}},
      {"rank 3 A", st_bytes(header({{"dtype", "F32"}, {"shape", {3, 4}}, {"data_offsets", {0, 48}}},
                                   {{"dtype", "F32"}, {"shape", {6, 2}}, {"data_offsets", {48, 96}}}),
                            std::string(96, '\0')),
       {kA, "[3, 4]", "[2, 4]"}},
      {"transposed B", st_bytes(header(f32, {{"dtype", "F32"}, {"shape", {2, 6}}, {"data_offsets", {32, 80}}}), zeros),
       {kB, "[2, 6]", "[6, 2]"}},
      {"integer A", st_bytes(header(a_with("dtype", "I32")), zeros), {kA, "dtype I32"}},
      {"1-D A", st_bytes(header({{"dtype", "F32"}, {"shape", {8}}, {"data_offsets", {0, 32}}}), zeros), {kA, "[8]"}},
  };
  int n = 0;
  for (const auto& c : cases) {
    const std::string dir = adapter_dir(tmp, "w" + std::to_string(n++), good_config(), c.bytes);
    std::vector<std::string> named = c.named;
    named.push_back(dir + "/adapter_model.safetensors");
    auto net = adapted_net();
    const at::Tensor before = net->proj->lora_A->weight.detach().clone();
    const std::string what = in_capped_child([&] { hf::load_peft_adapter(net, dir); });
    EXPECT_EQ(what.rfind("ConfigError: ", 0), 0u) << c.label << ": " << what;
    for (const auto& p : named) EXPECT_NE(what.find(p), std::string::npos) << c.label << ": expected \"" << p << "\" in: " << what;
    EXPECT_TRUE(net->proj->lora_A->weight.equal(before)) << c.label;
  }
}

// Files that are not regular files, too large, or missing: named, never
// opened for a blocking read.
TEST(PeftHostile, FilesThatAreNotRegularFilesAreNamed) {
  TempDir tmp;
  for (const std::string file : {"adapter_config.json", "adapter_model.safetensors"}) {
    const std::string fifo = adapter_dir(tmp, "fifo-" + file, good_config(), good_weights());
    std::remove((fifo + "/" + file).c_str());
    ASSERT_EQ(mkfifo((fifo + "/" + file).c_str(), 0600), 0);
    const std::string folder = adapter_dir(tmp, "dir-" + file, good_config(), good_weights());
    std::remove((folder + "/" + file).c_str());
    mkdir((folder + "/" + file).c_str(), 0755);
    const std::string missing = adapter_dir(tmp, "missing-" + file, good_config(), good_weights());
    std::remove((missing + "/" + file).c_str());
    for (const std::string& dir : {fifo, folder, missing}) {
      auto net = adapted_net();
      expect_named([&] { hf::load_peft_adapter(net, dir); }, {dir + "/" + file}, dir);
    }
  }
  // A config over the reader's limit (1 MiB): named, not parsed.
  json config = good_config();
  config["target_modules"] = std::vector<std::string>(200'000, "proj_x");
  const std::string huge = adapter_dir(tmp, "huge", config, good_weights());
  expect_named([&] { hf::read_peft_config(huge); }, {huge + "/adapter_config.json", "expected under 1 MiB"}, "huge");
  // Under the limit, as many names as 1 MiB holds: read in linear time
  // (a repeated name is found by a set, not by comparing every pair).
  std::vector<std::string> names;
  for (int i = 0; i < 110'000; ++i) names.push_back("m" + std::to_string(i));
  names.push_back("m7");
  config["target_modules"] = names;
  const std::string many = adapter_dir(tmp, "many", config, good_weights());
  const auto t0 = std::chrono::steady_clock::now();
  expect_named([&] { hf::read_peft_config(many); }, {many + "/adapter_config.json", "\"m7\" is given twice"}, "many");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
  // The directory itself missing.
  expect_named([&] { hf::read_peft_config(tmp.path() + "/nowhere"); }, {tmp.path() + "/nowhere/adapter_config.json"},
               "nowhere");
}

}  // namespace
}  // namespace fsdp::testing
