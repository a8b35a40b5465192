// The Jinja interpreter (src/chat/jinja*.cpp) against Python's jinja2.
//
// JinjaParity renders every chat template of tests/fixtures/chat_templates
// with every context of tests/chat/conversations.json, and every construct of
// tests/chat/snippets.json, and compares with golden.json, which
// tests/chat/render_jinja2.py wrote with jinja2 configured as transformers
// configures it (ctest's chat_templates_golden re-renders it with the
// installed jinja2 and checks it is current). The other tests state one
// behaviour each: whitespace control, errors and their lines, the sandbox,
// the limits, and that no template text crashes the interpreter.
#include <ctime>
#include <filesystem>
#include <fstream>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "chat/jinja.h"
#include "support/files.h"

using kvgraph::chat::jinja::RenderOptions;
using kvgraph::chat::jinja::Template;
using kvgraph::chat::jinja::TemplateError;
using kvgraph::chat::jinja::TemplateLimitError;
using nlohmann::ordered_json;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

namespace {

fs::path source_dir() { return fs::path(KVGRAPH_SOURCE_DIR); }

ordered_json read_json(const fs::path& p) { return ordered_json::parse(kvgraph::testing::read_file(p)); }

// strftime_now as render_jinja2.py pins it: 2024-07-26 12:00:00 local time.
RenderOptions fixed_clock() {
  std::tm tm{};
  tm.tm_year = 2024 - 1900;
  tm.tm_mon = 6;
  tm.tm_mday = 26;
  tm.tm_hour = 12;
  tm.tm_isdst = -1;
  RenderOptions o;
  o.now = std::chrono::system_clock::from_time_t(std::mktime(&tm));
  return o;
}

std::string render(const std::string& source, const ordered_json& context = ordered_json::object()) {
  return Template::parse(source).render(context, fixed_clock());
}

// The result as golden.json records it: {"text": ...} or {"error": ...}.
ordered_json result_of(const std::string& source, const ordered_json& context) {
  try {
    return {{"text", render(source, context)}};
  } catch (const TemplateError& e) {
    return {{"error", e.message()}};
  }
}

// Compares one render with jinja2's: the same text, or both failing (with
// the same message when the template raised it with raise_exception).
void expect_same(const ordered_json& expected, const ordered_json& got, const std::string& what) {
  if (expected.contains("text")) {
    ASSERT_TRUE(got.contains("text")) << what << ": jinja2 rendered, kvgraph failed: " << got["error"];
    EXPECT_EQ(got["text"].get<std::string>(), expected["text"].get<std::string>()) << what;
  } else {
    ASSERT_TRUE(got.contains("error")) << what << ": jinja2 failed (" << expected["error"]
                                       << "), kvgraph rendered: " << got["text"];
    if (expected["raised"].get<bool>()) EXPECT_EQ(got["error"], expected["error"]) << what;
  }
}

}  // namespace

TEST(JinjaParity, EveryChatTemplateAndConversationRendersAsJinja2Does) {
  const ordered_json golden = read_json(source_dir() / "tests/fixtures/chat_templates/golden.json");
  const ordered_json conversations = read_json(source_dir() / "tests/chat/conversations.json");
  size_t templates = 0, rendered = 0;
  for (const auto& entry : fs::directory_iterator(source_dir() / "tests/fixtures/chat_templates")) {
    if (entry.path().extension() != ".jinja") continue;
    const std::string name = entry.path().filename().string();
    ASSERT_TRUE(golden["templates"].contains(name)) << name << " is not in golden.json: run render_jinja2.py --write";
    const std::string source = kvgraph::testing::read_file(entry.path());
    ++templates;
    for (const auto& c : conversations) {
      const std::string what = name + " / " + c["name"].get<std::string>();
      const ordered_json& expected = golden["templates"][name][c["name"].get<std::string>()];
      expect_same(expected, result_of(source, c["context"]), what);
      rendered += expected.contains("text");
    }
  }
  EXPECT_EQ(templates, golden["templates"].size());
  EXPECT_GT(rendered, 150u);  // most cases render; the rest must fail as in jinja2
}

