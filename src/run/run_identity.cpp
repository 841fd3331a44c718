// What a checkpoint records of its run's identity (fsdp/run/run_identity.h).
#include "fsdp/run/run_identity.h"

namespace fsdp::run {

std::string config_name(const CheckpointInfo& info, const std::string& key) {
  for (const std::string& name : {"config." + key, key}) {
    if (info.values.count(name)) return name;
  }
  return "";
}

std::string run_id_of(const CheckpointInfo& info) {
  const std::string name = config_name(info, "run.id");
  return name.empty() ? "" : info.values.at(name);
}

}  // namespace fsdp::run
