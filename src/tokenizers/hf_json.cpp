// tokenizer.json: the file read into the pipeline (pipeline.h, bpe.h), and
// the Tokenizer that runs it. Every refusal names the file, the key (a JSON
// path) and what was expected; a component this module does not implement
// is refused by its type name with the list of those it does.
#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "bpe.h"
#include "files.h"
#include "fsdp/error.h"
#include "fsdp/tokenizers/tokenizer.h"
#include "json_reader.h"
#include "pipeline.h"
#include "regex.h"
#include "unicode.h"

namespace fsdp::tokenizers {

namespace {

using namespace detail;

const char* const kModels = "BPE";
const char* const kNormalizers = "NFC, Prepend, Replace, Sequence";
const char* const kPreTokenizers = "ByteLevel, Metaspace, Split, Sequence";
const char* const kPostProcessors = "TemplateProcessing, ByteLevel, Sequence";
const char* const kDecoders = "ByteLevel, ByteFallback, Fuse, Strip, Replace, Metaspace, Sequence";

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

PrependScheme parse_prepend_scheme(const Reader& r, const Json& j, const std::string& path) {
  // Metaspace: prepend_scheme (default always), or the older add_prefix_space: false (never).
  PrependScheme scheme = PrependScheme::kAlways;
  if (const Json* s = Reader::find(j, "prepend_scheme")) {
    const std::string name = r.string(*s, member_path(path, "prepend_scheme"));
    if (name == "always") {
      scheme = PrependScheme::kAlways;
    } else if (name == "never") {
      scheme = PrependScheme::kNever;
    } else if (name == "first") {
      scheme = PrependScheme::kFirst;
    } else {
      r.fail(member_path(path, "prepend_scheme"), "unknown scheme '" + name + "' (expected always, never or first)");
    }
  }
  if (const Json* a = Reader::find(j, "add_prefix_space"); a && !a->is_null()) {
    if (!r.boolean(*a, member_path(path, "add_prefix_space"))) scheme = PrependScheme::kNever;
  }
  return scheme;
}

std::unique_ptr<PreTokenizer> parse_pre_tokenizer(const Reader& r, const Json& j, const std::string& path,
                                                  bool has_normalizer) {
  if (j.is_null()) return nullptr;
  const std::string type = r.type(j, path, "pre-tokenizer", kPreTokenizers);
  if (type == "ByteLevel") {
    r.boolean(r.need(j, path, "trim_offsets", "true or false"), member_path(path, "trim_offsets"));
    const Json* use_regex = Reader::find(j, "use_regex");
    return std::make_unique<ByteLevelPreTokenizer>(
        r.boolean(r.need(j, path, "add_prefix_space", "true or false"), member_path(path, "add_prefix_space")),
        !use_regex || r.boolean(*use_regex, member_path(path, "use_regex")), r.source() + ": " + path);
  }
  if (type == "Split") {
    const std::string behavior_path = member_path(path, "behavior");
    const std::string name = r.string(r.need(j, path, "behavior", "a split behavior"), behavior_path);
    SplitBehavior behavior;
    if (name == "Isolated") {
      behavior = SplitBehavior::kIsolated;
    } else if (name == "Removed") {
      behavior = SplitBehavior::kRemoved;
    } else if (name == "MergedWithPrevious") {
      behavior = SplitBehavior::kMergedWithPrevious;
    } else if (name == "MergedWithNext") {
      behavior = SplitBehavior::kMergedWithNext;
    } else if (name == "Contiguous") {
      behavior = SplitBehavior::kContiguous;
    } else {
      r.fail(behavior_path, "unknown behavior '" + name +
                                "' (expected Isolated, Removed, MergedWithPrevious, MergedWithNext or Contiguous)");
    }
    return std::make_unique<SplitPreTokenizer>(
        r.pattern(r.need(j, path, "pattern", "{\"String\": ...} or {\"Regex\": ...}"), member_path(path, "pattern")),
        behavior, r.boolean(r.need(j, path, "invert", "true or false"), member_path(path, "invert")));
  }
  if (type == "Metaspace") {
    const char32_t replacement =
        r.character(r.need(j, path, "replacement", "one character"), member_path(path, "replacement"));
    const PrependScheme scheme = parse_prepend_scheme(r, j, path);
    if (scheme == PrependScheme::kFirst && has_normalizer) {
      r.fail(member_path(path, "prepend_scheme"),
             "'first' after a normalizer is not supported (it needs the normalizer's alignments to the original "
             "text; expected normalizer: null, as Mistral's and Llama's files have)");
    }
    const Json* split = Reader::find(j, "split");
    std::string rep;
    append_utf8(rep, replacement);
    return std::make_unique<MetaspacePreTokenizer>(
        rep, scheme, !split || split->is_null() || r.boolean(*split, member_path(path, "split")),
        r.source() + ": " + path);
  }
  if (type == "Sequence") {
    const std::string list = member_path(path, "pretokenizers");
    const Json& items = r.need(j, path, "pretokenizers", "a list of pre-tokenizers");
    if (!items.is_array()) r.fail(list, "expected a list of pre-tokenizers, got " + Reader::describe(items));
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    for (size_t i = 0; i < items.size(); ++i) {
      if (auto p = parse_pre_tokenizer(r, items[i], index_path(list, i), has_normalizer)) steps.push_back(std::move(p));
    }
    return std::make_unique<SequencePreTokenizer>(std::move(steps));
  }
  r.unknown(path, "pre-tokenizer", type, kPreTokenizers);
}

// TemplateProcessing's single template, with its special tokens' ids.
Template parse_template(const Reader& r, const Json& j, const std::string& path) {
  const std::string tokens_path = member_path(path, "special_tokens");
  const Json& tokens = r.object(r.need(j, path, "special_tokens", "an object of special tokens"), tokens_path,
                                "an object of special tokens");
  const std::string single_path = member_path(path, "single");
  const Json& single = r.need(j, path, "single", "the template of one sequence");
  if (!single.is_array()) r.fail(single_path, "expected a list of template pieces, got " + Reader::describe(single));
  Template t;
  for (size_t i = 0; i < single.size(); ++i) {
    const std::string piece_path = index_path(single_path, i);
    const Json& piece = r.object(single[i], piece_path, "{\"Sequence\": ...} or {\"SpecialToken\": ...}");
    if (const Json* seq = Reader::find(piece, "Sequence")) {
      const std::string seq_path = member_path(piece_path, "Sequence");
      const std::string id =
          r.string(r.need(r.object(*seq, seq_path, "an object"), seq_path, "id", "A"), member_path(seq_path, "id"));
      if (id != "A") {
        r.fail(member_path(seq_path, "id"), "the single template names sequence '" + id + "' (expected A)");
      }
      t.push_back({true, {}});
    } else if (const Json* special = Reader::find(piece, "SpecialToken")) {
      const std::string sp_path = member_path(piece_path, "SpecialToken");
      const std::string name =
          r.string(r.need(r.object(*special, sp_path, "an object"), sp_path, "id", "a special token's name"),
                   member_path(sp_path, "id"));
      const Json* entry = Reader::find(tokens, name);
      if (!entry) {
        r.fail(member_path(sp_path, "id"), "the template names '" + name + "', which " + tokens_path + " lacks");
      }
      const std::string entry_path = member_path(tokens_path, name);
      const Json& ids = r.need(r.object(*entry, entry_path, "a special token"), entry_path, "ids", "a list of ids");
      if (!ids.is_array()) {
        r.fail(member_path(entry_path, "ids"), "expected a list of ids, got " + Reader::describe(ids));
      }
      TemplatePiece p;
      for (size_t k = 0; k < ids.size(); ++k) {
        p.ids.push_back(static_cast<int64_t>(
            r.unsigned_integer(ids[k], index_path(member_path(entry_path, "ids"), k), UINT32_MAX)));
      }
      t.push_back(std::move(p));
    } else {
      r.fail(piece_path, "expected {\"Sequence\": ...} or {\"SpecialToken\": ...}, got " + Reader::describe(piece));
    }
  }
  return t;
}

void parse_post_processor(const Reader& r, const Json& j, const std::string& path, std::vector<Template>& out) {
  if (j.is_null()) return;
  const std::string type = r.type(j, path, "post-processor", kPostProcessors);
  if (type == "TemplateProcessing") {
    out.push_back(parse_template(r, j, path));
  } else if (type == "ByteLevel") {
    // Trims offsets only; the ids stay.
  } else if (type == "Sequence") {
    const std::string list = member_path(path, "processors");
    const Json& items = r.need(j, path, "processors", "a list of post-processors");
    if (!items.is_array()) r.fail(list, "expected a list of post-processors, got " + Reader::describe(items));
    for (size_t i = 0; i < items.size(); ++i) parse_post_processor(r, items[i], index_path(list, i), out);
  } else {
    r.unknown(path, "post-processor", type, kPostProcessors);
  }
}

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

std::unique_ptr<Bpe> parse_model(const Reader& r, const Json& root) {
  const std::string path = "model";
  const Json& j = r.need(root, "", "model", "the model: {\"type\": \"BPE\", \"vocab\": ..., \"merges\": ...}");
  const std::string type = r.type(j, path, "model", kModels);
  if (type != "BPE") r.unknown(path, "model", type, kModels);

  BpeOptions options;
  if (const Json* d = Reader::find(j, "dropout"); d && !d->is_null()) {
    if (!d->is_number()) r.fail("model.dropout", "expected null or a number, got " + Reader::describe(*d));
    if (d->get<double>() != 0.0) {
      r.fail("model.dropout",
             "BPE dropout " + d->dump() + " is not supported (it makes encoding random; expected null)");
    }
  }
  if (const Json* u = Reader::find(j, "unk_token"); u && !u->is_null()) {
    options.unk_token = r.string(*u, "model.unk_token");
  }
  for (const char* affix : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const Json* a = Reader::find(j, affix);
    if (a && !a->is_null() && !r.string(*a, member_path(path, affix)).empty()) {
      r.fail(member_path(path, affix), "'" + a->get<std::string>() +
                                           "' is not supported (expected null or \"\", as byte-level and "
                                           "SentencePiece-style BPEs have)");
    }
  }
  options.fuse_unk = r.flag(j, path, "fuse_unk");
  options.byte_fallback = r.flag(j, path, "byte_fallback");
  options.ignore_merges = r.flag(j, path, "ignore_merges");

  const Json& vocab_json =
      r.object(r.need(j, path, "vocab", "an object of token: id"), "model.vocab", "an object of token: id");
  std::unordered_map<std::string, uint32_t> vocab;
  vocab.reserve(vocab_json.size());
  for (const auto& [token, id] : vocab_json.items()) {
    vocab[token] = static_cast<uint32_t>(r.unsigned_integer(id, "model.vocab." + token, UINT32_MAX));
  }

  const Json& merges_json = r.need(j, path, "merges", "a list of merges");
  if (!merges_json.is_array()) {
    r.fail("model.merges", "expected a list of merges, got " + Reader::describe(merges_json));
  }
  std::vector<std::pair<std::string, std::string>> merges;
  merges.reserve(merges_json.size());
  const bool as_strings = !merges_json.empty() && merges_json[0].is_string();
  for (size_t i = 0; i < merges_json.size(); ++i) {
    const Json& m = merges_json[i];
    const std::string key = index_path("model.merges", i);
    const char* expected = as_strings ? "a merge \"a b\" (two tokens, one space), as model.merges[0] is"
                                      : "a merge [\"a\", \"b\"] (two tokens), as model.merges[0] is";
    if (as_strings && m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
        r.fail(key, std::string("expected ") + expected + ", got " + Reader::describe(m));
      }
      merges.emplace_back(s.substr(0, space), s.substr(space + 1));
    } else if (!as_strings && m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    } else {
      r.fail(key, std::string("expected ") + expected + ", got " + Reader::describe(m));
    }
  }
  return std::make_unique<Bpe>(std::move(vocab), merges, std::move(options), r.source());
}

class HfTokenizer : public Tokenizer {
 public:
  HfTokenizer(const Json& root, const std::string& source) : Tokenizer(source) {
    const Reader r(source);
    r.object(root, "", "a tokenizer.json object");
    if (const Json* v = Reader::find(root, "version"); v && r.string(*v, "version") != "1.0") {
      r.fail("version", "unknown version '" + v->get<std::string>() + "' (expected 1.0)");
    }
    for (const char* setting : {"truncation", "padding"}) {
      if (const Json* s = Reader::find(root, setting); s && !s->is_null()) {
        r.fail(setting, "not supported (expected null: encode returns every id of the text, unpadded)");
      }
    }
    model_ = parse_model(r, root);
    const Json null;
    const auto part = [&](const char* name) -> const Json& {
      const Json* p = Reader::find(root, name);
      return p ? *p : null;
    };
    normalizer_ = parse_normalizer(r, part("normalizer"), "normalizer");
    pre_tokenizer_ = parse_pre_tokenizer(r, part("pre_tokenizer"), "pre_tokenizer", normalizer_ != nullptr);
    parse_post_processor(r, part("post_processor"), "post_processor", templates_);
    decoder_ = parse_decoder(r, part("decoder"), "decoder");

    if (const Json* added = Reader::find(root, "added_tokens"); added && !added->is_null()) {
      if (!added->is_array()) r.fail("added_tokens", "expected a list of tokens, got " + Reader::describe(*added));
      for (size_t i = 0; i < added->size(); ++i) {
        const std::string p = index_path("added_tokens", i);
        const Json& t = r.object((*added)[i], p, "an added token object");
        r.unsigned_integer(r.need(t, p, "id", "the token's id"), member_path(p, "id"), UINT32_MAX);
        AddedToken token;
        token.content = r.string(r.need(t, p, "content", "the token's text"), member_path(p, "content"));
        token.single_word = r.boolean(r.need(t, p, "single_word", "true or false"), member_path(p, "single_word"));
        token.lstrip = r.boolean(r.need(t, p, "lstrip", "true or false"), member_path(p, "lstrip"));
        token.rstrip = r.boolean(r.need(t, p, "rstrip", "true or false"), member_path(p, "rstrip"));
        token.normalized = r.boolean(r.need(t, p, "normalized", "true or false"), member_path(p, "normalized"));
        token.special = r.boolean(r.need(t, p, "special", "true or false"), member_path(p, "special"));
        added_.add(token, *model_, source);
      }
    }
    added_.finish(normalizer_.get(), *model_, source);

    std::unordered_set<std::string> tokens;
    for (const auto& entry : model_->vocab()) tokens.insert(entry.first);
    for (const auto& entry : added_.tokens()) tokens.insert(entry.first);
    vocab_size_ = static_cast<int64_t>(tokens.size());

    // BOS and EOS: the special tokens around the sequence in the first template.
    if (!templates_.empty() && !templates_[0].empty()) {
      const Template& t = templates_[0];
      if (!t.front().sequence && t.front().ids.size() == 1) bos_id_ = t.front().ids[0];
      if (t.size() > 1 && !t.back().sequence && t.back().ids.size() == 1) eos_id_ = t.back().ids[0];
    }
  }

