// `fsdp-train tokenize` (fsdp/train/tokenize.h) against
// Hugging Face's `tokenizers` and `sentencepiece` in the venv:
// tests/python/make_tokenizers.py makes the tokenizers (Llama 3's and Llama
// 2's tokenizer.json layouts, a SentencePiece tokenizer.model) and what the
// Python packages encode of its corpus, with and without special tokens.
// Before: no such command ("The following argument was not expected:
// tokenize").
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "../support/subprocess.h"

using namespace fsdp::testing;
using Json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

#ifdef FSDP_TRAIN_TOKENIZERS_REQUIRE_PYTHON
#define SKIP_OR_FAIL_WITHOUT_REFERENCE(why) FAIL() << (why) << " (the wheel build's venv must have them: scripts/deps.sh)"
#else
#define SKIP_OR_FAIL_WITHOUT_REFERENCE(why) GTEST_SKIP() << (why) << ": no reference to compare with"
#endif

// fsdp-train tokenize with `args`; its standard output (in `dir`/stdout) and the run.
std::pair<std::string, RunResult> tokenize(const std::string& dir, const std::vector<std::string>& args) {
  std::vector<std::string> argv{"sh", "-c", "exec \"$0\" tokenize \"$@\" > '" + dir + "/stdout'", FSDP_TRAIN_PATH};
  argv.insert(argv.end(), args.begin(), args.end());
  const RunResult r = run_program(argv, std::chrono::seconds(60));
  return {read_file(dir + "/stdout"), r};
}

std::string line_of(const Json& ids) {
  std::string line;
  for (const Json& id : ids) line += (line.empty() ? "" : " ") + std::to_string(id.get<int64_t>());
  return line + "\n";
}

}  // namespace

// Each --text, then each file, one line of ids: with the special tokens by
// default (Tokenizer.encode(text), Llama 3's BOS template; the BOS first
// for a tokenizer.model), without them under --no-special-tokens, equal to
// the Python packages' ids for every line of the corpus tried (Unicode,
// emoji, white space, special tokens in the text, the empty string).
TEST(Tokenize, PrintsTheIdsThePythonTokenizersGiveOneLinePerInput) {
#ifndef FSDP_TRAIN_HAS_TOKENIZERS
  {
    TempDir none;
    const auto [out, r] = tokenize(none.path(), {"--tokenizer", none.path(), "--text", "hello"});
    EXPECT_EQ(r.exit_code(), 1) << r.output;
    EXPECT_NE(r.output.find("fsdp-train: tokenize: this fsdp-train is built"), std::string::npos) << r.output;
    GTEST_SKIP() << "fsdp-train has no fsdp::tokenizers in this build: tokenize refuses (checked)";
  }
#endif
  if (::access(FSDP_TEST_PYTHON, X_OK) != 0) SKIP_OR_FAIL_WITHOUT_REFERENCE(std::string("no ") + FSDP_TEST_PYTHON);
  TempDir dir;
  const std::string d = dir.path();
  const auto made = run_program({FSDP_TEST_PYTHON, FSDP_TEST_SOURCE_DIR "/python/make_tokenizers.py", d + "/ref"},
                                std::chrono::seconds(120));
  if (made.exit_code() != 0) SKIP_OR_FAIL_WITHOUT_REFERENCE("make_tokenizers.py failed: " + made.output);
  std::ifstream in(d + "/ref/reference.json");
  const Json reference = Json::parse(in);
  int checked = 0;
  for (const Json& t : reference["tokenizers"]) {
    const std::string name = t["name"];
    if (name != "llama3" && name != "llama2" && name != "sp_bpe") continue;
    SCOPED_TRACE(name);
    std::vector<std::string> args{"--tokenizer", d + "/ref/" + name};
    std::string want, want_plain;
    const Json& cases = t["cases"];
    size_t used = 0;
    for (const Json& c : cases) {
      const std::string text = c["text"];
      if (text.find('\0') != std::string::npos || (!text.empty() && text[0] == '-')) continue;  // not an argument
      args.push_back("--text");
      args.push_back(text);
      want += line_of(c["ids"]);
      want_plain += line_of(c["ids_plain"]);
      if (++used == 40) break;
    }
    // One more input from a file: the corpus's fourth line, whole.
    const std::string file = d + "/" + name + ".txt";
    write_file(file, cases[3]["text"].get<std::string>());
    args.push_back(file);
    want += line_of(cases[3]["ids"]);
    want_plain += line_of(cases[3]["ids_plain"]);

    const auto [out, r] = tokenize(d, args);
    ASSERT_EQ(r.exit_code(), 0) << r.output;
    EXPECT_EQ(out, want);
    args.push_back("--no-special-tokens");
    const auto [plain, rp] = tokenize(d, args);
    ASSERT_EQ(rp.exit_code(), 0) << rp.output;
    EXPECT_EQ(plain, want_plain);
    checked += static_cast<int>(used) + 1;
  }
  EXPECT_GE(checked, 3 * 20);
}

// Bad inputs are named: none at all, a missing file, a FIFO (refused before
// it is opened, no hang), text that is not UTF-8, a missing tokenizer.
TEST(Tokenize, RefusesBadInputsByName) {
#ifndef FSDP_TRAIN_HAS_TOKENIZERS
  GTEST_SKIP() << "fsdp-train has no fsdp::tokenizers in this build (the test above checks its refusal)";
#endif
  TempDir dir;
  const std::string d = dir.path();
  // The smallest tokenizer.json: a byte-level BPE over "a" and "b".
  write_file(d + "/tokenizer.json", R"({"version": "1.0", "added_tokens": [], "normalizer": null,
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
    "post_processor": null, "decoder": null,
    "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]}})");
  const auto ok = tokenize(d, {"--tokenizer", d, "--text", "abab", "--text", "ba"});
  EXPECT_EQ(ok.second.exit_code(), 0) << ok.second.output;
  EXPECT_EQ(ok.first, "2 2\n1 0\n");
  ASSERT_EQ(::mkfifo((d + "/fifo").c_str(), 0600), 0);
  write_file(d + "/bad.txt", "ab\xff");
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--tokenizer", d}, "fsdp-train: tokenize: no input: expected --text TEXT or a text file"},
      {{"--tokenizer", d, d + "/none.txt"}, "fsdp-train: tokenize: " + d + "/none.txt: no such file"},
      {{"--tokenizer", d, d + "/fifo"}, "fsdp-train: tokenize: " + d + "/fifo: not a regular file"},
      {{"--tokenizer", d, "--text", "ok", d + "/bad.txt"},
       "fsdp-train: tokenize: " + d + "/bad.txt: tokenizer: " + d + "/tokenizer.json: encode: the text is not valid "
       "UTF-8 at byte 2"},
      {{"--tokenizer", d + "/nothing", "--text", "a"}, "fsdp-train: tokenize: --tokenizer " + d + "/nothing: "},
  };
  for (const auto& [args, message] : cases) {
    const auto [out, r] = tokenize(d, args);
    EXPECT_EQ(r.exit_code(), 1) << r.output;
    EXPECT_FALSE(r.timed_out);
    EXPECT_NE(r.output.find(message), std::string::npos) << r.output;
  }
}
