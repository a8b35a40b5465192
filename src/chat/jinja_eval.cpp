// Walks the syntax tree with jinja2's runtime semantics: Python's operators
// and truth values, jinja2's Undefined, the sandbox's attribute rules, and
// frames that behave like jinja2's (see Scope in jinja_eval.h).
#include "chat/jinja_eval.h"

#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "chat/pystr.h"

namespace kvgraph::chat::jinja {

namespace {

// A macro bound to the scope it was defined in (macros read the variables
// of that scope when called, as jinja2's closures do).
class MacroObject : public Object {
 public:
  MacroObject(const MacroDef& def, ScopePtr closure) : def_(def), closure_(std::move(closure)) {}
  std::string type_name() const override { return "Macro"; }
  bool callable() const override { return true; }
  Value call(Interpreter& in, CallArgs& args, int) const override { return in.invoke_macro(def_, closure_, args); }
  std::optional<Value> attr(std::string_view name) const override {
    if (name == "name") return Value(def_.name);
    if (name == "catch_kwargs") return Value(def_.catch_kwargs);
    if (name == "catch_varargs") return Value(def_.catch_varargs);
    if (name == "caller") return Value(def_.uses_caller);
    if (name == "arguments") {
      std::vector<Value> names(def_.params.begin(), def_.params.end());
      return Value::list(std::move(names), true);
    }
    return std::nullopt;
  }
  std::string str() const override { return fmt::format("<Macro '{}'>", def_.name); }
  // The defining scope holds the macro: clearing it breaks the cycle.
  void release() override {
    if (closure_) closure_->vars.clear();
    closure_.reset();
  }

 private:
  const MacroDef& def_;
  ScopePtr closure_;
};

// The `loop` variable: one object per loop, advanced each iteration.
class LoopObject : public Object, public std::enable_shared_from_this<LoopObject> {
 public:
  LoopObject(std::vector<Value> items, int depth0, const Stmt* stmt, ScopePtr scope)
      : items_(std::move(items)), depth0_(depth0), stmt_(stmt), scope_(std::move(scope)) {}
  std::string type_name() const override { return "LoopContext"; }
  bool callable() const override { return stmt_->recursive && scope_; }
  Value call(Interpreter& in, CallArgs& args, int) const override {
    if (!stmt_->recursive)
      in.fail("Tried to call non recursive loop.  Maybe you forgot the 'recursive' modifier.");
    if (args.pos.size() != 1 || !args.kw.empty()) in.fail("loop() takes exactly one argument: the items to loop over");
    return in.run_recursive_loop(*stmt_, scope_, args.pos[0], depth0_ + 1);
  }
  std::optional<Value> attr(std::string_view name) const override;
  std::string str() const override { return fmt::format("<LoopContext {}/{}>", index_ + 1, items_.size()); }
  void set_index(size_t i) { index_ = i; }
  void release() override {
    items_.clear();
    scope_.reset();
    last_changed_.reset();
  }
  const std::vector<Value>& items() const { return items_; }

 private:
  friend class LoopMethod;
  std::vector<Value> items_;
  size_t index_ = 0;
  int depth0_;
  const Stmt* stmt_;
  ScopePtr scope_;
  mutable std::optional<Value> last_changed_;  // loop.changed()
};

// loop.cycle(...) and loop.changed(...).
class LoopMethod : public Object {
 public:
  LoopMethod(std::shared_ptr<const LoopObject> loop, bool cycle) : loop_(std::move(loop)), cycle_(cycle) {}
  std::string type_name() const override { return "method"; }
  bool callable() const override { return true; }
  Value call(Interpreter& in, CallArgs& args, int) const override {
    if (cycle_) {
      if (args.pos.empty()) in.fail("no items for cycling given");
      if (loop_->items_.empty()) in.fail("the loop has ended");
      return args.pos[loop_->index_ % args.pos.size()];
    }
    Value now = Value::list(args.pos, true);
    if (loop_->last_changed_ && py_equal(*loop_->last_changed_, now)) return Value(false);
    loop_->last_changed_ = now;
    return Value(true);
  }