  std::vector<int64_t> encode(const std::string& text, bool add_special_tokens) const override {
    if (const size_t bad = invalid_utf8_at(text); bad != std::string::npos) {
      throw ConfigError("tokenizer: " + source_ + ": encode: the text is not valid UTF-8 at byte " +
                        std::to_string(bad) + " (expected UTF-8 text)");
    }
    std::vector<Piece> pieces = added_.extract_and_normalize(normalizer_.get(), text);
    if (pre_tokenizer_) pre_tokenizer_->apply(pieces);
    std::vector<int64_t> ids;
    ids.reserve(text.size() / 3 + 4);
    for (const Piece& p : pieces) {
      if (p.id >= 0) {
        ids.push_back(p.id);
      } else {
        model_->tokenize(p.text, ids);
      }
    }
    if (add_special_tokens) apply_templates(templates_, ids);
    return ids;
  }

  std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const override {
    std::vector<std::string> tokens;
    tokens.reserve(ids.size());
    for (int64_t id : ids) {
      if (id < 0) {
        throw ConfigError("tokenizer: " + source_ + ": decode: id " + std::to_string(id) +
                          " is negative (expected ids from 0)");
      }
      const std::string* token = token_of(id);
      if (!token || (skip_special_tokens && added_.is_special(*token))) continue;
      tokens.push_back(*token);
    }
    std::string out;
    if (decoder_) {
      size_t input = 0;
      for (const std::string& t : tokens) input += t.size();
      for (const std::string& s : decoder_->decode_chain(std::move(tokens), input)) out += s;
    } else {
      for (size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
    }
    return out;
  }

  int64_t vocab_size() const override { return vocab_size_; }

  std::optional<int64_t> token_to_id(const std::string& token) const override {
    if (auto id = added_.token_to_id(token)) return *id;
    if (auto id = model_->token_to_id(token)) return *id;
    return std::nullopt;
  }

  std::optional<std::string> id_to_token(int64_t id) const override {
    const std::string* token = id >= 0 ? token_of(id) : nullptr;
    if (!token) return std::nullopt;
    return *token;
  }

 private:
  const std::string* token_of(int64_t id) const {
    if (id < 0 || id > UINT32_MAX) return nullptr;
    const auto id32 = static_cast<uint32_t>(id);
    const std::string* token = added_.id_to_token(id32);
    return token ? token : model_->id_to_token(id32);
  }

  std::unique_ptr<Bpe> model_;
  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::vector<Template> templates_;
  std::unique_ptr<Decoder> decoder_;
  AddedVocabulary added_;
  int64_t vocab_size_ = 0;
};

}  // namespace

std::unique_ptr<Tokenizer> hf_tokenizer_from_json(std::string_view json, const std::string& source) {
  const Json root = parse_json(json, source);
  try {
    return std::make_unique<HfTokenizer>(root, source);
  } catch (const Json::exception& e) {  // a type this reader did not check (it checks each)
    throw ConfigError("tokenizer: " + source + ": unexpected JSON: " + e.what());
  }
}

std::unique_ptr<Tokenizer> load_hf_tokenizer_json(const std::string& path) {
  const std::string text = read_tokenizer_file(path, "a tokenizer.json", kMaxTokenizerFileBytes);
  return hf_tokenizer_from_json(text, path);
}

}  // namespace fsdp::tokenizers
