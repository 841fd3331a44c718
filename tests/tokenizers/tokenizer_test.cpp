// fsdp::tokenizers (fsdp/tokenizers/tokenizer.h) against Hugging Face's
// `tokenizers` and Google's `sentencepiece`: tests/python/make_tokenizers.py
// trains tokenizers in the layouts of Llama 2 and 3, Mistral, Qwen2 and
// GPT-2 (no hub access), and writes what the Python packages make of its
// corpus (Unicode, emoji, digits, white space, contractions, special tokens
// in the text, the empty string, seeded random lines); every line must
// encode and decode the same here, with and without special tokens. Then
// PCRE2's character classes against Oniguruma's, and the refusals of bad
// files, which need no Python.
//
// The venv's Python is the reference; where it is absent (a Debian build on
// a machine without the venv) the comparisons skip, and the wheel build
// (FSDP_TOKENIZERS_REQUIRE_PYTHON) fails instead.
#include "fsdp/tokenizers/tokenizer.h"

#include <gtest/gtest.h>
#include <unicode/uchar.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "../../src/tokenizers/regex.h"
#include "../../src/tokenizers/unicode.h"
#include "../support/subprocess.h"
#include "fsdp/error.h"

using fsdp::testing::TempDir;
using fsdp::tokenizers::load_tokenizer;
using fsdp::tokenizers::Tokenizer;
using Json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

const char* const kScript = FSDP_TEST_SOURCE_DIR "/python/make_tokenizers.py";

// Why the Python reference cannot run here, or "" when it can.
std::string python_missing() {
  if (::access(FSDP_TOKENIZERS_PYTHON, X_OK) != 0) return std::string("no ") + FSDP_TOKENIZERS_PYTHON;
  auto r = fsdp::testing::run_program({FSDP_TOKENIZERS_PYTHON, "-c", "import tokenizers, sentencepiece"},
                                      std::chrono::seconds(60));
  if (r.exit_code() != 0) {
    return std::string(FSDP_TOKENIZERS_PYTHON) + " lacks tokenizers or sentencepiece: " + r.output;
  }
  return "";
}

#ifdef FSDP_TOKENIZERS_REQUIRE_PYTHON
#define SKIP_OR_FAIL_WITHOUT_PYTHON(why) FAIL() << (why) << " (the wheel build's venv must have them: scripts/deps.sh)"
#else
#define SKIP_OR_FAIL_WITHOUT_PYTHON(why) GTEST_SKIP() << (why) << ": no reference to compare with"
#endif

// The tokenizers and the reference, made once per process (CTest runs each
// test in a process of its own: one Python run per test, about a second).
struct Reference {
  TempDir dir;
  Json json;
  std::string error;
};

const Reference& reference() {
  static Reference* ref = [] {
    auto* r = new Reference;
    auto run = fsdp::testing::run_program({FSDP_TOKENIZERS_PYTHON, kScript, r->dir.path()}, std::chrono::seconds(100));
    if (run.exit_code() != 0) {
      r->error = "make_tokenizers.py failed: " + run.output;
      return r;
    }
    std::ifstream in(r->dir.path() + "/reference.json");
    r->json = Json::parse(in);
    return r;
  }();
  return *ref;
}

const Json& reference_of(const std::string& name) {
  for (const Json& t : reference().json["tokenizers"]) {
    if (t["name"] == name) return t;
  }
  static const Json none;
  return none;
}

std::vector<int64_t> ids_of(const Json& j) { return j.get<std::vector<int64_t>>(); }

