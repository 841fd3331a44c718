// fsdp/text/enum_names.h: one table gives an enum's names, its parser and
// the parser's list of accepted names.
#include "fsdp/text/enum_names.h"

#include <gtest/gtest.h>

namespace {

using fsdp::text::EnumName;
using fsdp::text::list_names;
using fsdp::text::name_of;
using fsdp::text::value_of;

enum class Color { kRed, kGreen, kBlue, kUnnamed };

constexpr EnumName<Color> kColors[] = {{Color::kRed, "red"}, {Color::kGreen, "green", "lime"}, {Color::kBlue, "blue"}};

TEST(EnumNames, NameOfEachValueAndUnknown) {
  EXPECT_STREQ(name_of(kColors, Color::kRed), "red");
  EXPECT_STREQ(name_of(kColors, Color::kGreen), "green");
  EXPECT_STREQ(name_of(kColors, Color::kBlue), "blue");
  EXPECT_STREQ(name_of(kColors, Color::kUnnamed), "?");
}

TEST(EnumNames, ValueOfNameOrAliasExactly) {
  EXPECT_EQ(value_of(kColors, "red"), Color::kRed);
  EXPECT_EQ(value_of(kColors, "green"), Color::kGreen);
  EXPECT_EQ(value_of(kColors, "lime"), Color::kGreen);
  EXPECT_EQ(value_of(kColors, "blue"), Color::kBlue);
  EXPECT_EQ(value_of(kColors, "Red"), std::nullopt);  // exact: the caller normalises case
  EXPECT_EQ(value_of(kColors, ""), std::nullopt);
  EXPECT_EQ(value_of(kColors, "?"), std::nullopt);
}

TEST(EnumNames, ToLowerLetsAParserAcceptAnyCase) {
  EXPECT_EQ(fsdp::text::to_lower("GrEeN-2"), "green-2");
  EXPECT_EQ(value_of(kColors, fsdp::text::to_lower("LIME")), Color::kGreen);
  EXPECT_EQ(fsdp::text::to_lower("\xff"), "\xff");  // bytes above ASCII stay as they are
}

TEST(EnumNames, EveryNameParsesBackToItsValue) {
  for (const auto& row : kColors) EXPECT_EQ(value_of(kColors, name_of(kColors, row.value)), row.value);
}

TEST(EnumNames, ListInTableOrderWithAliasesSeparatorAndQuotes) {
  EXPECT_EQ(list_names(kColors), "red, green (or lime), blue");
  EXPECT_EQ(list_names(kColors, " or "), "red or green (or lime) or blue");
  EXPECT_EQ(list_names(kColors, ", ", "\""), "\"red\", \"green\" (or lime), \"blue\"");
  constexpr EnumName<Color> kOne[] = {{Color::kRed, "red"}};
  EXPECT_EQ(list_names(kOne), "red");
}

}  // namespace
