// fsdp::Engine's names and make_strategy (fsdp/strategy/engine.h).
#include "fsdp/strategy/engine.h"

#include "fsdp/error.h"
#include "fsdp/text/enum_names.h"

namespace fsdp {

namespace {
constexpr text::EnumName<Engine> kEngineNames[] = {{Engine::kFsdp1, "fsdp1"}, {Engine::kFsdp2, "fsdp2"}};
}  // namespace

const char* to_string(Engine engine) { return text::name_of(kEngineNames, engine); }

Engine parse_engine(const std::string& name) {
  if (auto engine = text::value_of(kEngineNames, name)) return *engine;
  throw ConfigError("'" + name + "' is not an engine: expected " + text::list_names(kEngineNames, " or "));
}

std::unique_ptr<Strategy> make_strategy(Engine engine, FSDPStrategyOptions options) {
  if (engine == Engine::kFsdp2) return std::make_unique<ModelParallelStrategy>(std::move(options));
  return std::make_unique<FSDPStrategy>(std::move(options));
}

}  // namespace fsdp
