// fsdp-train: trains a byte-level GPT with fsdp-cpp (run it under fsdp-run),
// generates text from one of its checkpoints, or tokenizes text into a
// token-id file for --data.
//   fsdp-run --nproc-per-node 2 -- fsdp-train --preset tiny --steps 100 --out runs/tiny
//   fsdp-run --nproc-per-node 1 -- fsdp-train generate --checkpoint runs/tiny/checkpoints/step-00000100 --prompt "the"
//   fsdp-run --nproc-per-node 1 -- fsdp-train generate --model hf:Meta-Llama-3-8B --prompt "The" --temperature 0
//   fsdp-train prepare --tokenizer Meta-Llama-3-8B --out train.bin --append-eos a.txt b.txt
//   fsdp-train tokenize --tokenizer Meta-Llama-3-8B --text "Hello world"
#include <CLI/CLI.hpp>
#include <c10/util/Exception.h>

#include <charconv>
#include <cstdlib>
#include <limits>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "fsdp/distributed/process_group.h"  // init_process_group_from_env
#include "fsdp/error.h"
#include "fsdp/train/gpt_trainer.h"
#include "fsdp/train/prepare.h"
#include "fsdp/train/run_settings.h"
#include "fsdp/train/tokenize.h"

namespace {

// Prints "fsdp-train: <what>" to stderr in one write, so that the lines of
// ranks sharing one output (mpirun's, a terminal) never interleave; status 1.
int fail(const std::string& what) {
  const std::string line = "fsdp-train: " + what + "\n";
  std::cerr.write(line.data(), static_cast<std::streamsize>(line.size()));
  std::cerr.flush();
  return 1;
}

// `fsdp-train tokenize` (fsdp/train/tokenize.h): its options, and the run.
struct TokenizeCommand {
  CLI::App* app = nullptr;
  fsdp::train::TokenizeOptions options;
  bool plain = false;

  explicit TokenizeCommand(CLI::App& parent) {
    app = parent.add_subcommand("tokenize",
                                "print the token ids of texts, one line per input, as Hugging Face's tokenizer "
                                "encodes them (with its special tokens, as Tokenizer.encode(text) by default)");
    app->add_option("--tokenizer", options.tokenizer,
                    "a model directory (tokenizer.json or tokenizer.model) or the file")
        ->required();
    app->add_option("--text", options.texts, "a text to encode (repeatable; each one line of ids, before the files)")
        ->allow_extra_args(false);  // one text per --text: the words after it are files
    app->add_flag("--no-special-tokens", plain, "without the special tokens (encode(text, add_special_tokens=False))");
    app->add_option("files", options.files, "text files (UTF-8), each encoded whole as one input; - for standard input");
  }
  int run() {
    options.add_special_tokens = !plain;
    fsdp::train::tokenize(options, std::cout);
    return 0;
  }
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fsdp-train: a byte-level GPT trained with Fully Sharded Data Parallel"};
  fsdp::train::TrainConfig c;
  // One option per row of the run settings' table (fsdp/train/run_settings.h),
  // read as text and set through the row after parsing (in the table's
  // order: --preset before the model's sizes it sets), so that a bad value
  // is an error naming its flag. The defaults shown are TrainConfig's.
  const auto& rows = fsdp::train::run_settings();
  std::vector<std::string> texts(rows.size());
  std::unique_ptr<bool[]> switches(new bool[rows.size()]());  // a switch's value (bool&, which vector<bool> lacks)
  std::vector<CLI::Option*> given(rows.size(), nullptr);
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& row = rows[i];
    if (*row.flag == '\0') continue;  // no flag sets it
    if (row.is_switch) {
      const std::string names = row.off_flag ? std::string(row.flag) + ",!" + row.off_flag : std::string(row.flag);
      given[i] = app.add_flag(names, switches[i], row.help);
      continue;
    }
    given[i] = app.add_option(row.flag, texts[i], row.help);
    if (row.help_shows_default) given[i]->default_str(fsdp::train::setting_text(row.get(c)));
  }
  app.get_option("--overwrite")->excludes(app.get_option("--resume"));
  bool print_config = false;
  app.add_flag("--print-config", print_config,
               "print the configuration these flags make (JSON: the run's settings and the strategy's) and exit");

