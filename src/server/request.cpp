#include "server/request.h"

#include <cmath>
#include <limits>

#include "kvgraph/op_types.h"
#include "server/api_error.h"

namespace kvgraph::server {

namespace {

// Request bodies are parsed with a depth limit, as the configs are: serialising
// and copying JSON recurse, so a body of a million '[' must not reach them.
constexpr int kMaxJsonDepth = 64;
constexpr size_t kMaxStops = 16;
constexpr int kMaxTopLogprobs = 20;

const ojson* field(const ojson& body, const char* key) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<double> get_number(const ojson& body, const char* key) {
  const ojson* v = field(body, key);
  if (!v) return std::nullopt;
  if (!v->is_number()) bad_request("invalid_type", "\"{}\" must be a number, got {}", key, v->dump());
  return v->get<double>();
}

// A float field for the sampler: finite and representable as f32.
std::optional<float> get_float(const ojson& body, const char* key) {
  auto d = get_number(body, key);
  if (!d) return std::nullopt;
  if (!std::isfinite(*d) || std::fabs(*d) > std::numeric_limits<float>::max())
    bad_request("invalid_value", "\"{}\" {} is out of range", key, *d);
  return static_cast<float>(*d);
}

// A setting kvgraph does not implement: accepted at its neutral value,
// refused otherwise (silently ignoring it would give the client output it
// did not ask for).
void refuse_nonzero(const ojson& body, const char* key) {
  auto v = get_number(body, key);
  if (v && *v != 0.0)
    bad_request("unsupported_parameter", "\"{}\" is not supported (only 0 is accepted), got {}", key, *v);
}

void parse_common(const ojson& body, CompletionRequest& r) {
  if (auto m = get_string(body, "model")) r.model = *m;
  if (auto n = get_int(body, "n"); n && *n != 1)
    bad_request("unsupported_parameter", "\"n\" must be 1 (one choice per request), got {}", *n);
  if (auto n = get_int(body, "best_of"); n && *n != 1)
    bad_request("unsupported_parameter", "\"best_of\" must be 1, got {}", *n);
  refuse_nonzero(body, "presence_penalty");
  refuse_nonzero(body, "frequency_penalty");
  if (const ojson* lb = field(body, "logit_bias")) {
    if (!lb->is_object()) bad_request("invalid_type", "\"logit_bias\" must be an object");
    if (!lb->empty()) bad_request("unsupported_parameter", "\"logit_bias\" is not supported");
  }
  if (const ojson* rf = field(body, "response_format")) {
    if (!rf->is_object()) bad_request("invalid_type", "\"response_format\" must be an object");
    auto type = get_string(*rf, "type");
    if (type && *type != "text")
      bad_request("unsupported_parameter", "\"response_format\" type \"{}\" is not supported (only \"text\")", *type);
  }

  // max_completion_tokens is the newer name; it wins when both are given.
  for (const char* key : {"max_tokens", "max_completion_tokens"})
    if (auto v = get_int(body, key)) {
      if (*v < 1) bad_request("invalid_value", "\"{}\" must be an integer >= 1, got {}", key, *v);
      r.max_tokens = *v;
    }

  if (auto v = get_float(body, "temperature")) r.temperature = *v;
  if (auto v = get_float(body, "top_p")) r.top_p = *v;
  if (auto v = get_int(body, "top_k")) {
    if (*v < 0 || *v > std::numeric_limits<int32_t>::max())
      bad_request("invalid_value", "\"top_k\" must be an integer >= 0 (0: off), got {}", *v);
    r.top_k = static_cast<int32_t>(*v);
  }
  if (auto v = get_float(body, "repeat_penalty")) r.repeat_penalty = *v;
  // The sampler's own ranges, under the request's field names.
  if (auto issue = ops::check({r.temperature, r.top_k, r.top_p, r.repeat_penalty, 0})) {
    const std::string name = issue->field == "repetition_penalty" ? "repeat_penalty" : issue->field;
    bad_request("invalid_value", "\"{}\" {}: expected {}", name, issue->value, issue->expected);
  }
  if (const ojson* s = field(body, "seed")) {
    if (!s->is_number_integer()) bad_request("invalid_type", "\"seed\" must be an integer, got {}", s->dump());
    // Any 64-bit integer: negative seeds wrap, as they would in C.
    r.seed = s->is_number_unsigned() ? s->get<uint64_t>() : static_cast<uint64_t>(s->get<int64_t>());
  }

  if (const ojson* s = field(body, "stop")) {
    if (s->is_string()) {
      r.stop.push_back(s->get<std::string>());
    } else if (s->is_array()) {
      if (s->size() > kMaxStops) bad_request("invalid_value", "\"stop\" has {} strings, at most {}", s->size(), kMaxStops);
      for (const auto& x : *s) {
        if (!x.is_string()) bad_request("invalid_type", "\"stop\" must be a string or an array of strings");
        r.stop.push_back(x.get<std::string>());
      }
    } else {
      bad_request("invalid_type", "\"stop\" must be a string or an array of strings");
    }
  }
  if (auto v = get_bool(body, "ignore_eos")) r.ignore_eos = *v;
  if (auto v = get_bool(body, "stream")) r.stream = *v;
  if (const ojson* so = field(body, "stream_options")) {
    if (!so->is_object()) bad_request("invalid_type", "\"stream_options\" must be an object");
    if (auto v = get_bool(*so, "include_usage")) r.include_usage = *v;
  }
}

void check_top_logprobs(int64_t n, const char* key) {
  if (n < 0 || n > kMaxTopLogprobs)
    bad_request("invalid_value", "\"{}\" must be an integer in [0, {}], got {}", key, kMaxTopLogprobs, n);
}

// Message content: a string, null, or an array of text parts (joined by
// newlines); images and other parts are refused.
ojson flatten_content(const ojson& content, size_t i) {
  if (content.is_null() || content.is_string()) return content;
  if (!content.is_array())
    bad_request("invalid_type", "messages[{}].content must be a string, null or an array of text parts", i);
  std::string text;
  for (size_t k = 0; k < content.size(); ++k) {
    const ojson& part = content[k];
    if (!part.is_object()) bad_request("invalid_type", "messages[{}].content[{}] must be an object", i, k);
    auto type = get_string(part, "type");
    if (type != "text")
      bad_request("unsupported_content", "messages[{}].content[{}]: only \"text\" parts are supported, got \"{}\"", i,
                  k, type.value_or("(none)"));
    auto t = get_string(part, "text");
    if (!t) bad_request("invalid_value", "messages[{}].content[{}] has no \"text\"", i, k);
    if (k) text += "\n";
    text += *t;
  }
  return text;
}

}  // namespace

ojson parse_body(const std::string& body) {
  ojson j;
  try {
    j = ojson::parse(body, [](int depth, ojson::parse_event_t, ojson&) {
      if (depth > kMaxJsonDepth)
        bad_request("invalid_json", "the body is nested deeper than {} levels", kMaxJsonDepth);
      return true;
    });
  } catch (const ojson::exception& e) {
    bad_request("invalid_json", "the body is not valid JSON: {}", e.what());
  }
  if (!j.is_object()) bad_request("invalid_json", "the body must be a JSON object");
  return j;
}

std::optional<bool> get_bool(const ojson& body, const char* key) {
  const ojson* v = field(body, key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) bad_request("invalid_type", "\"{}\" must be true or false, got {}", key, v->dump());
  return v->get<bool>();
}

std::optional<std::string> get_string(const ojson& body, const char* key) {
  const ojson* v = field(body, key);
  if (!v) return std::nullopt;
  if (!v->is_string()) bad_request("invalid_type", "\"{}\" must be a string, got {}", key, v->dump());
  return v->get<std::string>();
}

std::optional<int64_t> get_int(const ojson& body, const char* key) {
  const ojson* v = field(body, key);
  if (!v) return std::nullopt;
  // 1.0 is an integer to JavaScript clients; 1.5 is not.
  if (v->is_number_float()) {
    const double d = v->get<double>();
    if (d == std::floor(d) && std::fabs(d) < 9e15) return static_cast<int64_t>(d);
  }
  if (!v->is_number_integer() || (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(INT64_MAX)))
    bad_request("invalid_type", "\"{}\" must be an integer, got {}", key, v->dump());
  return v->get<int64_t>();
}

std::vector<int32_t> get_ids(const ojson& body, const char* key) {
  const ojson* v = field(body, key);
  if (!v) bad_request("missing_field", "\"{}\" is required", key);
  if (!v->is_array()) bad_request("invalid_type", "\"{}\" must be an array of token ids", key);
  std::vector<int32_t> ids;
  ids.reserve(v->size());
  for (const auto& x : *v) {
    if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() > std::numeric_limits<int32_t>::max())
      bad_request("invalid_value", "\"{}\": {} is not a token id", key, x.dump());
    ids.push_back(static_cast<int32_t>(x.get<int64_t>()));
  }
  return ids;
}

