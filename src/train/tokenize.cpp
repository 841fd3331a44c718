// `fsdp-train tokenize` (fsdp/train/tokenize.h): inputs to printed token ids.
#include "fsdp/train/tokenize.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "fsdp/error.h"
#ifndef FSDP_NO_TOKENIZERS
#include "fsdp/tokenizers/tokenizer.h"
#endif

namespace fsdp::train {

#ifdef FSDP_NO_TOKENIZERS

void tokenize(const TokenizeOptions&, std::ostream&) {
#ifdef FSDP_TOKENIZERS_CLASH
  throw ConfigError("tokenize: this fsdp-train is built on Debian's LibTorch 1.13, without fsdp::tokenizers: that "
                    "LibTorch's libprotobuf and Debian's libsentencepiece cannot share a process (they crash at "
                    "start-up): expected the wheel build's fsdp-train (FSDP_LIBTORCH=wheel)");
#else
  throw ConfigError("tokenize: this fsdp-train was built without fsdp::tokenizers (configured with "
                    "-DFSDP_TOKENIZERS=OFF): expected a build with them (scripts/deps.sh installs what they need)");
#endif
}

#else

namespace {

namespace fs = std::filesystem;

// The whole text of `path` ("-": standard input), checked before it is opened.
std::string read_input(const std::string& path) {
  if (path == "-") {
    std::string text((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
    if (static_cast<int64_t>(text.size()) > kMaxTokenizeFileBytes) {
      throw ConfigError("tokenize: standard input: over " + std::to_string(kMaxTokenizeFileBytes) +
                        " bytes: expected a smaller text (`fsdp-train prepare` tokenizes big files in pieces)");
    }
    return text;
  }
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st)) throw ConfigError("tokenize: " + path + ": no such file; expected a text file (UTF-8)");
  if (!fs::is_regular_file(st)) {
    throw ConfigError("tokenize: " + path + ": not a regular file; expected a text file (UTF-8)");
  }
  const auto size = static_cast<int64_t>(fs::file_size(path, ec));
  if (ec || size > kMaxTokenizeFileBytes) {
    throw ConfigError("tokenize: " + path + ": " + std::to_string(size) + " bytes, over the limit of " +
                      std::to_string(kMaxTokenizeFileBytes) +
                      ": expected a smaller text (`fsdp-train prepare` tokenizes big files in pieces)");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError("tokenize: " + path + ": cannot open it: " + std::strerror(errno));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw ConfigError("tokenize: " + path + ": cannot read it: " + std::strerror(errno));
  return text;
}

}  // namespace

void tokenize(const TokenizeOptions& o, std::ostream& out) {
  if (o.texts.empty() && o.files.empty()) {
    throw ConfigError("tokenize: no input: expected --text TEXT or a text file (\"-\": standard input)");
  }
  std::unique_ptr<tokenizers::Tokenizer> tok;
  try {
    tok = tokenizers::load_tokenizer(o.tokenizer);
  } catch (const ConfigError& e) {
    throw ConfigError("tokenize: --tokenizer " + o.tokenizer + ": " + e.what());
  }
  auto encode = [&](const std::string& text, const std::string& where) {
    std::vector<int64_t> ids;
    try {
      ids = tok->encode(text, o.add_special_tokens);
    } catch (const ConfigError& e) {
      throw ConfigError("tokenize: " + where + ": " + e.what());
    }
    std::string line;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i) line += ' ';
      line += std::to_string(ids[i]);
    }
    line += '\n';
    out << line << std::flush;
  };
  for (size_t i = 0; i < o.texts.size(); ++i) encode(o.texts[i], "--text " + std::to_string(i + 1));
  for (const std::string& f : o.files) encode(read_input(f), f == "-" ? "standard input" : f);
}

#endif  // FSDP_NO_TOKENIZERS

}  // namespace fsdp::train
