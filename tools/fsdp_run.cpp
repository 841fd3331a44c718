// fsdp-run: torchrun-compatible launcher. See include/fsdp/launch/launcher.h.
#include <iostream>

#include "fsdp/launch/env.h"
#include "fsdp/error.h"
#include "fsdp/launch/launcher.h"

int main(int argc, char** argv) {
  try {
    auto options = fsdp::launch::parse_launch_args(std::vector<std::string>(argv + 1, argv + argc));
    if (options.help) {
      std::cout << fsdp::launch::usage();
      return 0;
    }
    if (options.print_env) return fsdp::launch::print_env(fsdp::launch::process_env(), std::cout, std::cerr);
    for (const auto& w : options.warnings) std::cerr << w << "\n";
    return fsdp::launch::launch(options);
  } catch (const fsdp::ConfigError& e) {
    std::cerr << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
}
