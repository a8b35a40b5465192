#pragma once
// The evaluator of a parsed template (jinja_eval.cpp) and the built-in
// filters, tests, globals and methods (jinja_builtins.cpp) it calls.
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "chat/jinja.h"
#include "chat/jinja_ast.h"
#include "chat/jinja_value.h"

namespace kvgraph::chat::jinja {

// A variable scope. A for-loop iteration, a macro call and {% with %} open
// one whose parent is the enclosing scope; {% set %} writes the innermost,
// names are read up the chain (which is how jinja2's frames behave: a
// variable set in a loop body is gone after the loop).
struct Scope {
  std::unordered_map<std::string, Value> vars;
  std::shared_ptr<Scope> parent;
  const Value* find(const std::string& name) const {
    for (const Scope* s = this; s; s = s->parent.get()) {
      auto it = s->vars.find(name);
      if (it != s->vars.end()) return &it->second;
    }
    return nullptr;
  }
};
using ScopePtr = std::shared_ptr<Scope>;

class Interpreter {
 public:
  explicit Interpreter(const RenderOptions& options);
  ~Interpreter();
  Interpreter(const Interpreter&) = delete;
  Interpreter& operator=(const Interpreter&) = delete;
  std::string render(const Ast& ast, const nlohmann::ordered_json& context);

  // ---- for the built-ins ----
  [[noreturn]] void fail(const std::string& message) const;
  [[noreturn]] void fail_limit(const std::string& message) const;  // TemplateLimitError
  // Raises the Undefined's error (UndefinedError, or SecurityError for a hidden attribute).
  [[noreturn]] void fail_undefined(const Value& v) const;
  void step();                                   // one unit of work against max_steps
  void check_size(size_t bytes) const;           // a string or list about to be built (max_output)
  Value make_string(std::string s);              // checked and counted
  // `s` as a Markup when `like` is one (markupsafe's methods keep Markup).
  Value make_string_like(const Value& like, std::string s);
  Value make_list(std::vector<Value> items, bool tuple = false);
  const RenderOptions& options() const { return options_; }
  // Objects that may hold references back to their scope (see Object::release).
  void track(std::shared_ptr<Object> o) { objects_.push_back(std::move(o)); }

  // Python-level operations the filters share.
  std::vector<Value> iterate(const Value& v);                       // for x in v
  Value get_attr(const Value& obj, const std::string& name);        // obj.name (sandboxed)
  Value get_item(const Value& obj, const Value& key);               // obj[key]
  Value call(const Value& callee, CallArgs& args);
  Value filter(const std::string& name, const Value& input, CallArgs& args);
  bool test(const std::string& name, const Value& input, CallArgs& args);
  bool has_filter(const std::string& name) const;
  bool has_test(const std::string& name) const;
  bool contains(const Value& container, const Value& item);         // item in container
  Value binary(std::string_view op, const Value& a, const Value& b);
  std::string to_string(const Value& v);  // str(v), Undefined as ""
  int line() const { return line_; }

  // Runs a macro (MacroObject::call).
  Value invoke_macro(const MacroDef& def, const ScopePtr& closure, CallArgs& args);
  // Runs a recursive loop's body over `items` (loop(items)).
  Value run_recursive_loop(const Stmt& loop, const ScopePtr& scope, const Value& items, int depth);

 private:
  enum class Flow { normal, break_, continue_ };
  struct Depth {
    Interpreter& in;
    explicit Depth(Interpreter& i);
    ~Depth() { --in.depth_; }
  };

  Flow exec(const Body& body, const ScopePtr& scope, std::string& out);
  Flow exec(const Stmt& s, const ScopePtr& scope, std::string& out);
  Flow exec_if(const Stmt& s, const ScopePtr& scope, std::string& out);
  void exec_for(const Stmt& s, const ScopePtr& scope, std::string& out, const Value* items_override, int depth);
  void exec_set(const Stmt& s, const ScopePtr& scope);
  void exec_set_block(const Stmt& s, const ScopePtr& scope);
  void exec_macro(const Stmt& s, const ScopePtr& scope);
  void exec_call_block(const Stmt& s, const ScopePtr& scope, std::string& out);
  void exec_filter_block(const Stmt& s, const ScopePtr& scope, std::string& out);
  void exec_with(const Stmt& s, const ScopePtr& scope, std::string& out);
  void assign(const Target& t, const Value& v, const ScopePtr& scope);
  // A new scope for the frame `body` (its assigned-first names start undefined).
  ScopePtr frame_scope(const ScopePtr& parent, const Body& body) const;
  void append(std::string& out, std::string_view s);

