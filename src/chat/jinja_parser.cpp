// Recursive-descent parser with jinja2's grammar and precedence (parser.py):
//   condexpr: or ['if' or ['else' condexpr]]
//   or: and ('or' and)*        and: not ('and' not)*      not: 'not' not | compare
//   compare: math1 (('=='|'!='|'<'|'<='|'>'|'>='|'in'|'not' 'in') math1)*
//   math1: concat (('+'|'-') concat)*     concat: math2 ('~' math2)*
//   math2: pow (('*'|'/'|'//'|'%') pow)*  pow: unary ('**' unary)*
//   unary: ('-'|'+') unary-without-filters | primary, then postfix (.x [x] (args)),
//          then filters and tests (|f(args), is [not] t args)
// so `a + b|trim` filters b alone and `not x is defined` is `not (x is defined)`.
#include <map>
#include <set>

#include <fmt/format.h>

#include "chat/jinja.h"
#include "chat/jinja_ast.h"
#include "chat/jinja_lexer.h"

namespace kvgraph::chat::jinja {

namespace {

constexpr int kMaxNesting = 200;  // brackets, operators and blocks inside one another

std::unique_ptr<Expr> make(Expr::Kind k, int line) {
  auto e = std::make_unique<Expr>();
  e->kind = k;
  e->line = line;
  return e;
}

std::unique_ptr<Stmt> make_stmt(Stmt::Kind k, int line) {
  auto s = std::make_unique<Stmt>();
  s->kind = k;
  s->line = line;
  return s;
}

std::string describe(const Token& t) {
  switch (t.type) {
    case TokenType::data: return "template data";
    case TokenType::var_begin: return "begin of print statement";
    case TokenType::var_end: return "end of print statement";
    case TokenType::block_begin: return "begin of statement block";
    case TokenType::block_end: return "end of statement block";
    case TokenType::eof: return "end of template";
    case TokenType::string: return "string";
    case TokenType::integer: return "integer";
    case TokenType::floating: return "float";
    default: return t.text;
  }
}

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : t_(std::move(tokens)) {}

  std::shared_ptr<Ast> run() {
    auto ast = std::make_shared<Ast>();
    ast->body = subparse({});
    if (cur().type != TokenType::eof) fail(fmt::format("unexpected '{}'", describe(cur())));
    return ast;
  }