std::string printable(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20) {
      out += "\\x" + std::string(1, "0123456789abcdef"[c >> 4]) + "0123456789abcdef"[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  return out.size() > 120 ? out.substr(0, 117) + "..." : out;
}

class Corpus : public ::testing::TestWithParam<const char*> {};

// Every corpus line, token for token: encode with and without the special
// tokens, decode keeping and skipping them; decode of random ids (cut UTF-8
// and all); the vocab size, BOS, EOS and token_to_id of a few tokens.
TEST_P(Corpus, EncodesAndDecodesEveryLineAsThePythonPackagesDo) {
  if (std::string why = python_missing(); !why.empty()) SKIP_OR_FAIL_WITHOUT_PYTHON(why);
  ASSERT_EQ(reference().error, "");
  const std::string name = GetParam();
  const Json& ref = reference_of(name);
  ASSERT_FALSE(ref.is_null()) << "make_tokenizers.py made no tokenizer " << name;
  const std::string dir = reference().dir.path() + "/" + name;
  std::unique_ptr<Tokenizer> tok = load_tokenizer(dir);

  EXPECT_EQ(tok->vocab_size(), ref["vocab_size"].get<int64_t>());
  EXPECT_EQ(tok->bos_id(), ref["bos"].is_null() ? std::nullopt : std::optional<int64_t>(ref["bos"].get<int64_t>()));
  EXPECT_EQ(tok->eos_id(), ref["eos"].is_null() ? std::nullopt : std::optional<int64_t>(ref["eos"].get<int64_t>()));
  for (const auto& [token, id] : ref["token_ids"].items()) {
    EXPECT_EQ(tok->token_to_id(token), id.is_null() ? std::nullopt : std::optional<int64_t>(id.get<int64_t>()))
        << "token_to_id('" << token << "')";
  }
  for (const auto& [id, token] : ref["id_tokens"].items()) {
    EXPECT_EQ(tok->id_to_token(std::stoll(id)),
              token.is_null() ? std::nullopt : std::optional<std::string>(token.get<std::string>()))
        << "id_to_token(" << id << ")";
  }

  int lines = 0, failures = 0;
  for (const Json& c : ref["cases"]) {
    const std::string text = c["text"];
    const std::vector<int64_t> ids = tok->encode(text, true), plain = tok->encode(text, false);
    const std::string decoded = tok->decode(ids_of(c["ids"]), false), skipped = tok->decode(ids_of(c["ids"]), true);
    const bool same = ids == ids_of(c["ids"]) && plain == ids_of(c["ids_plain"]) && decoded == c["decoded"] &&
                      skipped == c["decoded_skip"];
    ++lines;
    if (!same && ++failures <= 5) {
      ADD_FAILURE() << name << ": line '" << printable(text) << "':\n  ids  " << Json(ids).dump() << "\n  want "
                    << c["ids"].dump() << "\n  plain " << Json(plain).dump() << "\n  want  " << c["ids_plain"].dump()
                    << "\n  decoded '" << printable(decoded) << "'\n  want    '"
                    << printable(c["decoded"].get<std::string>()) << "'\n  skipped '" << printable(skipped)
                    << "'\n  want    '" << printable(c["decoded_skip"].get<std::string>()) << "'";
    }
  }
  EXPECT_EQ(failures, 0) << name << ": " << failures << " of " << lines << " lines differ";
  int decodes = 0, decode_failures = 0;
  for (const Json& d : ref["decodes"]) {
    ++decodes;
    const std::string kept = tok->decode(ids_of(d["ids"]), false), skipped = tok->decode(ids_of(d["ids"]), true);
    if ((kept != d["decoded"] || skipped != d["decoded_skip"]) && ++decode_failures <= 5) {
      ADD_FAILURE() << name << ": decode(" << d["ids"].dump() << "): '" << printable(kept) << "', want '"
                    << printable(d["decoded"].get<std::string>()) << "'; skipping special tokens '"
                    << printable(skipped) << "', want '" << printable(d["decoded_skip"].get<std::string>()) << "'";
    }
  }
  std::cout << name << ": " << lines - failures << " of " << lines
            << " lines encode (with and without special tokens) and decode (keeping and skipping them) as the "
               "Python package does; "
            << decodes - decode_failures << " of " << decodes << " random id lists decode the same\n";
  RecordProperty("lines", lines);
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, Corpus,
                         ::testing::Values("llama3", "gpt2", "roberta", "qwen2", "splits", "sp_bpe", "sp_unigram",
                                           "llama2", "mistral", "sp_metaspace"),
                         [](const ::testing::TestParamInfo<const char*>& info) { return std::string(info.param); });

// A truncated tokenizer.model is refused by sentencepiece, named.
TEST(Errors, TruncatedSentencePieceModelNamesTheFile) {
  if (std::string why = python_missing(); !why.empty()) SKIP_OR_FAIL_WITHOUT_PYTHON(why);
  ASSERT_EQ(reference().error, "");
  const std::string model = fsdp::testing::read_file(reference().dir.path() + "/sp_bpe/tokenizer.model");
  ASSERT_GT(model.size(), 1000u);
  TempDir d;
  for (size_t keep : {model.size() / 2, model.size() - 7, size_t{11}}) {
    const std::string path = d.path() + "/tokenizer.model";
    std::ofstream(path, std::ios::binary) << model.substr(0, keep);
    try {
      load_tokenizer(path);
      ADD_FAILURE() << "a tokenizer.model cut to " << keep << " bytes loaded";
    } catch (const fsdp::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("sentencepiece refuses the model"), std::string::npos) << e.what();
    }
  }
}

