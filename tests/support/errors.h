// Assertions on fsdp's named errors.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "fsdp/error.h"

namespace fsdp::testing {

// `f` throws a ConfigError whose message contains `text`.
inline void expect_config_error(const std::function<void()>& f, const std::string& text) {
  try {
    f();
    ADD_FAILURE() << "no error, expected: " << text;
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
  }
}

// The message of the ConfigError `f` throws; "(no ConfigError)" if it throws none.
template <class F>
std::string config_error(F&& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no ConfigError)";
}

}  // namespace fsdp::testing
