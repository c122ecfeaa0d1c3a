#include "common/grammar/json_schema.h"

#include <memory>
#include <string>
#include <string_view>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/grammar/sentence.h"

namespace tandem::grammar {
namespace {

using ::testing::HasSubstr;

Grammar Schema(std::string_view schema) {
  absl::StatusOr<Grammar> g = CompileJsonSchema(schema);
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? *std::move(g) : JsonObjectGrammar();
}

TEST(JsonSchemaTest, ObjectWithRequiredAndOptionalPropertiesInDeclaredOrder) {
  const Grammar g = Schema(R"({"type": "object", "properties": {
      "name": {"type": "string"}, "age": {"type": "integer"}, "ok": {"type": "boolean"}},
      "required": ["name", "age"], "additionalProperties": false})");
  EXPECT_TRUE(IsSentence(g, R"({"name":"Ann","age":30})"));
  EXPECT_TRUE(IsSentence(g, R"({"name":"Ann","age":-7,"ok":true})"));
  EXPECT_TRUE(IsSentence(g, "{\n  \"name\": \"Ann\",\n  \"age\": 0\n}"));
  EXPECT_FALSE(IsSentence(g, R"({"age":30})"));                // name is required
  EXPECT_FALSE(IsSentence(g, R"({"name":"Ann"})"));            // age is required
  EXPECT_FALSE(IsSentence(g, R"({"age":30,"name":"Ann"})"));   // declared order
  EXPECT_FALSE(IsSentence(g, R"({"name":"Ann","age":30,})"));  // trailing comma
  EXPECT_FALSE(IsSentence(g, R"({"name":"Ann","age":30,"x":1})"));
  EXPECT_FALSE(IsSentence(g, R"({"name":"Ann","age":030})"));  // leading zero
  EXPECT_FALSE(IsSentence(g, R"({"name":"Ann","age":3.5})"));  // not an integer
  EXPECT_FALSE(IsSentence(g, R"( {"name":"Ann","age":30})"));  // no leading space
  EXPECT_FALSE(IsSentence(g, R"({"name":"Ann","age":30} )"));  // nothing after
}

TEST(JsonSchemaTest, AllPropertiesOptional) {
  const Grammar g = Schema(R"({"properties": {"a": {"type": "integer"}, "b": {"type": "null"}}})");
  for (const char* ok : {"{}", R"({"a":1})", R"({"b":null})", R"({"a":1,"b":null})"}) {
    EXPECT_TRUE(IsSentence(g, ok)) << ok;
  }
  EXPECT_FALSE(IsSentence(g, R"({,"b":null})"));
  EXPECT_FALSE(IsSentence(g, R"({"b":null,"a":1})"));
}

TEST(JsonSchemaTest, WhitespaceIsBounded) {
  const Grammar g = Schema(R"({"type": "array", "items": {"type": "integer"}})");
  EXPECT_TRUE(IsSentence(g, "[1, 2]"));
  EXPECT_TRUE(IsSentence(g, "[\n  1,\n" + std::string(kMaxIndent, ' ') + "2\n]"));
  EXPECT_FALSE(IsSentence(g, "[1,\n" + std::string(kMaxIndent + 1, ' ') + "2]"));
  EXPECT_FALSE(IsSentence(g, "[1,  2]"));
  EXPECT_FALSE(IsSentence(g, "[1,\n\n2]"));
}

TEST(JsonSchemaTest, StringsAreUtf8WithEscapesAndLengths) {
  const Grammar any = Schema(R"({"type": "string"})");
  EXPECT_TRUE(IsSentence(any, "\"caf\xc3\xa9 \\n \\\" \\u00e9 \xf0\x9f\x98\x80\""));
  EXPECT_FALSE(IsSentence(any, "\"bad \xff byte\""));
  EXPECT_FALSE(IsSentence(any, "\"raw\nnewline\""));
  EXPECT_FALSE(IsSentence(any, "\"bad \\x escape\""));
  EXPECT_FALSE(IsSentence(any, "\"overlong \xe0\x80\x80\""));
  EXPECT_FALSE(IsSentence(any, "\"surrogate \xed\xa0\x80\""));
  EXPECT_FALSE(IsSentence(any, "\"lone \\ud800\""));
  EXPECT_TRUE(IsSentence(any, "\"pair \\ud83d\\ude00\""));
  const Grammar bounded = Schema(R"({"type": "string", "minLength": 2, "maxLength": 3})");
  EXPECT_FALSE(IsSentence(bounded, R"("a")"));
  EXPECT_TRUE(IsSentence(bounded, R"("ab")"));
  EXPECT_TRUE(IsSentence(bounded, "\"a\xc3\xa9\\n\""));  // three characters
  EXPECT_FALSE(IsSentence(bounded, R"("abcd")"));
}