 private:
  std::shared_ptr<const LoopObject> loop_;
  bool cycle_;
};

std::optional<Value> LoopObject::attr(std::string_view name) const {
  const int64_t n = static_cast<int64_t>(items_.size()), i = static_cast<int64_t>(index_);
  if (name == "index") return Value(i + 1);
  if (name == "index0") return Value(i);
  if (name == "revindex") return Value(n - i);
  if (name == "revindex0") return Value(n - i - 1);
  if (name == "first") return Value(i == 0);
  if (name == "last") return Value(i == n - 1);
  if (name == "length") return Value(n);
  if (name == "depth") return Value(static_cast<int64_t>(depth0_) + 1);
  if (name == "depth0") return Value(static_cast<int64_t>(depth0_));
  if (name == "previtem")
    return i > 0 ? items_[index_ - 1] : Value::undefined("there is no previous item");
  if (name == "nextitem")
    return i + 1 < n ? items_[index_ + 1] : Value::undefined("there is no next item");
  auto self = shared_from_this();
  if (name == "cycle") return Value(std::shared_ptr<Object>(std::make_shared<LoopMethod>(self, true)));
  if (name == "changed") return Value(std::shared_ptr<Object>(std::make_shared<LoopMethod>(self, false)));
  return std::nullopt;
}

bool checked_add(int64_t a, int64_t b, int64_t* r) { return !__builtin_add_overflow(a, b, r); }
bool checked_sub(int64_t a, int64_t b, int64_t* r) { return !__builtin_sub_overflow(a, b, r); }
bool checked_mul(int64_t a, int64_t b, int64_t* r) { return !__builtin_mul_overflow(a, b, r); }

// Python's float floor division and modulo (floatobject.c _float_div_mod).
void float_divmod(double vx, double wx, double* floordiv, double* mod) {
  double m = std::fmod(vx, wx);
  double div = (vx - m) / wx;
  if (m != 0.0) {
    if ((wx < 0) != (m < 0)) {
      m += wx;
      div -= 1.0;
    }
  } else {
    m = std::copysign(0.0, wx);
  }
  double fd;
  if (div != 0.0) {
    fd = std::floor(div);
    if (div - fd > 0.5) fd += 1.0;
  } else {
    fd = std::copysign(0.0, vx / wx);
  }
  *floordiv = fd;
  *mod = m;
}

std::string type_repr(const Value& v) { return fmt::format("'{}'", v.type_name()); }

}  // namespace

// ---------------------------------------------------------------------------

Interpreter::Interpreter(const RenderOptions& options) : options_(options), globals_(std::make_shared<Scope>()) {
  add_builtin_globals(*globals_);
}

Interpreter::~Interpreter() {
  for (const auto& o : objects_) o->release();
}

Interpreter::Depth::Depth(Interpreter& i) : in(i) {
  if (++in.depth_ > in.options_.limits.max_depth) {
    --in.depth_;
    in.fail_limit(fmt::format("recursion too deep: more than {} nested evaluations (a macro calling itself without end?)",
                        in.options_.limits.max_depth));
  }
}

void Interpreter::fail(const std::string& message) const { throw TemplateError(line_, message); }
void Interpreter::fail_limit(const std::string& message) const { throw TemplateLimitError(line_, message); }

void Interpreter::fail_undefined(const Value& v) const {
  const Undefined* u = v.undefined_info();
  fail(u && !u->message.empty() ? u->message : "value is undefined");
}

void Interpreter::step() {
  if (++steps_ > options_.limits.max_steps)
    fail_limit(fmt::format("the template did more than {} steps of work (an endless or huge loop?)",
                     options_.limits.max_steps));
}

void Interpreter::check_size(size_t bytes) const {
  if (bytes > options_.limits.max_output)
    fail_limit(fmt::format("a value of {} bytes exceeds the limit of {} bytes", bytes, options_.limits.max_output));
}

Value Interpreter::make_string(std::string s) {
  check_size(s.size());
  allocated_ += s.size();
  if (allocated_ > options_.limits.max_allocated)
    fail_limit(fmt::format("the template built more than {} bytes of values", options_.limits.max_allocated));
  return Value(std::move(s));
}

Value Interpreter::make_string_like(const Value& like, std::string s) {
  Value v = make_string(std::move(s));
  return like.is_markup() ? Value::markup(v.as_string()) : v;
}

Value Interpreter::make_list(std::vector<Value> items, bool tuple) {
  check_size(items.size() * sizeof(Value));
  allocated_ += items.size() * sizeof(Value);
  if (allocated_ > options_.limits.max_allocated)
    fail_limit(fmt::format("the template built more than {} bytes of values", options_.limits.max_allocated));
  return Value::list(std::move(items), tuple);
}

void Interpreter::append(std::string& out, std::string_view s) {
  if (out.size() + s.size() > options_.limits.max_output)
    fail_limit(fmt::format("the output exceeds the limit of {} bytes", options_.limits.max_output));
  out += s;
}

std::string Interpreter::render(const Ast& ast, const nlohmann::ordered_json& context) {
  if (!context.is_object()) throw TemplateError(0, "the render context must be a JSON object");
  auto ctx = std::make_shared<Scope>();
  ctx->parent = globals_;
  for (const auto& [k, v] : context.items()) ctx->vars[k] = Value::from_json(v);
  ast_ = &ast;
  auto root = frame_scope(ctx, ast.body);
  std::string out;
  exec(ast.body, root, out);
  return out;
}

// ---- statements ----

Interpreter::Flow Interpreter::exec(const Body& body, const ScopePtr& scope, std::string& out) {
  for (const auto& s : body) {
    const Flow f = exec(*s, scope, out);
    if (f != Flow::normal) return f;
  }
  return Flow::normal;
}

Interpreter::Flow Interpreter::exec(const Stmt& s, const ScopePtr& scope, std::string& out) {
  Depth depth(*this);
  step();
  line_ = s.line;
  switch (s.kind) {
    case Stmt::Kind::text: append(out, s.text); break;
    case Stmt::Kind::print: {
      const Value v = eval(*s.a, scope);
      append(out, to_string(v));
      break;
    }
    case Stmt::Kind::if_: return exec_if(s, scope, out);
    case Stmt::Kind::for_: exec_for(s, scope, out, nullptr, 0); break;
    case Stmt::Kind::set: exec_set(s, scope); break;
    case Stmt::Kind::set_block: exec_set_block(s, scope); break;
    case Stmt::Kind::macro: exec_macro(s, scope); break;
    case Stmt::Kind::call_block: exec_call_block(s, scope, out); break;
    case Stmt::Kind::filter_block: exec_filter_block(s, scope, out); break;
    case Stmt::Kind::with: exec_with(s, scope, out); break;
    case Stmt::Kind::break_: return Flow::break_;
    case Stmt::Kind::continue_: return Flow::continue_;
    case Stmt::Kind::scope: return exec(s.body, frame_scope(scope, s.body), out);
  }
  return Flow::normal;
}

Interpreter::Flow Interpreter::exec_if(const Stmt& s, const ScopePtr& scope, std::string& out) {
  for (const auto& [test, body] : s.branches) {
    if (eval(*test, scope).truthy()) return exec(body, scope, out);
  }
  return exec(s.else_body, scope, out);
}

void Interpreter::exec_for(const Stmt& s, const ScopePtr& scope, std::string& out, const Value* items_override,
                           int depth) {
  line_ = s.line;
  const Value seq = items_override ? *items_override : eval(*s.a, scope);
  std::vector<Value> items = iterate(seq);
  if (s.b) {  // {% for x in xs if cond %}: the filter sees the target, not `loop`
    std::vector<Value> kept;
    for (const Value& item : items) {
      step();
      auto f = std::make_shared<Scope>();
      f->parent = scope;
      assign(s.target, item, f);
      if (eval(*s.b, f).truthy()) kept.push_back(item);
    }
    items = std::move(kept);
  }
  auto loop = std::make_shared<LoopObject>(std::move(items), depth, &s, scope);
  track(loop);
  const Value loop_value(std::shared_ptr<Object>{loop});
  // jinja2 runs the else block unless an iteration reached the end of the
  // body: a loop left by break, or whose last iteration said continue, runs it.
  bool completed = false;
  for (size_t i = 0; i < loop->items().size(); ++i) {
    step();
    loop->set_index(i);
    auto inner = frame_scope(scope, s.body);
    assign(s.target, loop->items()[i], inner);
    inner->vars["loop"] = loop_value;
    const Flow f = exec(s.body, inner, out);
    if (f == Flow::break_) break;
    completed = f == Flow::normal;
  }
  if (!completed && !s.else_body.empty()) exec(s.else_body, frame_scope(scope, s.else_body), out);
}

Value Interpreter::run_recursive_loop(const Stmt& loop, const ScopePtr& scope, const Value& items, int depth) {
  std::string out;
  exec_for(loop, scope, out, &items, depth);
  return make_string(std::move(out));
}

ScopePtr Interpreter::frame_scope(const ScopePtr& parent, const Body& body) const {
  auto s = std::make_shared<Scope>();
  s->parent = parent;
  if (ast_)
    for (const std::string& name : ast_->locals_of(body)) s->vars[name] = Value::undefined(fmt::format("'{}' is undefined", name));
  return s;
}

void Interpreter::assign(const Target& t, const Value& v, const ScopePtr& scope) {
  if (!t.tuple) {
    scope->vars[t.names[0]] = v;
    return;
  }
  std::vector<Value> parts = iterate(v);
  if (parts.size() != t.names.size())
    fail(parts.size() > t.names.size()
             ? fmt::format("too many values to unpack (expected {})", t.names.size())
             : fmt::format("not enough values to unpack (expected {}, got {})", t.names.size(), parts.size()));
  for (size_t i = 0; i < parts.size(); ++i) scope->vars[t.names[i]] = parts[i];
}

void Interpreter::exec_set(const Stmt& s, const ScopePtr& scope) {
  Value v = eval(*s.a, scope);
  if (s.target.attr.empty()) {
    assign(s.target, v, scope);
    return;
  }
  const Value* ns = scope->find(s.target.names[0]);
  auto* obj = ns && ns->is_object() ? dynamic_cast<NamespaceObject*>(ns->object().get()) : nullptr;
  if (!obj) fail("cannot assign attribute on non-namespace object");
  obj->attrs.set(Value(s.target.attr), std::move(v));
}

void Interpreter::exec_set_block(const Stmt& s, const ScopePtr& scope) {
  auto inner = frame_scope(scope, s.body);
  std::string text;
  exec(s.body, inner, text);
  Value v = make_string(std::move(text));
  if (s.a) v = eval_filter(*s.a, scope, &v);
  if (!s.target.attr.empty()) {
    const Value* ns = scope->find(s.target.names[0]);
    auto* obj = ns && ns->is_object() ? dynamic_cast<NamespaceObject*>(ns->object().get()) : nullptr;
    if (!obj) fail("cannot assign attribute on non-namespace object");
    obj->attrs.set(Value(s.target.attr), std::move(v));
    return;
  }
  assign(s.target, v, scope);
}

void Interpreter::exec_macro(const Stmt& s, const ScopePtr& scope) {
  auto m = std::make_shared<MacroObject>(*s.macro, scope);
  track(m);
  scope->vars[s.macro->name] = Value(std::shared_ptr<Object>(std::move(m)));
}

void Interpreter::exec_call_block(const Stmt& s, const ScopePtr& scope, std::string& out) {
  const Expr& call = *s.a;
  Value callee = eval(*call.a, scope);
  CallArgs args = eval_args(call.call, scope);
  auto caller = std::make_shared<MacroObject>(*s.macro, scope);
  track(caller);
  args.kw.emplace_back("caller", Value(std::shared_ptr<Object>(std::move(caller))));
  line_ = s.line;
  append(out, to_string(this->call(callee, args)));
}

void Interpreter::exec_filter_block(const Stmt& s, const ScopePtr& scope, std::string& out) {
  auto inner = frame_scope(scope, s.body);
  std::string text;
  exec(s.body, inner, text);
  const Value body = make_string(std::move(text));
  append(out, to_string(eval_filter(*s.a, scope, &body)));
}

void Interpreter::exec_with(const Stmt& s, const ScopePtr& scope, std::string& out) {
  auto inner = frame_scope(scope, s.body);
  for (const auto& [target, value] : s.assignments) assign(target, eval(*value, scope), inner);
  exec(s.body, inner, out);
}

Value Interpreter::invoke_macro(const MacroDef& def, const ScopePtr& closure, CallArgs& args) {
  Depth depth(*this);
  step();
  auto scope = frame_scope(closure, def.body);
  const size_t n = def.params.size();
  if (args.pos.size() > n && !def.catch_varargs)
    fail(fmt::format("macro '{}' takes not more than {} argument(s)", def.name, n));
  const size_t first_default = n - def.defaults.size();
  for (size_t i = 0; i < n; ++i) {
    const std::string& p = def.params[i];
    auto kw = std::find_if(args.kw.begin(), args.kw.end(), [&](const auto& k) { return k.first == p; });
    if (i < args.pos.size()) {
      if (kw != args.kw.end()) fail(fmt::format("macro '{}' got multiple values for argument '{}'", def.name, p));
      scope->vars[p] = args.pos[i];
    } else if (kw != args.kw.end()) {
      scope->vars[p] = std::move(kw->second);
      args.kw.erase(kw);
    } else if (i >= first_default) {
      scope->vars[p] = eval(*def.defaults[i - first_default], scope);
    } else {
      scope->vars[p] = Value::undefined(fmt::format("parameter '{}' was not provided", p));
    }
  }
  if (def.uses_caller) {
    auto c = std::find_if(args.kw.begin(), args.kw.end(), [](const auto& k) { return k.first == "caller"; });
    if (c != args.kw.end()) {
      scope->vars["caller"] = std::move(c->second);
      args.kw.erase(c);
    } else {
      scope->vars["caller"] = Value::undefined("No caller defined");
    }
  }
  if (def.catch_varargs) {
    std::vector<Value> extra;
    for (size_t i = n; i < args.pos.size(); ++i) extra.push_back(args.pos[i]);
    scope->vars["varargs"] = Value::list(std::move(extra), true);
  }
  if (def.catch_kwargs) {
    auto d = std::make_shared<Dict>();
    for (auto& [k, v] : args.kw) d->set(Value(k), std::move(v));
    scope->vars["kwargs"] = Value::dict(std::move(*d));
  } else if (!args.kw.empty()) {
    fail(fmt::format("macro '{}' takes no keyword argument '{}'", def.name, args.kw.front().first));
  }
  std::string out;
  exec(def.body, scope, out);
  return make_string(std::move(out));
}

// ---- expressions ----

Value Interpreter::eval(const Expr& e, const ScopePtr& scope) {
  Depth depth(*this);
  step();
  line_ = e.line;
  switch (e.kind) {
    case Expr::Kind::literal: return e.value;
    case Expr::Kind::name: return eval_name(e, scope);
    case Expr::Kind::list:
    case Expr::Kind::tuple:
    case Expr::Kind::dict: return eval_collection(e, scope);
    case Expr::Kind::getattr: return eval_getattr(e, scope);
    case Expr::Kind::getitem: return eval_getitem(e, scope);
    case Expr::Kind::slice: fail("a slice is only valid inside []");
    case Expr::Kind::call: return eval_call(e, scope);
    case Expr::Kind::filter: return eval_filter(e, scope, nullptr);
    case Expr::Kind::test: return eval_test(e, scope);
    case Expr::Kind::neg:
    case Expr::Kind::pos: return eval_unary(e, scope);
    case Expr::Kind::not_: return Value(!eval(*e.a, scope).truthy());
    case Expr::Kind::binary: {
      const Value a = eval(*e.a, scope);
      const Value b = eval(*e.b, scope);
      line_ = e.line;
      return binary(e.name, a, b);
    }
    case Expr::Kind::concat: {
      std::string s;
      for (const auto& x : e.items) {
        s += to_string(eval(*x, scope));
        check_size(s.size());
      }
      return make_string(std::move(s));
    }
    case Expr::Kind::and_: {
      Value a = eval(*e.a, scope);
      return a.truthy() ? eval(*e.b, scope) : a;
    }
    case Expr::Kind::or_: {
      Value a = eval(*e.a, scope);
      return a.truthy() ? a : eval(*e.b, scope);
    }
    case Expr::Kind::compare: return eval_compare(e, scope);
    case Expr::Kind::cond: {
      if (eval(*e.a, scope).truthy()) return eval(*e.b, scope);
      if (e.c) return eval(*e.c, scope);
      return Value::undefined(fmt::format(
          "the inline if-expression on line {} evaluated to false and no else section was defined.", e.line));
    }
  }
  fail("internal error: unknown expression");
}

Value Interpreter::eval_name(const Expr& e, const ScopePtr& scope) {
  if (const Value* v = scope->find(e.name)) return *v;
  return Value::undefined(fmt::format("'{}' is undefined", e.name));
}

Value Interpreter::eval_collection(const Expr& e, const ScopePtr& scope) {
  if (e.kind == Expr::Kind::dict) {
    auto d = std::make_shared<Dict>();
    for (const auto& [k, v] : e.pairs) {
      Value key = eval(*k, scope);
      Value value = eval(*v, scope);
      if (!py_hashable(key)) fail(fmt::format("unhashable type: '{}'", key.type_name()));
      d->set(std::move(key), std::move(value));
    }
    return Value::dict(std::move(*d));
  }
  std::vector<Value> items;
  items.reserve(e.items.size());
  for (const auto& x : e.items) items.push_back(eval(*x, scope));
  return make_list(std::move(items), e.kind == Expr::Kind::tuple);
}

Value Interpreter::eval_unary(const Expr& e, const ScopePtr& scope) {
  const Value a = eval(*e.a, scope);
  line_ = e.line;
  if (a.is_undefined()) fail_undefined(a);
  const bool neg = e.kind == Expr::Kind::neg;
  if (a.is_integral()) {
    if (!neg) return Value(a.as_int());
    if (a.as_int() == std::numeric_limits<int64_t>::min()) fail("integer overflow");
    return Value(-a.as_int());
  }
  if (a.is_float()) return Value(neg ? -a.as_float() : a.as_float());
  fail(fmt::format("bad operand type for unary {}: '{}'", neg ? '-' : '+', a.type_name()));
}

Value Interpreter::eval_getattr(const Expr& e, const ScopePtr& scope) {
  const Value obj = eval(*e.a, scope);
  line_ = e.line;
  return get_attr(obj, e.name);
}

Value Interpreter::get_attr(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) fail_undefined(obj);
  const std::string owner = obj.is_object() ? obj.type_name() + " object" : obj.type_name() + " object";
  if (name.size() >= 2 && name[0] == '_' && name[1] == '_')  // Python's own attributes: hidden by the sandbox
    return Value::undefined(fmt::format("access to attribute '{}' of '{}' object is unsafe.", name, obj.type_name()),
                            true);
  if (obj.is_object()) {
    if (auto v = obj.object()->attr(name)) return *v;
    return Value::undefined(fmt::format("'{}' has no attribute '{}'", owner, name));
  }
  // A method of the type wins over a key of the same name, as in jinja2.
  if (auto m = builtin_method(obj, name)) return *m;
  if (obj.is_dict())
    if (const Value* v = obj.dict().find(std::string_view(name))) return *v;
  return Value::undefined(fmt::format("'{}' has no attribute '{}'", owner, name));
}

