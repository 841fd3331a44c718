// fsdp/train/run_settings.h — fsdp-train's run settings as one table: a row
// per setting, from which `fsdp-train --help` (the flags), --print-config
// (config_json), the hyperparameters the loggers get, the loss curve's
// title, and what a checkpoint records of the run (its values, the
// configuration digest, the flags a resume overrides, the changes a resume
// refuses) all come, and the checks validate_settings makes. A new flag is a
// new row, built in one place from a pointer to its TrainConfig member,
// with its flag, the parser of its type and its range check
// (src/train/run_settings_impl.h); a rule between settings goes into
// cross_setting_rules (fsdp/train/train_config.h). Values and text only:
// nothing here communicates; the checks read the files they name (--data,
// --resume-from).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <variant>
#include <vector>

#include "fsdp/observability/loggers.h"  // Hyperparameters
#include "fsdp/train/train_config.h"

namespace fsdp::train {

// A setting's value as --print-config prints it: a JSON boolean, integer,
// unsigned integer (the seed), number or string.
using SettingValue = std::variant<bool, int64_t, uint64_t, double, std::string>;

// `v` as text: "true"/"false", the integer, the number as an ostream prints
// it by default ("0.003"), or the string itself.
std::string setting_text(const SettingValue& v);

// One run setting.
struct RunSetting {
  // Its name in --print-config's object; "model.<x>" and "strategy.<x>"
  // nest under "model" and "strategy". The hyperparameter, the refusal of a
  // changed model shape and the title call it by the last part ("dim").
  const char* name;
  // The flag that sets it ("--lr"); "" when none does (it prints all the
  // same). A switch takes no value: its flag turns the setting on (or, for
  // --eager-init and --no-limit-all-gathers, off).
  const char* flag;
  // The flag that turns a switch back ("--no-forward-prefetch"); nullptr when none.
  const char* off_flag;
  bool is_switch;
  const char* help;           // --help's line for the flag
  bool help_shows_default;    // --help prints the default (false: `help` says it in words)
  // Whether a --resume may give it another value than the checkpoint's run
  // had: true: it applies from the resumed step on (the resume names it,
  // overridden_flags); false: the resume is refused, naming each (the
  // model's shape: the weights would not fit).
  bool may_change_on_resume;
  // Its key among a checkpoint's values ("run.lr", stored as "config.run.lr"),
  // nullptr when checkpoints do not record it.
  const char* record;
  // Its label in the configuration digest's input ("lr", "warmup"; nullptr
  // when not in it), and whether it joins the digest only where a run sets
  // it away from its default (the settings added after the digest was
  // first frozen: earlier configurations keep their digests).
  const char* digest_label;
  bool digest_when_set;
  // Its place in the digest's input, 1-based (0: not in it). Derived, never
  // written by hand: run_settings() numbers the digest's rows in the
  // table's order, first those always in it, then those that join when set.
  // A run's digest must stay the same across versions: a new row of the
  // digest is added after the table's last row of its kind, and the
  // table's digest rows are never reordered (tests/train/run_settings_test.cpp
  // pins the digests of fixed configurations).
  int digest_place;
  bool hyperparameter;  // the loggers get it (TensorBoard's HPARAMS, hparams.yaml)
  bool in_title;        // the loss curve's title names it
  // The value of `config` (the default: of TrainConfig()); resolved where
  // the config leaves it to the run (--warmup-steps -1 is a fifth of --steps).
  std::function<SettingValue(const TrainConfig&)> get;
  // Sets it from the flag's text (a switch: "true" when its flag was given,
  // "false" for its off_flag). ConfigError naming the flag for text that is
  // not a value of it. Null for a setting without a flag.
  std::function<void(TrainConfig&, const std::string&)> set;
  // How an empty string value reads in words ("(the generated corpus)"); nullptr: as "".
  const char* empty_text;
  // The setting's own range check (validate_settings runs each row's, in
  // the table's order): ConfigError naming the flag ("--steps must be
  // positive, got 0"). Null when every value of its type is valid; rules
  // between settings are cross_setting_rules'.
  std::function<void(const TrainConfig&)> check;
};

// The table, in --print-config's and --help's order, which is also the
// configuration digest's (RunSetting::digest_place). --preset comes before
// the model's sizes: setting it sets them (to the preset's), and a size's
// flag overrides it after; --mesh comes after --sharding-strategy, which
// it sets to HYBRID_SHARD.
const std::vector<RunSetting>& run_settings();

// The row named `name`; nullptr when none is.
const RunSetting* find_setting(const std::string& name);

// The last part of a row's name: "dim" of "model.dim".
std::string short_name(const RunSetting& row);

// The run's configuration as the loggers' hyperparameters: each
// hyperparameter row by the last part of its name, and "world".
Hyperparameters hyperparameters(const TrainConfig& config, int world);

// The loss curve's title: "fsdp-train --preset tiny --dim 64 ... --lr 0.003,
// world 2", each title row as its flag and value.
std::string loss_curve_title(const TrainConfig& config, int world);

}  // namespace fsdp::train
