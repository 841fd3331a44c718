// How a training job starts (src/train/job_start.h).
#include "job_start.h"

#include <algorithm>
#include <iostream>
#include <optional>
#include <string>
#include <variant>

#include "fsdp/distributed/rank_errors.h"
#include "fsdp/error.h"
#include "fsdp/run/run_start.h"
#include "run_record.h"

namespace fsdp::train {

namespace {

// The run's tokens: --data memory-mapped (never copied whole) and read as
// --data-format says, or the generated corpus.
Corpus read_corpus(const TrainConfig& c) {
  if (c.data.empty()) return Corpus::hold(generated_corpus(), "the generated corpus");
  return Corpus::map_file(c.data, "--data", c.data_format);
}

// ConfigError when the checkpoint a run resumed from (`from`) trained on the
// same --data path as `c` and recorded another fingerprint of it
// (Corpus::fingerprint) than `now`: the file changed in place; or read it
// as another format (DataLayout::format, "data_format") than `format`: the
// same bytes would be other tokens. With --allow-data-change, said on stderr
// instead. A changed path is a changed flag (overridden_flags names it); a
// checkpoint from before fingerprints (or formats) has none to compare.
void check_data_unchanged(const ResumePoint& from, const TrainConfig& c, const std::string& now,
                          const std::string& format) {
  const auto text = [&](const char* key) -> std::optional<std::string> {
    const auto it = from.values.find(key);
    if (it == from.values.end() || !std::holds_alternative<std::string>(it->second)) return std::nullopt;
    return std::get<std::string>(it->second);
  };
  const auto was = text("data_fingerprint"), path = text("config.run.data"), was_format = text("data_format");
  if (!path || *path != c.data) return;
  const std::string data = c.data.empty() ? std::string("the generated corpus") : "--data " + c.data;
  std::string what, expected = "the same file";
  if (was && *was != now) {
    what = data + " changed since " + from.path + " was saved: its fingerprint (size:hash of sampled pages) was " +
           *was + ", it is " + now;
  } else if (was_format && *was_format != format) {
    what = data + " is read as " + format + " now (--data-format " + c.data_format + "); the run that saved " +
           from.path + " read it as " + *was_format + ", so its bytes are other tokens now";
    expected = "the file read as the run read it (--data-format)";
  } else {
    return;
  }
  if (!c.allow_data_change) {
    throw ConfigError(what + ". The run would continue on other text than it trained on; expected " + expected +
                      ", or --allow-data-change to resume on the changed one on purpose");
  }
  std::cerr << "fsdp-train: WARNING: " << what << "; resuming on it (--allow-data-change)" << std::endl;
}

// [local; prints] Checks that the checkpoint `path` (described by `info`)
// may be resumed under `c`: ConfigError naming each setting that may not
// change on resume and differs (the model's shape: fixed_setting_changes).
// Prints on stdout the flags that differ and apply from its step on
// (overridden_flags). `saved`: the checkpoint's model (checkpoint_model).
void check_resumable(const std::string& path, const CheckpointInfo& info, const CheckpointModel& saved,
                     const TrainConfig& c) {
  if (const std::string changes = fixed_setting_changes(info, c); !changes.empty()) {
    throw ConfigError("--resume: " + path + " holds a model of another shape:" + changes);
  }
  // A Llama's shapes come from its config.json: compared tensor by tensor.
  if (saved.llama && trains_llama(c)) {
    if (const std::string change = llama_shape_change(*saved.llama, llama_config(c)); !change.empty()) {
      throw ConfigError("--resume: " + path + " holds a model of another shape than --model " + c.model_source +
                        " (with its LoRA settings): " + change +
                        ": expected the config.json and LoRA settings the run started with");
    }
  }
  const auto over = overridden_flags(info, c);
  if (!over.empty()) {
    std::string msg = "fsdp-train: --resume: these flags differ from the checkpoint's run and apply from its step on:";
    for (size_t i = 0; i < over.size(); ++i) msg += (i ? "; " : " ") + over[i];
    std::cout << msg << std::endl;
  }
}

// What the run asks to resume, with fsdp-train's checks of a checkpoint:
// its model configuration readable (checkpoint_model), then resumable
// under `c` (check_resumable).
fsdp::run::ResumeRequest resume_request(const TrainConfig& c) {
  fsdp::run::ResumeRequest r;
  r.resume = c.resume;
  r.resume_from = c.resume_from;
  r.readable = [](const std::string& path, const CheckpointInfo& info) { (void)checkpoint_model(info, path); };
  r.resumable = [&c](const std::string& path, const CheckpointInfo& info) {
    check_resumable(path, info, checkpoint_model(info, path), c);
  };
  return r;
}

}  // namespace

CheckpointState run_state(const Model& model, torch::optim::Optimizer& opt, int64_t step) {
  CheckpointState s;
  s.model("model", model.ptr()).optimizer("optimizer", opt).value("step", step);
  return s;
}

RunIdentity begin_job(const Strategy& strategy, const RunDirectory& run, TrainConfig& c,
                      std::optional<RunLock>& lock) {
  const int rank = strategy.global_rank();
  std::string job;
  if (rank == 0) job = fsdp::run::job_token();
  const bool restarted = rank == 0 && fsdp::run::records_job(run, job);
  const auto votes = strategy.group().all_gather_bytes(restarted ? "restart" : c.resume ? "resume" : "");
  const bool any_restart = std::find(votes.begin(), votes.end(), "restart") != votes.end();
  const bool any_resume = std::find(votes.begin(), votes.end(), "resume") != votes.end();
  if (any_restart || (c.resume_from.empty() && any_resume)) {
    c.resume = true;
    c.overwrite = false;
  }
  dist::agree_from(strategy.group(), 0, dist::capture([&] {
                     if (rank == 0) lock.emplace(c.out);
                   }),
                   "");
  const fsdp::run::RunStart how{c.resume || !c.resume_from.empty(), c.overwrite, config_digest(c)};
  return fsdp::run::begin_run(run, strategy, how, job);
}

void read_data(const Strategy& strategy, const TrainConfig& c, int64_t vocab_size, RunData& d) {
  dist::agree(strategy.group(), dist::capture([&] {
                Corpus corpus = read_corpus(c);
                if (trains_llama(c) && corpus.layout().format == "text") {
                  throw ConfigError("--data " + c.data + " is read as text (--data-format " + c.data_format +
                                    "): its bytes would be the ids, and --model " + c.model_source +
                                    " takes its tokenizer's: expected token ids (fsdp-train prepare --tokenizer DIR "
                                    "--out FILE TEXT... writes them with llm.c's header), or --data-format uint16 or "
                                    "uint32 for a raw .bin");
                }
                d.fingerprint = corpus.fingerprint();
                d.format = corpus.layout().format;
                d.batches.emplace(std::move(corpus), c.model.context, c.batch, c.strategy.seed(),
                                  strategy.global_rank(), strategy.world_size(), strategy.root_device(),
                                  vocab_size);
              }),
              "reading --data");
  d.evaluates = c.eval_every > 0 && d.batches->has_held_out();
  if (c.eval_every > 0 && !d.evaluates) {
    const Corpus& corpus = d.batches->corpus();
    strategy.print("fsdp-train: " + corpus.name() + " is too short to hold any text out (" +
                   std::to_string(corpus.tokens()) + " " + corpus.layout().unit() + "; at least " +
                   std::to_string(min_tokens_to_hold_out(c.model.context)) +
                   " needed): no held-out loss is computed");
  }
}

Start resume_job(const Strategy& strategy, const RunDirectory& run, const TrainConfig& c,
                 const RunIdentity& identity, Model& model, torch::optim::Optimizer& opt, const RunData& data) {
  Start at;
  if (!c.resume && c.resume_from.empty()) return at;
  CheckpointState s = run_state(model, opt, 0);
  at.from = fsdp::run::resume_run(run, strategy, resume_request(c), identity, s);
  if (at.from.path.empty()) return at;
  const int nranks = strategy.world_size();
  const fsdp::run::ResumedPosition p =
      fsdp::run::resumed_position(at.from.path, at.from.values, s.get<int64_t>("step"), c.steps, c.batch, nranks);
  at.step = p.step;
  at.position = p.samples;
  strategy.print("fsdp-train: resumed from " + at.from.path + " at step " + std::to_string(at.step));
  dist::agree(strategy.group(), dist::capture([&] { check_data_unchanged(at.from, c, data.fingerprint, data.format); }),
              "--resume: comparing --data with the checkpoint's");
  if (p.world && *p.world != nranks) {
    at.resized.emplace();
    at.resized->from_world = static_cast<int>(*p.world);
    at.resized->to_world = nranks;
    at.resized->step = at.step;
  }
  return at;
}

}  // namespace fsdp::train