Value Interpreter::get_item(const Value& obj, const Value& key) {
  if (obj.is_undefined()) fail_undefined(obj);
  auto missing = [&]() -> Value {
    if (key.is_string()) {
      if (key.as_string().size() >= 2 && key.as_string().compare(0, 2, "__") == 0) return get_attr(obj, key.as_string());
      if (obj.is_object()) {
        if (auto v = obj.object()->attr(key.as_string())) return *v;
      } else if (auto m = builtin_method(obj, key.as_string())) {
        return *m;
      }
      return Value::undefined(fmt::format("'{} object' has no attribute '{}'", obj.type_name(), key.as_string()));
    }
    return Value::undefined(fmt::format("'{} object' has no element {}", obj.type_name(), key.repr()));
  };
  if (obj.is_dict()) {
    if (!py_hashable(key)) return missing();
    if (const Value* v = obj.dict().find(key)) return *v;
    return missing();
  }
  if (obj.view_name()) return missing();  // dict views are not subscriptable
  if ((obj.is_list() || obj.is_string()) && key.is_integral()) {
    if (obj.is_list()) {
      const auto& xs = obj.items();
      int64_t i = key.as_int();
      if (i < 0) i += static_cast<int64_t>(xs.size());
      if (i < 0 || i >= static_cast<int64_t>(xs.size())) return missing();
      return xs[static_cast<size_t>(i)];
    }
    const std::u32string u = pystr::decode(obj.as_string());
    int64_t i = key.as_int();
    if (i < 0) i += static_cast<int64_t>(u.size());
    if (i < 0 || i >= static_cast<int64_t>(u.size())) return missing();
    std::string c;
    pystr::append(c, u[static_cast<size_t>(i)]);
    return obj.is_markup() ? Value::markup(std::move(c)) : Value(std::move(c));
  }
  return missing();
}

