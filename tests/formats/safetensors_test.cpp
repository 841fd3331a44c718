// Safetensors files without Python and without FSDP (runs on both LibTorch
// builds): the writer lays files out as the safetensors package does, and
// corrupt and hostile headers are refused with a ConfigError naming the
// file and the offence, as the package's reader refuses them.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "../support/errors.h"
#include "../support/index_files.h"
#include "../support/subprocess.h"
#include "fsdp/error.h"
#include "fsdp/formats/safetensors.h"

using namespace fsdp;
using namespace fsdp::testing;
namespace fs = std::filesystem;

namespace {

TEST(Safetensors, TheWriterLaysOutFilesAsSaveFileDoes) {
  TempDir dir;
  const std::string path = dir.path() + "/mixed.safetensors";
  const std::vector<std::pair<std::string, at::Tensor>> tensors = {
      {"b", torch::arange(6, torch::kFloat32).reshape({2, 3}).t()},  // not contiguous
      {"a", torch::tensor({1.5, -2.0, 3.25}).to(torch::kBFloat16)},
      {"c", torch::tensor({int64_t{1} << 40})},
      {"d", torch::tensor({true, false, true})},
      {"e", torch::zeros({0, 4})},
      {"f", torch::tensor(7.0, torch::kFloat64)}};
  std::vector<formats::SafetensorsTensor> plan;
  for (const auto& [k, t] : tensors) plan.push_back({k, t.scalar_type(), t.sizes().vec(), 0, 0});
  formats::SafetensorsWriter w(path, plan, {{"format", "pt"}});
  std::vector<std::string> order;
  for (const auto& t : w.layout()) order.push_back(t.name);
  // As save_file: by dtype (I64, F64, F32, ..., BF16, ..., BOOL), then by name.
  EXPECT_EQ(order, (std::vector<std::string>{"c", "f", "b", "e", "a", "d"}));
  EXPECT_FALSE(fs::exists(path));  // nothing under the name before commit
  for (const auto& t : w.layout()) {
    for (const auto& [k, v] : tensors) {
      if (k == t.name) w.write(v);
    }
  }
  w.commit();
  const auto h = formats::read_safetensors_header(path);
  EXPECT_EQ(h.data_start % 8, 0);
  EXPECT_EQ(h.metadata, (std::map<std::string, std::string>{{"format", "pt"}}));
  ASSERT_EQ(h.tensors.size(), tensors.size());
  for (const auto& t : h.tensors) {
    EXPECT_EQ(t.begin % static_cast<int64_t>(c10::elementSize(t.dtype)), 0) << t.name << " aligned";
    for (const auto& [k, v] : tensors) {
      if (k != t.name) continue;
      const auto got = formats::read_safetensors_tensor(path, h, t);
      EXPECT_EQ(got.scalar_type(), v.scalar_type()) << k;
      EXPECT_TRUE(torch::equal(got, v)) << k;
    }
  }
  EXPECT_THROW(
      formats::SafetensorsWriter(dir.path() + "/x", {{"a", at::kFloat, {1}, 0, 0}, {"a", at::kFloat, {1}, 0, 0}}, {}),
      ConfigError);
  EXPECT_THROW(formats::SafetensorsWriter(dir.path() + "/x", {{"a", at::kComplexFloat, {1}, 0, 0}}, {}), ConfigError);
  formats::SafetensorsWriter wrong(dir.path() + "/y", {{"a", at::kFloat, {2}, 0, 0}}, {});
  expect_config_error([&] { wrong.write(torch::zeros({3})); }, "tensor 'a' was planned as F32 [2]");
}


TEST(Safetensors, CorruptAndHostileHeadersAreRefusedByName) {
  const std::string z8(8, '\0');
  struct Case {
    std::string bytes, error;
  };
  const std::vector<Case> cases = {
      {std::string("\x10\0\0", 3), "fewer than the 8 of the header length"},
      {st_bytes(kA, z8, 100'000'001), "over the format's limit of 100 MB"},
      {st_bytes(kA, z8, 1000), "runs past the end of the file"},
      {st_bytes(kA, z8).substr(0, 40), "runs past the end of the file"},
      {st_bytes(kA, z8.substr(0, 4)), "(the file is truncated)"},
      {st_bytes(kA, z8 + "xx"), "(bytes no tensor covers)"},
      {st_bytes(
           R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
           z8 + "1234"),
       "tensor 'b' starts at byte 4 of the data, expected 8 (it overlaps the tensor before it)"},
      {st_bytes(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", z8), "(a hole before it)"},
      {st_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,99999999999]}})", z8),
       "hold 99999999999 bytes, but dtype F32 x shape [2] is 8 bytes"},
      {st_bytes(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", z8),
       "but dtype F32 x shape [3] is 12 bytes"},
      {st_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", z8), "end before they begin"},
      {st_bytes(R"({"a":{"dtype":"Q32","shape":[2],"data_offsets":[0,8]}})", z8), "tensor 'a': unknown dtype 'Q32'"},
      {st_bytes(R"({"a":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2]}})", z8.substr(0, 2)),
       "dtype 'F8_E4M3' is not supported by fsdp-cpp"},
      {st_bytes(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", z8),
       "'shape' must hold non-negative integers"},
      {st_bytes(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,8]}})", z8),
       "the shape's size overflows"},
      {st_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8,8]}})", z8), "must be a list of two integers"},
      {st_bytes(R"({"a":{"dtype":"F32","data_offsets":[0,8]}})", z8), "missing field 'shape'"},
      {st_bytes(R"({"a":[1]})", ""), "its entry must be an object"},
      {st_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})", z8), "the header is not valid JSON"},
      {st_bytes("{\"\xff\":{}}", ""), "the header is not valid JSON"},
      {st_bytes(R"([1, 2])", ""), "must be a JSON object"},
      {st_bytes(kA.substr(0, kA.size() - 1) + R"(,"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", z8),
       "the header has the key 'a' twice"},
      {st_bytes(R"({"__metadata__":{"k":1}})", ""), "'__metadata__' entry 'k' must be a string"},
      {st_bytes(R"({"__metadata__":"x"})", ""), "'__metadata__' must be an object"},
  };
  for (const auto& c : cases) {
    expect_config_error([&] { formats::parse_safetensors(c.bytes, static_cast<int64_t>(c.bytes.size()), "f.safetensors"); },
                        c.error);
  }
  // What the package accepts, fsdp-cpp accepts: padding, fields it ignores,
  // zero-size and 0-d tensors, metadata only.
  for (
      const std::string& ok :
      {st_bytes(kA + "   ", z8), st_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", z8),
       st_bytes(
           R"({"e":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},"s":{"dtype":"F64","shape":[],"data_offsets":[0,8]}})",
           z8),
       st_bytes(R"({"__metadata__":{"format":"pt"}})", "")}) {
    EXPECT_NO_THROW(formats::parse_safetensors(ok, static_cast<int64_t>(ok.size()), "ok")) << ok.substr(8);
  }
  // BOOL bytes other than 0/1 would be undefined in LibTorch.
  const std::string b = st_bytes(R"({"b":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]}})", "\x01\x02");
  const auto h = formats::parse_safetensors(b, static_cast<int64_t>(b.size()), "b");
  expect_config_error([&] { formats::safetensors_tensor_from(b, h, h.tensors[0]); }, "holds bytes other than 0 and 1");
}

// Issue 28 item 5: a header whose JSON would take more memory than its size
// allows (a value every 3 bytes: about 30 bytes of DOM per byte) or nests
// deeper than 64 ends in a named error before its DOM is built.
TEST(Safetensors, HeaderBombsAreRefusedByName) {
  std::string dense = "{\"__metadata__\":{},\"a\":[";
  for (int i = 0; i < 3'000'000; ++i) dense += "{},";
  dense += "{}]}";
  const std::string bomb = st_bytes(dense, "");
  expect_config_error([&] { formats::parse_safetensors(bomb, static_cast<int64_t>(bomb.size()), "bomb.safetensors"); },
                      "bomb.safetensors: the header expands beyond what its size allows");
  const std::string deep = st_bytes("{\"a\":" + std::string(1000, '[') + std::string(1000, ']') + "}", "");
  expect_config_error([&] { formats::parse_safetensors(deep, static_cast<int64_t>(deep.size()), "deep.safetensors"); },
                      "the header nests arrays and objects more than 64 deep");
}

}  // namespace