TEST(JinjaParity, EverySnippetRendersAsJinja2Does) {
  const ordered_json golden = read_json(source_dir() / "tests/fixtures/chat_templates/golden.json");
  const ordered_json snippets = read_json(source_dir() / "tests/chat/snippets.json");
  ASSERT_EQ(golden["snippets"].size(), snippets.size()) << "golden.json is stale: run render_jinja2.py --write";
  for (size_t i = 0; i < snippets.size(); ++i) {
    const ordered_json context = snippets[i].value("context", ordered_json::object());
    expect_same(golden["snippets"][i], result_of(snippets[i]["template"], context),
                "snippet " + std::to_string(i) + ": " + snippets[i]["template"].get<std::string>());
  }
}

TEST(Jinja, WhitespaceControlAsTransformersConfiguresIt) {
  // trim_blocks: the newline after a block tag goes; lstrip_blocks: the
  // indentation before it goes; neither applies to {{ }}.
  EXPECT_EQ(render("a\n  {% if true %}\n  b\n  {% endif %}\nc"), "a\n  b\nc");
  EXPECT_EQ(render("  {{ 'x' }}\n"), "  x");  // and one trailing newline of the template is dropped
  EXPECT_EQ(render("a  {%- if true -%}  b  {%- endif -%}  c"), "abc");
  EXPECT_EQ(render("  {%+ if true %}x{% endif %}"), "  x");  // + keeps the indentation
  EXPECT_EQ(render("{% if true +%}\nx{% endif %}"), "\nx");   // + keeps the newline
  EXPECT_EQ(render("x {# note #}\ny"), "x y");
  EXPECT_EQ(render("{{- '  a  ' -}}  \n  b"), "  a  b");
  EXPECT_EQ(render("{% raw %}{{ kept }}{% endraw %}"), "{{ kept }}");
  EXPECT_EQ(render("a\r\nb\rc"), "a\nb\nc");
}

TEST(Jinja, LoopVariablesAndControls) {
  EXPECT_EQ(render("{% for x in 'abc' %}{{ loop.index }}{{ loop.first }}{{ loop.last }}{{ loop.revindex }},{% endfor %}"),
            "1TrueFalse3,2FalseFalse2,3FalseTrue1,");
  EXPECT_EQ(render("{% for x in [1, 2, 3] %}{% if x == 2 %}{% continue %}{% endif %}{{ x }}{% endfor %}"), "13");
  EXPECT_EQ(render("{% for x in [1, 2, 3] %}{% if x == 2 %}{% break %}{% endif %}{{ x }}{% endfor %}"), "1");
  EXPECT_EQ(render("{% for x in [] %}{% else %}none{% endfor %}"), "none");
  EXPECT_EQ(render("{% for k, v in {'a': 1}.items() %}{{ k }}={{ v }}{% endfor %}"), "a=1");
  // A set inside a loop does not outlive the iteration; a namespace does.
  EXPECT_EQ(render("{% set n = 0 %}{% for i in [1, 2] %}{% set n = n + i %}{% endfor %}{{ n }}"), "0");
  EXPECT_EQ(render("{% set ns = namespace(n=0) %}{% for i in [1, 2] %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}"),
            "3");
}

TEST(Jinja, JinjaFramesNotPythonScopes) {
  // jinja2 decides at compile time that `i`, assigned at the top level after
  // the loop, is the template's own variable: the loop sees it undefined,
  // not the context's i (frame analysis, jinja2's idtracking.py).
  EXPECT_EQ(render("{% for x in [1] %}[{{ i }}]{% endfor %}{% set i = 5 %}{{ i }}", {{"i", 3}}), "[]5");
  EXPECT_EQ(render("{{ i }}{% for x in [1] %}[{{ i }}]{% endfor %}{% set i = 5 %}", {{"i", 3}}), "3[3]");
  EXPECT_EQ(render("{% for x in [1] %}[{{ i }}]{% endfor %}{% if false %}{% set i = 5 %}{% endif %}", {{"i", 3}}),
            "[3]");
}

TEST(Jinja, LazyFiltersAreSingleUseAndAlwaysTrue) {
  // select/map/... return generators in jinja2: true even when empty, and
  // what one loop consumes the next does not see.
  EXPECT_EQ(render("{% if [1, 3]|select('even') %}true{% endif %}"), "true");
  EXPECT_EQ(render("{% set g = [1, 2]|map('string') %}{{ g|join }}|{{ g|join }}|{{ g|list }}"), "12||[]");
  EXPECT_THROW(render("{{ [1, 2]|select|length }}"), TemplateError);
  EXPECT_EQ(render("{{ [1, 2]|select|list|length }}"), "2");
}