Value Interpreter::eval_getitem(const Expr& e, const ScopePtr& scope) {
  const Value obj = eval(*e.a, scope);
  if (e.b->kind == Expr::Kind::slice) return eval_slice(obj, *e.b, scope);
  const Value key = eval(*e.b, scope);
  line_ = e.line;
  return get_item(obj, key);
}

Value Interpreter::eval_slice(const Value& obj, const Expr& slice, const ScopePtr& scope) {
  std::optional<int64_t> bound[3];
  bool bad = false;
  const Expr* parts[3] = {slice.a.get(), slice.b.get(), slice.c.get()};
  for (int k = 0; k < 3; ++k) {
    if (!parts[k]) continue;
    const Value v = eval(*parts[k], scope);
    if (v.is_integral())
      bound[k] = v.as_int();
    else if (!v.is_none())
      bad = true;
  }
  line_ = slice.line;
  // jinja2 compiles a slice to a plain Python subscript (not the sandbox's
  // getitem), so slicing what is not a sequence raises.
  if (obj.is_undefined()) fail_undefined(obj);
  if (obj.is_dict()) fail("unhashable type: 'slice'");
  if (!(obj.is_list() || obj.is_string()) || obj.view_name())
    fail(fmt::format("'{}' object is not subscriptable", obj.type_name()));
  if (bad) fail("slice indices must be integers or None or have an __index__ method");
  const int64_t step = bound[2].value_or(1);
  if (step == 0) fail("slice step cannot be zero");
  std::u32string u;
  const bool str = obj.is_string();
  if (str) u = pystr::decode(obj.as_string());
  const int64_t n = str ? static_cast<int64_t>(u.size()) : static_cast<int64_t>(obj.items().size());
  // Python's PySlice_AdjustIndices.
  auto adjust = [&](std::optional<int64_t> v, int64_t dflt, bool is_start) -> int64_t {
    if (!v) return dflt;
    int64_t x = *v;
    if (x < 0) {
      x += n;
      if (x < 0) x = step < 0 ? -1 : 0;
    } else if (x >= n) {
      x = step < 0 ? n - 1 : n;
    }
    (void)is_start;
    return x;
  };
  const int64_t start = adjust(bound[0], step < 0 ? n - 1 : 0, true);
  const int64_t stop = adjust(bound[1], step < 0 ? -1 : n, false);
  std::vector<int64_t> idx;
  if (step > 0)
    for (int64_t i = start; i < stop; i += step) idx.push_back(i);
  else
    for (int64_t i = start; i > stop; i += step) idx.push_back(i);
  if (str) {
    std::u32string r;
    for (int64_t i : idx) r.push_back(u[static_cast<size_t>(i)]);
    return make_string_like(obj, pystr::encode(r));
  }
  std::vector<Value> r;
  for (int64_t i : idx) r.push_back(obj.items()[static_cast<size_t>(i)]);
  return make_list(std::move(r), obj.is_tuple());
}

