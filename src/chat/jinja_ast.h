#pragma once
// The syntax tree of a parsed template (jinja_parser.cpp builds it,
// jinja_eval.cpp walks it). Nodes are immutable once parsed.
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "chat/jinja_value.h"

namespace kvgraph::chat::jinja {

struct Expr;
struct Stmt;
using ExprPtr = std::unique_ptr<const Expr>;
using StmtPtr = std::unique_ptr<const Stmt>;
using Body = std::vector<StmtPtr>;

struct CallSyntax {
  std::vector<ExprPtr> pos;
  std::vector<std::pair<std::string, ExprPtr>> kw;
  ExprPtr star, dstar;  // *args, **kwargs
};

struct Expr {
  enum class Kind {
    literal,    // value
    name,       // name
    list,       // items
    tuple,      // items
    dict,       // pairs
    getattr,    // a.name
    getitem,    // a[b] (b may be a slice)
    slice,      // a:b:c, inside getitem; a, b, c may be null
    call,       // a(call)
    filter,     // a|name(call); a is null in {% filter %} blocks
    test,       // a is name(call)
    neg,        // -a
    pos,        // +a
    not_,       // not a
    binary,     // a op b: + - * / // % **
    concat,     // items joined with ~
    and_,       // a and b
    or_,        // a or b
    compare,    // a op1 b op2 c ... (ops)
    cond,       // b if a else c (c may be null)
  };
  Kind kind;
  int line = 0;
  Value value;                 // literal
  std::string name;            // name, attribute, filter or test name, binary operator
  ExprPtr a, b, c;             // operands
  std::vector<ExprPtr> items;  // list, tuple, concat; compare operands after the first
  std::vector<std::pair<ExprPtr, ExprPtr>> pairs;  // dict
  std::vector<std::string> ops;                   // compare: "==", "!=", "<", "<=", ">", ">=", "in", "notin"
  CallSyntax call;             // call, filter, test
};

// An assignment target: a name, a tuple of names (unpacking), or ns.attr.
struct Target {
  std::vector<std::string> names;  // one name, or the tuple's names
  bool tuple = false;
  std::string attr;  // non-empty: names[0].attr (a namespace attribute)
};

struct MacroDef {
  std::string name;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // for the last defaults.size() params
  Body body;
  bool catch_varargs = false, catch_kwargs = false, uses_caller = false;
};

struct Stmt {
  enum class Kind {
    text,       // text
    print,      // {{ expr }} (a)
    if_,        // conditions + bodies; else_body
    for_,       // target in a [if b] [recursive]; body; else_body
    set,        // target = a
    set_block,  // {% set target | filter %}...{% endset %}: body, a = the filter (operand null)
    macro,      // macro
    call_block, // {% call(params) a %}body{% endcall %}: macro holds the caller
    filter_block,  // a = the filter chain (innermost operand null), body
    with,       // targets/values, body
    break_,
    continue_,
    scope,      // body in its own scope ({% generation %})
  };
  Kind kind;
  int line = 0;
  std::string text;
  ExprPtr a, b;
  Target target;
  std::vector<std::pair<ExprPtr, Body>> branches;  // if / elif
  Body body, else_body;
  bool recursive = false;
  std::unique_ptr<MacroDef> macro;  // macro, call_block
  std::vector<std::pair<Target, ExprPtr>> assignments;  // with
};

struct Ast {
  Body body;
  // jinja2 resolves names per frame when it compiles (idtracking.py): a name
  // whose first use in a frame is an unconditional assignment is local to
  // that frame and undefined until assigned, even for the frames inside it
  // and even when the context has a variable of that name. These are such
  // names, per frame body (the template, a loop body or else, a macro or
  // call body, a set / filter / with block body).
  std::unordered_map<const Body*, std::vector<std::string>> frame_locals;
  const std::vector<std::string>& locals_of(const Body& b) const {
    static const std::vector<std::string> none;
    auto it = frame_locals.find(&b);
    return it == frame_locals.end() ? none : it->second;
  }
};

// Parses template source; throws TemplateError (jinja.h) on a syntax error.
std::shared_ptr<const Ast> parse(std::string_view source);

}  // namespace kvgraph::chat::jinja