TEST(Jinja, ToJsonIsPythonsJsonDumps) {
  const ordered_json ctx = {{"v", {{"b", 1.0}, {"a", {1, nullptr, true, "caf\xc3\xa9 <&>"}}}}};
  EXPECT_EQ(render("{{ v|tojson }}", ctx), "{\"b\": 1.0, \"a\": [1, null, true, \"caf\xc3\xa9 <&>\"]}");
  EXPECT_EQ(render("{{ v|tojson(indent=2) }}", ctx),
            "{\n  \"b\": 1.0,\n  \"a\": [\n    1,\n    null,\n    true,\n    \"caf\xc3\xa9 <&>\"\n  ]\n}");
  EXPECT_EQ(render("{{ v.a|tojson(ensure_ascii=true) }}", ctx), "[1, null, true, \"caf\\u00e9 <&>\"]");
  EXPECT_EQ(render("{{ 1e16|tojson }} {{ 0.1|tojson }} {{ 100.0|tojson }}"), "1e+16 0.1 100.0");
}

TEST(Jinja, SyntaxErrorsNameTheirLine) {
  try {
    Template::parse("line 1\n{% if true %}\n{{ 1 + }}\n{% endif %}");
    FAIL() << "no error";
  } catch (const TemplateError& e) {
    EXPECT_EQ(e.line(), 3);
    EXPECT_THAT(e.what(), HasSubstr("[chat_template] line 3: unexpected 'end of print statement'"));
  }
  try {
    Template::parse("{% for m in messages %}\n{{ m }}\n");
    FAIL() << "no error";
  } catch (const TemplateError& e) {
    EXPECT_THAT(e.message(), HasSubstr("looking for the following tags: 'endfor' or 'else'"));
  }
  EXPECT_THROW(Template::parse("{{ x|no_such_filter }}"), TemplateError);
  EXPECT_THROW(Template::parse("{% include 'other' %}"), TemplateError);
  EXPECT_THROW(Template::parse("{% break %}"), TemplateError);  // outside a loop
}

TEST(Jinja, RuntimeErrorsNameTheirLine) {
  try {
    render("a\nb\n{{ raise_exception('Conversation roles must alternate') }}");
    FAIL() << "no error";
  } catch (const TemplateError& e) {
    EXPECT_EQ(e.line(), 3);
    EXPECT_EQ(e.message(), "Conversation roles must alternate");
  }
  try {
    render("\n{{ messages[0].content.missing.deeper }}", {{"messages", {{{"content", "x"}}}}});
    FAIL() << "no error";
  } catch (const TemplateError& e) {
    EXPECT_EQ(e.line(), 2);
    EXPECT_EQ(e.message(), "'str object' has no attribute 'missing'");
  }
  EXPECT_THROW(render("{{ 1 / 0 }}"), TemplateError);
  EXPECT_THROW(render("{{ [] < 1 }}"), TemplateError);
  EXPECT_THROW(Template::parse("{{ x }}").render(ordered_json::array()), TemplateError);  // context not an object
}

TEST(Jinja, SandboxHidesPythonInternals) {
  EXPECT_EQ(render("[{{ ''.__class__ }}][{{ messages.__len__ }}]", {{"messages", ordered_json::array()}}), "[][]");
  try {
    render("{{ ''.__class__.__mro__ }}");
    FAIL() << "no error";
  } catch (const TemplateError& e) {
    EXPECT_EQ(e.message(), "access to attribute '__class__' of 'str' object is unsafe.");
  }
  EXPECT_THROW(render("{{ [].append(1) }}"), TemplateError);   // lists are immutable
  EXPECT_THROW(render("{{ {}.update({}) }}"), TemplateError);  // so are dicts
  EXPECT_THROW(render("{{ range(1000000)|length }}"), TemplateError);
  // d.items is the method even when d has a key "items" (jinja2 tries the
  // attribute first for `.`, the key first for `[]`).
  EXPECT_EQ(render("{{ d.items is callable }}|{{ d['items'] }}|{{ d.get('items') }}", {{"d", {{"items", 1}}}}),
            "True|1|1");
}