CallArgs Interpreter::eval_args(const CallSyntax& c, const ScopePtr& scope) {
  CallArgs args;
  for (const auto& p : c.pos) args.pos.push_back(eval(*p, scope));
  if (c.star)
    for (Value& v : iterate(eval(*c.star, scope))) args.pos.push_back(std::move(v));
  for (const auto& [k, v] : c.kw) args.kw.emplace_back(k, eval(*v, scope));
  if (c.dstar) {
    const Value d = eval(*c.dstar, scope);
    if (!d.is_dict()) fail(fmt::format("argument after ** must be a mapping, not {}", d.type_name()));
    for (const auto& [k, v] : d.dict().items) {
      if (!k.is_string()) fail("keywords must be strings");
      args.kw.emplace_back(k.as_string(), v);
    }
  }
  return args;
}

Value Interpreter::eval_call(const Expr& e, const ScopePtr& scope) {
  const Value callee = eval(*e.a, scope);
  CallArgs args = eval_args(e.call, scope);
  line_ = e.line;
  return call(callee, args);
}

Value Interpreter::call(const Value& callee, CallArgs& args) {
  if (callee.is_undefined()) fail_undefined(callee);
  if (!callee.is_object() || !callee.object()->callable())
    fail(fmt::format("'{}' object is not callable", callee.type_name()));
  const int line = line_;
  Value r = callee.object()->call(*this, args, line);
  line_ = line;
  return r;
}

