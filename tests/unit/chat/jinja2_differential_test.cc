// The language, template by template, against Python's Jinja2: each snippet
// must render the same text, or fail on both sides.
#include <string>
#include <vector>

#include "common/chat/jinja.h"
#include "gtest/gtest.h"
#include "tests/testing/model_files.h"
#include "tests/unit/chat/jinja2_reference.h"

namespace tandem::jinja {
namespace {

struct Case {
  const char* source;
  const char* context;  // JSON object
};

const Case kCases[] = {
    // Whitespace control: trim_blocks, lstrip_blocks, -/+ markers, comments.
    {"  {% if true %}\n  x\n  {% endif %}\n  y {# c #}\n  {# c2 #}\nz\n", "{}"},
    {"a  {%- if true -%}  b  {%- endif -%}  c", "{}"},
    {"a\n  {%+ if true %}b{% endif %}\n", "{}"},
    {"{{- '  x  ' -}}\n  {{ 'y' }}  \n", "{}"},
    {"a {{- 1 }} {{ 2 -}} b\n\n", "{}"},
    {"{% for i in [1,2] %}\n  {{ i }}\n{% endfor %}\n", "{}"},
    {"line1\r\nline2\r{% if 1 %}\r\nx{% endif %}\n\n", "{}"},
    {"{# comment\n spanning #}\nafter", "{}"},
    {"{% raw %}\n{{ x }}{% endraw %}\n1", "{}"},
    {"\t {% set x = 1 %}\t\n{{ x }}", "{}"},
    {"{{ 'a' }}\n   {% if true %}b{% endif %}", "{}"},
    // Output of values.
    {"{{ (1,2) | list }}|{{ {'a': [1, 2.0, None, True, 'x\"y', \"it's\"]} }}", "{}"},
    {"{{ 1e16 }} {{ 1/3 }} {{ 10/2 }} {{ 1e-5 }} {{ 0.0001 }} {{ 123456789.125 }} {{ -0.0 }}",
     "{}"},
    {"{{ none }}{{ None }}{{ true }}{{ False }}{{ x }}", "{}"},
    {"{{ d }}|{{ l }}|{{ s }}", R"({"d": {"k": "v\n", "n": null}, "l": [1.5, "a'b"], "s": "é"})"},
    {"{{ 'tab\\there' }}|{{ ['\\n', '\\\\', '\\x01'] }}", "{}"},
    // Operators.
    {"{{ 1 == 1.0 }} {{ true == 1 }} {{ 3 // 2 }} {{ -3 % 2 }} {{ 2 ** 10 }} {{ -7 // 2 }}", "{}"},
    {"{{ 7 / 0 }}", "{}"},
    {"{{ 7.5 // 2 }} {{ -7.5 % 2 }} {{ 2 ** -1 }} {{ 1 + true }}", "{}"},
    {"{{ 'a' ~ 1 ~ none ~ [1] }} {{ 'ab' * 3 }} {{ [1] * 2 }} {{ [1] + [2] }}", "{}"},
    {"{{ 'a' + 1 }}", "{}"},
    {"{{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 'a' < 'b' }} {{ [1,2] < [1,3] }} {{ 1 != 2 }}", "{}"},
    {"{{ 'a' < 1 }}", "{}"},
    {"{{ 'b' in 'abc' }} {{ 2 in [1,2] }} {{ 'k' in {'k':1} }} {{ 'z' not in 'abc' }}", "{}"},
    {"{{ not 1 }} {{ 1 and 2 }} {{ 0 or 'x' }} {{ none or [] }} {{ 1 if 0 else 2 }}", "{}"},
    {"{{ x if false }}|{{ -x }}", R"({"x": 3})"},
    {"{{ 'abc'[::-1] }} {{ 'héllo'[1:3] }} {{ [1,2,3,4][1::2] }} {{ 'abc'[-1] }} {{ 'abc'[5] }}",
     "{}"},
    {"{{ [1,2,3][::-2] }} {{ [1,2,3][-5:10] }} {{ 'ab'[10:] }} {{ [1,2,3][3:0:-1] }}", "{}"},
    {"{{ 'abc'[::0] }}", "{}"},
    // Undefined.
    {"{{ x.y }}", "{}"},
    {"{{ x | length }} {{ x is iterable }} {{ 'a' in x }} {{ x is sequence }}", "{}"},
    {"{{ 'a' + x }}", "{}"},
    {"{{ x | trim }}|{{ x | default('d') }}|{{ x is defined }}|{{ x == none }}", "{}"},
    {"{{ x | tojson }}", "{}"},
    {"{% for a in x %}{{ a }}{% else %}empty{% endfor %}", "{}"},
    {"{{ d.missing }}|{{ d['missing'] }}|{{ l[9] }}|{{ d.k.foo is defined }}",
     R"({"d": {"k": "v"}, "l": [1]})"},
    {"{{ d.missing.x }}", R"({"d": {}})"},
    {"{{ x < 1 }}", "{}"},
    // Attributes, methods.
    {"{{ 'x'.foo }}|{% for k, v in d.items() %}{{ k }}{{ v }}{% endfor %}|{{ d.keys() | list }}|{{ "
     "d.values() | list }}",
     R"({"d": {"a": 1, "b": [2]}})"},
    {"{{ d.get('a') }} {{ d.get('z') }} {{ d.get('z', 5) }}", R"({"d": {"a": 1}})"},
    {"{{ [1].append(2) }}", "{}"},
    {"{{ '  a b  '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ '  a '.lstrip() }}|{{ ' a  '.rstrip() }}",
     "{}"},
    {"{{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a b c'.split(' ', 1) }} "
     "{{ 'a b c'.rsplit(' ', 1) }} {{ 'a b'.split(none, 0) }}",
     "{}"},
    {"{{ 'abc'.startswith('ab') }} {{ 'abc'.endswith(('x', 'c')) }} {{ 'aBc'.upper() }} "
     "{{ 'ABC'.lower() }} {{ 'hello world'.title() }} {{ 'hELLO'.capitalize() }}",
     "{}"},
    {"{{ 'aaa'.replace('a', 'b', 2) }} {{ 'ab'.replace('', '-') }} {{ 'abcabc'.find('c') }} "
     "{{ 'abc'.count('') }} {{ '-'.join(['a', 'b']) }} {{ '12'.isdigit() }}",
     "{}"},
    {"{{ '\\u3000 x\\u00a0'.strip() }}|{{ ' é '.strip() }}", "{}"},
    // Filters.
    {"{{ '  hi  ' | trim }}|{{ 'xhix' | trim('x') }}|{{ 'Hi' | upper }}|{{ 'Hi' | lower }}|"
     "{{ 'hi there' | capitalize }}|{{ 'hi there' | title }}",
     "{}"},
    {"{{ [3,1,2] | sort }} {{ ['b','A','c'] | sort }} {{ [3,1,2] | sort(reverse=true) }} "
     "{{ ['b','A'] | sort(case_sensitive=true) }}",
     "{}"},
    {"{{ l | sort(attribute='n') | map(attribute='n') | list }}",
     R"({"l": [{"n": 2}, {"n": 1}, {"n": 3}]})"},
    {"{{ [1,2,3] | first }} {{ [1,2,3] | last }} {{ 'abc' | first }} {{ [] | first }} "
     "{{ {'a':1,'b':2} | first }}",
     "{}"},
    {"{{ [1,2] | join }} {{ [1,2] | join(', ') }} {{ l | join('-', attribute='n') }}",
     R"({"l": [{"n": "x"}, {"n": "y"}]})"},
    {"{{ 'a b' | replace(' ', '_') }} {{ 'aaa' | replace('a', 'b', 1) }} {{ 5 | string }}", "{}"},
    {"{{ [1,2] | length }} {{ 'héllo' | length }} {{ {'a':1} | count }}", "{}"},
    {"{{ 5 | length }}", "{}"},
    {"{{ d | items | list | length }}|{% for k, v in d | items %}{{ k }}={{ v }};{% endfor %}",
     R"({"d": {"z": 1, "a": 2}})"},
    {"{{ l | selectattr('role', 'equalto', 'user') | list | length }} "
     "{{ l | rejectattr('role', 'eq', 'user') | map(attribute='role') | join(',') }} "
     "{{ l | selectattr('x') | list }}",
     R"({"l": [{"role": "user"}, {"role": "bot", "x": 1}, {"role": "user"}]})"},
    {"{{ [1,2,3,4] | select('odd') | list }} {{ [1,2,3,4] | reject('even') | list }} "
     "{{ [0,1,''] | select | list }} {{ ['a','code_interpreter'] | reject('equalto', "
     "'code_interpreter') | join(', ') }}",
     "{}"},
    {"{{ ['a','b'] | map('upper') | join }} {{ [1,2,2,1] | unique | list }} {{ [3,1] | max }} "
     "{{ [3,1] | min }} {{ [1,2] | sum }} {{ [-1] | map('abs') | list }}",
     "{}"},
    {"{{ [1,2] | reverse | list }} {{ 'abc' | reverse }} {{ 3.7 | int }} {{ '42' | int }} "
     "{{ 'x' | int }} {{ '1.5' | float }} {{ 2.5 | round }} {{ 3.14159 | round(2) }} "
     "{{ 2.1 | round(0, 'ceil') }}",
     "{}"},
    {"{{ x | default('d') }} {{ '' | default('d') }} {{ '' | default('d', true) }} "
     "{{ none | d('n', boolean=true) }}",
     "{}"},
    {"{% for k, v in {'b': 1, 'a': 2} | dictsort %}{{ k }}{{ v }}{% endfor %} "
     "{% for k, v in {'b': 1, 'a': 2} | dictsort(by='value', reverse=true) %}{{ k }}{% endfor %}",
     "{}"},
    {"{{ 'a\\nb\\n\\nc' | indent }}|{{ 'a\\nb' | indent(2, true) }}|{{ 'a\\n\\nb' | indent(1, "
     "blank=true) }}",
     "{}"},
    {"{{ '<a href=\"x\">&\\'' | e }} {{ 'one two  three' | wordcount }}", "{}"},
    {"{{ [1, 'a', {'k': [true, none, 1.5]}] | tojson }} {{ {'é': '<>&\\''} | tojson }}", "{}"},
    {"{{ {'b': 1, 'a': [1, 2]} | tojson(indent=4) }}|{{ {} | tojson(indent=2) }}|"
     "{{ [[]] | tojson(indent=2) }}",
     "{}"},
    {"{{ {'b': 1, 'a': 2} | tojson(sort_keys=true) }} {{ [1,2] | tojson(separators=(',', ':')) }}",
     "{}"},
    {"{{ d | tojson }}", R"({"d": {"z": "\u0001\t\"\\", "a": 1e100, "b": 0.1, "c": -5}})"},
    {"{{ ('a' | attr('upper'))() }}|{{ {'a': 1} | attr('a') }}", "{}"},
    // Tests.
    {"{{ 1 is integer }} {{ 1.0 is float }} {{ true is integer }} {{ true is number }} "
     "{{ true is boolean }} {{ 'a' is string }} {{ {} is mapping }} {{ [] is mapping }} "
     "{{ [] is iterable }} {{ 'a' is sequence }} {{ 1 is iterable }} {{ none is none }}",
     "{}"},
    {"{{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ 9 is divisibleby(2) }} "
     "{{ 1 is eq 1 }} {{ 2 is gt 1 }} {{ 'a' is in 'abc' }} {{ 'abc' is lower }} "
     "{{ true is sameas true }} {{ none is sameas none }} {{ x is not defined }}",
     "{}"},
    {"{{ range is callable }} {{ 'x' is callable }} {{ true is true }} {{ 1 is true }}", "{}"},
    // Statements.
    {"{% for x in [1,2] %}{% if loop.first %}{% set y = 1 %}{% endif %}[{{ y }}]{% endfor %}",
     "{}"},
    {"{% set y = 5 %}{% for x in [1,2] %}[{{ y }}]{% set y = x %}[{{y}}]{% endfor %}{{y}}", "{}"},
    {"{% for x in 'ab' %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}"
     "{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.cycle('o','e') }}"
     "{{ loop.previtem }}{{ loop.nextitem }};{% endfor %}",
     "{}"},
    {"{% for x in [1,2,3,4] if x is odd %}{{ x }}{{ loop.index }}{{ loop.last }},{% endfor %}",
     "{}"},
    {"{% for x in [1,2,3,4] %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}"
     "{% break %}{% endif %}{{ x }}{% endfor %}",
     "{}"},
    {"{% for a, b in [[1,2],[3,4]] %}{{ a }}{{ b }}{% endfor %}", "{}"},
    {"{% for k in d %}{{ k }}{% endfor %}|{% for k, v in d.items() %}{{ k }}{{ v }}{% endfor %}",
     R"({"d": {"z": 1, "a": 2}})"},
    {"{% for a, b in [[1,2,3]] %}{% endfor %}", "{}"},
    {"{% for x in 5 %}{% endfor %}", "{}"},
    {"{% for i in range(3) %}{{ i }}{% endfor %}{{ range(1, 10, 3) | list }}{{ range(3, 0, -1) "
     "| list }}",
     "{}"},
    {"{% for o in [1,2] %}{% for i in [3,4] %}{{ loop.index }}{{ o }}{% endfor %}{{ loop.index }}"
     "{% endfor %}",
     "{}"},
    {"{% if 0 %}a{% elif '' %}b{% elif [1] %}c{% else %}d{% endif %}", "{}"},
    {"{% set ns = namespace(a=1, b='x') %}{% set ns.a = ns.a + 1 %}{{ ns.a }}{{ ns.b }}"
     "{% for i in [1,2] %}{% set ns.c = i %}{% endfor %}{{ ns.c }}{{ ns }}",
     "{}"},
    {"{% set ns = namespace() %}{% set ns.x = 1 %}{{ ns.x }}{{ ns.y }}", "{}"},
    {"{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set t = (1, 2) %}{{ t | length }}", "{}"},
    {"{% set x %}  block {{ 1 }}  {% endset %}[{{ x }}]{% set y | trim | upper %} a {% endset %}"
     "[{{ y }}]",
     "{}"},
    {"{% macro m(a, b='d', c=none) %}{{ a }}-{{ b }}-{{ c }}{% endmacro %}{{ m(1) }} "
     "{{ m(1, 2, 3) }} {{ m(b=5, a=0) }} {{ m() }}",
     "{}"},
    {"{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, 2) }}", "{}"},
    {"{% macro m(a) %}{{ a }}{% endmacro %}{{ m(z=1) }}", "{}"},
    {"{% macro outer() %}[{{ caller() }}]{% endmacro %}{% call outer() %}inner {{ 1 }}"
     "{% endcall %}",
     "{}"},
    {"{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(5) }}",
     "{}"},
    {"{% filter upper %}abc {{ 'd' }}{% endfilter %}", "{}"},
    {"{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}{{ a }}", "{}"},
    {"{% set x = [1, 2] %}{% set x = x + [3] %}{{ x }}{% set d = {'a': x} %}{{ d.a[2] }}", "{}"},
    {"{{ raise_exception('boom: ' ~ 1) }}", "{}"},
    {"{{ strftime_now('%d %b %Y %H:%M') }}", "{}"},
    {"{{ dict(a=1, b=[2]) }} {{ namespace(x=1).x }}", "{}"},
    {"{{ messages[0]['content'] | trim }}{{ messages[1:] | length }}",
     R"({"messages": [{"role": "system", "content": "  hi\n"}, {"role": "user", "content": "u"}]})"},
    {"{{ x.content.content is defined }} {{ x.tool_calls is defined and x.tool_calls is not none "
     "}}",
     R"({"x": {"content": "text", "tool_calls": null}})"},
    {"{{ 'x' if true }}{{ 'y' if false else 'z' if true else 'w' }}", "{}"},
    {"{{ \"a\" 'b' }}{{ 'multi\nline' }}", "{}"},
    {"{{ 1_000 + 0x10 if false else 1_000 }} {{ 2.5e3 }} {{ 1. }}", "{}"},
    {"{{ foo(1) }}", "{}"},
    {"{{ 1(2) }}", "{}"},
    {"{% for i in range(3) %}{{ i }}{% endfor %}{% break %}", "{}"},
    {"{{ l[0].a }} {{ l.0.a }} {{ 'abc'.1 }}", R"({"l": [{"a": 7}]})"},
    {"{{ [1, 2][true] }} {{ 'ab'[false] }}", "{}"},
    {"{{ x.y is defined }}", "{}"},
};

TEST(Jinja2DifferentialTest, SnippetsRenderAsJinja2Does) {
  std::vector<testing::Jinja2Job> jobs;
  for (const Case& c : kCases) {
    testing::Jinja2Job job;
    job.source = c.source;
    job.context = Json::parse(c.context);
    job.now_unix_seconds = 1722000000;
    jobs.push_back(std::move(job));
  }
  absl::StatusOr<std::vector<testing::Jinja2Result>> expected = testing::RenderWithJinja2(jobs);
  TANDEM_JINJA2_OR_SKIP(expected.status());
  RenderOptions options;
  options.functions["raise_exception"] = [](const FunctionArgs& args) -> absl::StatusOr<Json> {
    return absl::InvalidArgumentError(args.positional.empty() ? "" : args.positional[0].dump());
  };
  options.functions["strftime_now"] = [](const FunctionArgs& args) -> absl::StatusOr<Json> {
    // 2024-07-26 13:20:00 UTC, as the jobs' now_unix_seconds.
    (void)args;
    return Json("26 Jul 2024 13:20");
  };
  for (size_t i = 0; i < jobs.size(); ++i) {
    SCOPED_TRACE(::testing::Message()
                 << "template: " << jobs[i].source << "\ncontext: " << jobs[i].context.dump());
    const testing::Jinja2Result& want = (*expected)[i];
    absl::StatusOr<Template> t = Template::Parse(jobs[i].source);
    absl::StatusOr<std::string> got =
        t.ok() ? t->Render(jobs[i].context, options) : absl::StatusOr<std::string>(t.status());
    if (want.ok) {
      EXPECT_TRUE(got.ok()) << got.status() << "\nJinja2 rendered: " << want.output;
      if (got.ok()) {
        EXPECT_EQ(*got, want.output);
      }
    } else {
      EXPECT_FALSE(got.ok()) << "rendered: " << *got << "\nJinja2 failed: " << want.error;
    }
  }
}

}  // namespace
}  // namespace tandem::jinja