TEST(JsonSchemaTest, NumbersEnumsConstAnyOfAndTypeLists) {
  const Grammar num = Schema(R"({"type": "number"})");
  for (const char* ok : {"0", "-0.5", "12e3", "1.25E-7", "9007199254740991"}) {
    EXPECT_TRUE(IsSentence(num, ok)) << ok;
  }
  for (const char* bad : {"01", ".5", "1.", "+1", "1e", "12345678901234567"}) {
    EXPECT_FALSE(IsSentence(num, bad)) << bad;
  }
  const Grammar natural = Schema(R"({"type": "integer", "minimum": 0})");
  EXPECT_TRUE(IsSentence(natural, "42"));
  EXPECT_FALSE(IsSentence(natural, "-42"));
  const Grammar colour = Schema(R"({"type": "string", "enum": ["red", "green", 7]})");
  EXPECT_TRUE(IsSentence(colour, R"("red")"));
  EXPECT_FALSE(IsSentence(colour, "7"));  // not a string, so dropped
  EXPECT_FALSE(IsSentence(colour, R"("blue")"));
  const Grammar c = Schema(R"({"const": {"k": [1, null]}})");
  EXPECT_TRUE(IsSentence(c, R"({"k":[1,null]})"));
  const Grammar maybe = Schema(R"({"anyOf": [{"type": "string"}, {"type": "null"}]})");
  EXPECT_TRUE(IsSentence(maybe, "null"));
  EXPECT_TRUE(IsSentence(maybe, R"("x")"));
  EXPECT_FALSE(IsSentence(maybe, "1"));
  const Grammar list = Schema(R"({"type": ["integer", "boolean"]})");
  EXPECT_TRUE(IsSentence(list, "true"));
  EXPECT_TRUE(IsSentence(list, "3"));
  EXPECT_FALSE(IsSentence(list, "null"));
}

TEST(JsonSchemaTest, ArraysCountItems) {
  const Grammar g =
      Schema(R"({"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 2})");
  EXPECT_FALSE(IsSentence(g, "[]"));
  EXPECT_TRUE(IsSentence(g, "[true]"));
  EXPECT_TRUE(IsSentence(g, "[true, false]"));
  EXPECT_FALSE(IsSentence(g, "[true,false,true]"));
  const Grammar any = Schema(R"({"type": "array"})");
  EXPECT_TRUE(IsSentence(any, R"([1, "a", {"b": [null]}, []])"));
}

TEST(JsonSchemaTest, RecursiveRefs) {
  const Grammar g = Schema(R"({"$ref": "#/$defs/node", "$defs": {"node": {
      "type": "object", "properties": {"v": {"type": "integer"},
      "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
      "required": ["v", "kids"], "additionalProperties": false}}})");
  EXPECT_TRUE(
      IsSentence(g, R"({"v":1,"kids":[{"v":2,"kids":[]},{"v":3,"kids":[{"v":4,"kids":[]}]}]})"));
  EXPECT_FALSE(IsSentence(g, R"({"v":1,"kids":[{"v":2}]})"));
}

TEST(JsonSchemaTest, JsonObjectIsAnyObject) {
  const Grammar g = JsonObjectGrammar();
  EXPECT_TRUE(IsSentence(g, R"({"a": [1, 2.5, {"b": null}], "c": "d"})"));
  EXPECT_TRUE(IsSentence(g, "{}"));
  EXPECT_FALSE(IsSentence(g, "[]"));
  EXPECT_FALSE(IsSentence(g, R"({"a": 1)"));
}

TEST(JsonSchemaTest, RefusesWhatItCannotEnforceNamingIt) {
  struct Case {
    const char* schema;
    const char* message;
  };
  for (const Case& c : {
           Case{R"({"type": "string", "contentEncoding": "base64"})", "`contentEncoding`"},
           Case{R"({"oneOf": [{"type": "string"}]})", "`oneOf`"},
           Case{R"({"type": "integer", "maximum": 3})", "`maximum`"},
           Case{R"({"type": "integer", "minimum": 3})", "minimum of 0"},
           Case{R"({"properties": {"a": {"type": "tuple"}}})", "`tuple`"},
           Case{R"({"properties": {"a": {}}, "required": ["b"]})", "\"b\""},
           Case{R"({"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}})", "itself"},
           Case{R"({"$ref": "https://example.com/s.json"})", "inside the schema"},
           Case{R"({"$ref": "#/$defs/missing"})", "names nothing"},
           Case{R"({"type": "array", "maxItems": 100000})", "maxItems"},
           Case{"false", "no output can match"},
           Case{"{not json", "not valid JSON"},
       }) {
    absl::StatusOr<Grammar> g = CompileJsonSchema(c.schema);
    ASSERT_FALSE(g.ok()) << c.schema;
    EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(g.status().message(), HasSubstr(c.message)) << c.schema;
  }
}

TEST(JsonSchemaTest, DeepNestingIsBounded) {
  std::string schema;
  for (int i = 0; i <= kMaxSchemaDepth + 1; ++i) schema += R"({"type": "array", "items": )";
  schema += "{}";
  for (int i = 0; i <= kMaxSchemaDepth + 1; ++i) schema += "}";
  absl::StatusOr<Grammar> g = CompileJsonSchema(schema);
  ASSERT_FALSE(g.ok());
  EXPECT_THAT(g.status().message(), HasSubstr("nests deeper"));
}

}  // namespace
}  // namespace tandem::grammar
