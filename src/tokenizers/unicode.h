// UTF-8 and Unicode for the tokenizers module (private): validation,
// decoding, Rust's lossy conversion, NFC and the character classes of the
// Rust `regex` crate (ICU's properties).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace fsdp::tokenizers::detail {

// The byte offset of the first byte that is not part of valid UTF-8 (an
// overlong form, a surrogate, a code point over U+10FFFF, a cut sequence),
// or std::string_view::npos when all of `s` is valid.
size_t invalid_utf8_at(std::string_view s);

// The code point at s[i] (valid UTF-8), moving i past it.
char32_t next_code_point(std::string_view s, size_t& i);

// The number of bytes of the character whose first byte is `lead` (valid UTF-8).
inline size_t utf8_length(unsigned char lead) { return lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4; }

void append_utf8(std::string& out, char32_t c);

// Rust's String::from_utf8_lossy: each maximal ill-formed subsequence (the
// longest prefix of a valid sequence, or one byte) becomes U+FFFD.
std::string utf8_lossy(std::string_view bytes);

// Unicode NFC (ICU). `s` must be valid UTF-8.
std::string nfc(std::string_view s);

// The Rust regex crate's \s (White_Space) and \w (Alphabetic, marks,
// decimal digits, connector punctuation, Join_Control), which `tokenizers`
// uses for the lstrip, rstrip and single_word flags of added tokens.
bool is_white_space(char32_t c);
bool is_word_character(char32_t c);

}  // namespace fsdp::tokenizers::detail
