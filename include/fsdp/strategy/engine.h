// fsdp/strategy/engine.h — which engine shards a model (fsdp::Engine: FSDP1's
// FullyShardedDataParallel or FSDP2's fully_shard), its names, and
// make_strategy: the Strategy (fsdp/strategy/strategy_base.h) that trains
// with an engine under FSDPStrategy's options. fsdp-train's --engine is
// this enum; the trainer asks make_strategy for its strategy and never
// branches on the engine itself. Local: nothing here communicates.
#pragma once

#include <memory>
#include <string>

#include "fsdp/strategy/model_parallel.h"
#include "fsdp/strategy/strategy.h"
#include "fsdp/strategy/strategy_base.h"

namespace fsdp {

enum class Engine {
  kFsdp1,  // "fsdp1": FullyShardedDataParallel units (flat parameters): FSDPStrategy
  kFsdp2,  // "fsdp2": fully_shard (each parameter sharded on dim 0): ModelParallelStrategy
};
// The engine's name, "fsdp1" or "fsdp2".
const char* to_string(Engine engine);
// The engine named `name`; ConfigError "'<name>' is not an engine: expected
// fsdp1 or fsdp2" otherwise.
Engine parse_engine(const std::string& name);

// The strategy that trains with `engine` under `options`: FSDPStrategy(options)
// for kFsdp1, ModelParallelStrategy(options) — its fully_shard form, the same
// units, mesh and precision — for kFsdp2 (ConfigError there for what has no
// fully_shard form: has_fully_shard_form). Local; call setup_environment next.
std::unique_ptr<Strategy> make_strategy(Engine engine, FSDPStrategyOptions options);

}  // namespace fsdp
