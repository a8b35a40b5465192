#pragma once
// The OpenAI request bodies the server accepts, parsed and checked into one
// typed struct before any work is done. Every problem is an ApiError 400
// (invalid_request_error) naming the field: a body that is not JSON or not
// an object, a known field of the wrong type or out of range, n != 1, a
// feature kvgraph does not have (logit_bias, penalties other than 0, echo,
// suffix, a required or named tool_choice). Unknown fields are ignored, as
// the OpenAI API does with fields a client library adds.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace kvgraph::server {

using ojson = nlohmann::ordered_json;

struct CompletionRequest {
  bool chat = false;  // /v1/chat/completions (else /v1/completions)
  std::string model;  // as sent; answered with the served model's id

  // Chat: the messages, content parts flattened to strings and tool-call
  // arguments given as JSON text turned into objects (what chat templates
  // expect); tools as sent, passed to the template.
  ojson messages = ojson::array();
  ojson tools = ojson::array();
  bool parse_tool_calls = false;  // tools given and tool_choice is not "none"

  // Completions: the prompt as text (tokenized with the tokenizer's special
  // tokens) or as token ids (used as they are).
  std::optional<std::string> prompt_text;
  std::vector<int32_t> prompt_ids;

  std::optional<int64_t> max_tokens;  // max_completion_tokens, else max_tokens; none: fill the context
  float temperature = 1.0f;           // OpenAI's defaults: temperature 1, top_p 1
  float top_p = 1.0f;
  int32_t top_k = 0;                  // 0: off (llama-server extension)
  float repeat_penalty = 1.0f;        // HF repetition penalty (llama-server's repeat_penalty); 1: off
  std::optional<uint64_t> seed;       // none: a random seed per request
  std::vector<std::string> stop;      // up to 16 strings
  bool ignore_eos = false;            // llama-server extension
  bool stream = false;
  bool include_usage = false;         // stream_options.include_usage
  bool logprobs = false;
  int top_logprobs = 0;               // 0..20
};

// The body as a JSON object; 400 "invalid_json" when it is not JSON, or is
// not an object.
ojson parse_body(const std::string& body);

CompletionRequest parse_chat_request(const ojson& body);
CompletionRequest parse_completion_request(const ojson& body);

// Checked readers of optional fields, shared with the other endpoints
// (/tokenize, /detokenize, /apply-template): absent or null gives nullopt;
// the wrong type throws 400 naming `key`.
std::optional<bool> get_bool(const ojson& body, const char* key);
std::optional<std::string> get_string(const ojson& body, const char* key);
std::optional<int64_t> get_int(const ojson& body, const char* key);
// Token ids: an array of integers in [0, 2^31).
std::vector<int32_t> get_ids(const ojson& body, const char* key);

// Chat messages, checked and normalised as CompletionRequest::messages says;
// also what /apply-template reads.
ojson parse_messages(const ojson& body);
ojson parse_tools(const ojson& body);

}  // namespace kvgraph::server
