#include "common/grammar/regex.h"

#include <memory>
#include <string>
#include <string_view>

#include "common/grammar/json_schema.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/grammar/sentence.h"

namespace tandem::grammar {
namespace {

using ::testing::HasSubstr;

Grammar Regex(absl::string_view pattern, RegexOptions options = {}) {
  Grammar g;
  absl::StatusOr<int32_t> rule = AddRegex(g, pattern, options);
  EXPECT_TRUE(rule.ok()) << rule.status();
  if (rule.ok()) g.set_root(*rule);
  EXPECT_TRUE(g.Validate().ok());
  return g;
}

TEST(RegexTest, WholeMatchesOfTheServedSyntax) {
  const Grammar g = Regex(R"(^(ab|c)+[x-z]?\d{2,3}\.(?:\w|\s)*$)");
  for (const char* ok : {"ab12.", "cabc999.a_ 9", "cz00."}) EXPECT_TRUE(IsSentence(g, ok)) << ok;
  for (const char* bad : {"ab1.", "ab1234.", "a12.", "ab12x", "ab12.-"}) {
    EXPECT_FALSE(IsSentence(g, bad)) << bad;
  }
  const Grammar dot = Regex("a.c");
  EXPECT_TRUE(IsSentence(dot, "abc"));
  EXPECT_TRUE(IsSentence(dot,
                         "a\xc3\xa9"
                         "c"));
  EXPECT_FALSE(IsSentence(dot, "a\nc"));
  EXPECT_FALSE(IsSentence(dot,
                          "a\xff"
                          "c"));
  const Grammar negated = Regex(R"([^0-9"]{2})");
  EXPECT_TRUE(IsSentence(negated, "a\xe2\x82\xac"));  // a and the euro sign
  EXPECT_FALSE(IsSentence(negated, "a1"));
  EXPECT_FALSE(IsSentence(negated, "a\""));
  const Grammar unicode = Regex(R"(\u00e9+|caf\x65)");
  EXPECT_TRUE(IsSentence(unicode, "\xc3\xa9\xc3\xa9"));
  EXPECT_TRUE(IsSentence(unicode, "cafe"));
  const Grammar escaped = Regex(R"(\(\*\)\[\\\]-[\]a-]{1,}?)");
  EXPECT_TRUE(IsSentence(escaped, "(*)[\\]-]a-"));
}

TEST(RegexTest, InsideJsonStringsSpecialCharactersAreWrittenEscaped) {
  const Grammar g = Regex("a\"b\\\\c\\n", {.output = RegexOutput::kJsonString});
  EXPECT_TRUE(IsSentence(g, R"(a\"b\\c\n)"));
  EXPECT_FALSE(IsSentence(g, "a\"b\\c\n"));
  const Grammar search = Regex("cat", {.output = RegexOutput::kJsonString, .search = true});
  EXPECT_TRUE(IsSentence(search, R"(a \"cat\" here)"));
  EXPECT_FALSE(IsSentence(search, "a dog"));
  const Grammar anchored = Regex("^cat", {.output = RegexOutput::kJsonString, .search = true});
  EXPECT_TRUE(IsSentence(anchored, "cats"));
  EXPECT_FALSE(IsSentence(anchored, "a cat"));
}

TEST(RegexTest, RefusesWhatItCannotEnforce) {
  for (const auto& [pattern, message] : std::initializer_list<std::pair<const char*, const char*>>{
           {R"((a)\1)", "`\\1`"},
           {"a(?=b)", "lookaround"},
           {R"(\bword)", "`\\b`"},
           {"(ab", "unclosed `(`"},
           {"ab)", "unmatched `)`"},
           {"[ab", "unclosed `[`"},
           {"*a", "nothing to repeat"},
           {"a**", "quantifier after a quantifier"},
           {"a{5,2}", "repeats"},
           {"a{2000}", "repeats"},
           {"a^b", "anchors"},
           {"[z-a]", "reversed"},
           {"[^\xc3\xa9]", "negated class with non-ASCII"},
           {"((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((a))))))))))))))"
            "))))))))))))))))))))))))))))))))))))))))))))))))))))",
            "deeper than 64"},
       }) {
    Grammar g;
    absl::StatusOr<int32_t> rule = AddRegex(g, pattern, {});
    ASSERT_FALSE(rule.ok()) << pattern;
    EXPECT_EQ(rule.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(rule.status().message(), HasSubstr(message)) << pattern;
  }
}

TEST(RegexTest, GrammarSizeIsBounded) {
  std::string pattern;
  for (int i = 0; i < 300; ++i) pattern += "a{1000}";  // 300,000 elements
  Grammar g;
  absl::StatusOr<int32_t> rule = AddRegex(g, pattern, {});
  EXPECT_THAT(rule.status().message(), HasSubstr("elements"));
  // A group is one rule, however often it is repeated.
  Grammar shared;
  EXPECT_TRUE(AddRegex(shared, "(a{1000}){1000}", {}).ok());
}

TEST(RegexTest, SchemaPatternsAndFormats) {
  absl::StatusOr<Grammar> code =
      CompileJsonSchema(R"({"type": "string", "pattern": "^[A-Z]{3}-\\d{2}$"})");
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_TRUE(IsSentence(*code, R"("ABC-12")"));
  EXPECT_FALSE(IsSentence(*code, R"("AB-12")"));
  absl::StatusOr<Grammar> date = CompileJsonSchema(R"({"format": "date"})");
  ASSERT_TRUE(date.ok()) << date.status();
  EXPECT_TRUE(IsSentence(*date, R"("2026-11-27")"));
  EXPECT_FALSE(IsSentence(*date, R"("2026-13-01")"));
  absl::StatusOr<Grammar> when = CompileJsonSchema(R"({"type": "string", "format": "date-time"})");
  ASSERT_TRUE(when.ok()) << when.status();
  EXPECT_TRUE(IsSentence(*when, R"("2026-11-27T19:05:00.5+01:00")"));
  EXPECT_FALSE(IsSentence(*when, R"("2026-11-27 19:05:00Z")"));
  absl::StatusOr<Grammar> id = CompileJsonSchema(R"({"type": "string", "format": "uuid"})");
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_TRUE(IsSentence(*id, R"("123e4567-e89b-12d3-a456-426614174000")"));
  for (const auto& [schema, message] : std::initializer_list<std::pair<const char*, const char*>>{
           {R"({"type": "string", "format": "hostname"})", "\"hostname\" is not supported"},
           {R"({"type": "string", "pattern": "(?<=a)b"})", "lookaround"},
           {R"({"type": "string", "pattern": "a", "maxLength": 3})", "maxLength"},
           {R"({"type": "string", "pattern": "a", "format": "date"})", "keep one"},
       }) {
    absl::StatusOr<Grammar> g = CompileJsonSchema(schema);
    ASSERT_FALSE(g.ok()) << schema;
    EXPECT_THAT(g.status().message(), HasSubstr(message)) << schema;
  }
}

}  // namespace
}  // namespace tandem::grammar