  auto* gen = app.add_subcommand("generate", "continue a prompt with a trained checkpoint");
  std::string checkpoint, prompt = "the ";
  fsdp::train::GenerateOptions go;
  std::string gen_model;
  auto* gen_checkpoint = gen->add_option("--checkpoint", checkpoint, "checkpoint file or directory");
  gen->add_option("--model", gen_model, "hf:DIR: a Hugging Face model directory (config.json, safetensors, tokenizer) "
                                        "instead of a checkpoint")
      ->excludes(gen_checkpoint);
  gen->add_option("--prompt", prompt, "text to continue")->capture_default_str();
  // As text, parsed below: CLI11 saturates an integer beyond 64 bits instead of refusing it.
  std::string tokens = std::to_string(go.tokens);
  gen->add_option("--tokens", tokens, "tokens to generate (bytes for the GPT; printed as they are drawn)")->capture_default_str();
  gen->add_option("--temperature", go.temperature, "sampling temperature; 0: greedy")->capture_default_str();
  gen->add_option("--top-k", go.top_k, "sample among the k most likely tokens; 0: all")->capture_default_str();
  gen->add_option("--seed", go.seed, "sampling seed")->capture_default_str();
  gen->add_option("--tokenizer", go.tokenizer,
                  "a Llama checkpoint's tokenizer: a model directory or its tokenizer.json / tokenizer.model "
                  "(default: the --model hf:DIR it was trained from)");

  auto* prep = app.add_subcommand(
      "prepare", "tokenize text files with a model's tokenizer into a token-id file for --data (llm.c's format)");
  fsdp::train::PrepareOptions po;
  prep->add_option("--tokenizer", po.tokenizer, "a model directory (tokenizer.json or tokenizer.model) or the file")
      ->required();
  prep->add_option("--out", po.out, "the token file to write (llm.c's format: uint16 ids, uint32 above 65536 tokens)")
      ->required();
  prep->add_flag("--append-eos", po.append_eos, "the tokenizer's EOS after each input file");
  prep->add_flag("--add-bos", po.add_bos,
                 "the tokenizer's BOS before each input file (without it no BOS is written, where transformers' "
                 "tok(text) adds a Llama's)");
  prep->add_option("--chunk-bytes", po.chunk_bytes, "text read and encoded at a time (cut at line breaks)")
      ->capture_default_str();
  prep->add_option("inputs", po.inputs, "text files (UTF-8), in order")->required();
  TokenizeCommand tokenize(app);
  CLI11_PARSE(app, argc, argv);
  try {
    if (tokenize.app->parsed()) return tokenize.run();
    if (prep->parsed()) {
      const fsdp::train::PrepareResult r = fsdp::train::prepare(po);
      std::cout << "fsdp-train prepare: wrote " << po.out << ": " << r.tokens << " tokens of a vocabulary of "
                << r.vocab_size << " (llm.c version " << r.version << ", " << (r.version == 1 ? "uint16" : "uint32")
                << " ids) from " << po.inputs.size() << " file" << (po.inputs.size() == 1 ? "" : "s") << std::endl;
      return 0;
    }
    if (gen->parsed()) {
      auto world = fsdp::dist::init_process_group_from_env();
      {
        const char* end = tokens.data() + tokens.size();
        const auto [ptr, ec] = std::from_chars(tokens.data(), end, go.tokens);
        if (ec != std::errc() || ptr != end || go.tokens < 0) {
          throw fsdp::ConfigError("generate: --tokens " + tokens + " is not a count of bytes: expected an integer from 0 to " +
                                  std::to_string(std::numeric_limits<int64_t>::max()));
        }
      }
      if (checkpoint.empty() == gen_model.empty() || (!gen_model.empty() && gen_model.rfind("hf:", 0) != 0)) {
        throw fsdp::ConfigError("generate: expected --checkpoint PATH (a checkpoint of fsdp-train's) or --model hf:DIR "
                                "(a Hugging Face model directory)" +
                                (gen_model.empty() ? std::string() : ", got --model " + gen_model));
      }
      if (!gen_model.empty()) checkpoint = gen_model;  // generate_stream takes "hf:DIR" in its place
      // Rank 0 prints the text as it grows: the prompt once the checkpoint
      // loaded, then each byte as it is drawn.
      const bool printer = world->rank() == 0;
      fsdp::train::generate_stream(checkpoint, prompt, go, world, [&](char ch) {
        if (printer) std::cout << ch << std::flush;
      });
      if (printer) std::cout << std::endl;
      return 0;
    }
    // A restart (by fsdp-run --max-restarts, or torchrun's) continues the run
    // it restarts from its newest checkpoint, --overwrite applying to the
    // job's first start only: train() tells a restart by proof
    // (fsdp::train::job_token), never by TORCHELASTIC_RESTART_COUNT alone.
    c.model = fsdp::train::preset(c.preset);
    for (size_t i = 0; i < rows.size(); ++i) {
      if (given[i] && given[i]->count() > 0) rows[i].set(c, rows[i].is_switch ? (switches[i] ? "true" : "false") : texts[i]);
    }
    if (print_config) {
      (void)fsdp::train::model_spec(c);  // a Llama's config.json read and checked, as train() does
      fsdp::train::validate_settings(c);  // the errors a run gives; nothing is written
      std::cout << fsdp::train::config_json(c) << std::endl;
      return 0;
    }
    fsdp::train::train(c, fsdp::dist::init_process_group_from_env());
    return 0;
  } catch (const c10::Error& e) {
    return fail(e.what_without_backtrace());  // no LibTorch stack trace
  } catch (const std::exception& e) {
    return fail(e.what());
  }
}