TEST(Jinja, LimitsStopRunawayTemplates) {
  RenderOptions small = fixed_clock();
  small.limits.max_steps = 100000;
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(Template::parse("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}")
                   .render(ordered_json::object(), small),
               TemplateLimitError);
  EXPECT_THROW(Template::parse("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}").render(ordered_json::object()),
               TemplateLimitError);
  EXPECT_THROW(render("{{ 'x' * 100000000 }}"), TemplateLimitError);
  EXPECT_THROW(render("{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}"
                      "{% endfor %}"),
               TemplateLimitError);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 20.0);
  // Brackets nested beyond what the parser allows are an error, not a stack overflow.
  EXPECT_THROW(Template::parse("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}"), TemplateError);
  EXPECT_THROW(Template::parse(std::string(3000, '{') + "% if x %}"), TemplateError);
  // Lists nested beyond kMaxValueDepth are refused when built, so no walk
  // over a value (printing, comparing, freeing) can run out of stack.
  EXPECT_THROW(render("{% set ns = namespace(l=[]) %}{% for i in range(300) %}{% set ns.l = [ns.l] %}{% endfor %}"),
               TemplateError);
  EXPECT_EQ(render("{% set ns = namespace(l=[]) %}{% for i in range(100) %}{% set ns.l = [ns.l] %}{% endfor %}"
                   "{{ ns.l|length }}"),
            "1");
  // A namespace holding itself is released with the render (ASan's leak check).
  EXPECT_EQ(render("{% set ns = namespace() %}{% set ns.me = ns %}{% macro m() %}{{ ns }}{% endmacro %}ok"), "ok");
}

TEST(Jinja, OneTemplateRendersFromSeveralThreads) {
  const Template t = Template::parse(
      "{% for m in messages %}<{{ m.role }}>{{ m.content|trim }}{% endfor %}{% if add_generation_prompt %}<a>{% endif %}");
  const ordered_json ctx = {{"messages", {{{"role", "user"}, {"content", " hi "}}}}, {"add_generation_prompt", true}};
  std::vector<std::string> out(4);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < out.size(); ++i)
    threads.emplace_back([&, i] {
      for (int k = 0; k < 200; ++k) out[i] = t.render(ctx);
    });
  for (auto& th : threads) th.join();
  for (const auto& s : out) EXPECT_EQ(s, "<user>hi<a>");
}

TEST(Jinja, StrftimeNowUsesTheGivenClock) {
  EXPECT_EQ(render("{{ strftime_now('%d %b %Y') }}"), "26 Jul 2024");
  const std::string today = Template::parse("{{ strftime_now('%Y') }}").render(ordered_json::object());
  EXPECT_EQ(today.size(), 4u);
}

// Any text is a template that renders or raises one TemplateError: random
// sequences of template syntax, never a crash, a hang or another exception.
RC_GTEST_PROP(JinjaProperty, AnyTextRendersOrRaisesATemplateError, ()) {
  static const std::vector<std::string> pieces = {
      "{{", "}}", "{%", "%}", "{#", "#}", "{%-", "-%}", "{{-", "-}}", " ", "\n", "x", "if", "else", "elif", "endif",
      "for", "in", "endfor", "set", "=", "macro", "endmacro", "call", "endcall", "filter", "endfilter", "(", ")",
      "[", "]", "{", "}", ",", ":", ".", "|", "~", "+", "-", "*", "/", "//", "%", "**", "==", "<", "not", "and",
      "or", "is", "defined", "none", "'s'", "\"t\"", "1", "2.5", "messages", "m", "loop", "ns", "namespace",
      "range", "tojson", "trim", "length", "map", "select", "items", "raise_exception", "'\\u00e9'", "break",
      "continue", "raw", "endraw", "with", "endwith", "recursive", "__class__", "caller", "varargs", "\xc3\xa9", "\xff"};
  const auto picks = *rc::gen::container<std::vector<size_t>>(rc::gen::inRange<size_t>(0, pieces.size()));
  std::string source;
  for (size_t p : picks) source += pieces[p];
  RenderOptions o;
  o.limits.max_steps = 20000;
  o.limits.max_output = 1 << 16;
  const ordered_json ctx = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"m", {{"a", 1}}}};
  try {
    (void)Template::parse(source).render(ctx, o);
  } catch (const TemplateError&) {
  }
}
