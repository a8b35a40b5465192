// ReplyWriter: generated text -> OpenAI objects, streamed and whole, with
// tool calls parsed out (text a model would write, fed token by token).
#include <gtest/gtest.h>

#include "server/completion.h"
#include "support/test_server.h"

using namespace kvgraph::server;
using kvgraph::testing::sse_data;

namespace {

const char* kCallText =
    "Checking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";

CompletionRequest chat_request(bool stream, bool tools) {
  ojson body = {{"messages", {{{"role", "user"}, {"content", "Weather?"}}}}, {"stream", stream}};
  if (tools) body["tools"] = ojson::parse(R"([{"type": "function", "function": {"name": "get_weather"}}])");
  return parse_chat_request(body);
}

// Feeds `text` as tokens of 3 bytes.
void feed(ReplyWriter& w, const std::string& text) {
  for (size_t i = 0; i < text.size(); i += 3) w.token(text.substr(i, 3), ojson());
}

const ojson kUsage = {{"prompt_tokens", 5}, {"completion_tokens", 9}, {"total_tokens", 14}};
const ojson kTimings = {{"prompt_n", 5}};

}  // namespace

TEST(ReplyWriter, AWholeReplyWithACallHasToolCallsAndNoContent) {
  const CompletionRequest req = chat_request(false, true);
  ReplyWriter w(req, "chatcmpl-1", 7, "m", {});
  w.begin();
  feed(w, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>");
  const ojson r = ojson::parse(w.end("stop", kUsage, kTimings));
  EXPECT_EQ(r["object"], "chat.completion");
  EXPECT_EQ(r["id"], "chatcmpl-1");
  EXPECT_EQ(r["created"], 7);
  EXPECT_EQ(r["model"], "m");
  const ojson& c = r["choices"][0];
  EXPECT_EQ(c["finish_reason"], "tool_calls");
  EXPECT_TRUE(c["message"]["content"].is_null());
  ASSERT_EQ(c["message"]["tool_calls"].size(), 1u);
  const ojson& call = c["message"]["tool_calls"][0];
  EXPECT_EQ(call["id"].get<std::string>().rfind("call_", 0), 0u);
  EXPECT_EQ(call["type"], "function");
  EXPECT_EQ(call["function"]["name"], "get_weather");
  EXPECT_EQ(ojson::parse(call["function"]["arguments"].get<std::string>()), ojson({{"city", "Paris"}}));
  EXPECT_EQ(r["usage"], kUsage);
  EXPECT_EQ(r["timings"], kTimings);
}

TEST(ReplyWriter, AStreamedCallIsOneDeltaAfterTheContent) {
  const CompletionRequest req = chat_request(true, true);
  std::string sent;
  ReplyWriter w(req, "chatcmpl-2", 7, "m", [&](std::string_view b) {
    sent.append(b);
    return true;
  });
  w.begin();
  feed(w, kCallText);
  EXPECT_EQ(w.end("stop", kUsage, kTimings), "");
  const auto data = sse_data(sent);
  ASSERT_GE(data.size(), 4u);
  EXPECT_EQ(data.back(), "[DONE]");
  std::string content;
  std::vector<ojson> calls;
  std::string finish;
  for (size_t i = 0; i + 1 < data.size(); ++i) {
    const ojson c = ojson::parse(data[i]);
    EXPECT_EQ(c["object"], "chat.completion.chunk");
    const ojson& d = c["choices"][0]["delta"];
    if (d.contains("content")) {
      EXPECT_TRUE(calls.empty()) << "content after the call";
      content += d["content"].get<std::string>();
    }
    if (d.contains("tool_calls")) calls.push_back(d["tool_calls"][0]);
    if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(content, "Checking.\n");
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0]["index"], 0);
  EXPECT_EQ(calls[0]["type"], "function");
  EXPECT_EQ(calls[0]["function"]["name"], "get_weather");
  EXPECT_EQ(finish, "tool_calls");
  // Every token wrote something: content, or a comment while the call was held.
  size_t comments = 0;
  for (size_t p = 0; (p = sent.find(": \n\n", p)) != std::string::npos; ++p)
    if (p == 0 || sent[p - 1] == '\n') ++comments;
  EXPECT_GT(comments, 10u);
}

TEST(ReplyWriter, WithoutToolsTheCallTextIsContent) {
  const CompletionRequest req = chat_request(false, false);
  ReplyWriter w(req, "x", 0, "m", {});
  feed(w, kCallText);
  const ojson r = ojson::parse(w.end("length", kUsage, kTimings));
  EXPECT_EQ(r["choices"][0]["message"]["content"], kCallText);
  EXPECT_FALSE(r["choices"][0]["message"].contains("tool_calls"));
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
}

TEST(ReplyWriter, StopsWritingOnceTheClientIsGone) {
  const CompletionRequest req = chat_request(true, false);
  int writes = 0;
  ReplyWriter w(req, "x", 0, "m", [&](std::string_view) { return ++writes < 3; });
  w.begin();
  w.token("a", ojson());
  EXPECT_FALSE(w.client_gone());
  w.token("b", ojson());
  EXPECT_TRUE(w.client_gone());
  w.token("c", ojson());
  w.end("stop", kUsage, kTimings);
  EXPECT_EQ(writes, 3);  // nothing after the failed write
}

TEST(ReplyWriter, LogprobsRideOnTheChunkThatShowsTheirText) {
  CompletionRequest req = parse_completion_request({{"prompt", "x"}, {"stream", true}, {"logprobs", 1}});
  std::string sent;
  ReplyWriter w(req, "cmpl-1", 0, "m", [&](std::string_view b) {
    sent.append(b);
    return true;
  });
  auto entry = [](const std::string& t) {
    return ojson{{"token", t}, {"logprob", -0.5}, {"bytes", ojson::array()}, {"top_logprobs", ojson::array()}};
  };
  w.token("", entry("\xe4"));          // half a character: held, its entry waits
  w.token("\xe4\xb8\x80", entry("\xb8\x80"));  // the character is shown with both entries
  w.end("stop", kUsage, kTimings);
  const auto data = sse_data(sent);
  ASSERT_GE(data.size(), 2u);
  const ojson first = ojson::parse(data[0], nullptr, false, true);
  EXPECT_EQ(first["choices"][0]["text"], "\xe4\xb8\x80");
  EXPECT_EQ(first["choices"][0]["logprobs"]["token_logprobs"].size(), 2u);
  EXPECT_EQ(first["choices"][0]["logprobs"]["text_offset"], ojson({0, 1}));
}
