// EdgeStats' one field list (visit_edge_stats): `run --json`, the browser view and the totals of
// `run -i` carry every field, including ones added later.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <type_traits>

#include "tandem/client.h"

namespace tandem {
namespace {

// Every field set: counts and times to `v`, flags true, the error text "e".
EdgeStats filled(int v) {
  EdgeStats s;
  visit_edge_stats(
      [v](const char*, auto& field) {
        using T = std::decay_t<decltype(field)>;
        if constexpr (std::is_same_v<T, std::string>) {
          field = std::string(1, 'e');  // not a literal: GCC 12 -Wrestrict
        } else if constexpr (std::is_same_v<T, bool>) {
          field = true;
        } else {
          field = static_cast<T>(v);
        }
      },
      s);
  return s;
}

TEST(EdgeStatsFields, JsonCarriesEveryField) {
  int n = 0;
  EdgeStats s = filled(3);
  visit_edge_stats([&n](const char*, const auto&) { ++n; }, s);
  const nlohmann::json j = nlohmann::json::parse(edge_stats_json(s));
  EXPECT_EQ(static_cast<int>(j.size()), n);
  EXPECT_EQ(j["chained_steps"], 3);
  EXPECT_EQ(j["last_cloud_error"], "e");
  EXPECT_FALSE(nlohmann::json::parse(edge_stats_json(EdgeStats{})).contains("last_cloud_error"));
}

TEST(EdgeStatsFields, SessionTotalsAddEveryCount) {
  EdgeStats total;
  add_edge_stats(total, filled(2));
  add_edge_stats(total, filled(5));
  visit_edge_stats(
      [](std::string_view name, const auto& field) {
        using T = std::decay_t<decltype(field)>;
        if constexpr (std::is_same_v<T, std::string>) {
          EXPECT_EQ(field, "e");
        } else if constexpr (std::is_same_v<T, bool>) {
          EXPECT_TRUE(field);
        } else if (name == "ttft_ms") {
          EXPECT_EQ(field, T(2)) << "the first answer's";
        } else if (name == "cloud_share") {
          EXPECT_DOUBLE_EQ(field, 1.0);  // 7 of 7 tokens
        } else if (name == "tok_s") {
          EXPECT_DOUBLE_EQ(field, 1000.0);  // 7 tokens in 7 ms
        } else {
          EXPECT_EQ(field, T(7)) << name;
        }
      },
      total);
}

}  // namespace
}  // namespace tandem