  Value eval(const Expr& e, const ScopePtr& scope);
  Value eval_name(const Expr& e, const ScopePtr& scope);
  Value eval_getattr(const Expr& e, const ScopePtr& scope);
  Value eval_getitem(const Expr& e, const ScopePtr& scope);
  Value eval_slice(const Value& obj, const Expr& slice, const ScopePtr& scope);
  Value eval_call(const Expr& e, const ScopePtr& scope);
  Value eval_filter(const Expr& e, const ScopePtr& scope, const Value* hole);
  Value eval_test(const Expr& e, const ScopePtr& scope);
  Value eval_compare(const Expr& e, const ScopePtr& scope);
  Value eval_collection(const Expr& e, const ScopePtr& scope);
  Value eval_unary(const Expr& e, const ScopePtr& scope);
  CallArgs eval_args(const CallSyntax& c, const ScopePtr& scope);

  RenderOptions options_;
  int line_ = 0;
  int depth_ = 0;
  int64_t steps_ = 0;
  size_t allocated_ = 0;
  ScopePtr globals_;
  const Ast* ast_ = nullptr;
  std::vector<std::shared_ptr<Object>> objects_;  // released when the render ends
};

// ---- jinja_builtins.cpp ----
using FilterFn = Value (*)(Interpreter&, const Value&, CallArgs&);
using TestFn = bool (*)(Interpreter&, const Value&, CallArgs&);
const std::unordered_map<std::string, FilterFn>& builtin_filters();
const std::unordered_map<std::string, TestFn>& builtin_tests();
// range, dict, namespace, cycler, joiner, raise_exception, strftime_now.
void add_builtin_globals(Scope& globals);
// The method `name` of a str, list, tuple or dict value as a bound method;
// nullopt when that type has no such attribute; an unsafe Undefined for the
// mutating methods the immutable sandbox hides (list.append, dict.update, ...).
std::optional<Value> builtin_method(const Value& self, const std::string& name);
// Python's `str % args` (printf-style formatting) and str.format.
// With `escape_args` (a Markup format string) each argument's text is
// HTML-escaped unless it is Markup itself, as markupsafe does.
std::string percent_format(Interpreter& in, const std::string& fmt, const Value& args, bool escape_args = false);

// A lazy iterator, which is what jinja2's select, reject, selectattr,
// rejectattr, map, unique, items, batch and slice filters return (Python
// generators) and what reverse gives for a list. It behaves as one: always
// true (even when empty), single-use (a second loop over it sees what the
// first left), no len(), not subscriptable, and printed as Python prints it.
// Its items are computed at once; an error doing so is raised only when it
// is iterated, as the generator would.
class IteratorObject : public Object {
 public:
  // `python_type` "generator", "list_reverseiterator", ...; `function` the
  // generator's function in jinja2 ("select_or_reject"), or empty.
  IteratorObject(std::string python_type, std::string function, std::vector<Value> items)
      : type_(std::move(python_type)), function_(std::move(function)), items_(std::move(items)) {}
  IteratorObject(std::string python_type, std::string function, const TemplateError& error)
      : type_(std::move(python_type)), function_(std::move(function)), error_(error) {}
  std::string type_name() const override { return type_; }
  std::string str() const override;
  void release() override { items_.clear(); }
  std::vector<Value> take(Interpreter& in);          // all that is left
  std::optional<Value> next(Interpreter& in);        // nullopt at the end
  bool take_until(Interpreter& in, const Value& x);  // Python's `x in it`

 private:
  void check(Interpreter& in) const;
  std::string type_, function_;
  std::vector<Value> items_;
  size_t pos_ = 0;
  std::optional<TemplateError> error_;
};

// namespace(): the one mutable value.
class NamespaceObject : public Object {
 public:
  std::string type_name() const override { return "Namespace"; }
  std::optional<Value> attr(std::string_view name) const override;
  std::string str() const override;
  void release() override { attrs.items.clear(); }
  Dict attrs;
};

}  // namespace kvgraph::chat::jinja
