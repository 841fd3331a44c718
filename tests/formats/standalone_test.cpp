// The formats module alone: a safetensors file and a pickle written and read
// back with nothing but fsdp/formats/*.h (no FSDP object, no process group),
// as a program that only reads and writes PyTorch's files would use them.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <unistd.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "fsdp/formats/pickle_writer.h"
#include "fsdp/formats/safetensors.h"
#include "fsdp/formats/torch_pickle.h"

namespace fs = std::filesystem;
namespace formats = fsdp::formats;

TEST(FormatsAlone, WritesAndReadsASafetensorsFile) {
  const fs::path dir = fs::temp_directory_path() / ("fsdp-formats-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string path = (dir / "weights.safetensors").string();
  const std::map<std::string, torch::Tensor> tensors{{"w", torch::arange(6, torch::kFloat32).reshape({2, 3})},
                                                     {"b", torch::tensor({int64_t{1}, int64_t{-2}})}};
  std::vector<formats::SafetensorsTensor> plan;
  for (const auto& [k, t] : tensors) plan.push_back({k, t.scalar_type(), t.sizes().vec(), 0, 0});
  formats::SafetensorsWriter w(path, plan, {{"format", "pt"}});
  for (const auto& t : w.layout()) w.write(tensors.at(t.name));
  w.commit();

  const formats::SafetensorsHeader h = formats::read_safetensors_header(path);
  EXPECT_EQ(h.metadata.at("format"), "pt");
  ASSERT_EQ(h.tensors.size(), tensors.size());
  for (const auto& t : h.tensors) EXPECT_TRUE(torch::equal(formats::read_safetensors_tensor(path, h, t), tensors.at(t.name))) << t.name;
  fs::remove_all(dir);
}

TEST(FormatsAlone, WritesAndReadsAPickle) {
  // {"step": 3, "lr": 0.5, "name": "x", "flags": [True, None]}
  formats::pickle::Writer w;
  w.empty_dict();
  w.mark();
  w.str("step");
  w.integer(3);
  w.str("lr");
  w.floating(0.5);
  w.str("name");
  w.str("x");
  w.str("flags");
  w.empty_list();
  w.mark();
  w.boolean(true);
  w.none();
  w.appends();
  w.setitems();
  const auto parsed = formats::pickle::parse(w.finish(), "memory.pkl");
  using K = formats::pickle::Value::Kind;
  const auto& root = parsed.root();
  ASSERT_EQ(root.kind, K::kDict);
  ASSERT_NE(root.get("step"), nullptr);
  EXPECT_EQ(root.get("step")->integer, 3);
  EXPECT_EQ(root.get("lr")->floating, 0.5);
  EXPECT_EQ(root.get("name")->text, "x");
  const auto* flags = root.get("flags");
  ASSERT_EQ(flags->kind, K::kList);
  ASSERT_EQ(flags->items.size(), 2u);
  EXPECT_TRUE(flags->items[0]->boolean);
  EXPECT_EQ(flags->items[1]->kind, K::kNone);
  EXPECT_FALSE(formats::pickle::describe(root).empty());
}
