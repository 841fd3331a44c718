// load_tokenizer: a directory or file as Hugging Face lays them out, and
// tokenizer_config.json's BOS and EOS.
#include "fsdp/tokenizers/tokenizer.h"

#include <nlohmann/json.hpp>

#include <filesystem>

#include "files.h"
#include "fsdp/error.h"

namespace fsdp::tokenizers {

Tokenizer::~Tokenizer() = default;

namespace {

// tokenizer_config.json's bos_token or eos_token ("<s>", {"content": "<s>", ...} or null) as an id.
std::optional<int64_t> config_token(const Tokenizer& t, const nlohmann::json& config, const char* key,
                                    const std::string& path) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::nullopt;
  const nlohmann::json* value = &*it;
  if (value->is_object()) {
    auto content = value->find("content");
    if (content == value->end()) {
      throw ConfigError("tokenizer: " + path + ": " + key + ".content: missing (expected the token's text)");
    }
    value = &*content;
  }
  if (!value->is_string()) {
    throw ConfigError("tokenizer: " + path + ": " + key + ": expected a token's text, got " + value->dump());
  }
  const std::string token = value->get<std::string>();
  auto id = t.token_to_id(token);
  if (!id) {
    throw ConfigError("tokenizer: " + path + ": " + key + ": '" + token + "' is not a token of " + t.source());
  }
  return id;
}

}  // namespace

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec)) throw ConfigError("tokenizer: " + path + ": no such file or directory");
  if (!fs::is_directory(path, ec)) {
    const bool json = fs::path(path).extension() == ".json";
    return json ? load_hf_tokenizer_json(path) : load_sentencepiece(path);
  }
  const fs::path dir(path);
  std::unique_ptr<Tokenizer> t;
  if (fs::exists(dir / "tokenizer.json", ec)) {
    t = load_hf_tokenizer_json((dir / "tokenizer.json").string());
  } else if (fs::exists(dir / "tokenizer.model", ec)) {
    t = load_sentencepiece((dir / "tokenizer.model").string());
  } else {
    throw ConfigError("tokenizer: " + path + ": the directory has neither tokenizer.json nor tokenizer.model");
  }
  const std::string config_path = (dir / "tokenizer_config.json").string();
  if (fs::exists(config_path, ec)) {
    const std::string text =
        detail::read_tokenizer_file(config_path, "a tokenizer_config.json", kMaxTokenizerFileBytes);
    const nlohmann::json config = nlohmann::json::parse(text, nullptr, false);
    if (config.is_discarded() || !config.is_object()) {
      throw ConfigError("tokenizer: " + config_path + ": not a JSON object (expected tokenizer_config.json)");
    }
    if (config.contains("bos_token")) t->bos_id_ = config_token(*t, config, "bos_token", config_path);
    if (config.contains("eos_token")) t->eos_id_ = config_token(*t, config, "eos_token", config_path);
  }
  return t;
}

}  // namespace fsdp::tokenizers
