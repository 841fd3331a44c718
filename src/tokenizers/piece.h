// A piece of the text on its way through tokenizer.json's pipeline
// (private): the added vocabulary cuts the raw text at its tokens
// (added_vocabulary.h), the pre-tokenizers cut the rest further
// (pre_tokenizers/), and the model gives each piece without an id its ids.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace fsdp::tokenizers::detail {

struct Piece {
  std::string text;
  size_t start = 0;  // where it starts in the original text (exact when there is no normalizer)
  int64_t id = -1;   // an added token's id; -1: text for the pre-tokenizer and the model
};

}  // namespace fsdp::tokenizers::detail
