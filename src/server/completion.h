#pragma once
// A completion request run on a slot's session and answered in OpenAI's
// shapes: a chat.completion / text_completion object, or the SSE stream of
// chunks ("data: {json}\n\n" ... "data: [DONE]\n\n"). Socket-free: the HTTP
// layer (server.cpp) hands in a WriteFn, and tests can too.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "chat/chat_template.h"
#include "kvgraph/model.h"
#include "kvgraph/session.h"
#include "kvgraph/tokenizer.h"
#include "server/metrics.h"
#include "server/request.h"
#include "server/slots.h"
#include "server/tool_calls.h"

namespace kvgraph::server {

// The loaded model as the server serves it.
struct ServedModel {
  std::shared_ptr<const Model> model;
  Tokenizer tokenizer;
  std::filesystem::path dir;  // where the chat template is read from
  std::string id;             // GET /v1/models, and "model" in every response
  // End-of-turn tokens (chat::end_of_turn_ids: <|im_end|>, <|eot_id|>, ...,
  // those the vocabulary has): chat replies end on them as on EOS.
  std::vector<int32_t> end_of_turn;
  // The checkpoint's chat template, read and parsed once at load; null when
  // it ships none (the per-family format is used).
  std::shared_ptr<const chat::ChatTemplate> chat_template;

  // Reads the chat template too: a malformed one (or a tokenizer_config.json
  // that cannot be read) is a load error, not a 400 on every chat request.
  static ServedModel make(std::shared_ptr<const Model> model, Tokenizer tokenizer, std::string id);
};

// The conversation as the checkpoint's chat template renders it; a template
// that fails is a 400 ("template_error").
std::string render_chat(const ServedModel& m, const ojson& messages, const ojson& tools, bool add_generation_prompt);
// The rendered text's ids (chat::encode_conversation: special tokens written
// in the text are matched, nothing is added, as transformers encodes a
// rendered chat; the template or the per-family format writes the BOS).
std::vector<int32_t> chat_prompt_ids(const ServedModel& m, const std::string& text);

// A request made ready to run: its prompt ids, checked against the model's
// vocabulary and the slot's context.
struct Job {
  CompletionRequest req;
  std::vector<int32_t> prompt;
  uint64_t seed = 0;    // the request's, or drawn at random
  int32_t ctx = 0;      // tokens a slot holds
  std::string id;       // "chatcmpl-<hex>" / "cmpl-<hex>"
  int64_t created = 0;  // unix seconds
  std::chrono::steady_clock::time_point received = std::chrono::steady_clock::now();
};

// Renders and tokenizes; 400 for an empty prompt, an id outside the
// vocabulary, or a prompt that leaves no room for one new token in `ctx`
// ("context_length_exceeded").
Job prepare_job(const ServedModel& m, CompletionRequest req, int32_t ctx);

// Writes bytes of a stream to the client; false once the client is gone.
using WriteFn = std::function<bool(std::string_view)>;

// Turns a completion's generated text into OpenAI objects: stream chunks
// written through WriteFn as they become final, or the one response body.
// Tool calls (chat requests with tools) are parsed out of the text here.
// Session-free, so the shapes can be checked with any text.
class ReplyWriter {
 public:
  // `write` is used for streams only (may be empty otherwise).
  ReplyWriter(const CompletionRequest& req, std::string id, int64_t created, std::string model, WriteFn write);
  // Stream: the first chunk (chat: the assistant role, empty content).
  void begin();
  // One generated token: the text that became final with it (often "") and,
  // when logprobs were asked for, its entry {"token", "logprob", "bytes",
  // "top_logprobs"}. A token that shows nothing still writes an SSE comment,
  // so a client that left is noticed at that token.
  void token(std::string_view text, ojson logprob);
  // Text released after the last token (bytes generation held back).
  void tail(std::string_view text);
  // The end. Stream: the last chunk (finish_reason, timings), the usage
  // chunk (stream_options.include_usage), [DONE]; returns "". Otherwise
  // returns the response body. `finish` ("stop" or "length") becomes
  // "tool_calls" when a call was parsed.
  std::string end(std::string finish, const ojson& usage, const ojson& timings);
  // A stream cut short: an error event, then [DONE].
  void fail(const std::string& message, const std::string& type, const std::string& code);
  bool client_gone() const { return gone_; }

 private:
  ojson base(const char* object) const;
  ojson chunk(ojson delta, std::optional<std::string> finish);
  void send(const ojson& j);
  void write(const std::string& bytes);
  void piece(std::string_view text);
  void handle(std::vector<ToolEvent> events);
  ojson legacy_logprobs(const ojson& entries);  // /v1/completions' parallel arrays

  const CompletionRequest& req_;
  std::string id_;
  int64_t created_;
  std::string model_;
  WriteFn write_;
  std::optional<ToolCallParser> parser_;
  bool gone_ = false, wrote_ = false;
  std::string content_;
  ojson calls_ = ojson::array();
  int n_calls_ = 0;
  ojson logprobs_ = ojson::array(), pending_logprobs_ = ojson::array();
  int64_t text_offset_ = 0;
};

struct Outcome {
  std::string body;  // the JSON response; empty for a stream (written through WriteFn)
  CompletionStats stats;
};

// Runs the job on `s` (whose previous tokens are kept as far as they match
// the prompt). Everything a request sets (sampling, seed, banned tokens, stop
// strings) is set here for this request alone. A stream ends at the first
// failed write (within one token: `cancel` is set and generation polls it
// after each token); `cancel` set from outside (shutdown) ends it too. Errors
// of the session propagate: the caller resets the slot.
// `turns` (CUDA; see TurnLock): held while the session works, given up while
// each token is written.
Outcome run_job(const ServedModel& m, const Job& job, Session& s, const WriteFn& write, std::atomic<bool>& cancel,
                TurnLock* turns = nullptr);

// The SSE frame of an error object, for a stream that fails after it began.
std::string sse_error(const std::string& message, const std::string& type, const std::string& code);

// Log-probabilities of one sampled token under the model's distribution
// (log-softmax of the raw logits, before temperature and top-k/top-p), and
// the `top` most likely tokens, most likely first.
struct TokenLogprob {
  int32_t id = -1;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;
};
TokenLogprob token_logprob(std::span<const float> logits, int32_t id, int top);

}  // namespace kvgraph::server
