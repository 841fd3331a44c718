// fsdp/text/enum_names.h — an enum's names, written once: a table of
// {value, "NAME"} rows from which both its to_string and its parser come,
// the parser's error listing the accepted names from the same table.
//
//   constexpr text::EnumName<Backend> kBackendNames[] = {
//       {Backend::kAuto, "auto"}, {Backend::kGloo, "gloo"}, {Backend::kNccl, "nccl"}};
//   const char* backend_name(Backend b) { return text::name_of(kBackendNames, b); }
//   if (auto b = text::value_of(kBackendNames, value)) return *b;
//   throw ConfigError("... expected one of " + text::list_names(kBackendNames));
//
// Header-only, standard library only. Each call is a linear scan of the
// table (a handful of rows); no allocation except the string list_names
// returns. Comparisons are exact: a parser that ignores case or accepts
// other spellings normalises its input first.
#pragma once

#include <cctype>
#include <cstddef>
#include <optional>
#include <string>

namespace fsdp::text {

// One row of an enum's name table.
template <class E>
struct EnumName {
  E value;                      // the enumerator
  const char* name;             // its name: what to_string returns and a parser accepts
  const char* alias = nullptr;  // another spelling a parser accepts, listed as "name (or alias)"; none if null
};

// The name of `value` in `table`; "?" when no row has it.
template <class E, std::size_t N>
const char* name_of(const EnumName<E> (&table)[N], E value) {
  for (const auto& row : table) {
    if (row.value == value) return row.name;
  }
  return "?";
}

// The value whose name or alias is exactly `name`; std::nullopt when none is.
template <class E, std::size_t N>
std::optional<E> value_of(const EnumName<E> (&table)[N], const std::string& name) {
  for (const auto& row : table) {
    if (name == row.name || (row.alias != nullptr && name == row.alias)) return row.value;
  }
  return std::nullopt;
}

// The accepted names in table order, for an error message: each wrapped in
// `quote` and followed by " (or alias)" when it has one, joined by
// `separator`: "auto, gloo, nccl"; with quote "\"": "\"full\", \"sharded\"".
template <class E, std::size_t N>
std::string list_names(const EnumName<E> (&table)[N], const char* separator = ", ", const char* quote = "") {
  std::string out;
  for (std::size_t i = 0; i < N; ++i) {
    if (i > 0) out += separator;
    out += std::string(quote) + table[i].name + quote;
    if (table[i].alias != nullptr) out += std::string(" (or ") + table[i].alias + ")";
  }
  return out;
}

// `s` in lower case (ASCII), for a parser that accepts any case: value_of(table, to_lower(name)).
inline std::string to_lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace fsdp::text
