// Tool calls out of generated text, whole and streamed in pieces.
#include <gtest/gtest.h>

#include "server/tool_calls.h"

using namespace kvgraph::server;

namespace {

// Feeds `text` cut at the given byte positions; returns content and calls.
ParsedReply feed_in_pieces(const std::string& text, const std::vector<size_t>& cuts) {
  ToolCallParser p;
  ParsedReply r;
  auto take = [&](std::vector<ToolEvent> events) {
    for (auto& e : events) {
      if (e.is_call)
        r.calls.push_back(e.call);
      else
        r.content += e.content;
    }
  };
  size_t at = 0;
  for (size_t c : cuts) {
    take(p.feed(text.substr(at, c - at)));
    at = c;
  }
  take(p.feed(text.substr(at)));
  take(p.finish());
  return r;
}

void expect_same(const ParsedReply& a, const ParsedReply& b, const std::string& what) {
  EXPECT_EQ(a.content, b.content) << what;
  ASSERT_EQ(a.calls.size(), b.calls.size()) << what;
  for (size_t i = 0; i < a.calls.size(); ++i) {
    EXPECT_EQ(a.calls[i].name, b.calls[i].name) << what;
    EXPECT_EQ(a.calls[i].arguments, b.calls[i].arguments) << what;
  }
}

}  // namespace

TEST(ToolCalls, HermesCallsAreTakenOutOfTheText) {
  ParsedReply r = parse_tool_calls(
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
      "<tool_call>{\"name\": \"get_time\", \"arguments\": {}}</tool_call>");
  EXPECT_EQ(r.content, "Let me check.\n");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(r.calls[0].arguments, R"({"city":"Paris"})");
  EXPECT_EQ(r.calls[1].name, "get_time");
  EXPECT_EQ(r.calls[1].arguments, "{}");
}

TEST(ToolCalls, ACallOnlyReplyHasNoContent) {
  ParsedReply r = parse_tool_calls("\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": [1, 2]}}\n</tool_call>\n");
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, R"({"x":[1,2]})");
}

TEST(ToolCalls, Llama31JsonReplyIsACall) {
  ParsedReply r = parse_tool_calls(" {\"name\": \"search\", \"parameters\": {\"q\": \"kv cache\"}}");
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "search");
  EXPECT_EQ(r.calls[0].arguments, R"({"q":"kv cache"})");
  ParsedReply tagged = parse_tool_calls("<|python_tag|>{\"type\": \"function\", \"name\": \"f\", \"parameters\": {}}");
  ASSERT_EQ(tagged.calls.size(), 1u);
  EXPECT_EQ(tagged.calls[0].name, "f");
  // Arguments given as JSON text, and the {"function": {...}} wrapper.
  ParsedReply wrapped = parse_tool_calls(R"({"function": {"name": "g", "arguments": "{\"a\": 1}"}})");
  ASSERT_EQ(wrapped.calls.size(), 1u);
  EXPECT_EQ(wrapped.calls[0].arguments, R"({"a":1})");
}

TEST(ToolCalls, TextThatIsNotACallStaysContent) {
  for (const std::string text : {std::string("{\"name\": \"Bob\", \"age\": 3}"),  // no arguments: not a call
                                 std::string("{not json at all"),
                                 std::string("Use <tool_call> tags like <tool_call>this</tool_call> ok"),
                                 std::string("a < b and <tool_ is not a tag"),
                                 std::string("ends with a partial tag <tool_c"),
                                 std::string("   "),
                                 std::string("")}) {
    ParsedReply r = parse_tool_calls(text);
    EXPECT_TRUE(r.calls.empty()) << text;
    EXPECT_EQ(r.content, text);
  }
}

TEST(ToolCalls, AnUnclosedCallWhoseJsonIsWholeIsACall) {
  ParsedReply r = parse_tool_calls("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.content, "");
  ParsedReply cut = parse_tool_calls("<tool_call>\n{\"name\": \"f\", \"argu");
  EXPECT_TRUE(cut.calls.empty());
  EXPECT_EQ(cut.content, "<tool_call>\n{\"name\": \"f\", \"argu");
}

TEST(ToolCalls, AnySplitIntoPiecesGivesTheWholeResult) {
  const std::string texts[] = {
      "Sure.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {\"k\": \"<tool_call>\"}}\n</tool_call>\nDone.",
      "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call><tool_call>{\"name\": \"b\", \"arguments\": {}}</tool_call>",
      "{\"name\": \"s\", \"parameters\": {\"q\": 1}}",
      "plain text with < and <tool and </tool_call> in it",
      "<|python_tag|>{\"name\": \"p\", \"parameters\": {}}"};
  for (const std::string& t : texts) {
    const ParsedReply whole = parse_tool_calls(t);
    for (size_t c1 = 0; c1 <= t.size(); ++c1)  // every single cut
      expect_same(feed_in_pieces(t, {c1}), whole, t + " cut at " + std::to_string(c1));
    std::vector<size_t> every;  // one byte at a time
    for (size_t i = 1; i < t.size(); ++i) every.push_back(i);
    expect_same(feed_in_pieces(t, every), whole, t + " byte by byte");
  }
}

TEST(ToolCalls, ContentIsReleasedAsSoonAsItCannotBeATag) {
  ToolCallParser p;
  auto out = p.feed("Hello wor");
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].content, "Hello wor");
  out = p.feed("ld <tool");  // "<tool" may begin a tag: held
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].content, "ld ");
  out = p.feed("box>");
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].content, "<toolbox>");
  out = p.feed("<tool_call>{\"name\": \"f\", \"arguments\": {}}");
  EXPECT_TRUE(out.empty());  // inside a call: nothing until it closes
  out = p.feed("</tool_call>");
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(out[0].is_call);
  EXPECT_EQ(p.calls(), 1);
}