 private:
  // ---- tokens ----
  const Token& cur() const { return t_[i_]; }
  const Token& look() const { return t_[std::min(i_ + 1, t_.size() - 1)]; }
  const Token& next() {
    const Token& t = t_[i_];
    if (i_ + 1 < t_.size()) ++i_;
    return t;
  }
  bool is_name(std::string_view kw) const { return cur().type == TokenType::name && cur().text == kw; }
  bool is_op(std::string_view op) const { return cur().type == TokenType::op && cur().text == op; }
  bool skip_name(std::string_view kw) {
    if (!is_name(kw)) return false;
    next();
    return true;
  }
  bool skip_op(std::string_view op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  [[noreturn]] void fail(const std::string& msg, int line = 0) const {
    throw TemplateError(line ? line : cur().line, msg);
  }
  void expect_op(std::string_view op) {
    if (!skip_op(op)) fail(fmt::format("expected token '{}', got '{}'", op, describe(cur())));
  }
  const Token& expect_name() {
    if (cur().type != TokenType::name) fail(fmt::format("expected token 'name', got '{}'", describe(cur())));
    return next();
  }
  void expect_name(std::string_view kw) {
    if (!skip_name(kw)) fail(fmt::format("expected token '{}', got '{}'", kw, describe(cur())));
  }
  void expect(TokenType type) {
    if (cur().type != type) {
      if (cur().type == TokenType::eof) fail("unexpected end of template");
      Token want{type, "", 0, 0, 0};
      fail(fmt::format("expected token '{}', got '{}'", describe(want), describe(cur())));
    }
    next();
  }

  struct Nest {
    Parser& p;
    explicit Nest(Parser& parser) : p(parser) {
      if (++p.depth_ > kMaxNesting) p.fail(fmt::format("template nested too deeply (more than {} levels)", kMaxNesting));
    }
    ~Nest() { --p.depth_; }
  };

  // ---- statements ----

  // Statements until a block whose first name is one of `end` (left current),
  // or the end of the template when `end` is empty.
  Body subparse(const std::vector<std::string_view>& end) {
    Nest nest(*this);
    Body body;
    std::string text;
    int text_line = 0;
    auto flush = [&] {
      if (text.empty()) return;
      auto s = make_stmt(Stmt::Kind::text, text_line);
      s->text = std::move(text);
      body.push_back(std::move(s));
      text.clear();
    };
    while (cur().type != TokenType::eof) {
      const Token& tok = cur();
      if (tok.type == TokenType::data) {
        if (text.empty()) text_line = tok.line;
        text += tok.text;
        next();
      } else if (tok.type == TokenType::var_begin) {
        flush();
        const int line = next().line;
        auto s = make_stmt(Stmt::Kind::print, line);
        s->a = parse_tuple(false, true, {}, false);
        expect(TokenType::var_end);
        body.push_back(std::move(s));
      } else if (tok.type == TokenType::block_begin) {
        flush();
        next();
        if (cur().type == TokenType::name)
          for (auto e : end)
            if (cur().text == e) return body;
        body.push_back(parse_statement(end));
        expect(TokenType::block_end);
      } else {
        fail(fmt::format("unexpected '{}'", describe(tok)));
      }
    }
    flush();
    if (!end.empty()) {
      std::string want;
      for (auto e : end) want += (want.empty() ? "'" : " or '") + std::string(e) + "'";
      fail(fmt::format("Unexpected end of template. Jinja was looking for the following tags: {}. The innermost block "
                       "that needs to be closed is '{}'.",
                       want, tags_.empty() ? "" : tags_.back()));
    }
    return body;
  }

  // After the statement's opening: `:`? `%}` then the body up to one of `end`.
  Body statements(const std::vector<std::string_view>& end, bool drop_end) {
    skip_op(":");
    expect(TokenType::block_end);
    Body b = subparse(end);
    if (drop_end) next();
    return b;
  }

  StmtPtr parse_statement(const std::vector<std::string_view>& enclosing_end) {
    if (cur().type != TokenType::name) fail("tag name expected");
    const std::string tag = cur().text;
    const int line = cur().line;
    tags_.push_back(tag);
    StmtPtr s;
    if (tag == "if") s = parse_if();
    else if (tag == "for") s = parse_for();
    else if (tag == "set") s = parse_set();
    else if (tag == "macro") s = parse_macro();
    else if (tag == "call") s = parse_call_block();
    else if (tag == "filter") s = parse_filter_block();
    else if (tag == "with") s = parse_with();
    else if (tag == "print") s = parse_print();
    else if (tag == "generation") {
      next();
      auto g = make_stmt(Stmt::Kind::scope, line);
      g->body = statements({"endgeneration"}, true);
      s = std::move(g);
    } else if (tag == "break" || tag == "continue") {
      next();
      if (loops_ == 0) fail(fmt::format("'{}' outside of a loop", tag), line);
      s = make_stmt(tag == "break" ? Stmt::Kind::break_ : Stmt::Kind::continue_, line);
    } else if (tag == "include" || tag == "import" || tag == "from" || tag == "extends" || tag == "block") {
      fail(fmt::format("'{}' is not supported: a chat template is one self-contained template (no loader)", tag), line);
    } else {
      tags_.pop_back();
      std::string msg = fmt::format("Encountered unknown tag '{}'.", tag);
      if (!enclosing_end.empty()) {
        std::string want;
        for (auto e : enclosing_end) want += (want.empty() ? "'" : " or '") + std::string(e) + "'";
        msg += fmt::format(" Jinja was looking for the following tags: {}. The innermost block that needs to be "
                           "closed is '{}'.",
                           want, tags_.empty() ? "" : tags_.back());
      }
      fail(msg, line);
    }
    tags_.pop_back();
    return s;
  }

  StmtPtr parse_if() {
    auto s = make_stmt(Stmt::Kind::if_, next().line);
    while (true) {
      ExprPtr test = parse_tuple(false, false, {}, false);
      Body body = statements({"elif", "else", "endif"}, false);
      s->branches.emplace_back(std::move(test), std::move(body));
      const Token& t = next();
      if (t.text == "elif") continue;
      if (t.text == "else") s->else_body = statements({"endif"}, true);
      break;
    }
    return s;
  }

  StmtPtr parse_for() {
    auto s = make_stmt(Stmt::Kind::for_, next().line);
    s->target = parse_target(false, {"in"});
    expect_name("in");
    s->a = parse_tuple(false, false, {"recursive"}, false);
    if (skip_name("if")) s->b = parse_expression(true);
    s->recursive = skip_name("recursive");
    ++loops_;
    s->body = statements({"endfor", "else"}, false);
    --loops_;
    if (next().text == "else") s->else_body = statements({"endfor"}, true);
    return s;
  }

  StmtPtr parse_set() {
    const int line = next().line;
    Target target = parse_target(true, {});
    if (skip_op("=")) {
      auto s = make_stmt(Stmt::Kind::set, line);
      s->target = std::move(target);
      s->a = parse_tuple(false, true, {}, false);
      return s;
    }
    auto s = make_stmt(Stmt::Kind::set_block, line);
    s->target = std::move(target);
    s->a = parse_filter(nullptr, false);
    s->body = statements({"endset"}, true);
    return s;
  }

  StmtPtr parse_with() {
    auto s = make_stmt(Stmt::Kind::with, next().line);
    while (cur().type != TokenType::block_end) {
      if (!s->assignments.empty()) expect_op(",");
      Target t = parse_target(false, {});
      expect_op("=");
      s->assignments.emplace_back(std::move(t), parse_expression(true));
    }
    s->body = statements({"endwith"}, true);
    return s;
  }

  // {% print a, b %} writes each expression, which is what printing a ~ b writes.
  StmtPtr parse_print() {
    auto s = make_stmt(Stmt::Kind::print, next().line);
    auto all = make(Expr::Kind::concat, s->line);
    while (cur().type != TokenType::block_end) {
      if (!all->items.empty()) expect_op(",");
      all->items.push_back(parse_expression(true));
    }
    if (all->items.size() == 1)
      s->a = std::move(all->items[0]);
    else
      s->a = std::move(all);
    return s;
  }

  void parse_signature(MacroDef& m) {
    expect_op("(");
    while (!is_op(")")) {
      if (!m.params.empty()) expect_op(",");
      m.params.push_back(expect_name().text);
      if (skip_op("="))
        m.defaults.push_back(parse_expression(true));
      else if (!m.defaults.empty())
        fail("non-default argument follows default argument");
    }
    expect_op(")");
  }

  // The macro's body, with what it reads of varargs / kwargs / caller noted.
  void parse_macro_body(MacroDef& m, std::string_view end) {
    macros_.push_back(&m);
    const int loops = loops_;
    loops_ = 0;  // a loop outside the macro is not one `break` can leave
    m.body = statements({end}, true);
    loops_ = loops;
    macros_.pop_back();
  }

  StmtPtr parse_macro() {
    auto s = make_stmt(Stmt::Kind::macro, next().line);
    s->macro = std::make_unique<MacroDef>();
    s->macro->name = expect_name().text;
    parse_signature(*s->macro);
    parse_macro_body(*s->macro, "endmacro");
    return s;
  }

  StmtPtr parse_call_block() {
    auto s = make_stmt(Stmt::Kind::call_block, next().line);
    s->macro = std::make_unique<MacroDef>();
    s->macro->name = "caller";
    if (is_op("(")) parse_signature(*s->macro);
    s->a = parse_expression(true);
    if (s->a->kind != Expr::Kind::call) fail("expected call", s->line);
    parse_macro_body(*s->macro, "endcall");
    return s;
  }

  StmtPtr parse_filter_block() {
    auto s = make_stmt(Stmt::Kind::filter_block, next().line);
    s->a = parse_filter(nullptr, true);
    s->body = statements({"endfilter"}, true);
    return s;
  }

  // A name, names separated by commas (unpacking), or (with_namespace) ns.attr.
  Target parse_target(bool with_namespace, const std::vector<std::string_view>& extra_end) {
    Target t;
    bool paren = skip_op("(");
    while (true) {
      if (!t.names.empty()) {
        if (!skip_op(",")) break;
        t.tuple = true;
        if (is_tuple_end(extra_end) || (paren && is_op(")"))) break;
      }
      const Token& n = expect_name();
      if (n.text == "true" || n.text == "false" || n.text == "True" || n.text == "False" || n.text == "none" ||
          n.text == "None")
        fail("can't assign to 'const'", n.line);
      t.names.push_back(n.text);
      if (with_namespace && !t.tuple && t.names.size() == 1 && is_op(".")) {
        next();
        t.attr = expect_name().text;
        break;
      }
    }
    if (paren) {
      expect_op(")");
      t.tuple = true;
    }
    return t;
  }

  // ---- expressions ----

  bool is_tuple_end(const std::vector<std::string_view>& extra_end) const {
    const TokenType ty = cur().type;
    if (ty == TokenType::var_end || ty == TokenType::block_end || (ty == TokenType::op && cur().text == ")"))
      return true;
    for (auto e : extra_end)
      if (is_name(e)) return true;
    return false;
  }

  ExprPtr parse_tuple(bool simplified, bool with_condexpr, const std::vector<std::string_view>& extra_end,
                      bool explicit_parentheses) {
    const int line = cur().line;
    std::vector<ExprPtr> args;
    bool is_tuple = false;
    while (true) {
      if (!args.empty()) expect_op(",");
      if (is_tuple_end(extra_end)) break;
      args.push_back(simplified ? parse_primary() : parse_expression(with_condexpr));
      if (is_op(","))
        is_tuple = true;
      else
        break;
    }
    if (!is_tuple) {
      if (!args.empty()) return std::move(args[0]);
      if (!explicit_parentheses) fail(fmt::format("Expected an expression, got '{}'", describe(cur())));
    }
    auto t = make(Expr::Kind::tuple, line);
    t->items = std::move(args);
    return t;
  }

  ExprPtr parse_expression(bool with_condexpr) {
    Nest nest(*this);
    return with_condexpr ? parse_condexpr() : parse_or();
  }

  ExprPtr parse_condexpr() {
    int line = cur().line;
    ExprPtr e1 = parse_or();
    while (skip_name("if")) {
      auto c = make(Expr::Kind::cond, line);
      c->a = parse_or();  // the condition
      c->b = std::move(e1);
      if (skip_name("else")) {
        Nest nest(*this);
        c->c = parse_condexpr();
      }
      e1 = std::move(c);
      line = cur().line;
    }
    return e1;
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (is_name("or")) {
      auto e = make(Expr::Kind::or_, next().line);
      e->a = std::move(left);
      e->b = parse_and();
      left = std::move(e);
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (is_name("and")) {
      auto e = make(Expr::Kind::and_, next().line);
      e->a = std::move(left);
      e->b = parse_not();
      left = std::move(e);
    }
    return left;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      Nest nest(*this);
      auto e = make(Expr::Kind::not_, next().line);
      e->a = parse_not();
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const int line = cur().line;
    ExprPtr first = parse_math1();
    std::unique_ptr<Expr> cmp;
    while (true) {
      std::string op;
      if (cur().type == TokenType::op &&
          (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == "<=" || cur().text == ">" ||
           cur().text == ">=")) {
        op = next().text;
      } else if (skip_name("in")) {
        op = "in";
      } else if (is_name("not") && look().type == TokenType::name && look().text == "in") {
        next();
        next();
        op = "notin";
      } else {
        break;
      }
      if (!cmp) {
        cmp = make(Expr::Kind::compare, line);
        cmp->a = std::move(first);
      }
      cmp->ops.push_back(op);
      cmp->items.push_back(parse_math1());
    }
    if (!cmp) return first;
    return cmp;
  }

  ExprPtr binary(std::string op, ExprPtr a, ExprPtr b, int line) {
    auto e = make(Expr::Kind::binary, line);
    e->name = std::move(op);
    e->a = std::move(a);
    e->b = std::move(b);
    return e;
  }

  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token& t = next();
      left = binary(t.text, std::move(left), parse_concat(), t.line);
    }
    return left;
  }

