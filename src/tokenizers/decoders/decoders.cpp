// The decoders of tokenizer.json's pipeline, as tokenizers 0.23's
// decoders/ (and pre_tokenizers/'s ByteLevel and Metaspace) run them:
// tokens back to text; and their reading from the file.
#include "decoders.h"

#include <algorithm>
#include <cstdint>

#include "../normalizers/normalizers.h"
#include "../unicode.h"
#include "fsdp/error.h"

namespace fsdp::tokenizers::detail {

std::vector<std::string> ByteLevelDecoder::decode_chain(std::vector<std::string> tokens, size_t) const {
  std::string bytes;
  std::string token_bytes;
  for (const std::string& t : tokens) {
    token_bytes.clear();
    bool all = true;
    for (size_t i = 0; i < t.size() && all;) {
      const auto b = byte_level_byte(next_code_point(t, i));
      if (b) {
        token_bytes += static_cast<char>(*b);
      } else {
        all = false;
      }
    }
    bytes += all ? token_bytes : t;
  }
  return {utf8_lossy(bytes)};
}

namespace {

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// "<0xHH>": HH as Rust's u8::from_str_radix(HH, 16) reads it (a leading '+' allowed).
std::optional<unsigned char> byte_token(const std::string& t) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return std::nullopt;
  const int hi = hex_digit(t[3]), lo = hex_digit(t[4]);
  if (t[3] == '+' && lo >= 0) return static_cast<unsigned char>(lo);
  if (hi < 0 || lo < 0) return std::nullopt;
  return static_cast<unsigned char>(hi * 16 + lo);
}

}  // namespace

std::vector<std::string> ByteFallbackDecoder::decode_chain(std::vector<std::string> tokens, size_t) const {
  std::vector<std::string> out;
  std::string bytes;
  size_t count = 0;
  auto flush = [&] {
    if (count == 0) return;
    if (invalid_utf8_at(bytes) == std::string_view::npos) {
      out.push_back(bytes);
    } else {
      for (size_t i = 0; i < count; ++i) out.emplace_back("\xEF\xBF\xBD");
    }
    bytes.clear();
    count = 0;
  };
  for (std::string& t : tokens) {
    if (auto b = byte_token(t)) {
      bytes += static_cast<char>(*b);
      ++count;
    } else {
      flush();
      out.push_back(std::move(t));
    }
  }
  flush();
  return out;
}

std::vector<std::string> FuseDecoder::decode_chain(std::vector<std::string> tokens, size_t) const {
  std::string all;
  for (const std::string& t : tokens) all += t;
  return {all};
}

std::vector<std::string> StripDecoder::decode_chain(std::vector<std::string> tokens, size_t) const {
  for (std::string& t : tokens) {
    std::vector<size_t> starts;  // byte offset of each character
    std::vector<char32_t> chars;
    for (size_t i = 0; i < t.size();) {
      starts.push_back(i);
      chars.push_back(next_code_point(t, i));
    }
    size_t start_cut = 0;
    for (size_t i = 0; i < std::min(start_, chars.size()) && chars[i] == content_; ++i) start_cut = i + 1;
    size_t stop_cut = chars.size();
    for (size_t i = 0; i < std::min(stop_, chars.size()) && chars[chars.size() - i - 1] == content_; ++i) {
      stop_cut = chars.size() - i - 1;
    }
    if (start_cut >= stop_cut) {
      t.clear();  // (tokenizers would panic here: a token stripped from both ends past its middle)
      continue;
    }
    const size_t b = start_cut < starts.size() ? starts[start_cut] : t.size();
    const size_t e = stop_cut < starts.size() ? starts[stop_cut] : t.size();
    t = t.substr(b, e - b);
  }
  return tokens;
}

std::vector<std::string> ReplaceDecoder::decode_chain(std::vector<std::string> tokens, size_t input) const {
  // The bound of normalizers (normalized_limit), over all the tokens.
  const size_t limit = normalized_limit(input);
  size_t total = 0;
  for (std::string& t : tokens) {
    std::optional<std::string> out = replace_all(pattern_, t, content_, limit - total);
    if (!out) {
      throw ConfigError("tokenizer: " + where_ + ": the decoded text would be over " + std::to_string(limit) +
                        " bytes, the limit for tokens of " + std::to_string(input) + " bytes (" +
                        std::to_string(kMaxNormalizedGrowth) + " x their bytes + " +
                        std::to_string(kNormalizedSlackBytes >> 10) +
                        " KiB; expected decoders that grow a text by a few times at most)");
    }
    total += out->size();
    t = std::move(*out);
  }
  return tokens;
}

std::vector<std::string> MetaspaceDecoder::decode_chain(std::vector<std::string> tokens, size_t) const {
  for (size_t k = 0; k < tokens.size(); ++k) {
    std::string out;
    const std::string& t = tokens[k];
    for (size_t i = 0; i < t.size();) {
      const char32_t c = next_code_point(t, i);
      if (c != replacement_) {
        append_utf8(out, c);
      } else if (k != 0 || scheme_ == PrependScheme::kNever) {
        out += ' ';
      }
    }
    tokens[k] = std::move(out);
  }
  return tokens;
}

std::vector<std::string> SequenceDecoder::decode_chain(std::vector<std::string> tokens, size_t input) const {
  for (const auto& step : steps_) tokens = step->decode_chain(std::move(tokens), input);
  return tokens;
}

// --- from tokenizer.json ---------------------------------------------------------

namespace {
const char* const kDecoders = "ByteLevel, ByteFallback, Fuse, Strip, Replace, Metaspace, Sequence";
}  // namespace

std::unique_ptr<Decoder> parse_decoder(const Reader& r, const Json& j, const std::string& path) {
  if (j.is_null()) return nullptr;
  const std::string type = r.type(j, path, "decoder", kDecoders);
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Strip") {
    return std::make_unique<StripDecoder>(
        r.character(r.need(j, path, "content", "one character"), member_path(path, "content")),
        r.unsigned_integer(r.need(j, path, "start", "a count"), member_path(path, "start"), UINT32_MAX),
        r.unsigned_integer(r.need(j, path, "stop", "a count"), member_path(path, "stop"), UINT32_MAX));
  }
  if (type == "Replace") {
    return std::make_unique<ReplaceDecoder>(
        r.pattern(r.need(j, path, "pattern", "{\"String\": ...} or {\"Regex\": ...}"), member_path(path, "pattern")),
        r.string(r.need(j, path, "content", "a string"), member_path(path, "content")),
        r.source() + ": " + path + " (Replace)");
  }
  if (type == "Metaspace") {
    return std::make_unique<MetaspaceDecoder>(
        r.character(r.need(j, path, "replacement", "one character"), member_path(path, "replacement")),
        parse_prepend_scheme(r, j, path));
  }
  if (type == "Sequence") {
    const std::string list = member_path(path, "decoders");
    const Json& items = r.need(j, path, "decoders", "a list of decoders");
    if (!items.is_array()) r.fail(list, "expected a list of decoders, got " + Reader::describe(items));
    std::vector<std::unique_ptr<Decoder>> steps;
    for (size_t i = 0; i < items.size(); ++i) {
      if (auto d = parse_decoder(r, items[i], index_path(list, i))) steps.push_back(std::move(d));
    }
    return std::make_unique<SequenceDecoder>(std::move(steps));
  }
  r.unknown(path, "decoder", type, kDecoders);
}

}  // namespace fsdp::tokenizers::detail
