#pragma once
// A Jinja interpreter for Hugging Face chat templates: the subset of jinja2
// those templates use, rendered as transformers renders them
// (ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks, the
// loop-controls extension, `{% generation %}` blocks, a tojson that does not
// escape HTML, raise_exception and strftime_now). Output is meant to be byte
// for byte what Python's jinja2 gives for the same template and variables.
//
//   auto t = jinja::Template::parse(source);          // TemplateError on a syntax error
//   std::string text = t.render(context_json);        // TemplateError on a runtime error
//
// Sandbox: a template sees only its variables, dict keys, and the listed str /
// dict / list methods; no file, import or attribute access beyond that.
// Recursion, work and output are bounded (RenderLimits), so any template
// text ends in a result or one TemplateError.
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "kvgraph/error.h"

namespace kvgraph::chat::jinja {

// A syntax or runtime error of a template; what() is
// "[chat_template] ORIGIN line N: message" (no origin when not given, no line
// when unknown: 0).
class TemplateError : public Error {
 public:
  TemplateError(int line, const std::string& message, const std::string& origin = "");
  int line() const { return line_; }
  const std::string& message() const { return message_; }  // without the prefix

 private:
  int line_;
  std::string message_;
};

// A render stopped by RenderLimits (steps, depth, sizes).
class TemplateLimitError : public TemplateError {
 public:
  using TemplateError::TemplateError;
};

struct RenderLimits {
  int64_t max_steps = 5'000'000;       // statements, expressions and loop iterations evaluated
  int max_depth = 400;                 // nesting of evaluation (macro recursion included)
  size_t max_output = 32u << 20;       // bytes of output, and of any one string or list built
  size_t max_allocated = 256u << 20;   // bytes of strings and list items built in all
};

struct RenderOptions {
  RenderLimits limits;
  // The time strftime_now formats (local time); nullopt: now. Tests fix it.
  std::optional<std::chrono::system_clock::time_point> now;
};

struct Ast;  // jinja_ast.h

class Template {
 public:
  static Template parse(std::string_view source);
  // `context` must be a JSON object: its keys are the template's variables.
  std::string render(const nlohmann::ordered_json& context, const RenderOptions& options = {}) const;

 private:
  explicit Template(std::shared_ptr<const Ast> ast) : ast_(std::move(ast)) {}
  std::shared_ptr<const Ast> ast_;  // immutable: one Template renders from several threads at once
};

}  // namespace kvgraph::chat::jinja