ojson parse_messages(const ojson& body) {
  const ojson* m = field(body, "messages");
  if (!m) bad_request("missing_field", "\"messages\" is required");
  if (!m->is_array() || m->empty()) bad_request("invalid_type", "\"messages\" must be a non-empty array");
  ojson out = ojson::array();
  for (size_t i = 0; i < m->size(); ++i) {
    const ojson& msg = (*m)[i];
    if (!msg.is_object()) bad_request("invalid_type", "messages[{}] must be an object", i);
    auto role = get_string(msg, "role");
    if (!role) bad_request("missing_field", "messages[{}] has no \"role\"", i);
    if (*role != "system" && *role != "developer" && *role != "user" && *role != "assistant" && *role != "tool")
      bad_request("invalid_value", "messages[{}].role \"{}\": expected system, developer, user, assistant or tool", i,
                  *role);
    ojson n = msg;
    n["content"] = flatten_content(msg.contains("content") ? msg["content"] : ojson(), i);
    if (const ojson* calls = field(msg, "tool_calls")) {
      if (!calls->is_array()) bad_request("invalid_type", "messages[{}].tool_calls must be an array", i);
      for (size_t k = 0; k < calls->size(); ++k) {
        ojson& call = n["tool_calls"][k];
        if (!call.is_object() || !call.contains("function") || !call["function"].is_object())
          bad_request("invalid_type", "messages[{}].tool_calls[{}] must be an object with a \"function\"", i, k);
        ojson& fn = call["function"];
        if (!fn.contains("name") || !fn["name"].is_string())
          bad_request("invalid_type", "messages[{}].tool_calls[{}].function.name must be a string", i, k);
        // Arguments come as JSON text; templates index and tojson them as objects.
        if (fn.contains("arguments") && fn["arguments"].is_string()) {
          ojson args = ojson::parse(fn["arguments"].get<std::string>(), nullptr, false);
          if (!args.is_discarded() && args.is_object()) fn["arguments"] = std::move(args);
        }
      }
    }
    out.push_back(std::move(n));
  }
  return out;
}