Value Interpreter::eval_filter(const Expr& e, const ScopePtr& scope, const Value* hole) {
  const Value input = e.a ? (e.a->kind == Expr::Kind::filter ? eval_filter(*e.a, scope, hole) : eval(*e.a, scope))
                          : (hole ? *hole : Value());
  CallArgs args = eval_args(e.call, scope);
  line_ = e.line;
  return filter(e.name, input, args);
}

Value Interpreter::eval_test(const Expr& e, const ScopePtr& scope) {
  const Value input = eval(*e.a, scope);
  CallArgs args = eval_args(e.call, scope);
  line_ = e.line;
  return Value(test(e.name, input, args));
}

Value Interpreter::filter(const std::string& name, const Value& input, CallArgs& args) {
  const auto& filters = builtin_filters();
  auto it = filters.find(name);
  if (it == filters.end()) fail(fmt::format("No filter named '{}'.", name));
  step();
  const int line = line_;
  Value r = it->second(*this, input, args);
  line_ = line;
  return r;
}

bool Interpreter::test(const std::string& name, const Value& input, CallArgs& args) {
  const auto& tests = builtin_tests();
  auto it = tests.find(name);
  if (it == tests.end()) fail(fmt::format("No test named '{}'.", name));
  step();
  return it->second(*this, input, args);
}

bool Interpreter::has_filter(const std::string& name) const { return builtin_filters().count(name) > 0; }
bool Interpreter::has_test(const std::string& name) const { return builtin_tests().count(name) > 0; }

Value Interpreter::eval_compare(const Expr& e, const ScopePtr& scope) {
  Value left = eval(*e.a, scope);
  for (size_t i = 0; i < e.ops.size(); ++i) {
    Value right = eval(*e.items[i], scope);
    line_ = e.line;
    const std::string& op = e.ops[i];
    bool ok;
    if (op == "==") {
      ok = py_equal(left, right);
    } else if (op == "!=") {
      ok = !py_equal(left, right);
    } else if (op == "in" || op == "notin") {
      ok = contains(right, left) == (op == "in");
    } else {
      if (left.is_undefined()) fail_undefined(left);
      if (right.is_undefined()) fail_undefined(right);
      auto c = py_compare(left, right);
      if (!c) fail(fmt::format("'{}' not supported between instances of {} and {}", op, type_repr(left), type_repr(right)));
      if (*c == 2) {
        ok = false;  // NaN
      } else {
        ok = op == "<" ? *c < 0 : op == "<=" ? *c <= 0 : op == ">" ? *c > 0 : *c >= 0;
      }
    }
    if (!ok) return Value(false);
    left = std::move(right);
  }
  return Value(true);
}