// PCRE2's \s, \p{L}, \p{N} and [^\s\p{L}\p{N}] (the classes of Llama 3's,
// Qwen2's and GPT-2's patterns) against Oniguruma's in tokenizers, over
// every code point: they agree on every character Unicode 14 (PCRE2
// 10.42's) assigns, but for U+180E, which PCRE2's \s matches (the
// difference docs/tokenizers.md names).
TEST(CharClasses, Pcre2MatchesOnigurumaOnEveryCodePointOfUnicode14) {
  if (std::string why = python_missing(); !why.empty()) SKIP_OR_FAIL_WITHOUT_PYTHON(why);
  TempDir d;
  const std::string path = d.path() + "/classes.json";
  auto run =
      fsdp::testing::run_program({FSDP_TOKENIZERS_PYTHON, kScript, "--char-classes", path}, std::chrono::seconds(100));
  ASSERT_EQ(run.exit_code(), 0) << run.output;
  std::ifstream in(path);
  const Json classes = Json::parse(in);
  ASSERT_EQ(classes.size(), 4u);
  for (const auto& [pattern, ranges] : classes.items()) {
    std::vector<bool> onig(0x110000, false);
    for (const Json& r : ranges) {
      for (uint32_t c = r[0].get<uint32_t>(); c <= r[1].get<uint32_t>(); ++c) onig[c] = true;
    }
    const fsdp::tokenizers::detail::Regex regex(pattern, "test");
    int agree = 0, newer = 0, known = 0;
    std::vector<std::string> differ;
    std::string text;
    for (char32_t c = 0; c < 0x110000; ++c) {
      if (c >= 0xD800 && c <= 0xDFFF) continue;
      text.clear();
      fsdp::tokenizers::detail::append_utf8(text, c);
      const auto spans = regex.find_matches(text);
      const bool pcre2 = spans.size() == 1 && spans[0].match && spans[0].end == text.size();
      UVersionInfo age;
      u_charAge(static_cast<UChar32>(c), age);
      const bool in_unicode_14 = age[0] != 0 && age[0] <= 14;  // ICU 72 knows Unicode 15: age 0 is unassigned there
      if (pcre2 == onig[c]) {
        ++agree;
      } else if (!in_unicode_14) {
        ++newer;
      } else if (c == 0x180E) {
        ++known;  // MONGOLIAN VOWEL SEPARATOR: PCRE2's \s has it, Unicode's White_Space no longer does
      } else {
        char hex[16];
        std::snprintf(hex, sizeof(hex), "U+%04X", static_cast<unsigned>(c));
        differ.push_back(std::string(hex) + (pcre2 ? " (PCRE2 matches)" : " (Oniguruma matches)"));
      }
    }
    EXPECT_TRUE(differ.empty()) << pattern << ": " << differ.size() << " characters of Unicode 14 differ, e.g. "
                                << differ.front();
    std::cout << pattern << ": " << agree << " code points agree; " << newer
              << " differ, all assigned after Unicode 14 (PCRE2 10.42's)" << (known ? ", and U+180E" : "") << "\n";
  }
}