ojson parse_tools(const ojson& body) {
  const ojson* t = field(body, "tools");
  if (!t) return ojson::array();
  if (!t->is_array()) bad_request("invalid_type", "\"tools\" must be an array");
  for (size_t i = 0; i < t->size(); ++i) {
    const ojson& tool = (*t)[i];
    if (!tool.is_object() || get_string(tool, "type").value_or("") != "function" || !tool.contains("function") ||
        !tool["function"].is_object() || !tool["function"].contains("name") || !tool["function"]["name"].is_string())
      bad_request("invalid_value", "tools[{}] must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}", i);
  }
  return *t;
}

CompletionRequest parse_chat_request(const ojson& body) {
  CompletionRequest r;
  r.chat = true;
  parse_common(body, r);
  r.messages = parse_messages(body);
  r.tools = parse_tools(body);
  bool tools_on = !r.tools.empty();
  if (const ojson* tc = field(body, "tool_choice")) {
    if (!tc->is_string() || (*tc != "none" && *tc != "auto"))
      bad_request("unsupported_parameter", "\"tool_choice\" must be \"none\" or \"auto\", got {}", tc->dump());
    if (*tc == "none") tools_on = false;
  }
  r.parse_tool_calls = tools_on;
  if (!tools_on) r.tools = ojson::array();  // tool_choice "none": the model is not told about them
  if (auto v = get_bool(body, "logprobs")) r.logprobs = *v;
  if (auto v = get_int(body, "top_logprobs")) {
    check_top_logprobs(*v, "top_logprobs");
    if (!r.logprobs && *v > 0) bad_request("invalid_value", "\"top_logprobs\" needs \"logprobs\": true");
    r.top_logprobs = static_cast<int>(*v);
  }
  return r;
}

CompletionRequest parse_completion_request(const ojson& body) {
  CompletionRequest r;
  parse_common(body, r);
  const ojson* p = field(body, "prompt");
  if (!p) bad_request("missing_field", "\"prompt\" is required");
  // A string, token ids, or a batch of one of them.
  const ojson* one = p;
  if (p->is_array() && p->size() == 1 && ((*p)[0].is_string() || (*p)[0].is_array())) one = &(*p)[0];
  if (one->is_string()) {
    r.prompt_text = one->get<std::string>();
  } else if (one->is_array() && !one->empty() && (*one)[0].is_number()) {
    ojson wrap = {{"prompt", *one}};
    r.prompt_ids = get_ids(wrap, "prompt");
  } else if (p->is_array() && p->size() > 1 && (*p)[0].is_string()) {
    bad_request("unsupported_parameter", "\"prompt\" holds {} prompts: one per request", p->size());
  } else {
    bad_request("invalid_type", "\"prompt\" must be a string or an array of token ids");
  }
  if (auto e = get_bool(body, "echo"); e && *e) bad_request("unsupported_parameter", "\"echo\" is not supported");
  if (auto s = get_string(body, "suffix"); s && !s->empty())
    bad_request("unsupported_parameter", "\"suffix\" is not supported");
  // Legacy completions: logprobs is the number of top alternatives (0..5 in
  // OpenAI's API; up to 20 here), and the chosen token's logprob is always given.
  if (auto v = get_int(body, "logprobs")) {
    check_top_logprobs(*v, "logprobs");
    r.logprobs = true;
    r.top_logprobs = static_cast<int>(*v);
  }
  return r;
}

}  // namespace kvgraph::server
