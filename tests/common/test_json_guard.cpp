#include "common/json_guard.h"

#include <gtest/gtest.h>

#include <string>

namespace tandem {
namespace {

std::string nested(int levels, const std::string& inner = "1") {
  return std::string(levels, '[') + inner + std::string(levels, ']');
}

TEST(JsonGuard, MeasuresDepthOfArraysAndObjects) {
  EXPECT_EQ(scan_json_shape("1").depth, 0);
  EXPECT_EQ(scan_json_shape("[]").depth, 1);
  EXPECT_EQ(scan_json_shape(R"({"a":[{"b":[1,2]}],"c":{}})").depth, 4);
  EXPECT_EQ(scan_json_shape(R"({"a":[{"b":[1,2]}],"c":{}})").containers, 5u);
}

TEST(JsonGuard, BracketsInsideStringsDoNotCount) {
  EXPECT_EQ(scan_json_shape(R"(["[[[[{{{{", "\"[[[", "\\"])").depth, 1);
  // An escaped quote does not end the string: the brackets after it are still text.
  EXPECT_EQ(scan_json_shape(R"(["\"[[[[]"])").depth, 1);
}

TEST(JsonGuard, StopsAtTheFirstLevelOverTheLimit) {
  const std::string deep = nested(100000);
  const JsonShape s = scan_json_shape(deep, 64);
  EXPECT_TRUE(s.too_deep);
  EXPECT_EQ(s.depth, 65);
  EXPECT_FALSE(scan_json_shape(nested(64), 64).too_deep);
  EXPECT_TRUE(scan_json_shape(nested(65), 64).too_deep);
}

TEST(JsonGuard, ErrorNamesTheLimitAndTheDocument) {
  EXPECT_EQ(json_depth_error(nested(3)), "");
  EXPECT_EQ(json_depth_error(nested(70), 64, "the request body"),
            "the request body: the JSON nests deeper than 64 levels");
}

TEST(JsonGuard, UnbalancedOrTruncatedTextNeverFails) {
  EXPECT_FALSE(scan_json_shape("]]]]}}}}").too_deep);
  EXPECT_FALSE(scan_json_shape("[\"unterminated \\").too_deep);
  EXPECT_EQ(scan_json_shape("[[[").depth, 3);
}

TEST(JsonGuard, CountsAnUpperBoundOfTheValues) {
  EXPECT_EQ(scan_json_shape("1").values, 1u);
  EXPECT_EQ(scan_json_shape("[]").values, 2u);       // the array and a possible first value
  EXPECT_EQ(scan_json_shape("[1,2,3]").values, 4u);  // at least the 4 values
  EXPECT_EQ(scan_json_shape(R"({"a":1,"b":[2]})").values, 4u);
  EXPECT_EQ(scan_json_shape(R"(["a,b,c", "[,]"])").values, 3u);  // commas in strings: text
}

TEST(JsonGuard, StopsAtTheFirstValueOverTheLimit) {
  // The shallow attack: {"data":[{},{},...]} builds ~80 bytes of tree per 3 bytes of text.
  std::string wide = R"({"data":[{})";
  for (int i = 0; i < 100000; ++i) wide += ",{}";
  wide += "]}";
  const JsonShape s = scan_json_shape(wide, 64, 4096);
  EXPECT_TRUE(s.too_many);
  EXPECT_FALSE(s.too_deep);
  EXPECT_EQ(s.values, 4097u);
  EXPECT_FALSE(scan_json_shape(wide, 64, 300000).too_many);
  EXPECT_EQ(json_shape_error(wide, 64, 4096, "the answer"),
            "the answer: the JSON holds more than 4096 values");
  EXPECT_EQ(json_shape_error("[[[[1]]]]", 3, 4096), "the JSON nests deeper than 3 levels");
  EXPECT_EQ(json_shape_error("[1,2]", 64, 4096), "");
}

}  // namespace
}  // namespace tandem
