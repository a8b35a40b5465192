// Request bodies -> CompletionRequest, and the 400s for everything else.
#include <random>

#include <gtest/gtest.h>

#include "server/api_error.h"
#include "server/request.h"

using namespace kvgraph::server;

namespace {

// The ApiError code a parse throws ("" when it does not throw).
template <typename F>
std::string code_of(F f) {
  try {
    f();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_EQ(e.type(), "invalid_request_error");
    return e.code();
  }
  return "";
}

const ojson kUser = {{{"role", "user"}, {"content", "Hi"}}};

}  // namespace

TEST(ServerRequest, ChatDefaultsFollowOpenAI) {
  CompletionRequest r = parse_chat_request({{"model", "x"}, {"messages", kUser}});
  EXPECT_TRUE(r.chat);
  EXPECT_EQ(r.model, "x");
  EXPECT_FLOAT_EQ(r.temperature, 1.0f);
  EXPECT_FLOAT_EQ(r.top_p, 1.0f);
  EXPECT_EQ(r.top_k, 0);
  EXPECT_FALSE(r.max_tokens);
  EXPECT_FALSE(r.seed);
  EXPECT_FALSE(r.stream);
  EXPECT_FALSE(r.logprobs);
  EXPECT_FALSE(r.parse_tool_calls);
  EXPECT_EQ(r.messages, kUser);
}

