// tokenizer.json's normalizers, as tokenizers 0.23's normalizers/ runs
// them (unicode.rs, prepend.rs, replace.rs, utils.rs's Sequence), and their
// reading from the file.
#include "normalizers.h"

#include <cstdint>
#include <optional>

#include "../unicode.h"
#include "fsdp/error.h"

namespace fsdp::tokenizers::detail {

size_t normalized_limit(size_t text_bytes) {
  if (text_bytes > (SIZE_MAX - kNormalizedSlackBytes) / kMaxNormalizedGrowth) return SIZE_MAX;
  return text_bytes * kMaxNormalizedGrowth + kNormalizedSlackBytes;
}

void Normalizer::too_long(size_t input) const {
  throw ConfigError("tokenizer: " + where_ + ": the normalized text would be over " +
                    std::to_string(normalized_limit(input)) + " bytes, the limit for a text of " +
                    std::to_string(input) + " bytes (" + std::to_string(kMaxNormalizedGrowth) + " x its bytes + " +
                    std::to_string(kNormalizedSlackBytes >> 10) +
                    " KiB; expected normalizers that grow a text by a few times at most)");
}

std::string NfcNormalizer::apply(std::string text, size_t input) const {
  std::string out = nfc(text);
  if (out.size() > normalized_limit(input)) too_long(input);
  return out;
}

std::string PrependNormalizer::apply(std::string text, size_t input) const {
  if (text.empty()) return text;
  if (text.size() + prepend_.size() > normalized_limit(input)) too_long(input);
  return prepend_ + text;
}

std::string ReplaceNormalizer::apply(std::string text, size_t input) const {
  std::optional<std::string> out = replace_all(pattern_, text, content_, normalized_limit(input));
  if (!out) too_long(input);
  return std::move(*out);
}

std::string SequenceNormalizer::apply(std::string text, size_t input) const {
  for (const auto& step : steps_) text = step->apply(std::move(text), input);
  return text;
}

// --- from tokenizer.json ---------------------------------------------------------

namespace {
const char* const kNormalizers = "NFC, Prepend, Replace, Sequence";
}  // namespace

std::unique_ptr<Normalizer> parse_normalizer(const Reader& r, const Json& j, const std::string& path) {
  if (j.is_null()) return nullptr;
  const std::string type = r.type(j, path, "normalizer", kNormalizers);
  std::string where = r.source() + ": " + path + " (" + type + ")";  // names it in its errors
  if (type == "NFC") return std::make_unique<NfcNormalizer>(std::move(where));
  if (type == "Prepend") {
    return std::make_unique<PrependNormalizer>(
        r.string(r.need(j, path, "prepend", "a string"), member_path(path, "prepend")), std::move(where));
  }
  if (type == "Replace") {
    return std::make_unique<ReplaceNormalizer>(
        r.pattern(r.need(j, path, "pattern", "{\"String\": ...} or {\"Regex\": ...}"), member_path(path, "pattern")),
        r.string(r.need(j, path, "content", "a string"), member_path(path, "content")), std::move(where));
  }
  if (type == "Sequence") {
    const std::string list = member_path(path, "normalizers");
    const Json& items = r.need(j, path, "normalizers", "a list of normalizers");
    if (!items.is_array()) r.fail(list, "expected a list of normalizers, got " + Reader::describe(items));
    std::vector<std::unique_ptr<Normalizer>> steps;
    for (size_t i = 0; i < items.size(); ++i) {
      if (auto n = parse_normalizer(r, items[i], index_path(list, i))) steps.push_back(std::move(n));
    }
    return std::make_unique<SequenceNormalizer>(std::move(steps), std::move(where));
  }
  r.unknown(path, "normalizer", type, kNormalizers);
}

}  // namespace fsdp::tokenizers::detail