// --- refusals of bad files (no Python) -------------------------------------------

// A small byte-level BPE in tokenizer.json's layout; each error test breaks one part.
Json minimal() {
  return Json::parse(R"({
    "version": "1.0", "truncation": null, "padding": null,
    "added_tokens": [{"id": 6, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false,
                      "normalized": false, "special": true}],
    "normalizer": null,
    "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
      {"type": "Split", "pattern": {"Regex": "\\s+|\\p{L}+"}, "behavior": "Isolated", "invert": false},
      {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}]},
    "post_processor": {"type": "TemplateProcessing",
      "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
      "pair": [], "special_tokens": {"<s>": {"id": "<s>", "ids": [6], "tokens": ["<s>"]}}},
    "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
    "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
              "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
              "vocab": {"a": 0, "b": 1, "ab": 2, "Ġ": 3, "c": 4, "abc": 5},
              "merges": ["a b", "ab c"]}
  })");
}

class BadFiles : public ::testing::Test {
 protected:
  // Writes `j` (or `text`) as tokenizer.json and expects a ConfigError naming the file and each of `parts`.
  void expect_refused(const std::string& text, const std::vector<std::string>& parts) {
    const std::string path = dir_.path() + "/tokenizer.json";
    std::ofstream(path, std::ios::binary) << text;
    try {
      fsdp::tokenizers::load_hf_tokenizer_json(path);
      ADD_FAILURE() << "accepted: " << text.substr(0, 200);
    } catch (const fsdp::ConfigError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(path), std::string::npos) << "the message names no file: " << what;
      for (const std::string& p : parts) EXPECT_NE(what.find(p), std::string::npos) << "no '" << p << "' in: " << what;
    }
  }
  void expect_refused(const Json& j, const std::vector<std::string>& parts) { expect_refused(j.dump(), parts); }
  TempDir dir_;
};

TEST_F(BadFiles, TheMinimalFileLoadsEncodesAndDecodes) {
  const std::string path = dir_.path() + "/tokenizer.json";
  std::ofstream(path) << minimal().dump();
  auto tok = load_tokenizer(path);
  EXPECT_EQ(tok->encode("abc ab<s>", true), (std::vector<int64_t>{6, 5, 3, 2, 6}));
  EXPECT_EQ(tok->encode("abc ab<s>", false), (std::vector<int64_t>{5, 3, 2, 6}));
  EXPECT_EQ(tok->decode({6, 5, 3, 2, 6}, false), "<s>abc ab<s>");
  EXPECT_EQ(tok->decode({6, 5, 3, 2, 6, 99}, true), "abc ab");  // 99 names no token: dropped
  EXPECT_EQ(tok->bos_id(), 6);
  EXPECT_EQ(tok->eos_id(), std::nullopt);
  EXPECT_EQ(tok->vocab_size(), 7);
  EXPECT_EQ(tok->source(), path);
}

TEST_F(BadFiles, UnknownModelTypeIsNamedWithTheSupportedOnes) {
  Json j = minimal();
  j["model"]["type"] = "WordPiece";
  expect_refused(j, {"model.type", "unknown model type 'WordPiece'", "supported: BPE"});
}

TEST_F(BadFiles, MergesThatNameTokensOutsideTheVocab) {
  Json j = minimal();
  j["model"]["merges"][1] = "ab zz";
  expect_refused(j, {"model.merges[1]", "'zz' is not in model.vocab"});
  j["model"]["merges"][1] = "a c";  // "ac" is not in the vocab
  expect_refused(j, {"model.merges[1]", "'ac' is not in model.vocab"});
  j["model"]["merges"][1] = "a b c";
  expect_refused(j, {"model.merges[1]", "two tokens, one space"});
  j["model"]["merges"] = Json::parse(R"([["a", "b"], "ab c"])");
  expect_refused(j, {"model.merges[1]", "[\"a\", \"b\"]"});
}

