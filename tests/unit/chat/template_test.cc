#include <pthread.h>

#include <random>
#include <string>

#include "common/chat/jinja.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/model_files.h"
#include "tests/testing/status_matchers.h"

namespace tandem::jinja {
namespace {

using ::tandem::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

// Renders `source` with `context`; failures come back as "ERROR: message".
std::string R(absl::string_view source, const Json& context = Json::object(),
              const RenderOptions& options = RenderOptions()) {
  absl::StatusOr<Template> t = Template::Parse(source);
  if (!t.ok()) return "ERROR: " + std::string(t.status().message());
  absl::StatusOr<std::string> out = t->Render(context, options);
  if (!out.ok()) return "ERROR: " + std::string(out.status().message());
  return *out;
}

absl::Status RenderStatus(absl::string_view source, const Json& context = Json::object(),
                          const RenderOptions& options = RenderOptions()) {
  absl::StatusOr<Template> t = Template::Parse(source);
  if (!t.ok()) return t.status();
  return t->Render(context, options).status();
}

TEST(JinjaTest, TextAndOutput) {
  EXPECT_EQ(R("hello"), "hello");
  EXPECT_EQ(R("{{ 'a' + 'b' }}"), "ab");
  EXPECT_EQ(R("{{ x }}", {{"x", 42}}), "42");
  EXPECT_EQ(R("{{ x }}", {{"x", {{"a", {1, 2.5, nullptr, true}}}}}), "{'a': [1, 2.5, None, True]}");
  EXPECT_EQ(R(""), "");
}

TEST(JinjaTest, TrimBlocksAndLstripBlocks) {
  EXPECT_EQ(R("{% if true %}\n  a\n{% endif %}\nb"), "  a\nb");
  EXPECT_EQ(R("  {% if true %}x{% endif %}"), "x");
  EXPECT_EQ(R("a  {%- if true -%}  b  {%- endif -%}  c"), "abc");
  EXPECT_EQ(R("a\n  {%+ if true %}b{% endif %}"), "a\n  b");
  EXPECT_EQ(R("x\n"), "x");  // keep_trailing_newline=False
  EXPECT_EQ(R("x\n\n"), "x\n");
  EXPECT_EQ(R("{{ 'a' }}\n{{ 'b' }}"), "a\nb");  // no trimming after }}
}

TEST(JinjaTest, Loops) {
  EXPECT_EQ(R("{% for m in ms %}{{ loop.index }}{{ m }}{% if not loop.last %},{% endif %}"
              "{% endfor %}",
              {{"ms", {"a", "b"}}}),
            "1a,2b");
  EXPECT_EQ(R("{% for m in [] %}x{% else %}none{% endfor %}"), "none");
  EXPECT_EQ(R("{% for x in [1,2,3] if x > 1 %}{{ loop.length }}{% endfor %}"), "22");
  EXPECT_EQ(R("{% for x in [1,2,3] %}{% if x == 2 %}{% break %}{% endif %}{{ x }}{% endfor %}"),
            "1");
}

TEST(JinjaTest, NamespaceAndMacros) {
  EXPECT_EQ(R("{% set ns = namespace(n=0) %}{% for i in [1,2,3] %}{% set ns.n = ns.n + i %}"
              "{% endfor %}{{ ns.n }}"),
            "6");
  EXPECT_EQ(R("{% macro greet(name, p='Hi') %}{{ p }} {{ name }}{% endmacro %}"
              "{{ greet('a') }}/{{ greet('b', p='Yo') }}"),
            "Hi a/Yo b");
}

TEST(JinjaTest, ToJsonIsHuggingFaceJsonDumps) {
  // Key order kept, no HTML escaping, non-ASCII kept, Python separators.
  EXPECT_EQ(R("{{ x | tojson }}", Json::parse(R"({"x": {"b": "<é>", "a": [1, 2.0]}})")),
            R"({"b": "<é>", "a": [1, 2.0]})");
  EXPECT_EQ(R("{{ x | tojson(indent=2) }}", Json::parse(R"({"x": {"a": [1]}})")),
            "{\n  \"a\": [\n    1\n  ]\n}");
}

TEST(JinjaTest, HostFunctionsAndRaise) {
  RenderOptions options;
  options.functions["raise_exception"] = [](const FunctionArgs& args) -> absl::StatusOr<Json> {
    return absl::InvalidArgumentError(args.positional.at(0).get<std::string>());
  };
  EXPECT_THAT(
      RenderStatus("a\n{{ raise_exception('roles must alternate') }}", Json::object(), options),
      StatusIs(absl::StatusCode::kInvalidArgument,
               AllOf(HasSubstr("roles must alternate"), HasSubstr("line 2"))));
}

TEST(JinjaBadInputTest, ErrorsNameTheConstructAndLine) {
  EXPECT_THAT(RenderStatus("ok\n{% frobnicate %}"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("unknown tag 'frobnicate'"), HasSubstr("line 2"))));
  EXPECT_THAT(RenderStatus("a\n\n{% for x in y %}\n{{ x }}"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("'for' block opened on line 3 was never closed"),
                             HasSubstr("endfor"))));
  EXPECT_THAT(RenderStatus("{% if x %}\n{% endfor %}"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("unknown tag 'endfor'"), HasSubstr("line 2"))));
  EXPECT_THAT(RenderStatus("\n\n{{ x | frob }}"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("no filter named 'frob'"), HasSubstr("line 3"))));
  EXPECT_THAT(RenderStatus("{% if x is frob %}{% endif %}"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no test named 'frob'")));
  EXPECT_THAT(RenderStatus("{{ x "),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unclosed '{{'")));
  EXPECT_THAT(RenderStatus("{# x "),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("missing end of comment")));
  EXPECT_THAT(RenderStatus("{{ 'abc }}"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unterminated string")));
  EXPECT_THAT(RenderStatus("{{ (1 }}"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(RenderStatus("{% include 'x' %}"), StatusIs(absl::StatusCode::kInvalidArgument,
                                                          HasSubstr("'include' is not supported")));
  EXPECT_THAT(RenderStatus("{{ 1 }}\n{{ x.y }}"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("'x' is undefined"), HasSubstr("line 2"))));
  EXPECT_THAT(RenderStatus("{{ m.content + 'x' }}", {{"m", Json::object()}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("'dict object' has no attribute 'content'")));
  EXPECT_THAT(RenderStatus("{{ 1 }}", Json::array()), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(JinjaBadInputTest, LimitsBoundTimeAndSize) {
  RenderOptions small;
  small.max_output_bytes = 1000;
  EXPECT_THAT(
      RenderStatus("{% for i in range(100) %}0123456789abcdef{% endfor %}", Json::object(), small),
      StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(RenderStatus("{{ 'x' * 100000000 }}"),
              StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(RenderStatus("{{ range(1000000000) | length }}"),
              StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(RenderStatus("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}"),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("nested deeper")));
  RenderOptions few_steps;
  few_steps.max_steps = 10000;
  EXPECT_THAT(RenderStatus("{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}"
                           "{% endfor %}",
                           Json::object(), few_steps),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("steps")));
  for (int depth : {500, 5000}) {
    EXPECT_THAT(
        RenderStatus("{{ " + std::string(depth, '(') + "1" + std::string(depth, ')') + " }}"),
        StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("nested")));
  }
  EXPECT_THAT(RenderStatus("{{ " + std::string(5000, '-') + "1 }}"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("nested")));
  EXPECT_THAT(RenderStatus("{{ " + std::string(5000, '[') + " }}"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("nested")));
  // Long chains grow the tree without nesting.
  std::string chain_attr = "{{ x", chain_plus = "{{ 1", chain_filter = "{{ 'a'", chain_not = "{{ ",
              filter_block = "{% filter trim";
  for (int i = 0; i < 100000; ++i) {
    chain_attr += ".a";
    chain_plus += "+1";
    chain_filter += "|trim";
    chain_not += "not ";
    filter_block += "|trim";
  }
  for (std::string t : {chain_attr + " }}", chain_plus + " }}", chain_filter + " }}",
                        chain_not + "1 }}", filter_block + " %}x{% endfilter %}"}) {
    EXPECT_THAT(RenderStatus(t), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("nested")));
  }
  std::string deep_blocks;
  for (int i = 0; i < 1000; ++i) deep_blocks += "{% if 1 %}";
  EXPECT_THAT(RenderStatus(deep_blocks),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("nested deeper")));
  // Reference cycles through namespaces are broken after the render.
  EXPECT_EQ(R("{% set ns = namespace() %}{% set ns.self = ns %}ok"), "ok");
}

// Deep recursion (recursive macro calls, each inside nested blocks
// evaluating a tall expression) ends in a clean error within a bounded stack
// (the test runs it on a thread with 2 MiB of stack).
TEST(JinjaBadInputTest, DeepNestingStopsWithinABoundedStack) {
  std::string open, close, expr = "n";
  for (int i = 0; i < 100; ++i) {
    open += "{% if true %}";
    close += "{% endif %}";
  }
  for (int i = 0; i < 150; ++i) expr += " + 0";
  const std::string t = "{% macro f(n) %}" + open + "{{ " + expr +
                        " }}{% if n > 0 %}{{ f(n - 1) }}{% endif %}" + close +
                        "{% endmacro %}{{ f(depth) }}";
  absl::StatusOr<Template> parsed = Template::Parse(t);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  absl::StatusOr<std::string> shallow = absl::UnknownError("not run");
  absl::StatusOr<std::string> deep = absl::UnknownError("not run");
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 2 << 20);
  struct Job {
    const Template* t;
    absl::StatusOr<std::string>* shallow;
    absl::StatusOr<std::string>* deep;
  } job{&*parsed, &shallow, &deep};
  pthread_t thread;
  ASSERT_EQ(pthread_create(
                &thread, &attr,
                [](void* arg) -> void* {
                  Job* j = static_cast<Job*>(arg);
                  *j->shallow = j->t->Render({{"depth", 3}});
                  *j->deep = j->t->Render({{"depth", 30}});
                  return nullptr;
                },
                &job),
            0);
  pthread_join(thread, nullptr);
  pthread_attr_destroy(&attr);
  ASSERT_TRUE(shallow.ok()) << shallow.status();
  EXPECT_EQ(shallow->substr(0, 4), "3210");
  EXPECT_THAT(deep, StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("nested deeper")));
}

// Regression guard for robustness: mutated chat templates (bytes replaced,
// inserted, deleted, spliced from a pool of Jinja fragments) must parse and
// render to a value or a clean error, never crash or hang.
TEST(JinjaBadInputTest, RandomMutationsNeverCrash) {
  const std::string seed_template =
      "{%- set ns = namespace(first=true) %}{{ bos_token }}"
      "{%- for message in messages if message.role != 'x' %}\n"
      "  {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
      "{{ raise_exception('alternate') }}{% endif %}\n"
      "  {{- '<|' + message.role + '|>\\n' + message.content | trim + '\\n' }}"
      "{%- set ns.first = false -%}\n"
      "{%- endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
      "{{ messages | tojson(indent=2) }}{{ (messages[1:] | map(attribute='role') | list)[::-1] }}"
      "{% macro m(a, b=2) %}{{ a ~ b }}{% endmacro %}{{ m(1) }}{{ 'x'.split()[0].strip() }}";
  const std::vector<std::string> fragments = {
      "{%",     "%}",         "{{",     "}}",
      "{#",     "#}",         "-",      "+",
      "(",      ")",          "[",      "]",
      "{",      "}",          "'",      "\"",
      "|",      ".",          ",",      ":",
      "~",      "*",          "**",     "//",
      "%",      "==",         "not ",   " in ",
      " is ",   " if ",       " else ", "endif",
      "endfor", "for ",       "set ",   "macro ",
      "loop.",  "namespace(", "range(", "\n",
      " ",      "\\",         "0",      "9999999999999999999",
      "-1",     "::-1",       "\xff",   "\xc3",
      "é"};
  const Json context = Json::parse(R"({"bos_token": "<s>", "add_generation_prompt": true,
      "messages": [{"role": "user", "content": " hi "}, {"role": "assistant", "content": "yo"}]})");
  RenderOptions options;
  options.max_steps = 200000;
  options.max_output_bytes = 1 << 20;
  options.functions["raise_exception"] = [](const FunctionArgs&) -> absl::StatusOr<Json> {
    return absl::InvalidArgumentError("raised");
  };
  std::mt19937 rng(20240726);
  int rendered = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::string t = seed_template;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const size_t pos = rng() % (t.size() + 1);
      switch (rng() % 4) {
        case 0:
          if (pos < t.size()) t[pos] = static_cast<char>(rng() % 256);
          break;
        case 1:
          t.insert(pos, fragments[rng() % fragments.size()]);
          break;
        case 2:
          t.erase(pos, rng() % 8);
          break;
        default: {
          const size_t from = rng() % t.size();
          t.insert(pos, t.substr(from, rng() % 40));
        }
      }
    }
    absl::StatusOr<Template> parsed = Template::Parse(t);
    if (!parsed.ok()) continue;
    absl::StatusOr<std::string> out = parsed->Render(context, options);
    if (out.ok()) ++rendered;
  }
  EXPECT_GT(rendered, 100);  // the mutations still exercise rendering
}

}  // namespace
}  // namespace tandem::jinja