bool Interpreter::contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::undefined: return false;  // iterates as empty
    case Value::Kind::string:
      if (!item.is_string())
        fail(fmt::format("'in <string>' requires string as left operand, not {}", item.type_name()));
      return container.as_string().find(item.as_string()) != std::string::npos;
    case Value::Kind::list:
      for (const Value& x : container.items()) {
        step();
        if (py_equal(x, item)) return true;
      }
      return false;
    case Value::Kind::dict:
      if (!py_hashable(item)) fail(fmt::format("unhashable type: '{}'", item.type_name()));
      return container.dict().find(item) != nullptr;
    case Value::Kind::object:
      if (auto* it = dynamic_cast<IteratorObject*>(container.object().get())) return it->take_until(*this, item);
      if (dynamic_cast<const LoopObject*>(container.object().get())) {
        for (const Value& x : iterate(container))
          if (py_equal(x, item)) return true;
        return false;
      }
      fail(fmt::format("argument of type '{}' is not iterable", container.type_name()));
    default: fail(fmt::format("argument of type '{}' is not iterable", container.type_name()));
  }
}

std::vector<Value> Interpreter::iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::undefined: return {};
    case Value::Kind::list: return v.items();
    case Value::Kind::dict: {
      std::vector<Value> keys;
      keys.reserve(v.dict().items.size());
      for (const auto& kv : v.dict().items) keys.push_back(kv.first);
      return keys;
    }
    case Value::Kind::string: {
      std::vector<Value> chars;
      for (char32_t c : pystr::decode(v.as_string())) {
        std::string s;
        pystr::append(s, c);
        chars.emplace_back(std::move(s));
      }
      return chars;
    }
    case Value::Kind::object:
      if (auto* it = dynamic_cast<IteratorObject*>(v.object().get())) return it->take(*this);
      if (auto* loop = dynamic_cast<const LoopObject*>(v.object().get())) return loop->items();
      [[fallthrough]];
    default: fail(fmt::format("'{}' object is not iterable", v.type_name()));
  }
}

std::string IteratorObject::str() const {
  // Python prints the object's address; this one has as many digits.
  const auto addr = reinterpret_cast<uintptr_t>(this) & 0xFFFFFFFFFFFFu;
  return function_.empty() ? fmt::format("<{} object at 0x{:012x}>", type_, addr)
                           : fmt::format("<{} object {} at 0x{:012x}>", type_, function_, addr);
}

void IteratorObject::check(Interpreter& in) const {
  if (error_) throw *error_;
  (void)in;
}

std::vector<Value> IteratorObject::take(Interpreter& in) {
  check(in);
  std::vector<Value> rest(items_.begin() + static_cast<std::ptrdiff_t>(pos_), items_.end());
  pos_ = items_.size();
  return rest;
}

std::optional<Value> IteratorObject::next(Interpreter& in) {
  check(in);
  if (pos_ >= items_.size()) return std::nullopt;
  return items_[pos_++];
}

bool IteratorObject::take_until(Interpreter& in, const Value& x) {
  check(in);
  while (pos_ < items_.size()) {
    in.step();
    if (py_equal(items_[pos_++], x)) return true;
  }
  return false;
}

std::string Interpreter::to_string(const Value& v) { return v.str(); }

Value Interpreter::binary(std::string_view op, const Value& a, const Value& b) {
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  auto unsupported = [&]() -> Value {
    fail(fmt::format("unsupported operand type(s) for {}: '{}' and '{}'", op, a.type_name(), b.type_name()));
  };
  auto overflow = [&]() -> Value { fail("integer overflow (the template's integers are 64-bit)"); };
  if (a.is_number() && b.is_number()) {
    const bool ints = a.is_integral() && b.is_integral();
    if (ints) {
      const int64_t x = a.as_int(), y = b.as_int();
      int64_t r = 0;
      if (op == "+") return checked_add(x, y, &r) ? Value(r) : overflow();
      if (op == "-") return checked_sub(x, y, &r) ? Value(r) : overflow();
      if (op == "*") return checked_mul(x, y, &r) ? Value(r) : overflow();
      if (op == "/") {
        if (y == 0) fail("division by zero");
        return Value(static_cast<double>(x) / static_cast<double>(y));
      }
      if (op == "//" || op == "%") {
        if (y == 0) fail("integer division or modulo by zero");
        if (x == std::numeric_limits<int64_t>::min() && y == -1) return op == "%" ? Value(int64_t{0}) : overflow();
        int64_t q = x / y, m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) {
          m += y;
          q -= 1;
        }
        return Value(op == "//" ? q : m);
      }
      if (op == "**") {
        if (y < 0) {
          if (x == 0) fail("0.0 cannot be raised to a negative power");
          return Value(std::pow(static_cast<double>(x), static_cast<double>(y)));
        }
        int64_t result = 1, base = x, e = y;
        while (e > 0) {
          if (e & 1)
            if (!checked_mul(result, base, &result)) return overflow();
          e >>= 1;
          if (e > 0 && !checked_mul(base, base, &base)) return overflow();
        }
        return Value(result);
      }
    }
    const double x = a.as_float(), y = b.as_float();
    if (op == "+") return Value(x + y);
    if (op == "-") return Value(x - y);
    if (op == "*") return Value(x * y);
    if (op == "/") {
      if (y == 0) fail("float division by zero");
      return Value(x / y);
    }
    if (op == "//" || op == "%") {
      if (y == 0) fail(op == "%" ? "float modulo" : "float floor division by zero");
      double fd = 0, m = 0;
      float_divmod(x, y, &fd, &m);
      return Value(op == "//" ? fd : m);
    }
    if (op == "**") {
      if (x == 0 && y < 0) fail("0.0 cannot be raised to a negative power");
      if (x < 0 && y != std::floor(y)) fail("complex results are not supported");
      return Value(std::pow(x, y));
    }
    return unsupported();
  }
  if (op == "+") {
    if (a.is_string() && b.is_string()) {
      check_size(a.as_string().size() + b.as_string().size());
      if (a.is_markup() || b.is_markup()) {  // Markup + str escapes the str
        auto esc = [](const Value& v) { return v.is_markup() ? v.as_string() : html_escape(v.as_string()); };
        const Value r = make_string(esc(a) + esc(b));
        return Value::markup(r.as_string());
      }
      return make_string(a.as_string() + b.as_string());
    }
    if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
      std::vector<Value> r = a.items();
      r.insert(r.end(), b.items().begin(), b.items().end());
      return make_list(std::move(r), a.is_tuple());
    }
    if (a.is_string()) fail(fmt::format("can only concatenate str (not \"{}\") to str", b.type_name()));
    if (a.is_list() && !a.is_tuple())
      fail(fmt::format("can only concatenate list (not \"{}\") to list", b.type_name()));
    return unsupported();
  }
  if (op == "*" && ((a.is_integral() && (b.is_string() || b.is_list())) || (b.is_integral() && (a.is_string() || a.is_list())))) {
    const Value& seq = a.is_integral() ? b : a;
    const int64_t n = std::max<int64_t>(0, (a.is_integral() ? a : b).as_int());
    if (seq.is_string()) {
      const size_t len = seq.as_string().size();
      if (len && static_cast<uint64_t>(n) > options_.limits.max_output / len) check_size(options_.limits.max_output + 1);
      std::string r;
      r.reserve(len * static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) r += seq.as_string();
      return make_string_like(seq, std::move(r));
    }
    const size_t len = seq.items().size();
    if (len && static_cast<uint64_t>(n) > options_.limits.max_output / (len * sizeof(Value)))
      check_size(options_.limits.max_output + 1);
    std::vector<Value> r;
    for (int64_t i = 0; i < n; ++i) r.insert(r.end(), seq.items().begin(), seq.items().end());
    return make_list(std::move(r), seq.is_tuple());
  }
  if (op == "%" && a.is_string()) return make_string_like(a, percent_format(*this, a.as_string(), b, a.is_markup()));
  return unsupported();
}

