// kvgraph serve, end to end over loopback HTTP: a server started in-process
// with the default model, driven by cpp-httplib's client. Answers are checked
// against Session::generate run directly on the same prompt ids.
#include <atomic>
#include <cmath>
#include <future>
#include <thread>

#include <gtest/gtest.h>

#include "chat/chat_template.h"
#include "support/test_server.h"

using namespace kvgraph;
using namespace kvgraph::testing;
using server::ServerOptions;

namespace {

const std::string kLongPrompt =
    "The old man walked along the shore every morning, counting the waves and the gulls, and talking to anyone "
    "who would listen about the ships he had sailed and the storms he had seen. Nobody believed half of it, but "
    "everybody listened, because the way he told a story made the sea seem close enough to touch.";

std::vector<int32_t> encode(const std::string& text) { return load_default().tokenizer.encode(text, true); }

// The chat prompt ids the server builds, through its own endpoints.
std::vector<int32_t> chat_ids(const TestServer& ts, const ojson& messages) {
  Reply t = ts.post("/apply-template", {{"messages", messages}});
  EXPECT_EQ(t.status, 200) << t.body;
  return server::chat_prompt_ids(load_default(), t.json["prompt"].get<std::string>());
}

void expect_error(const Reply& r, int status, const std::string& code) {
  EXPECT_EQ(r.status, status) << r.body;
  ASSERT_TRUE(r.json.is_object()) << r.body;
  ASSERT_TRUE(r.json.contains("error")) << r.body;
  EXPECT_TRUE(r.json["error"]["message"].is_string());
  EXPECT_FALSE(r.json["error"]["message"].get<std::string>().empty());
  EXPECT_TRUE(r.json["error"]["type"].is_string());
  EXPECT_EQ(r.json["error"]["code"], code) << r.body;
}

// A long streamed completion on its own thread: the constructor returns once
// its first chunk has arrived (it holds a slot), release() lets the client
// hang up, finish() waits for the reply.
class LongStream {
 public:
  explicit LongStream(const TestServer& ts)
      : reply_(std::async(std::launch::async, [this, &ts] {
          return ts.stream("/v1/completions",
                           {{"prompt", "Once"}, {"max_tokens", 1000}, {"ignore_eos", true}, {"stream", true}},
                           [this](const std::string&) {
                             if (!signalled_) {
                               signalled_ = true;
                               started_.set_value();
                             }
                             return !release_.load();
                           });
        })) {
    started_.get_future().wait();
  }
  ~LongStream() {
    if (reply_.valid()) finish();
  }
  void release() { release_ = true; }
  Reply finish() {
    release();
    return reply_.get();
  }
  Reply wait() { return reply_.get(); }  // without hanging up: the server ends it

 private:
  std::promise<void> started_;
  std::atomic<bool> release_{false};
  bool signalled_ = false;
  std::future<Reply> reply_;
};

}  // namespace

TEST(Server, HealthIs503WhileLoadingThenOk) {
  std::promise<void> release;
  std::shared_future<void> go = release.get_future().share();
  TestServer ts({}, [go] {
    go.wait();
    return load_default();
  }, /*wait=*/false);
  Reply loading = ts.get("/health");
  expect_error(loading, 503, "loading_model");
  expect_error(ts.post("/v1/completions", {{"prompt", "Hi"}}), 503, "loading_model");
  EXPECT_EQ(ts.metric("kvgraph_model_loaded"), 0);
  release.set_value();
  ts.server().wait_loaded();
  Reply ok = ts.get("/health");
  EXPECT_EQ(ok.status, 200);
  EXPECT_EQ(ok.json, ojson({{"status", "ok"}}));
  EXPECT_EQ(ts.metric("kvgraph_model_loaded"), 1);
}

TEST(Server, AFailedLoadIsReportedNotACrash) {
  TestServer ts({}, []() -> server::ServedModel { throw kvgraph::Error("[model] no config.json in /nowhere"); }, false);
  EXPECT_THROW(ts.server().wait_loaded(), kvgraph::Error);
  Reply h = ts.get("/health");
  expect_error(h, 503, "model_failed");
  EXPECT_NE(h.body.find("no config.json"), std::string::npos);
}

TEST(Server, ModelsListsTheServedModel) {
  TestServer ts({.parallel = 2});
  Reply r = ts.get("/v1/models");
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.json["object"], "list");
  ASSERT_EQ(r.json["data"].size(), 1u);
  EXPECT_EQ(r.json["data"][0]["id"], "default");
  EXPECT_EQ(r.json["data"][0]["object"], "model");
  EXPECT_EQ(r.json["data"][0]["meta"]["ctx"], 1024);  // the model's max_position_embeddings
  EXPECT_EQ(r.json["data"][0]["meta"]["parallel"], 2);
}

