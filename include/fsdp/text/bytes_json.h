// fsdp/text/bytes_json.h — byte strings (paths above all) in JSON, losslessly.
//
// A path is bytes; a JSON text holds Unicode. fsdp-cpp writes a byte string
// into JSON with one escape, Python's "surrogateescape" as os.fsdecode and
// os.fsencode use it: each byte 0x80-0xFF that is not part of a valid UTF-8
// sequence is the code point U+DC80-U+DCFF (U+DC00 + the byte), which the
// JSON text holds as the escape "\udc80" ... "\udcff"; every valid UTF-8
// sequence is itself. So a path b"runs/\xff.txt" is the JSON string
// "runs/\udcff.txt", and in Python os.fsencode(json.loads(text)[...]) gives
// the bytes back (docs/checkpoint-format.md, "Strings").
//
// nlohmann::json cannot hold such a string itself (dump() throws on invalid
// UTF-8, and parse() refuses a lone "\udcXX"), so the escape is made in two
// halves around it:
//   writing: j["data"] = escape_bytes(path); text = json_text(j.dump());
//   reading: j = json::parse(json_input(text)); path = unescape_bytes(j["data"]);
// Between the halves a string holds an escaped byte as U+FDD0 (a Unicode
// noncharacter) and two lowercase hex digits, and a U+FDD0 of its own as
// U+FDD0 "--": valid UTF-8 either way, and never ambiguous. Text without
// invalid bytes and without U+FDD0 passes every function unchanged, so
// files written before the escape read the same.
//
// Standard library only; thread-safe (pure functions).
#pragma once

#include <string>
#include <string_view>

namespace fsdp::text {

// `bytes` as a valid UTF-8 string for a nlohmann::json value (see above).
std::string escape_bytes(std::string_view bytes);

// The bytes of a string value read back from a JSON text through
// json_input: the inverse of escape_bytes.
std::string unescape_bytes(std::string_view value);

// The JSON text to write, from nlohmann::json::dump() (with its default
// ensure_ascii = false) of values made with escape_bytes: each escaped byte
// becomes "\udcXX".
std::string json_text(std::string_view dumped);

// A JSON text made ready for nlohmann::json::parse: each lone "\udc80" ...
// "\udcff" escape in a string (one that is not the second half of a
// surrogate pair) becomes the escaped byte of escape_bytes. Text that is
// not JSON passes through, for parse() to name its error.
std::string json_input(std::string_view text);

// `bytes` with each byte that is not part of valid UTF-8 written as the
// UTF-8 form of its surrogate (U+DC80-U+DCFF: three bytes ED B2 80 ...
// ED B3 BF), as Python's pickle writes such a str ("surrogatepass") and
// reads it back; for formats that hold UTF-8 without escapes (a pickle's
// strings).
std::string surrogate_utf8(std::string_view bytes);

}  // namespace fsdp::text