TEST(ServerRequest, ReadsEverySetting) {
  CompletionRequest r = parse_chat_request({{"messages", kUser},
                                            {"max_tokens", 10},
                                            {"max_completion_tokens", 20},
                                            {"temperature", 0.5},
                                            {"top_p", 0.9},
                                            {"top_k", 40},
                                            {"seed", -1},
                                            {"stop", {"a", "b"}},
                                            {"stream", true},
                                            {"stream_options", {{"include_usage", true}}},
                                            {"logprobs", true},
                                            {"top_logprobs", 5},
                                            {"ignore_eos", true},
                                            {"repeat_penalty", 1.1}});
  EXPECT_EQ(r.max_tokens, 20);  // max_completion_tokens wins
  EXPECT_FLOAT_EQ(r.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.top_p, 0.9f);
  EXPECT_EQ(r.top_k, 40);
  EXPECT_EQ(r.seed, UINT64_MAX);  // -1 wraps
  EXPECT_EQ(r.stop, (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.top_logprobs, 5);
  EXPECT_TRUE(r.ignore_eos);
  EXPECT_FLOAT_EQ(r.repeat_penalty, 1.1f);
  EXPECT_EQ(parse_chat_request({{"messages", kUser}, {"stop", "x"}}).stop, std::vector<std::string>{"x"});
  EXPECT_EQ(parse_chat_request({{"messages", kUser}, {"max_tokens", 3.0}}).max_tokens, 3);  // 3.0 from JavaScript
  EXPECT_FALSE(parse_chat_request({{"messages", kUser}, {"max_tokens", nullptr}}).max_tokens);
}

TEST(ServerRequest, RefusesWhatItCannotDo) {
  auto chat = [](ojson extra) {
    return code_of([&] {
      ojson b = {{"messages", kUser}};
      for (auto& [k, v] : extra.items()) b[k] = v;
      parse_chat_request(b);
    });
  };
  EXPECT_EQ(chat({{"n", 3}}), "unsupported_parameter");
  EXPECT_EQ(chat({{"best_of", 2}}), "unsupported_parameter");
  EXPECT_EQ(chat({{"frequency_penalty", 1}}), "unsupported_parameter");
  EXPECT_EQ(chat({{"logit_bias", {{"5", 1}}}}), "unsupported_parameter");
  EXPECT_EQ(chat({{"response_format", {{"type", "json_object"}}}}), "unsupported_parameter");
  EXPECT_EQ(chat({{"tool_choice", {{"type", "function"}}}}), "unsupported_parameter");
  EXPECT_EQ(chat({{"top_k", -1}}), "invalid_value");
  EXPECT_EQ(chat({{"temperature", 1e300}}), "invalid_value");
  EXPECT_EQ(chat({{"repeat_penalty", 0}}), "invalid_value");
  EXPECT_EQ(chat({{"stop", {1}}}), "invalid_type");
  EXPECT_EQ(chat({{"stop", ojson::array({"1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14",
                                         "15", "16", "17"})}}),
            "invalid_value");
  EXPECT_EQ(chat({{"top_logprobs", 2}}), "invalid_value");  // needs logprobs: true
  EXPECT_EQ(chat({{"logprobs", 1}}), "invalid_type");
  EXPECT_EQ(chat({{"stream_options", true}}), "invalid_type");
  EXPECT_EQ(chat({{"model", 5}}), "invalid_type");
  EXPECT_EQ(chat({{"n", 1}, {"frequency_penalty", 0}, {"response_format", {{"type", "text"}}}}), "");
}

TEST(ServerRequest, MessagesAreCheckedAndNormalised) {
  auto msgs = [](ojson m) { return code_of([&] { parse_messages({{"messages", m}}); }); };
  EXPECT_EQ(msgs(ojson::array()), "invalid_type");
  EXPECT_EQ(msgs("hello"), "invalid_type");
  EXPECT_EQ(msgs({1}), "invalid_type");
  EXPECT_EQ(msgs({{{"content", "x"}}}), "missing_field");
  EXPECT_EQ(msgs({{{"role", "user"}, {"content", 5}}}), "invalid_type");
  EXPECT_EQ(msgs({{{"role", "user"}, {"content", {{{"type", "text"}}}}}}), "invalid_value");
  EXPECT_EQ(msgs({{{"role", "assistant"}, {"tool_calls", {{{"id", "1"}}}}}}), "invalid_type");
  const ojson m = parse_messages(
      {{"messages",
        {{{"role", "assistant"},
          {"tool_calls", {{{"type", "function"}, {"function", {{"name", "f"}, {"arguments", "{\"a\": 1}"}}}}}}},
         {{"role", "user"}, {"content", {{{"type", "text"}, {"text", "a"}}, {{"type", "text"}, {"text", "b"}}}}}}}});
  EXPECT_TRUE(m[0]["content"].is_null());  // added when absent
  EXPECT_EQ(m[0]["tool_calls"][0]["function"]["arguments"], ojson({{"a", 1}}));  // JSON text -> object
  EXPECT_EQ(m[1]["content"], "a\nb");
}

TEST(ServerRequest, ToolsAndToolChoice) {
  const ojson tools = {{{"type", "function"}, {"function", {{"name", "f"}}}}};
  EXPECT_TRUE(parse_chat_request({{"messages", kUser}, {"tools", tools}}).parse_tool_calls);
  EXPECT_TRUE(parse_chat_request({{"messages", kUser}, {"tools", tools}, {"tool_choice", "auto"}}).parse_tool_calls);
  CompletionRequest none = parse_chat_request({{"messages", kUser}, {"tools", tools}, {"tool_choice", "none"}});
  EXPECT_FALSE(none.parse_tool_calls);
  EXPECT_TRUE(none.tools.empty());
  EXPECT_EQ(code_of([&] { parse_chat_request({{"messages", kUser}, {"tools", {{{"type", "function"}}}}}); }),
            "invalid_value");
  EXPECT_EQ(code_of([&] { parse_chat_request({{"messages", kUser}, {"tools", "f"}}); }), "invalid_type");
}

TEST(ServerRequest, CompletionPromptShapes) {
  EXPECT_EQ(parse_completion_request({{"prompt", "abc"}}).prompt_text, "abc");
  EXPECT_EQ(parse_completion_request({{"prompt", {"abc"}}}).prompt_text, "abc");
  EXPECT_EQ(parse_completion_request({{"prompt", {1, 2, 3}}}).prompt_ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(parse_completion_request({{"prompt", {{4, 5}}}}).prompt_ids, (std::vector<int32_t>{4, 5}));
  CompletionRequest lp = parse_completion_request({{"prompt", "a"}, {"logprobs", 3}});
  EXPECT_TRUE(lp.logprobs);
  EXPECT_EQ(lp.top_logprobs, 3);
  auto comp = [](ojson b) { return code_of([&] { parse_completion_request(b); }); };
  EXPECT_EQ(comp(ojson::object()), "missing_field");
  EXPECT_EQ(comp({{"prompt", 5}}), "invalid_type");
  EXPECT_EQ(comp({{"prompt", {"a", "b"}}}), "unsupported_parameter");
  EXPECT_EQ(comp({{"prompt", {1, 2.5}}}), "invalid_value");
  EXPECT_EQ(comp({{"prompt", {1, 3000000000LL}}}), "invalid_value");
  EXPECT_EQ(comp({{"prompt", "a"}, {"suffix", "b"}}), "unsupported_parameter");
  EXPECT_EQ(comp({{"prompt", "a"}, {"logprobs", 21}}), "invalid_value");
}

TEST(ServerRequest, BodiesThatAreNotJSONObjects) {
  EXPECT_EQ(code_of([] { parse_body(""); }), "invalid_json");
  EXPECT_EQ(code_of([] { parse_body("{\"a\": }"); }), "invalid_json");
  EXPECT_EQ(code_of([] { parse_body("\"text\""); }), "invalid_json");
  EXPECT_EQ(code_of([] { parse_body(std::string(100000, '[')); }), "invalid_json");  // depth, not a stack overflow
  EXPECT_EQ(parse_body("{\"a\": 1}")["a"], 1);
}

// Whatever a client sends is parsed or refused with an ApiError, never
// another exception: every known field set to values of every JSON type,
// and random damage to a valid body.
TEST(ServerRequest, AnyValueOfAnyFieldIsParsedOrA400) {
  const ojson weird[] = {nullptr, true, false, 0, -1, 1, 2, 21, 1.5, -0.0, 1e308, -1e308,
                         ojson(uint64_t(18446744073709551615ull)), ojson(int64_t(INT64_MIN)), "", "x", "none",
                         ojson::array(), ojson::array({1, 2}), ojson::array({"a"}), ojson::array({ojson::array()}),
                         ojson::object(), ojson({{"type", "text"}}), ojson({{"include_usage", 3}})};
  const char* fields[] = {"model", "messages", "tools", "tool_choice", "prompt", "max_tokens", "max_completion_tokens",
                          "temperature", "top_p", "top_k", "repeat_penalty", "seed", "stop", "ignore_eos", "stream",
                          "stream_options", "logprobs", "top_logprobs", "n", "best_of", "presence_penalty",
                          "frequency_penalty", "logit_bias", "response_format", "echo", "suffix"};
  const ojson base = {{"messages", kUser}, {"prompt", "hi"}};
  int refused = 0, parsed = 0;
  for (const char* f : fields)
    for (const ojson& v : weird) {
      ojson b = base;
      b[f] = v;
      for (bool chat : {true, false}) {
        try {
          chat ? parse_chat_request(b) : parse_completion_request(b);
          ++parsed;
        } catch (const ApiError& e) {
          EXPECT_EQ(e.status(), 400);
          ++refused;
        } catch (const std::exception& e) {
          ADD_FAILURE() << f << " = " << v.dump() << " (chat " << chat << "): " << e.what();
        }
      }
    }
  EXPECT_GT(refused, 100);
  EXPECT_GT(parsed, 100);
}

TEST(ServerRequest, DamagedBodiesAreA400NeverACrash) {
  const std::string valid = ojson({{"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                                   {"tools", {{{"type", "function"}, {"function", {{"name", "f"}}}}}},
                                   {"stop", {"a"}},
                                   {"max_tokens", 5},
                                   {"stream_options", {{"include_usage", true}}}})
                                .dump();
  std::mt19937 rng(7);
  const std::string alphabet = "{}[]\":,0123456789-.eE truefalsnul\\x";
  for (int i = 0; i < 3000; ++i) {
    std::string s = valid;
    for (int k = 0, n = 1 + rng() % 4; k < n && !s.empty(); ++k) {
      const size_t at = rng() % s.size();
      switch (rng() % 3) {
        case 0: s[at] = alphabet[rng() % alphabet.size()]; break;
        case 1: s.erase(at, 1 + rng() % 8); break;
        default: s.insert(at, 1, alphabet[rng() % alphabet.size()]); break;
      }
    }
    for (bool chat : {true, false}) {
      try {
        const ojson b = parse_body(s);
        chat ? parse_chat_request(b) : parse_completion_request(b);
      } catch (const ApiError& e) {
        EXPECT_EQ(e.status(), 400);
      } catch (const std::exception& e) {
        ADD_FAILURE() << s << ": " << e.what();
      }
    }
  }
}
