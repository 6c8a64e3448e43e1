// Tests of the tools' small JSON reader (tools/json_reader.h): every value kind, the
// string escapes, and the errors that name where parsing stopped.
#include "json_reader.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <string_view>

namespace moert::tools {
namespace {

TEST(JsonReader, ValuesOfEveryKind) {
  auto v = ParseJson(R"( {"a": [1, -2, 0, true, false, null, "s", {}], "b": {"c": []}} )");
  ASSERT_TRUE(v.ok()) << v.status();
  ASSERT_EQ(v->kind, JsonValue::Kind::kObject);
  const JsonValue* a = v->Find("a");
  ASSERT_NE(a, nullptr);
  ASSERT_EQ(a->array.size(), 8u);
  EXPECT_EQ(a->array[0].integer, 1);
  EXPECT_EQ(a->array[1].integer, -2);
  EXPECT_EQ(a->array[2].kind, JsonValue::Kind::kInt);
  EXPECT_TRUE(a->array[3].boolean);
  EXPECT_EQ(a->array[4].kind, JsonValue::Kind::kBool);
  EXPECT_FALSE(a->array[4].boolean);
  EXPECT_EQ(a->array[5].kind, JsonValue::Kind::kNull);
  EXPECT_EQ(a->array[6].string, "s");
  EXPECT_EQ(a->array[7].kind, JsonValue::Kind::kObject);
  ASSERT_NE(v->Find("b"), nullptr);
  EXPECT_EQ(v->Find("b")->Find("c")->kind, JsonValue::Kind::kArray);
  EXPECT_EQ(v->Find("missing"), nullptr);
  EXPECT_EQ(a->Find("a"), nullptr);  // not an object
}

TEST(JsonReader, IntegerLimits) {
  EXPECT_EQ(ParseJson("9223372036854775807")->integer, INT64_MAX);
  EXPECT_EQ(ParseJson("-9223372036854775808")->integer, INT64_MIN);
  EXPECT_FALSE(ParseJson("9223372036854775808").ok());
  EXPECT_FALSE(ParseJson("-9223372036854775809").ok());
  EXPECT_FALSE(ParseJson("01").ok());
  EXPECT_FALSE(ParseJson("-").ok());
  EXPECT_FALSE(ParseJson("1.5").ok());
  EXPECT_FALSE(ParseJson("1e3").ok());
}

TEST(JsonReader, StringEscapes) {
  auto v = ParseJson(R"("q\" b\\ s\/ \b\f\n\r\t \u0041 \u00e9 \u20ac \ud83d\ude00 Ġ")");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->string, "q\" b\\ s/ \b\f\n\r\t A \xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80 \xC4\xA0");
}

TEST(JsonReader, ErrorsNameTheOffset) {
  auto v = ParseJson(R"({"a": [1, 2,]})");
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(v.status().message().find("at byte 12"), std::string_view::npos) << v.status();
  for (const char* bad : {"", "[", "{\"a\" 1}", "{1: 2}", "\"abc", "\"\\x\"", "\"\\ud800\"",
                          "\"\\udc00\"", "\"\\u12g4\"", "\"a\nb\"", "[1] 2", "tru", "nul"}) {
    EXPECT_FALSE(ParseJson(bad).ok()) << bad;
  }
  EXPECT_FALSE(ParseJson(std::string(100, '[') + std::string(100, ']')).ok());
}

}  // namespace
}  // namespace moert::tools
