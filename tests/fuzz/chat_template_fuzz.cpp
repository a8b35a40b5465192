// libFuzzer target: a chat template through jinja::Template::parse, then a
// render of whatever parsed.
//
// Input layout: TEMPLATE [ '\0' CONTEXT_JSON ]. Without a context (or with
// one that is not a JSON object) a fixed conversation is used, so seeds that
// are plain templates render too.
//
// Contract under test: parsing and rendering either succeed or throw
// jinja::TemplateError, under limits small enough for quick executions; no
// crash, hang, leak or other exception.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include <nlohmann/json.hpp>

#include "chat/jinja.h"

namespace {

const nlohmann::ordered_json& default_context() {
  static const nlohmann::ordered_json ctx = nlohmann::ordered_json::parse(R"({
    "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi <b>\u00e9"},
                 {"role": "assistant", "content": "Hello!", "tool_calls": [{"id": "call12345", "type": "function",
                  "function": {"name": "f", "arguments": {"x": 1.5, "y": [true, null]}}}]},
                 {"role": "tool", "tool_call_id": "call12345", "content": "{\"ok\": 1}"},
                 {"role": "user", "content": "Bye"}],
    "tools": [{"type": "function", "function": {"name": "f", "description": "F.",
               "parameters": {"type": "object", "properties": {"x": {"type": "number"}}}}}],
    "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>", "enable_thinking": false})");
  return ctx;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t nul = in.find('\0');
  const std::string_view source = in.substr(0, nul);
  nlohmann::ordered_json context = default_context();
  if (nul != std::string_view::npos) {
    auto parsed = nlohmann::ordered_json::parse(in.substr(nul + 1), nullptr, /*allow_exceptions=*/false);
    if (parsed.is_object()) context = std::move(parsed);
  }
  kvgraph::chat::jinja::RenderOptions options;
  options.limits.max_steps = 200000;
  options.limits.max_output = 1 << 20;
  options.limits.max_allocated = 16 << 20;
  try {
    (void)kvgraph::chat::jinja::Template::parse(source).render(context, options);
  } catch (const kvgraph::chat::jinja::TemplateError&) {
  }
  return 0;
}
