// tokenizer.json's post-processors, as tokenizers 0.23's processors/
// (template.rs, sequence.rs) apply them to one sequence, and their reading
// from the file.
#include "processors.h"

#include <utility>

namespace fsdp::tokenizers::detail {

void apply_templates(const std::vector<Template>& templates, std::vector<int64_t>& ids) {
  for (const Template& t : templates) {
    std::vector<int64_t> out;
    for (const TemplatePiece& p : t) {
      const std::vector<int64_t>& part = p.sequence ? ids : p.ids;
      out.insert(out.end(), part.begin(), part.end());
    }
    ids = std::move(out);
  }
}

// --- from tokenizer.json ---------------------------------------------------------

namespace {

const char* const kPostProcessors = "TemplateProcessing, ByteLevel, Sequence";

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

}  // namespace

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

}  // namespace fsdp::tokenizers::detail
