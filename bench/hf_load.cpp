// fsdp-hf-load: the load of a Hugging Face model directory into a model that
// fully_shard shards, timed and measured per rank, for the comparison with
// PyTorch's two ways in docs/performance.md ("Hugging Face models";
// bench/hf_peers.py is PyTorch's side).
//
//   fsdp-run --nproc-per-node 2 -- fsdp-hf-load DIR [--dtype bfloat16|float32]
//
// The model is built sharded (EmptyInitGuard: each decoder layer gets its
// memory when fully_shard shards it) in --dtype, uninitialised
// (LlamaConfig::initialize, as from_pretrained), then hf::load_weights reads
// each rank's byte ranges. Prints one JSON line per rank: seconds (the build,
// the sharding and the load, between two barriers), peak_rss_mib
// (ru_maxrss), base_rss_mib (before the build: LibTorch and the process
// group), built_rss_mib (after the sharded build, before the load),
// shard_mib (the rank's parameter bytes), bytes_read and peak_buffer_bytes
// (the loader's counters).
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <c10/core/DefaultDtype.h>

#include <chrono>
#include <iostream>
#include <memory>
#include <string>

#include "fsdp/core/utils.h"  // resident_memory_mib
#include "fsdp/distributed/process_group.h"
#include "fsdp/error.h"
#include "fsdp/fsdp2/fully_shard.h"
#include "fsdp/hf/hf_model.h"
#include "fsdp/models/llama.h"

int main(int argc, char** argv) {
  CLI::App app{"fsdp-hf-load: load a Hugging Face model directory sharded, and measure it"};
  std::string dir, dtype = "bfloat16";
  app.add_option("dir", dir, "the model directory (config.json and safetensors)")->required();
  app.add_option("--dtype", dtype, "the model's dtype: bfloat16 or float32")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    if (dtype != "bfloat16" && dtype != "float32") throw fsdp::ConfigError("--dtype " + dtype + ": expected bfloat16 or float32");
    auto world = fsdp::dist::init_process_group_from_env();
    const double base = fsdp::resident_memory_mib();
    auto config = fsdp::hf::read_config(dir);
    config.initialize = false;  // the weights come next, as from_pretrained
    // The weights' headers against the config before anything is built: a
    // num_hidden_layers or a size they do not have is refused by key.
    fsdp::hf::check_weights(fsdp::HfStorageReader(dir), config);
    world->barrier();
    const auto t = std::chrono::steady_clock::now();
    // The modules' parameters are made in --dtype (LibTorch's default dtype
    // while they are built and sharded).
    const auto was = c10::get_default_dtype();
    c10::set_default_dtype(dtype == "bfloat16" ? caffe2::TypeMeta::Make<at::BFloat16>() : caffe2::TypeMeta::Make<float>());
    fsdp::Unit<fsdp::models::LlamaImpl> model(nullptr);
    {
      fsdp::EmptyInitGuard deferred;
      model = fsdp::Unit<fsdp::models::LlamaImpl>(config);
    }
    fsdp::Mesh mesh = fsdp::Mesh::of(world);
    for (auto& layer : model->model->layers) fsdp::fully_shard(layer, mesh);
    fsdp::fully_shard(model, mesh);
    c10::set_default_dtype(was);
    const double built = fsdp::resident_memory_mib();
    int64_t param_bytes = 0;
    for (const auto& p : model->parameters()) param_bytes += p.numel() * static_cast<int64_t>(p.element_size());
    const fsdp::hf::LoadStats stats = fsdp::hf::load_weights(dir, config, model.ptr(), *world);
    world->barrier();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
    rusage r{};
    getrusage(RUSAGE_SELF, &r);
    std::cout << "{\"peer\": \"fsdp-cpp\", \"rank\": " << world->rank() << ", \"seconds\": " << seconds
              << ", \"peak_rss_mib\": " << static_cast<double>(r.ru_maxrss) / 1024.0 << ", \"base_rss_mib\": " << base
              << ", \"built_rss_mib\": " << built << ", \"shard_mib\": " << static_cast<double>(param_bytes) / (1 << 20)
              << ", \"bytes_read\": " << stats.bytes_read << ", \"peak_buffer_bytes\": " << stats.peak_buffer_bytes
              << "}" << std::endl;
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "fsdp-hf-load: " << e.what() << std::endl;
    return 1;
  }
}