  ExprPtr parse_concat() {
    const int line = cur().line;
    ExprPtr first = parse_math2();
    if (!is_op("~")) return first;
    auto e = make(Expr::Kind::concat, line);
    e->items.push_back(std::move(first));
    while (skip_op("~")) e->items.push_back(parse_math2());
    return e;
  }

  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& t = next();
      left = binary(t.text, std::move(left), parse_pow(), t.line);
    }
    return left;
  }

  ExprPtr parse_pow() {
    ExprPtr left = parse_unary(true);
    while (is_op("**")) {
      const Token& t = next();
      left = binary("**", std::move(left), parse_unary(true), t.line);
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    Nest nest(*this);
    ExprPtr node;
    if (is_op("-") || is_op("+")) {
      const Token& t = next();
      auto e = make(t.text == "-" ? Expr::Kind::neg : Expr::Kind::pos, t.line);
      e->a = parse_unary(false);
      node = std::move(e);
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr parse_primary() {
    Nest nest(*this);
    const Token& t = cur();
    switch (t.type) {
      case TokenType::name: {
        next();
        auto e = make(Expr::Kind::literal, t.line);
        if (t.text == "true" || t.text == "True") {
          e->value = Value(true);
        } else if (t.text == "false" || t.text == "False") {
          e->value = Value(false);
        } else if (t.text == "none" || t.text == "None") {
          e->value = Value::none();
        } else {
          e->kind = Expr::Kind::name;
          e->name = t.text;
          if (t.text == "varargs" || t.text == "kwargs" || t.text == "caller")
            for (MacroDef* m : macros_) {
              if (t.text == "varargs") m->catch_varargs = true;
              if (t.text == "kwargs") m->catch_kwargs = true;
              if (t.text == "caller") m->uses_caller = true;
            }
        }
        return e;
      }
      case TokenType::string: {
        auto e = make(Expr::Kind::literal, t.line);
        std::string s;
        while (cur().type == TokenType::string) s += next().text;  // adjacent literals concatenate
        e->value = Value(std::move(s));
        return e;
      }
      case TokenType::integer: {
        auto e = make(Expr::Kind::literal, t.line);
        e->value = Value(next().integer);
        return e;
      }
      case TokenType::floating: {
        auto e = make(Expr::Kind::literal, t.line);
        e->value = Value(next().floating);
        return e;
      }
      case TokenType::op:
        if (t.text == "(") {
          next();
          ExprPtr e = parse_tuple(false, true, {}, true);
          expect_op(")");
          return e;
        }
        if (t.text == "[") {
          auto e = make(Expr::Kind::list, next().line);
          while (!is_op("]")) {
            if (!e->items.empty()) expect_op(",");
            if (is_op("]")) break;
            e->items.push_back(parse_expression(true));
          }
          expect_op("]");
          return e;
        }
        if (t.text == "{") {
          auto e = make(Expr::Kind::dict, next().line);
          while (!is_op("}")) {
            if (!e->pairs.empty()) expect_op(",");
            if (is_op("}")) break;
            ExprPtr k = parse_expression(true);
            expect_op(":");
            e->pairs.emplace_back(std::move(k), parse_expression(true));
          }
          expect_op("}");
          return e;
        }
        break;
      default: break;
    }
    if (t.type == TokenType::eof) fail("unexpected end of template");
    fail(fmt::format("unexpected '{}'", describe(t)));
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      if (is_op(".") || is_op("[")) {
        node = parse_subscript(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    while (true) {
      if (is_op("|")) {
        node = parse_filter(std::move(node), false);
      } else if (is_name("is")) {
        node = parse_test(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr node) {
    Nest nest(*this);
    const Token& t = next();
    if (t.text == ".") {
      const Token& a = next();
      if (a.type == TokenType::name) {
        auto e = make(Expr::Kind::getattr, t.line);
        e->a = std::move(node);
        e->name = a.text;
        return e;
      }
      if (a.type != TokenType::integer) fail("expected name or number", a.line);
      auto e = make(Expr::Kind::getitem, t.line);
      e->a = std::move(node);
      auto k = make(Expr::Kind::literal, a.line);
      k->value = Value(a.integer);
      e->b = std::move(k);
      return e;
    }
    // [ subscript (, subscript)* ]
    std::vector<ExprPtr> args;
    while (!is_op("]")) {
      if (!args.empty()) expect_op(",");
      args.push_back(parse_subscribed());
    }
    expect_op("]");
    auto e = make(Expr::Kind::getitem, t.line);
    e->a = std::move(node);
    if (args.size() == 1) {
      e->b = std::move(args[0]);
    } else {
      auto tup = make(Expr::Kind::tuple, t.line);
      tup->items = std::move(args);
      e->b = std::move(tup);
    }
    return e;
  }

  ExprPtr parse_subscribed() {
    const int line = cur().line;
    ExprPtr start;
    if (is_op(":")) {
      next();
    } else {
      start = parse_expression(true);
      if (!is_op(":")) return start;
      next();
    }
    auto s = make(Expr::Kind::slice, line);
    s->a = std::move(start);
    if (!is_op(":") && !is_op("]") && !is_op(",")) s->b = parse_expression(true);
    if (skip_op(":"))
      if (!is_op("]") && !is_op(",")) s->c = parse_expression(true);
    return s;
  }

  CallSyntax parse_call_args() {
    const int line = cur().line;
    expect_op("(");
    CallSyntax c;
    bool require_comma = false;
    auto ensure = [&](bool ok) {
      if (!ok) fail("invalid syntax for function call expression", line);
    };
    while (!is_op(")")) {
      if (require_comma) {
        expect_op(",");
        if (is_op(")")) break;
      }
      if (is_op("*")) {
        ensure(!c.star && !c.dstar);
        next();
        c.star = parse_expression(true);
      } else if (is_op("**")) {
        ensure(!c.dstar);
        next();
        c.dstar = parse_expression(true);
      } else if (cur().type == TokenType::name && look().type == TokenType::op && look().text == "=") {
        ensure(!c.dstar);
        std::string key = next().text;
        next();
        c.kw.emplace_back(std::move(key), parse_expression(true));
      } else {
        ensure(!c.star && !c.dstar && c.kw.empty());
        c.pos.push_back(parse_expression(true));
      }
      require_comma = true;
    }
    expect_op(")");
    return c;
  }

  ExprPtr parse_call(ExprPtr node) {
    Nest nest(*this);
    auto e = make(Expr::Kind::call, cur().line);
    e->a = std::move(node);
    e->call = parse_call_args();
    return e;
  }

  // `|name(args)|...`; with `start_inline` the first filter has no pipe ({% filter %}).
  ExprPtr parse_filter(ExprPtr node, bool start_inline) {
    while (is_op("|") || start_inline) {
      Nest nest(*this);
      if (!start_inline) next();
      start_inline = false;
      const Token& n = expect_name();
      auto e = make(Expr::Kind::filter, n.line);
      e->name = n.text;
      while (skip_op(".")) e->name += "." + expect_name().text;
      if (is_op("(")) e->call = parse_call_args();
      e->a = std::move(node);
      node = std::move(e);
    }
    return node;
  }

  ExprPtr parse_test(ExprPtr node) {
    Nest nest(*this);
    const int line = next().line;  // `is`
    const bool negated = skip_name("not");
    auto e = make(Expr::Kind::test, line);
    e->name = expect_name().text;
    while (skip_op(".")) e->name += "." + expect_name().text;
    const TokenType ty = cur().type;
    if (is_op("(")) {
      e->call = parse_call_args();
    } else if ((ty == TokenType::name || ty == TokenType::string || ty == TokenType::integer ||
                ty == TokenType::floating || is_op("[") || is_op("{")) &&
               !is_name("else") && !is_name("or") && !is_name("and")) {
      if (is_name("is")) fail("You cannot chain multiple tests with is");
      e->call.pos.push_back(parse_postfix(parse_primary()));
    }
    e->a = std::move(node);
    if (!negated) return e;
    auto n = make(Expr::Kind::not_, line);
    n->a = std::move(e);
    return n;
  }

  std::vector<Token> t_;
  size_t i_ = 0;
  int depth_ = 0;
  int loops_ = 0;                    // loops around the statement being parsed (break/continue)
  std::vector<std::string> tags_;    // open statements, for messages
  std::vector<MacroDef*> macros_;    // macros whose body is being parsed
};

// ---- jinja2's frame symbol analysis (idtracking.py), reduced to what
// changes a result: which names start a frame as undefined locals ----

class Symbols {
 public:
  enum class Load { param, resolve, alias, undefined };
  explicit Symbols(const Symbols* parent) : parent_(parent) {}

  bool find_ref(const std::string& name) const {
    return refs_.count(name) || (parent_ && parent_->find_ref(name));
  }
  void load(const std::string& name) {
    if (!find_ref(name)) refs_[name] = Load::resolve;
  }
  void store(const std::string& name) {
    stores_.insert(name);
    if (refs_.count(name)) return;
    refs_[name] = parent_ && parent_->find_ref(name) ? Load::alias : Load::undefined;
  }
  void param(const std::string& name) {
    stores_.insert(name);
    refs_[name] = Load::param;
  }
  // After an if: a name some branch assigns, that the frame had not, keeps
  // its outer value until assigned.
  void branch_update(const std::vector<Symbols>& branches) {
    std::set<std::string> stored;
    for (const auto& b : branches) stored.insert(b.stores_.begin(), b.stores_.end());
    for (const auto& n : stores_) stored.erase(n);
    for (const auto& b : branches) {
      for (const auto& [k, v] : b.refs_) refs_[k] = v;
      stores_.insert(b.stores_.begin(), b.stores_.end());
    }
    for (const auto& n : stored) refs_[n] = parent_ && parent_->find_ref(n) ? Load::alias : Load::resolve;
  }
  std::vector<std::string> undefined_locals() const {
    std::vector<std::string> out;
    for (const auto& [k, v] : refs_)
      if (v == Load::undefined) out.push_back(k);
    return out;
  }

 private:
  const Symbols* parent_;
  std::map<std::string, Load> refs_;
  std::set<std::string> stores_;
};

class FrameAnalysis {
 public:
  explicit FrameAnalysis(Ast& ast) : ast_(ast) {}

  // `params` are the frame's parameters, `before` what it reads before its
  // body (macro defaults), `after` what it reads after (a filter block's filter).
  void frame(const Body& body, const Symbols* parent, const std::vector<std::string>& params = {},
             const std::vector<const Expr*>& before = {}, const Expr* after = nullptr) {
    Symbols sym(parent);
    for (const auto& p : params) sym.param(p);
    for (const Expr* e : before) loads(e, sym);
    for (const auto& s : body) visit(*s, sym);
    loads(after, sym);
    auto locals = sym.undefined_locals();
    if (!locals.empty()) ast_.frame_locals[&body] = std::move(locals);
    // Child frames see this frame's complete symbol table.
    for (const auto& s : body) children(*s, sym);
  }

 private:
  static void loads(const Expr* e, Symbols& sym) {
    if (!e) return;
    if (e->kind == Expr::Kind::name) sym.load(e->name);
    loads(e->a.get(), sym);
    loads(e->b.get(), sym);
    loads(e->c.get(), sym);
    for (const auto& x : e->items) loads(x.get(), sym);
    for (const auto& [k, v] : e->pairs) {
      loads(k.get(), sym);
      loads(v.get(), sym);
    }
    for (const auto& x : e->call.pos) loads(x.get(), sym);
    for (const auto& [k, v] : e->call.kw) loads(v.get(), sym);
    loads(e->call.star.get(), sym);
    loads(e->call.dstar.get(), sym);
  }

  static void store(const Target& t, Symbols& sym) {
    if (!t.attr.empty()) {
      sym.load(t.names[0]);  // ns.attr = ...: a load of ns
      return;
    }
    for (const auto& n : t.names) sym.store(n);
  }

  // What jinja2's FrameSymbolVisitor sees of a statement in its own frame.
  static void visit(const Stmt& s, Symbols& sym) {
    switch (s.kind) {
      case Stmt::Kind::print: loads(s.a.get(), sym); break;
      case Stmt::Kind::set:
        loads(s.a.get(), sym);
        store(s.target, sym);
        break;
      case Stmt::Kind::set_block: store(s.target, sym); break;
      case Stmt::Kind::if_: {
        loads(s.branches[0].first.get(), sym);
        // jinja2 visits the body, the elifs (as one branch) and the else, each from a copy.
        std::vector<Symbols> branches;
        {
          Symbols b = sym;
          for (const auto& x : s.branches[0].second) visit(*x, b);
          branches.push_back(std::move(b));
        }
        {
          Symbols b = sym;
          for (size_t i = 1; i < s.branches.size(); ++i) {
            loads(s.branches[i].first.get(), b);
            for (const auto& x : s.branches[i].second) visit(*x, b);
          }
          branches.push_back(std::move(b));
        }
        {
          Symbols b = sym;
          for (const auto& x : s.else_body) visit(*x, b);
          branches.push_back(std::move(b));
        }
        sym.branch_update(branches);
        break;
      }
      case Stmt::Kind::for_: loads(s.a.get(), sym); break;
      case Stmt::Kind::macro: sym.store(s.macro->name); break;
      case Stmt::Kind::call_block: loads(s.a.get(), sym); break;
      case Stmt::Kind::filter_block: loads(s.a.get(), sym); break;
      case Stmt::Kind::with:
        for (const auto& [t, v] : s.assignments) loads(v.get(), sym);
        break;
      default: break;
    }
  }

  static std::vector<std::string> macro_params(const MacroDef& m) {
    std::vector<std::string> p = m.params;
    if (m.uses_caller) p.push_back("caller");
    if (m.catch_varargs) p.push_back("varargs");
    if (m.catch_kwargs) p.push_back("kwargs");
    return p;
  }

  // The frames a statement opens, analysed with `sym` as their parent.
  void children(const Stmt& s, const Symbols& sym) {
    switch (s.kind) {
      case Stmt::Kind::if_:
        for (const auto& [test, body] : s.branches)
          for (const auto& x : body) children(*x, sym);
        for (const auto& x : s.else_body) children(*x, sym);
        break;
      case Stmt::Kind::for_: {
        std::vector<std::string> params = s.target.names;
        params.push_back("loop");
        frame(s.body, &sym, params);
        frame(s.else_body, &sym);
        break;
      }
      case Stmt::Kind::macro:
      case Stmt::Kind::call_block: {
        std::vector<const Expr*> defaults;
        for (const auto& d : s.macro->defaults) defaults.push_back(d.get());
        frame(s.macro->body, &sym, macro_params(*s.macro), defaults);
        break;
      }
      case Stmt::Kind::set_block: frame(s.body, &sym); break;
      case Stmt::Kind::filter_block: frame(s.body, &sym, {}, {}, s.a.get()); break;
      case Stmt::Kind::with: {
        std::vector<std::string> params;
        for (const auto& [t, v] : s.assignments) params.insert(params.end(), t.names.begin(), t.names.end());
        frame(s.body, &sym, params);
        break;
      }
      case Stmt::Kind::scope: frame(s.body, &sym); break;
      default: break;
    }
  }

  Ast& ast_;
};

}  // namespace

std::shared_ptr<const Ast> parse(std::string_view source) {
  std::shared_ptr<Ast> ast = Parser(tokenize(source)).run();
  FrameAnalysis(*ast).frame(ast->body, nullptr);
  return ast;
}

}  // namespace kvgraph::chat::jinja
