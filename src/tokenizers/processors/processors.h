// tokenizer.json's post-processors (private; processors/ of tokenizers
// 0.23): TemplateProcessing's single template puts the special tokens
// around the ids, ByteLevel's changes no id, and a Sequence applies its
// templates in order; and their reading from the file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "../json_reader.h"

namespace fsdp::tokenizers::detail {

// TemplateProcessing's `single` template: the sequence, and the ids of each
// special token around it.
struct TemplatePiece {
  bool sequence = false;
  std::vector<int64_t> ids;  // a special token's ids
};
using Template = std::vector<TemplatePiece>;

// `ids` put through each template in order.
void apply_templates(const std::vector<Template>& templates, std::vector<int64_t>& ids);

// The templates of the post-processor `j` at the JSON path `path` appended
// to `out` (none for null, ByteLevel, or an empty Sequence). ConfigError
// naming the key for a malformed one (a template naming a special token
// its special_tokens lack), or an unknown type with those supported.
void parse_post_processor(const Reader& r, const Json& j, const std::string& path, std::vector<Template>& out);

}  // namespace fsdp::tokenizers::detail
