#include "server/completion.h"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <mutex>
#include <numeric>
#include <optional>
#include <random>

#include <fmt/format.h>

#include "kvgraph/error.h"
#include "server/api_error.h"
#include "chat/chat_template.h"
#include "server/tool_calls.h"

namespace kvgraph::server {

namespace {

double seconds(std::chrono::steady_clock::duration d) { return std::chrono::duration<double>(d).count(); }

// Random ids and seeds: one generator for the process, seeded once.
uint64_t random_u64() {
  static std::mutex mu;
  static std::mt19937_64 gen{std::random_device{}()};
  std::lock_guard lk(mu);
  return gen();
}

std::string random_hex(int n) {
  std::string s;
  while (static_cast<int>(s.size()) < n) s += fmt::format("{:016x}", random_u64());
  return s.substr(0, n);
}

std::string dump(const ojson& j) { return j.dump(-1, ' ', false, ojson::error_handler_t::replace); }

ojson bytes_of(const std::string& s) {
  ojson b = ojson::array();
  for (unsigned char c : s) b.push_back(c);
  return b;
}

}  // namespace

ReplyWriter::ReplyWriter(const CompletionRequest& req, std::string id, int64_t created, std::string model,
                         WriteFn write)
    : req_(req), id_(std::move(id)), created_(created), model_(std::move(model)), write_(std::move(write)) {
  if (req_.parse_tool_calls) parser_.emplace();
}

void ReplyWriter::begin() {
  if (req_.stream && req_.chat) send(chunk({{"role", "assistant"}, {"content", ""}}, std::nullopt));
}

void ReplyWriter::token(std::string_view text, ojson logprob) {
  wrote_ = false;
  if (req_.logprobs && !logprob.is_null()) {
    logprobs_.push_back(logprob);
    pending_logprobs_.push_back(std::move(logprob));
  }
  piece(text);
  // A token that showed nothing still probes the connection (an SSE
  // comment, which clients skip), so a client that left is noticed at once.
  if (req_.stream && !wrote_) write(": \n\n");
}

void ReplyWriter::tail(std::string_view text) { piece(text); }

void ReplyWriter::piece(std::string_view text) {
  if (parser_)
    handle(parser_->feed(text));
  else if (!text.empty())
    handle({ToolEvent{.is_call = false, .content = std::string(text), .call = {}}});
}

std::string ReplyWriter::end(std::string finish, const ojson& usage, const ojson& timings) {
  if (parser_) handle(parser_->finish());
  if (n_calls_ > 0) finish = "tool_calls";
  if (req_.stream) {
    ojson last = chunk(ojson::object(), finish);
    last["timings"] = timings;
    send(std::move(last));
    if (req_.include_usage) {
      ojson u = base(req_.chat ? "chat.completion.chunk" : "text_completion");
      u["choices"] = ojson::array();
      u["usage"] = usage;
      send(std::move(u));
    }
    write("data: [DONE]\n\n");
    return "";
  }
  ojson resp = base(req_.chat ? "chat.completion" : "text_completion");
  ojson choice = {{"index", 0}};
  if (req_.chat) {
    ojson msg = {{"role", "assistant"}, {"content", content_.empty() && !calls_.empty() ? ojson() : ojson(content_)}};
    if (!calls_.empty()) msg["tool_calls"] = calls_;
    choice["message"] = std::move(msg);
    choice["logprobs"] = req_.logprobs ? ojson{{"content", logprobs_}} : ojson();
  } else {
    choice["text"] = content_;
    choice["logprobs"] = req_.logprobs ? legacy_logprobs(logprobs_) : ojson();
  }
  choice["finish_reason"] = finish;
  resp["choices"] = ojson::array({std::move(choice)});
  resp["usage"] = usage;
  resp["timings"] = timings;
  return dump(resp);
}

void ReplyWriter::fail(const std::string& message, const std::string& type, const std::string& code) {
  write(sse_error(message, type, code) + "data: [DONE]\n\n");
}

ojson ReplyWriter::base(const char* object) const {
  return {{"id", id_}, {"object", object}, {"created", created_}, {"model", model_}};
}

ojson ReplyWriter::chunk(ojson delta, std::optional<std::string> finish) {
  ojson j = base(req_.chat ? "chat.completion.chunk" : "text_completion");
  ojson c = {{"index", 0}};
  if (req_.chat)
    c["delta"] = std::move(delta);
  else
    c["text"] = delta.value("content", "");
  ojson lp;
  if (req_.logprobs && !pending_logprobs_.empty()) {
    lp = req_.chat ? ojson{{"content", pending_logprobs_}} : legacy_logprobs(pending_logprobs_);
    pending_logprobs_ = ojson::array();
  }
  c["logprobs"] = std::move(lp);
  c["finish_reason"] = finish ? ojson(*finish) : ojson();
  j["choices"] = ojson::array({std::move(c)});
  return j;
}

void ReplyWriter::send(const ojson& j) { write("data: " + dump(j) + "\n\n"); }

void ReplyWriter::write(const std::string& bytes) {
  if (gone_ || !write_) return;
  wrote_ = true;
  if (!write_(bytes)) gone_ = true;
}

void ReplyWriter::handle(std::vector<ToolEvent> events) {
  for (auto& e : events) {
    if (e.is_call) {
      ojson call = {{"id", "call_" + random_hex(24)},
                    {"type", "function"},
                    {"function", {{"name", e.call.name}, {"arguments", e.call.arguments}}}};
      if (req_.stream) {
        // One delta per call, whole: index, id, type, name and arguments.
        ojson streamed = {{"index", n_calls_}};
        for (auto& [k, v] : call.items()) streamed[k] = v;
        send(chunk({{"tool_calls", ojson::array({std::move(streamed)})}}, std::nullopt));
      }
      calls_.push_back(std::move(call));
      ++n_calls_;
    } else {
      content_ += e.content;
      if (req_.stream) send(chunk({{"content", e.content}}, std::nullopt));
    }
  }
}

ojson ReplyWriter::legacy_logprobs(const ojson& entries) {
  ojson tokens = ojson::array(), lps = ojson::array(), tops = ojson::array(), offsets = ojson::array();
  for (const auto& e : entries) {
    tokens.push_back(e["token"]);
    lps.push_back(e["logprob"]);
    ojson top = ojson::object();
    for (const auto& t : e["top_logprobs"]) top[t["token"].get<std::string>()] = t["logprob"];
    tops.push_back(std::move(top));
    offsets.push_back(text_offset_);
    text_offset_ += static_cast<int64_t>(e["token"].get<std::string>().size());
  }
  return {{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

namespace {

ojson logprob_entry(const Tokenizer& tok, int32_t id, float lp) {
  const std::string t = tok.decode(std::span<const int32_t>(&id, 1), false);
  return {{"token", t}, {"logprob", lp}, {"bytes", bytes_of(t)}};
}

ojson usage_of(const GenerateResult& r, int32_t P) {
  const int64_t n = static_cast<int64_t>(r.tokens.size());
  return {{"prompt_tokens", P},
          {"completion_tokens", n},
          {"total_tokens", P + n},
          {"prompt_tokens_details", {{"cached_tokens", r.reused}}}};
}

// As llama-server's: prompt = the prefilled part (cached tokens are not
// computed again) and the first sample; predicted = the tokens after the
// first, per second of decoding (the first comes out of the prompt step),
// which is what `kvgraph bench` reports as decode speed.
ojson timings_of(const GenerateResult& r, int32_t P) {
  const int64_t prompt_n = P - r.reused;
  const int64_t n = static_cast<int64_t>(r.tokens.size());
  const double pms = r.prefill_seconds * 1e3, dms = r.decode_seconds * 1e3;
  return {{"cache_n", r.reused},
          {"prompt_n", prompt_n},
          {"prompt_ms", pms},
          {"prompt_per_second", pms > 0 ? prompt_n * 1e3 / pms : 0.0},
          {"predicted_n", n},
          {"predicted_ms", dms},
          {"predicted_per_second", n > 1 && dms > 0 ? (n - 1) * 1e3 / dms : 0.0}};
}

}  // namespace

ServedModel ServedModel::make(std::shared_ptr<const Model> model, Tokenizer tokenizer, std::string id) {
  ServedModel m{std::move(model), std::move(tokenizer), {}, std::move(id), {}, {}};
  m.dir = m.model->dir();
  m.end_of_turn = chat::end_of_turn_ids(*m.model, m.tokenizer);
  if (!m.dir.empty())
    if (auto t = chat::ChatTemplate::from_model_dir(m.dir)) m.chat_template = std::make_shared<chat::ChatTemplate>(std::move(*t));
  return m;
}

// A checkpoint without a chat template (a base model, like the embedded
// one) has no way of its own to see tools, tool calls or tool results: the
// tools are described in the system message, calls and results written as
// text, in the Hermes style the tool-call parser reads back.
static ojson plain_tool_messages(const ojson& messages, const ojson& tools) {
  ojson out = ojson::array();
  if (!tools.empty()) {
    std::string text = "You may call one or more functions. The functions are in <tools></tools>:\n<tools>\n";
    for (const auto& t : tools) text += t.dump() + "\n";
    text += "</tools>\nTo call one, answer with <tool_call>{\"name\": NAME, \"arguments\": {...}}</tool_call>.";
    if (!messages.empty() && messages[0].value("role", "") == "system" && messages[0].contains("content") &&
        messages[0]["content"].is_string())
      text = messages[0]["content"].get<std::string>() + "\n\n" + text;
    out.push_back({{"role", "system"}, {"content", text}});
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const ojson& msg = messages[i];
    if (i == 0 && !tools.empty() && msg.value("role", "") == "system" && msg.contains("content") &&
        msg["content"].is_string())
      continue;  // merged above
    const std::string role = msg.value("role", "");
    const std::string content = msg.contains("content") && msg["content"].is_string() ? msg["content"].get<std::string>() : "";
    if (role == "tool") {
      out.push_back({{"role", "user"}, {"content", "<tool_response>\n" + content + "\n</tool_response>"}});
    } else if (role == "assistant" && msg.contains("tool_calls") && msg["tool_calls"].is_array()) {
      std::string text = content;
      for (const auto& c : msg["tool_calls"]) {
        const ojson f = c.contains("function") ? c["function"] : c;
        ojson call = {{"name", f.value("name", "")}, {"arguments", f.contains("arguments") ? f["arguments"] : ojson::object()}};
        if (call["arguments"].is_string()) {
          try {
            call["arguments"] = ojson::parse(call["arguments"].get<std::string>());
          } catch (const std::exception&) {
          }
        }
        text += (text.empty() ? "" : "\n") + std::string("<tool_call>") + call.dump() + "</tool_call>";
      }
      out.push_back({{"role", "assistant"}, {"content", text}});
    } else {
      out.push_back(msg);
    }
  }
  return out;
}

std::string render_chat(const ServedModel& m, const ojson& messages, const ojson& tools, bool add_generation_prompt) {
  try {
    if (!m.chat_template)
      return chat::render_conversation(nullptr, m.dir, *m.model, m.tokenizer, plain_tool_messages(messages, tools),
                                       ojson::array(), add_generation_prompt);
    return chat::render_conversation(m.chat_template.get(), m.dir, *m.model, m.tokenizer, messages, tools,
                                     add_generation_prompt);
  } catch (const std::exception& e) {
    // A template that raises (raise_exception, a message it cannot render)
    // is the request's problem as far as the client can act on it.
    bad_request("template_error", "the chat template failed: {}", e.what());
  }
}

std::vector<int32_t> chat_prompt_ids(const ServedModel& m, const std::string& text) {
  return chat::encode_conversation(m.tokenizer, text);
}

Job prepare_job(const ServedModel& m, CompletionRequest req, int32_t ctx) {
  Job job;
  job.ctx = ctx;
  if (req.chat) {
    job.prompt = chat_prompt_ids(m, render_chat(m, req.messages, req.tools, true));
  } else if (req.prompt_text) {
    job.prompt = m.tokenizer.encode(*req.prompt_text, true);
  } else {
    job.prompt = req.prompt_ids;
    const int32_t V = m.model->config().vocab_size;
    for (int32_t id : job.prompt)
      if (id >= V) bad_request("invalid_value", "\"prompt\": token id {} is outside the vocabulary (size {})", id, V);
  }
  if (job.prompt.empty()) bad_request("empty_prompt", "the prompt is empty");
  const int64_t P = static_cast<int64_t>(job.prompt.size());
  if (P >= ctx)
    bad_request("context_length_exceeded",
                "the prompt is {} tokens and a slot holds {}: it needs {} with one new token (raise --ctx, or shorten "
                "the prompt)",
                P, ctx, P + 1);
  job.seed = req.seed ? *req.seed : random_u64();
  job.id = (req.chat ? "chatcmpl-" : "cmpl-") + random_hex(24);
  job.created = static_cast<int64_t>(std::time(nullptr));
  job.req = std::move(req);
  return job;
}

Outcome run_job(const ServedModel& m, const Job& job, Session& s, const WriteFn& write, std::atomic<bool>& cancel,
                TurnLock* turns) {
  std::unique_lock<TurnLock> turn;
  if (turns) turn = std::unique_lock<TurnLock>(*turns);
  const CompletionRequest& req = job.req;
  const int32_t P = static_cast<int32_t>(job.prompt.size());
  ops::SamplingParams sp;
  sp.temperature = req.temperature;
  sp.top_k = req.top_k;
  sp.top_p = req.top_p;
  sp.repetition_penalty = req.repeat_penalty;
  sp.seed = job.seed;
  s.sampling() = sp;
  s.set_banned_tokens({});  // generate() bans the end tokens again only when this request ignores them

  GenerateOptions go;
  const int64_t room = static_cast<int64_t>(job.ctx) - P;  // >= 1 (prepare_job)
  go.max_tokens = static_cast<int32_t>(std::clamp<int64_t>(req.max_tokens.value_or(room), 1, job.ctx));
  go.stop = req.stop;
  go.ignore_eos = req.ignore_eos;
  if (req.chat) go.extra_eos = m.end_of_turn;
  go.cancel = &cancel;
  go.reuse_prefix = true;

  ReplyWriter out(req, job.id, job.created, m.id, req.stream ? write : WriteFn());
  out.begin();
  std::optional<std::chrono::steady_clock::time_point> first_token;
  const auto t_start = std::chrono::steady_clock::now();
  GenerateResult r = s.generate(job.prompt, &m.tokenizer, go, [&](int32_t id, std::string_view text) {
    if (id < 0) return out.tail(text);
    if (!first_token) first_token = std::chrono::steady_clock::now();
    ojson lp;
    if (req.logprobs) {
      // The distribution `id` was sampled from is the session's last logits.
      const TokenLogprob t = token_logprob(s.last_logits(), id, req.top_logprobs);
      lp = logprob_entry(m.tokenizer, id, t.logprob);
      ojson top = ojson::array();
      for (const auto& [tid, l] : t.top) top.push_back(logprob_entry(m.tokenizer, tid, l));
      lp["top_logprobs"] = std::move(top);
    }
    if (turn) turn.unlock();  // another slot may step while this token goes out
    out.token(text, std::move(lp));
    if (turn) turn.lock();
    if (out.client_gone()) cancel.store(true, std::memory_order_relaxed);  // generate() ends after this token
  });
  if (turn) turn.unlock();

  Outcome o;
  CompletionStats& st = o.stats;
  st.prompt_tokens = P;
  st.cached_tokens = r.reused;
  st.generated = static_cast<int64_t>(r.tokens.size());
  st.queue_seconds = seconds(t_start - job.received);
  st.prefill_seconds = r.prefill_seconds;
  st.decode_seconds = r.decode_seconds;
  st.ttft_seconds = first_token ? seconds(*first_token - job.received) : -1;
  st.cancelled = r.finish == FinishReason::cancelled;
  if (st.cancelled) {
    // A client that went away reads nothing more; a stream cut by shutdown
    // says so, and an unstreamed request gets 503.
    if (!req.stream) throw ApiError(503, "unavailable_error", "shutting_down", "the server is shutting down");
    if (!out.client_gone()) out.fail("the server is shutting down", "unavailable_error", "shutting_down");
    return o;
  }
  const std::string finish = r.finish == FinishReason::eos || r.finish == FinishReason::stop ? "stop" : "length";
  o.body = out.end(finish, usage_of(r, P), timings_of(r, P));
  return o;
}

std::string sse_error(const std::string& message, const std::string& type, const std::string& code) {
  return "data: " + error_body(message, type, code) + "\n\n";
}

TokenLogprob token_logprob(std::span<const float> logits, int32_t id, int top) {
  TokenLogprob t;
  t.id = id;
  if (logits.empty() || id < 0 || id >= static_cast<int32_t>(logits.size())) fail("server", "logprob of token {} out of range", id);
  const float mx = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float x : logits) sum += std::exp(static_cast<double>(x) - mx);
  const double lse = mx + std::log(sum);
  t.logprob = static_cast<float>(logits[id] - lse);
  if (top > 0) {
    std::vector<int32_t> idx(logits.size());
    std::iota(idx.begin(), idx.end(), 0);
    const size_t k = std::min<size_t>(top, idx.size());
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    for (size_t i = 0; i < k; ++i) t.top.emplace_back(idx[i], static_cast<float>(logits[idx[i]] - lse));
  }
  return t;
}

}  // namespace kvgraph::server
