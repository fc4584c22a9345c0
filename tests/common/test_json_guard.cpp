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

}  // namespace
}  // namespace tandem