TEST(Server, CompletionEqualsSessionGenerate) {
  TestServer ts;
  Reply r = ts.post("/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 24}, {"temperature", 0}});
  ASSERT_EQ(r.status, 200) << r.body;
  const Direct d = direct_generate(encode("Once upon a time"), greedy(), {.max_tokens = 24});
  EXPECT_EQ(r.json["object"], "text_completion");
  EXPECT_EQ(r.json["model"], "default");
  ASSERT_EQ(r.json["choices"].size(), 1u);
  EXPECT_EQ(r.json["choices"][0]["text"], d.text);
  EXPECT_EQ(r.json["choices"][0]["finish_reason"], d.finish == FinishReason::max_tokens ? "length" : "stop");
  EXPECT_EQ(r.json["usage"]["prompt_tokens"], encode("Once upon a time").size());
  EXPECT_EQ(r.json["usage"]["completion_tokens"], d.tokens.size());
  EXPECT_EQ(r.json["usage"]["total_tokens"], encode("Once upon a time").size() + d.tokens.size());
  EXPECT_EQ(r.json["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  const ojson& t = r.json["timings"];
  for (const char* k : {"prompt_n", "prompt_ms", "prompt_per_second", "predicted_n", "predicted_ms", "predicted_per_second"})
    EXPECT_TRUE(t.contains(k)) << k;
  EXPECT_EQ(t["predicted_n"], d.tokens.size());
  EXPECT_GT(t["predicted_per_second"].get<double>(), 0);
}

TEST(Server, SeededSamplingEqualsSessionGenerateWithTheSameSeed) {
  TestServer ts;
  const ojson body = {{"prompt", "The secret of life"}, {"max_tokens", 20}, {"temperature", 0.9},
                      {"top_p", 0.9},                   {"top_k", 30},      {"seed", 1234}};
  Reply a = ts.post("/v1/completions", body);
  Reply b = ts.post("/v1/completions", body);
  ASSERT_EQ(a.status, 200) << a.body;
  const Direct d = direct_generate(encode("The secret of life"), {0.9f, 30, 0.9f, 1.0f, 1234}, {.max_tokens = 20});
  EXPECT_EQ(a.json["choices"][0]["text"], d.text);
  EXPECT_EQ(b.json["choices"][0]["text"], d.text);  // same seed, same text (the slot's cache reused or not)
}

TEST(Server, CompletionTakesTokenIds) {
  TestServer ts;
  const std::vector<int32_t> ids = encode("A penny saved");
  Reply r = ts.post("/v1/completions", {{"prompt", ids}, {"max_tokens", 8}, {"temperature", 0}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.json["choices"][0]["text"], direct_generate(ids, greedy(), {.max_tokens = 8}).text);
}

TEST(Server, ChatCompletionRendersTheTemplateAndEqualsSessionGenerate) {
  TestServer ts;
  const ojson messages = {{{"role", "system"}, {"content", "Be brief."}}, {{"role", "user"}, {"content", "A wise man"}}};
  Reply r = ts.post("/v1/chat/completions", {{"messages", messages}, {"max_tokens", 16}, {"temperature", 0}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.json["object"], "chat.completion");
  EXPECT_EQ(r.json["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
  const ojson& msg = r.json["choices"][0]["message"];
  EXPECT_EQ(msg["role"], "assistant");
  const std::vector<int32_t> ids = chat_ids(ts, messages);
  EXPECT_EQ(msg["content"], direct_generate(ids, greedy(), {.max_tokens = 16}).text);
  EXPECT_EQ(r.json["usage"]["prompt_tokens"], ids.size());
  EXPECT_TRUE(r.json["choices"][0]["logprobs"].is_null());
}

TEST(Server, ChatContentPartsAreJoined) {
  TestServer ts;
  const ojson parts = {{{"role", "user"},
                        {"content", {{{"type", "text"}, {"text", "One"}}, {{"type", "text"}, {"text", "two"}}}}}};
  const ojson plain = {{{"role", "user"}, {"content", "One\ntwo"}}};
  Reply a = ts.post("/apply-template", {{"messages", parts}});
  Reply b = ts.post("/apply-template", {{"messages", plain}});
  ASSERT_EQ(a.status, 200) << a.body;
  EXPECT_EQ(a.json["prompt"], b.json["prompt"]);
  expect_error(ts.post("/v1/chat/completions",
                       {{"messages", {{{"role", "user"}, {"content", {{{"type", "image_url"}, {"image_url", "x"}}}}}}}}),
               400, "unsupported_content");
}

TEST(Server, StreamedChatEqualsTheWholeAnswer) {
  TestServer ts;
  const ojson messages = {{{"role", "user"}, {"content", "Life is"}}};
  ojson body = {{"messages", messages}, {"max_tokens", 24}, {"temperature", 0}};
  Reply whole = ts.post("/v1/chat/completions", body);
  ASSERT_EQ(whole.status, 200);
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  Reply s = ts.stream("/v1/chat/completions", body);
  ASSERT_EQ(s.status, 200);
  EXPECT_NE(s.headers.find("Content-Type")->second.find("text/event-stream"), std::string::npos);
  const auto data = sse_data(s.body);
  ASSERT_GE(data.size(), 4u);
  EXPECT_EQ(data.back(), "[DONE]");
  const ojson first = ojson::parse(data[0]);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  std::string text;
  std::string finish;
  ojson usage;
  for (size_t i = 0; i + 1 < data.size(); ++i) {
    const ojson c = ojson::parse(data[i]);
    EXPECT_EQ(c["id"], first["id"]);  // one id for the whole stream
    if (c["choices"].empty()) {
      usage = c["usage"];  // the include_usage chunk: no choices
      EXPECT_EQ(i, data.size() - 2);
      continue;
    }
    const ojson& ch = c["choices"][0];
    if (ch["delta"].contains("content")) text += ch["delta"]["content"].get<std::string>();
    if (!ch["finish_reason"].is_null()) {
      finish = ch["finish_reason"];
      EXPECT_TRUE(c.contains("timings"));
    }
  }
  EXPECT_EQ(text, whole.json["choices"][0]["message"]["content"]);
  EXPECT_EQ(finish, whole.json["choices"][0]["finish_reason"]);
  EXPECT_EQ(usage["completion_tokens"], whole.json["usage"]["completion_tokens"]);
  EXPECT_EQ(usage["prompt_tokens"], whole.json["usage"]["prompt_tokens"]);
}

TEST(Server, StreamedCompletionWithoutUsageHasNoUsageChunk) {
  TestServer ts;
  ojson body = {{"prompt", "It was a dark"}, {"max_tokens", 12}, {"temperature", 0}, {"stream", true}};
  Reply s = ts.stream("/v1/completions", body);
  ASSERT_EQ(s.status, 200);
  const auto data = sse_data(s.body);
  ASSERT_GE(data.size(), 2u);
  EXPECT_EQ(data.back(), "[DONE]");
  std::string text;
  for (size_t i = 0; i + 1 < data.size(); ++i) {
    const ojson c = ojson::parse(data[i]);
    EXPECT_EQ(c["object"], "text_completion");
    ASSERT_EQ(c["choices"].size(), 1u) << "no usage chunk without include_usage";
    text += c["choices"][0]["text"].get<std::string>();
  }
  EXPECT_EQ(text, direct_generate(encode("It was a dark"), greedy(), {.max_tokens = 12}).text);
}

TEST(Server, StopStringsCutTheTextAndFinishWithStop) {
  TestServer ts;
  const Direct d = direct_generate(encode("Once upon a time"), greedy(), {.max_tokens = 32});
  ASSERT_GE(d.text.size(), 12u);
  const std::string stop = d.text.substr(8, 3);  // a piece of what greedy decoding writes
  const size_t cut = d.text.find(stop);
  for (bool stream : {false, true}) {
    ojson body = {{"prompt", "Once upon a time"}, {"max_tokens", 32}, {"temperature", 0}, {"stop", {stop, "zzzz"}},
                  {"stream", stream}};
    std::string text, finish;
    if (!stream) {
      Reply r = ts.post("/v1/completions", body);
      ASSERT_EQ(r.status, 200) << r.body;
      text = r.json["choices"][0]["text"];
      finish = r.json["choices"][0]["finish_reason"];
    } else {
      for (const auto& d : sse_data(ts.stream("/v1/completions", body).body)) {
        if (d == "[DONE]") continue;
        const ojson c = ojson::parse(d);
        text += c["choices"][0]["text"].get<std::string>();
        if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
      }
    }
    EXPECT_EQ(text, d.text.substr(0, cut)) << "stream " << stream;
    EXPECT_EQ(finish, "stop");
  }
}

TEST(Server, LogprobsAreTheModelsLogSoftmax) {
  TestServer ts;
  const ojson messages = {{{"role", "user"}, {"content", "Time flies"}}};
  Reply r = ts.post("/v1/chat/completions", {{"messages", messages},
                                             {"max_tokens", 4},
                                             {"temperature", 0},
                                             {"logprobs", true},
                                             {"top_logprobs", 3}});
  ASSERT_EQ(r.status, 200) << r.body;
  const ojson& content = r.json["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), r.json["usage"]["completion_tokens"].get<size_t>());
  // Independent reference: the first token's distribution from a fresh prefill.
  auto m = load_default();
  Session s(m.model, {.capacity = 1024});
  s.prefill(chat_ids(ts, messages));
  const std::vector<float> logits = s.last_logits();
  double mx = -INFINITY, sum = 0;
  for (float x : logits) mx = std::max<double>(mx, x);
  for (float x : logits) sum += std::exp(x - mx);
  const int32_t first = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  const ojson& e = content[0];
  EXPECT_NEAR(e["logprob"].get<double>(), logits[first] - mx - std::log(sum), 1e-4);
  EXPECT_EQ(e["token"], m.tokenizer.decode(std::vector<int32_t>{first}, false));
  ASSERT_EQ(e["top_logprobs"].size(), 3u);
  EXPECT_EQ(e["top_logprobs"][0]["logprob"], e["logprob"]);  // greedy: the chosen token is the most likely
  for (const auto& entry : content) {
    EXPECT_LE(entry["logprob"].get<double>(), 0.0);
    const ojson& top = entry["top_logprobs"];
    for (size_t i = 1; i < top.size(); ++i) EXPECT_GE(top[i - 1]["logprob"], top[i]["logprob"]);
    std::string bytes;
    for (int b : entry["bytes"]) bytes += static_cast<char>(b);
    EXPECT_EQ(bytes, entry["token"].get<std::string>());
  }
  // Legacy completions shape: parallel arrays.
  Reply c = ts.post("/v1/completions", {{"prompt", "Time flies"}, {"max_tokens", 3}, {"temperature", 0}, {"logprobs", 2}});
  ASSERT_EQ(c.status, 200) << c.body;
  const ojson& lp = c.json["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"].size(), 3u);
  EXPECT_EQ(lp["token_logprobs"].size(), 3u);
  EXPECT_EQ(lp["top_logprobs"].size(), 3u);
  EXPECT_EQ(lp["text_offset"][0], 0);
}

TEST(Server, BadRequestsAreOpenAIErrors) {
  TestServer ts;
  const ojson msg = {{{"role", "user"}, {"content", "Hi"}}};
  expect_error(ts.post_raw("/v1/chat/completions", "{not json"), 400, "invalid_json");
  expect_error(ts.post_raw("/v1/chat/completions", "[1, 2]"), 400, "invalid_json");
  expect_error(ts.post_raw("/v1/chat/completions", std::string(200, '[') + std::string(200, ']')), 400,
               "invalid_json");
  expect_error(ts.post("/v1/chat/completions", ojson::object()), 400, "missing_field");
  expect_error(ts.post("/v1/chat/completions", {{"messages", ojson::array()}}), 400, "invalid_type");
  expect_error(ts.post("/v1/chat/completions", {{"messages", {{{"role", "wizard"}, {"content", "x"}}}}}), 400,
               "invalid_value");
  expect_error(ts.post("/v1/chat/completions", {{"messages", msg}, {"max_tokens", "ten"}}), 400, "invalid_type");
  expect_error(ts.post("/v1/chat/completions", {{"messages", msg}, {"max_tokens", 0}}), 400, "invalid_value");
  expect_error(ts.post("/v1/chat/completions", {{"messages", msg}, {"n", 2}}), 400, "unsupported_parameter");
  expect_error(ts.post("/v1/chat/completions", {{"messages", msg}, {"temperature", -1}}), 400, "invalid_value");
  expect_error(ts.post("/v1/chat/completions", {{"messages", msg}, {"top_p", 0}}), 400, "invalid_value");
  expect_error(ts.post("/v1/chat/completions", {{"messages", msg}, {"stream", "yes"}}), 400, "invalid_type");
  expect_error(ts.post("/v1/chat/completions", {{"messages", msg}, {"stop", 5}}), 400, "invalid_type");
  expect_error(ts.post("/v1/chat/completions", {{"messages", msg}, {"seed", 1.5}}), 400, "invalid_type");
  expect_error(ts.post("/v1/chat/completions", {{"messages", msg}, {"logit_bias", {{"1", 5}}}}), 400,
               "unsupported_parameter");
  expect_error(ts.post("/v1/chat/completions", {{"messages", msg}, {"presence_penalty", 0.5}}), 400,
               "unsupported_parameter");
  expect_error(ts.post("/v1/chat/completions", {{"messages", msg}, {"tool_choice", "required"}}), 400,
               "unsupported_parameter");
  expect_error(ts.post("/v1/chat/completions", {{"messages", msg}, {"top_logprobs", 50}, {"logprobs", true}}), 400,
               "invalid_value");
  expect_error(ts.post("/v1/chat/completions", {{"messages", msg}, {"tools", {{{"type", "nope"}}}}}), 400,
               "invalid_value");
  expect_error(ts.post("/v1/completions", {{"max_tokens", 3}}), 400, "missing_field");
  expect_error(ts.post("/v1/completions", {{"prompt", {"a", "b"}}}), 400, "unsupported_parameter");
  expect_error(ts.post("/v1/completions", {{"prompt", {1, 999999}}}), 400, "invalid_value");
  expect_error(ts.post("/v1/completions", {{"prompt", {1, -2}}}), 400, "invalid_value");
  expect_error(ts.post("/v1/completions", {{"prompt", "x"}, {"echo", true}}), 400, "unsupported_parameter");
  // Neutral values of unsupported settings are fine.
  EXPECT_EQ(ts.post("/v1/completions", {{"prompt", "x"}, {"max_tokens", 1}, {"presence_penalty", 0}, {"n", 1},
                                        {"logit_bias", ojson::object()}, {"user", "someone"}})
                .status,
            200);
  // Nothing above left a slot busy.
  EXPECT_EQ(ts.server().slots_busy(), 0);
}

TEST(Server, APromptLongerThanTheContextIs400) {
  TestServer ts({.ctx = 64});
  std::string text;
  while (encode(text).size() < 80) text += "and then the sea came in ";
  Reply r = ts.post("/v1/completions", {{"prompt", text}});
  expect_error(r, 400, "context_length_exceeded");
  EXPECT_NE(r.json["error"]["message"].get<std::string>().find("64"), std::string::npos) << r.body;
  // A prompt that fits but leaves less room than max_tokens ends with "length".
  Reply ok = ts.post("/v1/completions", {{"prompt", "Once upon"}, {"max_tokens", 500}, {"temperature", 0},
                                         {"ignore_eos", true}});
  ASSERT_EQ(ok.status, 200) << ok.body;
  EXPECT_EQ(ok.json["choices"][0]["finish_reason"], "length");
  // The slot's 64 positions are full, and the last token (sampled, never fed) is the 65th.
  EXPECT_EQ(ok.json["usage"]["total_tokens"].get<int>(), 65);
}

TEST(Server, UnknownEndpointsAre404AndBigBodies413) {
  TestServer ts({.max_body_bytes = 1000});
  expect_error(ts.get("/v2/nothing"), 404, "not_found");
  expect_error(ts.get("/v1/chat/completions"), 404, "not_found");  // POST only
  Reply big = ts.post("/v1/completions", {{"prompt", std::string(5000, 'a')}});
  expect_error(big, 413, "body_too_large");
  EXPECT_EQ(ts.post("/v1/completions", {{"prompt", "a"}, {"max_tokens", 1}}).status, 200);
}

TEST(Server, APIKeyIsRequiredExceptForHealth) {
  TestServer ts({.api_key = "s3cret"});
  const ojson body = {{"prompt", "Hi"}, {"max_tokens", 2}};
  expect_error(ts.post("/v1/completions", body), 401, "invalid_api_key");
  expect_error(ts.post("/v1/completions", body, "wrong"), 401, "invalid_api_key");
  expect_error(ts.get("/v1/models"), 401, "invalid_api_key");
  expect_error(ts.get("/metrics"), 401, "invalid_api_key");
  EXPECT_EQ(ts.post("/v1/completions", body, "s3cret").status, 200);
  EXPECT_EQ(ts.get("/v1/models", "s3cret").status, 200);
  EXPECT_EQ(ts.get("/health").status, 200);
}

TEST(Server, BrowsersMayCallFromAnyOrigin) {
  TestServer ts({.api_key = "k"});
  auto c = ts.client();
  auto pre = c->Options("/v1/chat/completions");
  ASSERT_TRUE(pre);
  EXPECT_EQ(pre->status, 204);  // the preflight carries no key
  EXPECT_EQ(pre->get_header_value("Access-Control-Allow-Origin"), "*");
  EXPECT_NE(pre->get_header_value("Access-Control-Allow-Headers").find("Authorization"), std::string::npos);
  Reply r = ts.get("/v1/models", "k");
  EXPECT_EQ(r.headers.find("Access-Control-Allow-Origin")->second, "*");
}

TEST(Server, TokenizeDetokenizeAndApplyTemplate) {
  TestServer ts;
  auto m = load_default();
  const std::string text = "Hello there, old friend.";
  Reply t = ts.post("/tokenize", {{"content", text}});
  ASSERT_EQ(t.status, 200) << t.body;
  EXPECT_EQ(t.json["tokens"].get<std::vector<int32_t>>(), m.tokenizer.encode(text, false));
  Reply ts2 = ts.post("/tokenize", {{"content", text}, {"add_special", true}, {"with_pieces", true}});
  ASSERT_EQ(ts2.status, 200);
  const auto with_bos = m.tokenizer.encode(text, true);
  ASSERT_EQ(ts2.json["tokens"].size(), with_bos.size());
  EXPECT_EQ(ts2.json["tokens"][0]["id"], with_bos[0]);
  std::string joined;
  for (const auto& p : ts2.json["tokens"]) joined += p["piece"].get<std::string>();
  EXPECT_EQ(joined, m.tokenizer.decode(with_bos, false));
  Reply d = ts.post("/detokenize", {{"tokens", t.json["tokens"]}});
  ASSERT_EQ(d.status, 200);
  EXPECT_EQ(d.json["content"], text);
  expect_error(ts.post("/detokenize", {{"tokens", {1, 100000}}}), 400, "invalid_value");
  expect_error(ts.post("/detokenize", {{"tokens", "abc"}}), 400, "invalid_type");
  expect_error(ts.post("/tokenize", {{"text", "x"}}), 400, "missing_field");
  const ojson messages = {{{"role", "system"}, {"content", "S"}}, {{"role", "user"}, {"content", "U"}}};
  Reply a = ts.post("/apply-template", {{"messages", messages}});
  ASSERT_EQ(a.status, 200);
  EXPECT_EQ(a.json["prompt"], chat::render_conversation(m.dir, *m.model, m.tokenizer, messages, ojson::array(), true));
  expect_error(ts.post("/apply-template", ojson::object()), 400, "missing_field");
}

TEST(Server, ToolsReachTheTemplateAndTheReplyIsWellFormed) {
  TestServer ts;
  const ojson tools = ojson::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "description": "Weather in a city",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])");
  const ojson messages = {{{"role", "user"}, {"content", "Weather in Paris?"}}};
  Reply a = ts.post("/apply-template", {{"messages", messages}, {"tools", tools}});
  ASSERT_EQ(a.status, 200);
  EXPECT_NE(a.json["prompt"].get<std::string>().find("get_weather"), std::string::npos);
  // tool_choice "none": the model is not told about the tools.
  Reply none = ts.post("/v1/chat/completions",
                       {{"messages", messages}, {"tools", tools}, {"tool_choice", "none"}, {"max_tokens", 4},
                        {"temperature", 0}});
  ASSERT_EQ(none.status, 200);
  EXPECT_EQ(none.json["usage"]["prompt_tokens"], chat_ids(ts, messages).size());
  // The default model never writes a call; the reply is an ordinary message.
  for (bool stream : {false, true}) {
    ojson body = {{"messages", messages}, {"tools", tools}, {"max_tokens", 8}, {"temperature", 0}, {"stream", stream}};
    if (!stream) {
      Reply r = ts.post("/v1/chat/completions", body);
      ASSERT_EQ(r.status, 200) << r.body;
      EXPECT_FALSE(r.json["choices"][0]["message"].contains("tool_calls"));
      EXPECT_NE(r.json["choices"][0]["finish_reason"], "tool_calls");
    } else {
      Reply r = ts.stream("/v1/chat/completions", body);
      EXPECT_EQ(sse_data(r.body).back(), "[DONE]");
    }
  }
  // A conversation that holds a call and its result renders.
  const ojson history = {
      {{"role", "user"}, {"content", "Weather in Paris?"}},
      {{"role", "assistant"},
       {"content", nullptr},
       {"tool_calls",
        {{{"id", "call_1"}, {"type", "function"},
          {"function", {{"name", "get_weather"}, {"arguments", "{\"city\": \"Paris\"}"}}}}}}},
      {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "sunny"}}};
  Reply h = ts.post("/v1/chat/completions", {{"messages", history}, {"tools", tools}, {"max_tokens", 4}});
  EXPECT_EQ(h.status, 200) << h.body;
}

TEST(Server, PrefixReuseAcrossRequestsMatchesAFreshSlot) {
  TestServer ts;  // one slot
  ASSERT_GE(encode(kLongPrompt).size(), 64u);
  Reply a = ts.post("/v1/completions", {{"prompt", kLongPrompt}, {"max_tokens", 4}, {"temperature", 0}});
  ASSERT_EQ(a.status, 200);
  EXPECT_EQ(a.json["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  const std::string longer = kLongPrompt + " One day a stranger came";
  Reply b = ts.post("/v1/completions", {{"prompt", longer}, {"max_tokens", 16}, {"temperature", 0}});
  ASSERT_EQ(b.status, 200);
  const int cached = b.json["usage"]["prompt_tokens_details"]["cached_tokens"];
  EXPECT_GE(cached, 64);
  EXPECT_EQ(cached % 64, 0);  // whole prefill chunks
  EXPECT_EQ(b.json["timings"]["cache_n"], cached);
  EXPECT_EQ(b.json["timings"]["prompt_n"], encode(longer).size() - cached);
  EXPECT_EQ(b.json["choices"][0]["text"], direct_generate(encode(longer), greedy(), {.max_tokens = 16}).text);
  EXPECT_EQ(ts.metric("kvgraph_prompt_tokens_cached_total"), cached);
}

TEST(Server, ARequestGoesToTheSlotHoldingItsPrefix) {
  TestServer ts({.parallel = 2});
  const std::string x = kLongPrompt, y = "Twas brillig, and the slithy toves did gyre and gimble in the wabe. " + kLongPrompt;
  for (const std::string& p : {x, y})
    ASSERT_EQ(ts.post("/v1/completions", {{"prompt", p}, {"max_tokens", 2}, {"temperature", 0}}).status, 200);
  // x went to one slot, y to the other (y shares only BOS with x: no
  // reusable chunk, so it took the unused slot).
  for (const std::string& p : {x, y}) {
    Reply r = ts.post("/v1/completions", {{"prompt", p + " And so"}, {"max_tokens", 2}, {"temperature", 0}});
    ASSERT_EQ(r.status, 200);
    EXPECT_GE(r.json["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), 64) << p;
  }
}

TEST(Server, NothingLeaksIntoTheNextRequest) {
  TestServer ts;
  const ojson plain = {{"prompt", "Never trust a"}, {"max_tokens", 40}, {"temperature", 0}};
  Reply before = ts.post("/v1/completions", plain);
  ASSERT_EQ(before.status, 200);
  // A request with every per-request setting changed...
  Reply odd = ts.post("/v1/completions", {{"prompt", "Never trust a"},
                                          {"max_tokens", 30},
                                          {"temperature", 1.5},
                                          {"top_k", 5},
                                          {"seed", 99},
                                          {"ignore_eos", true},
                                          {"repeat_penalty", 1.3},
                                          {"stop", {"e"}}});
  ASSERT_EQ(odd.status, 200);
  // ...then the plain one again: the same answer as a fresh session's.
  Reply after = ts.post("/v1/completions", plain);
  ASSERT_EQ(after.status, 200);
  const Direct d = direct_generate(encode("Never trust a"), greedy(), {.max_tokens = 40});
  EXPECT_EQ(before.json["choices"][0]["text"], d.text);
  EXPECT_EQ(after.json["choices"][0]["text"], d.text);
  EXPECT_EQ(after.json["choices"][0]["finish_reason"], before.json["choices"][0]["finish_reason"]);
}

class ServerConcurrency : public ::testing::TestWithParam<bool> {};

// take_turns (what CUDA models always do): the slots step one at a time,
// handing the turn over at every token; answers are the same.
TEST_P(ServerConcurrency, TwoConcurrentRequestsBothAnswerAsAlone) {
  TestServer ts({.parallel = 2, .take_turns = GetParam()});
  const ojson a = {{"prompt", "The cat"}, {"max_tokens", 200}, {"temperature", 0}, {"ignore_eos", true}};
  const ojson b = {{"messages", {{{"role", "user"}, {"content", "The dog"}}}}, {"max_tokens", 200}, {"temperature", 0},
                   {"ignore_eos", true}, {"stream", true}};
  std::atomic<int> peak{0};
  std::atomic<bool> done{false};
  std::thread watch([&] {
    while (!done) {
      peak = std::max(peak.load(), ts.server().slots_busy());
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  auto fa = std::async(std::launch::async, [&] { return ts.post("/v1/completions", a); });
  auto fb = std::async(std::launch::async, [&] { return ts.stream("/v1/chat/completions", b); });
  Reply ra = fa.get(), rb = fb.get();
  done = true;
  watch.join();
  ASSERT_EQ(ra.status, 200);
  ASSERT_EQ(rb.status, 200);
  EXPECT_EQ(ra.json["choices"][0]["text"],
            direct_generate(encode("The cat"), greedy(), {.max_tokens = 200, .ignore_eos = true}).text);
  std::string text;
  for (const auto& d : sse_data(rb.body))
    if (d != "[DONE]") {
      const ojson c = ojson::parse(d);
      if (!c["choices"].empty() && c["choices"][0]["delta"].contains("content"))
        text += c["choices"][0]["delta"]["content"].get<std::string>();
    }
  const Direct db =
      direct_generate(chat_ids(ts, b["messages"]), greedy(), {.max_tokens = 200, .ignore_eos = true});
  EXPECT_EQ(text, db.text);
  EXPECT_EQ(ts.metric("kvgraph_completions_total"), 2);
  EXPECT_EQ(peak.load(), 2);  // both were in flight at once
}

INSTANTIATE_TEST_SUITE_P(Server, ServerConcurrency, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "TakingTurns" : "SideBySide"; });

TEST(Server, ClientDisconnectCancelsTheGeneration) {
  TestServer ts({.ctx = 1024});
  const int max_tokens = 1000;
  int seen = 0;
  Reply r = ts.stream("/v1/completions",
                      {{"prompt", "Once"}, {"max_tokens", max_tokens}, {"ignore_eos", true}, {"stream", true}},
                      [&](const std::string&) { return ++seen < 3; });
  EXPECT_EQ(r.status, 0);  // we hung up after 3 chunks
  ASSERT_TRUE(TestServer::eventually([&] { return ts.server().slots_busy() == 0; })) << "the slot was not freed";
  ASSERT_TRUE(TestServer::eventually([&] { return ts.metric("kvgraph_completions_cancelled_total") == 1; }));
  const double generated = ts.metric("kvgraph_generated_tokens_total");
  EXPECT_GE(generated, 3);
  EXPECT_LT(generated, max_tokens - 1) << "generation ran on after the client left";
  // The slot serves the next request as a fresh one would.
  Reply next = ts.post("/v1/completions", {{"prompt", "Once"}, {"max_tokens", 8}, {"temperature", 0}});
  ASSERT_EQ(next.status, 200);
  EXPECT_EQ(next.json["choices"][0]["text"], direct_generate(encode("Once"), greedy(), {.max_tokens = 8}).text);
}

TEST(Server, BusyServerWithNoQueueAnswers503) {
  TestServer ts({.parallel = 1, .queue = {.max_waiting = 0, .max_wait = std::chrono::milliseconds(0)}});
  LongStream long_one(ts);
  Reply busy = ts.post("/v1/completions", {{"prompt", "Hi"}, {"max_tokens", 2}});
  expect_error(busy, 503, "server_busy");
  EXPECT_EQ(busy.headers.find("Retry-After")->second, "1");
  long_one.finish();
  ASSERT_TRUE(TestServer::eventually([&] { return ts.server().slots_busy() == 0; }));
  EXPECT_EQ(ts.post("/v1/completions", {{"prompt", "Hi"}, {"max_tokens", 2}}).status, 200);
}

TEST(Server, WaitingPastTheQueueTimeoutIs503AndAShortWaitIsServed) {
  TestServer ts({.parallel = 1, .queue = {.max_waiting = 4, .max_wait = std::chrono::milliseconds(800)}});
  LongStream long_one(ts);
  const auto t0 = std::chrono::steady_clock::now();
  Reply late = ts.post("/v1/completions", {{"prompt", "Hi"}, {"max_tokens", 2}});
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  expect_error(late, 503, "server_busy");
  EXPECT_GE(waited, 0.79);
  // A request that waits less than the timeout is served.
  auto queued = std::async(std::launch::async, [&] { return ts.post("/v1/completions", {{"prompt", "Hi"}, {"max_tokens", 2}}); });
  ASSERT_TRUE(TestServer::eventually([&] { return ts.metric("kvgraph_requests_waiting") == 1; }));
  long_one.finish();
  EXPECT_EQ(queued.get().status, 200);
}

TEST(Server, StopEndsARunningStreamCleanly) {
  auto ts = std::make_unique<TestServer>();
  LongStream s(*ts);
  ts->server().stop();
  Reply r = s.wait();
  const auto data = sse_data(r.body);
  ASSERT_GE(data.size(), 2u);
  EXPECT_EQ(data.back(), "[DONE]");
  const ojson err = ojson::parse(data[data.size() - 2]);
  EXPECT_EQ(err["error"]["code"], "shutting_down") << r.body;
}

TEST(Server, MetricsCountRequestsTokensAndTimeToFirstToken) {
  TestServer ts;
  int generated = 0;
  for (int i = 0; i < 3; ++i) {
    Reply r = ts.post("/v1/completions", {{"prompt", "Hello"}, {"max_tokens", 5 + i}, {"temperature", 0}});
    ASSERT_EQ(r.status, 200);
    generated += r.json["usage"]["completion_tokens"].get<int>();
  }
  ts.post("/v1/completions", ojson::object());  // a 400
  Reply m = ts.get("/metrics");
  ASSERT_EQ(m.status, 200);
  EXPECT_NE(m.headers.find("Content-Type")->second.find("text/plain"), std::string::npos);
  EXPECT_NE(m.body.find("kvgraph_requests_total{endpoint=\"/v1/completions\",status=\"200\"} 3"), std::string::npos)
      << m.body;
  EXPECT_NE(m.body.find("kvgraph_requests_total{endpoint=\"/v1/completions\",status=\"400\"} 1"), std::string::npos);
  EXPECT_EQ(ts.metric("kvgraph_generated_tokens_total"), generated);
  EXPECT_EQ(ts.metric("kvgraph_time_to_first_token_seconds_count"), 3);
  EXPECT_GT(ts.metric("kvgraph_time_to_first_token_seconds_sum"), 0);
  EXPECT_GT(ts.metric("kvgraph_decode_tokens_per_second"), 0);
  EXPECT_EQ(ts.metric("kvgraph_slots_total"), 1);
  EXPECT_EQ(ts.metric("kvgraph_slots_busy"), 0);
}
