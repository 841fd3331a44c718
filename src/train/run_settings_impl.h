// src/train/run_settings_impl.h — the private half of run_settings: how a
// row of the run settings' table is built (run_settings.cpp): from a
// pointer to its TrainConfig member, with its flag, the parser of its type
// and its range check in one place:
//
//   Row("steps", "--steps", "training steps").of(&C::steps).positive().record("run.steps")
//
// Values and text only; header-only, for run_settings.cpp.
#pragma once

#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>

#include "fsdp/error.h"
#include "fsdp/train/run_settings.h"

namespace fsdp::train::rows {

// The flag's text as an integer of type T; ConfigError naming the flag otherwise.
template <class T>
T whole(const char* flag, const std::string& text) {
  T v{};
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec != std::errc() || ptr != end) {
    throw ConfigError(std::string(flag) + " '" + text + "': expected an integer from " +
                      std::to_string(std::numeric_limits<T>::min()) + " to " +
                      std::to_string(std::numeric_limits<T>::max()));
  }
  return v;
}

inline double number(const char* flag, const std::string& text) {
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE) {
    throw ConfigError(std::string(flag) + " '" + text + "': expected a number");
  }
  return v;
}

// `set`, its ConfigError prefixed with "<flag>: " (a parser's error names the value, not the flag).
template <class F>
void named(const char* flag, F set) {
  try {
    set();
  } catch (const ConfigError& e) {
    throw ConfigError(std::string(flag) + ": " + e.what());
  }
}

using C = TrainConfig;
using V = SettingValue;
inline const FSDPStrategyOptions& S(const C& c) { return c.strategy; }

// A setting's value as a SettingValue (int as int64_t).
template <class T>
V value_of(const T& v) {
  if constexpr (std::is_same_v<T, int>) {
    return int64_t{v};
  } else {
    return v;
  }
}

// The flag's text as a T (a switch: "true" / "false").
template <class T>
T parse(const char* flag, const std::string& text) {
  if constexpr (std::is_same_v<T, bool>) {
    return text == "true";
  } else if constexpr (std::is_same_v<T, double>) {
    return number(flag, text);
  } else if constexpr (std::is_same_v<T, std::string>) {
    return text;
  } else {
    return whole<T>(flag, text);
  }
}

// One row being built: the setting's name, flag and help, then what else
// it is (a switch, recorded, in the digest, ...), its value (get/set) and
// its own range check, all in one place. Defaults: a flag that takes a
// value, --help shows its default, a resume may change it.
class Row {
 public:
  Row(const char* name, const char* flag, const char* help) {
    r_.name = name;
    r_.flag = flag;
    r_.off_flag = nullptr;
    r_.is_switch = false;
    r_.help = help;
    r_.help_shows_default = true;
    r_.may_change_on_resume = true;
    r_.record = nullptr;
    r_.digest_label = nullptr;
    r_.digest_when_set = false;
    r_.digest_place = 0;  // numbered by run_settings(), in the table's order
    r_.hyperparameter = false;
    r_.in_title = false;
    r_.empty_text = nullptr;
  }
  // The value `member` (of TrainConfig, or `inner` of its member `outer`):
  // get reads it, set parses the flag's text as its type.
  template <class T>
  Row&& of(T C::*member) && {
    const char* flag = r_.flag;
    r_.get = [member](const C& c) -> V { return value_of(c.*member); };
    r_.set = [member, flag](C& c, const std::string& t) { c.*member = parse<T>(flag, t); };
    at_ = [member](const C& c) -> double { return as_number(c.*member); };
    return std::move(*this);
  }
  template <class O, class T>
  Row&& of(O C::*outer, T O::*inner) && {
    const char* flag = r_.flag;
    r_.get = [outer, inner](const C& c) -> V { return value_of(c.*outer.*inner); };
    r_.set = [outer, inner, flag](C& c, const std::string& t) { c.*outer.*inner = parse<T>(flag, t); };
    at_ = [outer, inner](const C& c) -> double { return as_number(c.*outer.*inner); };
    return std::move(*this);
  }
  // A value that is not a plain member (the strategy's options, a parsed name).
  Row&& get(std::function<V(const C&)> f) && {
    r_.get = std::move(f);
    return std::move(*this);
  }
  Row&& set(std::function<void(C&, const std::string&)> f) && {
    r_.set = std::move(f);
    return std::move(*this);
  }
  // A switch: its flag turns it on ("true"); `off` turns it back.
  Row&& switch_flag(const char* off = nullptr) && {
    r_.is_switch = true;
    r_.off_flag = off;
    return std::move(*this);
  }
  Row&& default_in_words() && {  // --help's line says the default itself
    r_.help_shows_default = false;
    return std::move(*this);
  }
  Row&& fixed_on_resume() && {  // the model's shape: a resume that changes it is refused
    r_.may_change_on_resume = false;
    return std::move(*this);
  }
  Row&& record(const char* key) && {
    r_.record = key;
    return std::move(*this);
  }
  // In the configuration digest as "<label> <value>", at the row's place
  // in the table (RunSetting::digest_place); digest_when_set: only where a
  // run sets it away from its default (a setting added to the digest later).
  Row&& digest(const char* label) && {
    r_.digest_label = label;
    return std::move(*this);
  }
  Row&& digest_when_set(const char* label) && {
    r_.digest_label = label;
    r_.digest_when_set = true;
    return std::move(*this);
  }
  Row&& hyperparameter() && {
    r_.hyperparameter = true;
    return std::move(*this);
  }
  Row&& title() && {
    r_.in_title = true;
    return std::move(*this);
  }
  Row&& empty_text(const char* text) && {
    r_.empty_text = text;
    return std::move(*this);
  }
  // Range checks of the member's value (`of`), ConfigError naming the flag:
  // at least `low` (`what` says the range in words, else "positive").
  Row&& at_least(double low, const char* what = nullptr) && {
    const char* flag = r_.flag;
    add_check([at = at_, low, flag, what](const C& c) {
      const double v = at(c);
      if (v >= low) return;
      throw ConfigError(std::string(flag) + " must be " + (what ? what : "positive") + ", got " + number_text(v));
    });
    return std::move(*this);
  }
  Row&& positive() && { return std::move(*this).at_least(1); }
  Row&& at_most(double high) && {
    const char* flag = r_.flag;
    add_check([at = at_, high, flag](const C& c) {
      const double v = at(c);
      if (v <= high) return;
      throw ConfigError(std::string(flag) + " must be at most " + number_text(high) + ", got " + number_text(v));
    });
    return std::move(*this);
  }
  // Any other check of the setting's own value.
  Row&& check(std::function<void(const C&)> f) && {
    add_check(std::move(f));
    return std::move(*this);
  }
  RunSetting done() && { return std::move(r_); }

 private:
  template <class T>
  static double as_number(const T& v) {
    if constexpr (std::is_arithmetic_v<T>) {
      return static_cast<double>(v);
    } else {
      return 0;
    }
  }
  // Integers as integers ("-5"), other numbers as std::to_string writes them.
  static std::string number_text(double v) {
    if (v == static_cast<double>(static_cast<int64_t>(v))) return std::to_string(static_cast<int64_t>(v));
    return std::to_string(v);
  }
  void add_check(std::function<void(const C&)> f) {
    if (!r_.check) {
      r_.check = std::move(f);
      return;
    }
    r_.check = [a = std::move(r_.check), b = std::move(f)](const C& c) {
      a(c);
      b(c);
    };
  }
  RunSetting r_{};
  std::function<double(const C&)> at_;
};

}  // namespace fsdp::train::rows