// ---- Template ----

namespace {

// jinja2 reports an unknown filter or test when it compiles the template,
// except inside an `if` (statement or expression) of the same frame, where
// it fails only if reached. Loops, macros and blocks open a new frame.
void check_names(const Expr* e, bool soft);
void check_names(const Body& body, bool soft);

void check_call(const CallSyntax& c, bool soft) {
  for (const auto& p : c.pos) check_names(p.get(), soft);
  for (const auto& [k, v] : c.kw) check_names(v.get(), soft);
  check_names(c.star.get(), soft);
  check_names(c.dstar.get(), soft);
}

void check_names(const Expr* e, bool soft) {
  if (!e) return;
  if (e->kind == Expr::Kind::cond) soft = true;
  if (!soft && e->kind == Expr::Kind::filter && !builtin_filters().count(e->name))
    throw TemplateError(e->line, fmt::format("No filter named '{}'.", e->name));
  if (!soft && e->kind == Expr::Kind::test && !builtin_tests().count(e->name))
    throw TemplateError(e->line, fmt::format("No test named '{}'.", e->name));
  check_names(e->a.get(), soft);
  check_names(e->b.get(), soft);
  check_names(e->c.get(), soft);
  for (const auto& x : e->items) check_names(x.get(), soft);
  for (const auto& [k, v] : e->pairs) {
    check_names(k.get(), soft);
    check_names(v.get(), soft);
  }
  check_call(e->call, soft);
}

void check_names(const Body& body, bool soft) {
  for (const auto& s : body) {
    switch (s->kind) {
      case Stmt::Kind::if_:
        for (const auto& [test, b] : s->branches) {
          check_names(test.get(), true);
          check_names(b, true);
        }
        check_names(s->else_body, true);
        break;
      case Stmt::Kind::for_:
        check_names(s->a.get(), soft);
        check_names(s->b.get(), false);
        check_names(s->body, false);
        check_names(s->else_body, false);
        break;
      case Stmt::Kind::macro:
      case Stmt::Kind::call_block:
        for (const auto& d : s->macro->defaults) check_names(d.get(), false);
        check_names(s->macro->body, false);
        check_names(s->a.get(), soft);
        break;
      case Stmt::Kind::with:
        for (const auto& [t, v] : s->assignments) check_names(v.get(), soft);
        check_names(s->body, false);
        break;
      default:
        check_names(s->a.get(), soft);
        check_names(s->b.get(), soft);
        check_names(s->body, s->kind == Stmt::Kind::scope ? soft : false);
    }
  }
}

}  // namespace

TemplateError::TemplateError(int line, const std::string& message, const std::string& origin)
    : Error(fmt::format("[chat_template] {}{}{}", origin, origin.empty() || line <= 0 ? "" : " ",
                        line > 0 ? fmt::format("line {}: {}", line, message)
                                 : (origin.empty() ? message : ": " + message))),
      line_(line),
      message_(message) {}

Template Template::parse(std::string_view source) {
  auto ast = jinja::parse(source);
  check_names(ast->body, false);
  return Template(std::move(ast));
}

std::string Template::render(const nlohmann::ordered_json& context, const RenderOptions& options) const {
  Interpreter in(options);
  try {
    return in.render(*ast_, context);
  } catch (const TemplateError&) {
    throw;
  } catch (const std::bad_alloc&) {
    throw TemplateError(in.line(), "out of memory");
  } catch (const std::exception& e) {
    throw TemplateError(in.line(), e.what());
  }
}

}  // namespace kvgraph::chat::jinja