TEST_F(BadFiles, UnknownPreTokenizerNormalizerDecoderAndPostProcessorAreNamed) {
  Json j = minimal();
  j["pre_tokenizer"]["pretokenizers"][1] = Json::parse(R"({"type": "Whitespace"})");
  expect_refused(j, {"pre_tokenizer.pretokenizers[1].type", "unknown pre-tokenizer type 'Whitespace'",
                     "ByteLevel, Metaspace, Split, Sequence"});
  j = minimal();
  j["normalizer"] = Json::parse(R"({"type": "Lowercase"})");
  expect_refused(j, {"normalizer.type", "unknown normalizer type 'Lowercase'", "NFC, Prepend, Replace, Sequence"});
  j = minimal();
  j["decoder"] = Json::parse(R"({"type": "WordPiece", "prefix": "##", "cleanup": true})");
  expect_refused(j, {"decoder.type", "unknown decoder type 'WordPiece'", "ByteFallback"});
  j = minimal();
  j["post_processor"] = Json::parse(R"({"type": "BertProcessing", "sep": ["[SEP]", 1], "cls": ["[CLS]", 0]})");
  expect_refused(j, {"post_processor.type", "unknown post-processor type 'BertProcessing'", "TemplateProcessing"});
}

TEST_F(BadFiles, BadJsonBadRegexAndOtherRefusals) {
  expect_refused(std::string("{\"model\": "), {"not valid JSON"});
  expect_refused(std::string("{\"model\": \"\xff\"}"), {"not valid JSON"});
  expect_refused(std::string(100, '[') + std::string(100, ']'), {"nests objects and lists more than 64 deep"});
  Json j = minimal();
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "((a";
  expect_refused(j, {"pre_tokenizer.pretokenizers[0].pattern.Regex", "bad regular expression '((a'"});
  j = minimal();
  j["model"].erase("vocab");
  expect_refused(j, {"model.vocab: missing"});
  j = minimal();
  j["model"]["vocab"]["x"] = -1;
  expect_refused(j, {"model.vocab.x", "expected an integer from 0 to 4294967295"});
  j = minimal();
  j["model"]["vocab"]["x"] = 2;
  expect_refused(j, {"model.vocab", "both have id 2"});
  j = minimal();
  j["model"]["unk_token"] = "<unk>";
  expect_refused(j, {"model.unk_token", "'<unk>' is not in model.vocab"});
  j = minimal();
  j["model"]["dropout"] = 0.1;
  expect_refused(j, {"model.dropout", "not supported"});
  j = minimal();
  j["truncation"] = Json::parse(R"({"max_length": 8})");
  expect_refused(j, {"truncation: not supported"});
  j = minimal();
  j["added_tokens"][0].erase("special");
  expect_refused(j, {"added_tokens[0].special: missing"});
  j = minimal();
  j["post_processor"]["single"][0]["SpecialToken"]["id"] = "<bos>";
  expect_refused(j, {"post_processor.single[0].SpecialToken.id", "'<bos>'"});
  j = minimal();
  j["normalizer"] = Json::parse(R"({"type": "NFC"})");
  j["pre_tokenizer"] =
      Json::parse(R"({"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": false})");
  expect_refused(j, {"pre_tokenizer.prepend_scheme", "'first' after a normalizer"});
}

TEST_F(BadFiles, MissingFilesDirectoriesAndHugeFilesAreRefusedByName) {
  const std::string missing = dir_.path() + "/none";
  for (auto load : {+[](const std::string& p) { return load_tokenizer(p); },
                    +[](const std::string& p) { return fsdp::tokenizers::load_hf_tokenizer_json(p); },
                    +[](const std::string& p) { return fsdp::tokenizers::load_sentencepiece(p); }}) {
    try {
      load(missing);
      ADD_FAILURE() << "a missing file loaded";
    } catch (const fsdp::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
    }
  }
  try {
    load_tokenizer(dir_.path());
    ADD_FAILURE() << "an empty directory loaded";
  } catch (const fsdp::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("neither tokenizer.json nor tokenizer.model"), std::string::npos) << e.what();
  }
  try {
    fsdp::tokenizers::load_hf_tokenizer_json(dir_.path());
    ADD_FAILURE() << "a directory loaded as tokenizer.json";
  } catch (const fsdp::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("not a regular file"), std::string::npos) << e.what();
  }
  // Over the limit: refused from its size, unread (a sparse file).
  const std::string huge = dir_.path() + "/tokenizer.json";
  std::ofstream(huge).close();
  fs::resize_file(huge, static_cast<uintmax_t>(fsdp::tokenizers::kMaxTokenizerFileBytes) + 1);
  try {
    load_tokenizer(huge);
    ADD_FAILURE() << "a file over the limit loaded";
  } catch (const fsdp::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("over the limit"), std::string::npos) << e.what();
  }
  fs::remove(huge);
  // Not a SentencePiece model at all.
  const std::string garbage = dir_.path() + "/tokenizer.model";
  std::ofstream(garbage) << "this is not a model";
  try {
    load_tokenizer(dir_.path());
    ADD_FAILURE() << "garbage loaded as tokenizer.model";
  } catch (const fsdp::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(garbage), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("sentencepiece refuses the model"), std::string::npos) << e.what();
  }
}

