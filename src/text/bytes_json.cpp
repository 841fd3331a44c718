// Byte strings in JSON (fsdp/text/bytes_json.h): Python's surrogateescape.
#include "fsdp/text/bytes_json.h"

#include <cstddef>
#include <cstdint>

namespace fsdp::text {

namespace {

// U+FDD0 in UTF-8: the mark of an escaped byte between the two halves.
constexpr char kMark[] = "\xEF\xB7\x90";
constexpr size_t kMarkSize = 3;
constexpr char kHex[] = "0123456789abcdef";

// The length of the valid UTF-8 sequence at s[i], or 0 when none starts
// there (RFC 3629: no overlong forms, no surrogates, nothing past U+10FFFF).
size_t utf8_length(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const size_t left = s.size() - i;
  const unsigned char c = b(0);
  if (c < 0x80) return 1;
  auto cont = [&](size_t k, unsigned char lo = 0x80, unsigned char hi = 0xBF) {
    return k < left && b(k) >= lo && b(k) <= hi;
  };
  if (c >= 0xC2 && c <= 0xDF) return cont(1) ? 2 : 0;
  if (c == 0xE0) return cont(1, 0xA0) && cont(2) ? 3 : 0;
  if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) return cont(1) && cont(2) ? 3 : 0;
  if (c == 0xED) return cont(1, 0x80, 0x9F) && cont(2) ? 3 : 0;
  if (c == 0xF0) return cont(1, 0x90) && cont(2) && cont(3) ? 4 : 0;
  if (c >= 0xF1 && c <= 0xF3) return cont(1) && cont(2) && cont(3) ? 4 : 0;
  if (c == 0xF4) return cont(1, 0x80, 0x8F) && cont(2) && cont(3) ? 4 : 0;
  return 0;
}

bool is_mark(std::string_view s, size_t i) { return s.compare(i, kMarkSize, kMark) == 0; }

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// The 4 hex digits at s[i] as a number; -1 when they are not.
long hex4(std::string_view s, size_t i) {
  if (i + 4 > s.size()) return -1;
  long v = 0;
  for (size_t k = 0; k < 4; ++k) {
    const int d = hex_value(s[i + k]);
    if (d < 0) return -1;
    v = v * 16 + d;
  }
  return v;
}

void put_escaped_byte(std::string& out, unsigned char byte) {
  out.append(kMark, kMarkSize);
  out += kHex[byte >> 4];
  out += kHex[byte & 15];
}

}  // namespace

std::string escape_bytes(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    const size_t n = utf8_length(bytes, i);
    if (n == 0) {
      put_escaped_byte(out, static_cast<unsigned char>(bytes[i]));
      i += 1;
      continue;
    }
    out.append(bytes.substr(i, n));
    if (n == kMarkSize && is_mark(bytes, i)) out += "--";  // a U+FDD0 of its own
    i += n;
  }
  return out;
}

std::string unescape_bytes(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (size_t i = 0; i < value.size();) {
    if (is_mark(value, i) && i + kMarkSize + 2 <= value.size()) {
      const char a = value[i + kMarkSize], b = value[i + kMarkSize + 1];
      if (a == '-' && b == '-') {
        out.append(kMark, kMarkSize);
        i += kMarkSize + 2;
        continue;
      }
      const int hi = hex_value(a), lo = hex_value(b);
      if (hi >= 8 && lo >= 0) {  // bytes 0x80-0xff only
        out += static_cast<char>(hi * 16 + lo);
        i += kMarkSize + 2;
        continue;
      }
    }
    out += value[i++];
  }
  return out;
}

std::string json_text(std::string_view dumped) {
  std::string out;
  out.reserve(dumped.size());
  for (size_t i = 0; i < dumped.size();) {
    if (is_mark(dumped, i) && i + kMarkSize + 2 <= dumped.size()) {
      const char a = dumped[i + kMarkSize], b = dumped[i + kMarkSize + 1];
      if (a == '-' && b == '-') {
        out.append(kMark, kMarkSize);
        i += kMarkSize + 2;
        continue;
      }
      if (hex_value(a) >= 8 && hex_value(b) >= 0) {
        out += "\\udc";
        out += a;
        out += b;
        i += kMarkSize + 2;
        continue;
      }
    }
    out += dumped[i++];
  }
  return out;
}

std::string json_input(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  bool in_string = false;
  for (size_t i = 0; i < text.size();) {
    const char c = text[i];
    if (!in_string) {
      if (c == '"') in_string = true;
      out += c;
      ++i;
      continue;
    }
    if (c == '"') {
      in_string = false;
      out += c;
      ++i;
    } else if (is_mark(text, i)) {  // a U+FDD0 of the text's own
      out.append(kMark, kMarkSize);
      out += "--";
      i += kMarkSize;
    } else if (c == '\\' && i + 1 < text.size() && text[i + 1] == 'u') {
      const long cp = hex4(text, i + 2);
      if (cp >= 0xD800 && cp <= 0xDBFF && i + 12 <= text.size() && text[i + 6] == '\\' && text[i + 7] == 'u' &&
          hex4(text, i + 8) >= 0xDC00 && hex4(text, i + 8) <= 0xDFFF) {
        out.append(text.substr(i, 12));  // a surrogate pair: one character
        i += 12;
      } else if (cp >= 0xDC80 && cp <= 0xDCFF) {
        put_escaped_byte(out, static_cast<unsigned char>(cp & 0xFF));
        i += 6;
      } else if (cp == 0xFDD0) {
        out.append(kMark, kMarkSize);
        out += "--";
        i += 6;
      } else {
        out.append(text.substr(i, 2));
        i += 2;
      }
    } else if (c == '\\' && i + 1 < text.size()) {
      out.append(text.substr(i, 2));  // \" \\ \n ...: the quote is not the string's end
      i += 2;
    } else {
      out += c;
      ++i;
    }
  }
  return out;
}

std::string surrogate_utf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    const size_t n = utf8_length(bytes, i);
    if (n == 0) {
      const unsigned cp = 0xDC00u + static_cast<unsigned char>(bytes[i]);
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
      i += 1;
    } else {
      out.append(bytes.substr(i, n));
      i += n;
    }
  }
  return out;
}

}  // namespace fsdp::text