TEST_F(BadFiles, TextThatIsNotUtf8AndNegativeIdsAreRefused) {
  const std::string path = dir_.path() + "/tokenizer.json";
  std::ofstream(path) << minimal().dump();
  auto tok = load_tokenizer(path);
  try {
    tok->encode("ab\xc3", true);
    ADD_FAILURE() << "cut UTF-8 encoded";
  } catch (const fsdp::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("not valid UTF-8 at byte 2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(tok->decode({1, -1}), fsdp::ConfigError);
}

TEST_F(BadFiles, TokenizerConfigNamesAMissingToken) {
  std::ofstream(dir_.path() + "/tokenizer.json") << minimal().dump();
  std::ofstream(dir_.path() + "/tokenizer_config.json") << R"({"bos_token": "<s>", "eos_token": {"content": "</s>"}})";
  try {
    load_tokenizer(dir_.path());
    ADD_FAILURE() << "an eos_token the vocab lacks was accepted";
  } catch (const fsdp::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer_config.json: eos_token: '</s>' is not a token"), std::string::npos)
        << e.what();
  }
  std::ofstream(dir_.path() + "/tokenizer_config.json") << R"({"bos_token": null, "eos_token": {"content": "<s>"}})";
  auto tok = load_tokenizer(dir_.path());
  EXPECT_EQ(tok->bos_id(), std::nullopt);
  EXPECT_EQ(tok->eos_id(), 6);
}

// Rust's String::from_utf8_lossy, which the byte-level decoder ends with.
TEST(Utf8, LossyConversionReplacesEachMaximalBadSubsequence) {
  using fsdp::tokenizers::detail::utf8_lossy;
  EXPECT_EQ(utf8_lossy("a\xE2\x82z"), "a\xEF\xBF\xBDz");                          // a cut 3-byte sequence: one U+FFFD
  EXPECT_EQ(utf8_lossy("\xE9\xE9"), "\xEF\xBF\xBD\xEF\xBF\xBD");                  // two lone lead bytes
  EXPECT_EQ(utf8_lossy("\xF0\x9F\x98"), "\xEF\xBF\xBD");                          // a cut 4-byte sequence
  EXPECT_EQ(utf8_lossy("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // a surrogate: three
  EXPECT_EQ(utf8_lossy("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");                  // overlong
  EXPECT_EQ(utf8_lossy("ok \xF0\x9F\x98\x80"), "ok \xF0\x9F\x98\x80");
}

}  // namespace
