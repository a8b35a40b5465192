#pragma once
// Values of the Jinja interpreter (src/chat/jinja*.cpp): Python's data model,
// as far as Hugging Face chat templates see it. None, bool, int (64-bit; an
// overflow is an error, not a bignum), float, str (UTF-8; lengths and indices
// count code points, as Python does), list, tuple, dict (insertion-ordered,
// any hashable key), jinja2's Undefined, and objects (namespace(), the loop
// variable, macros, built-in functions and bound methods).
//
// Lists, tuples and dicts are immutable once built (the sandbox forbids
// mutating methods), so copies share them; only a namespace is mutable, and
// it is shared by reference as in Python.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

namespace kvgraph::chat::jinja {

class Value;
class Interpreter;

// Lists and dicts nest at most this deep (a template could otherwise build a
// chain deep enough to overflow the stack of any recursive walk, the
// destructor's included); deeper is an error when built.
inline constexpr uint32_t kMaxValueDepth = 128;

struct List {
  std::vector<Value> items;
  bool tuple = false;  // printed (a, b); never equal to a list
  // A dict view (dict.items(), .keys(), .values()): iterates as the list,
  // prints as Python prints the view ("dict_items([...])"), not subscriptable.
  const char* view = nullptr;
  uint32_t depth = 1;  // 1 + the deepest list or dict item
};

struct Dict;

// Arguments of a call: positional, then keyword in the order given.
struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
};

// jinja2's default Undefined: prints as "", is false, iterates as empty, and
// raises `message` (an UndefinedError, or a SecurityError when `unsafe`) on
// any other use.
struct Undefined {
  std::string message;  // e.g. "'x' is undefined", "'dict object' has no attribute 'y'"
  bool unsafe = false;  // an attribute the sandbox hides
};

// Namespaces, loops, macros, built-in functions and bound methods.
class Object {
 public:
  virtual ~Object() = default;
  virtual std::string type_name() const = 0;  // "Namespace", "LoopContext", "Macro", "builtin_function_or_method"
  // An attribute (`obj.name`); nullopt: none (the caller makes an Undefined).
  virtual std::optional<Value> attr(std::string_view name) const;
  virtual bool callable() const { return false; }
  // `line` is the call's line, for error messages.
  virtual Value call(Interpreter& in, CallArgs& args, int line) const;
  // What {{ obj }} prints.
  virtual std::string str() const;
  // Drops the values it holds. Called on every object a render made, when
  // the render ends: namespaces, loops and macro scopes can refer to each
  // other, and the cycles must not outlive the render.
  virtual void release() {}
};

class Value {
 public:
  enum class Kind : uint8_t { undefined, none, boolean, integer, floating, string, list, dict, object };

  Value() : v_(std::shared_ptr<const Undefined>()) {}  // undefined, no message
  static Value none() { return Value(Storage(std::in_place_index<1>)); }
  static Value undefined(std::string message, bool unsafe = false);
  Value(bool b) : v_(b) {}
  Value(int64_t i) : v_(i) {}
  Value(int i) : v_(static_cast<int64_t>(i)) {}
  Value(double d) : v_(d) {}
  Value(std::string s) : v_(std::move(s)) {}
  // markupsafe's Markup: a str already HTML-escaped (what escape and safe
  // return). Adding a plain str to it escapes that str; printed as is.
  static Value markup(std::string s) {
    Value v(std::move(s));
    v.markup_ = true;
    return v;
  }
  bool is_markup() const { return markup_ && is_string(); }
  Value(const char* s) : v_(std::string(s)) {}
  Value(std::string_view s) : v_(std::string(s)) {}
  // Both throw std::length_error beyond kMaxValueDepth.
  static Value list(std::vector<Value> items, bool tuple = false);
  static Value view(std::vector<Value> items, const char* name);  // "dict_items", "dict_keys", "dict_values"
  static Value dict(Dict d);  // throws std::length_error beyond kMaxValueDepth
  Value(std::shared_ptr<Object> o) : v_(std::move(o)) {}

  Kind kind() const { return static_cast<Kind>(v_.index()); }
  bool is_undefined() const { return kind() == Kind::undefined; }
  bool is_none() const { return kind() == Kind::none; }
  bool is_bool() const { return kind() == Kind::boolean; }
  bool is_int() const { return kind() == Kind::integer; }      // not bool
  bool is_float() const { return kind() == Kind::floating; }
  bool is_number() const { return is_bool() || is_int() || is_float(); }  // Python's numbers.Number
  bool is_integral() const { return is_bool() || is_int(); }             // Python's int (bool included)
  bool is_string() const { return kind() == Kind::string; }
  bool is_list() const { return kind() == Kind::list; }  // list or tuple
  bool is_tuple() const { return is_list() && std::get<6>(v_)->tuple; }
  const char* view_name() const { return is_list() ? std::get<6>(v_)->view : nullptr; }
  bool is_dict() const { return kind() == Kind::dict; }
  bool is_object() const { return kind() == Kind::object; }

  bool as_bool() const { return std::get<2>(v_); }
  int64_t as_int() const { return is_bool() ? (std::get<2>(v_) ? 1 : 0) : std::get<3>(v_); }  // is_integral()
  double as_float() const;  // is_number()
  const std::string& as_string() const { return std::get<5>(v_); }
  const std::vector<Value>& items() const { return std::get<6>(v_)->items; }  // is_list()
  const Dict& dict() const { return *std::get<7>(v_); }
  const std::shared_ptr<const Dict>& dict_ptr() const { return std::get<7>(v_); }
  const std::shared_ptr<Object>& object() const { return std::get<8>(v_); }
  const Undefined* undefined_info() const { return std::get<0>(v_).get(); }  // may be null
  uint32_t nesting() const;  // a list's or dict's depth (1: no list or dict inside), else 0

  // Python's truth value (Undefined is false).
  bool truthy() const;
  // str(value): what {{ value }} prints. Undefined prints "".
  std::string str() const;
  // repr(value), as Python prints list items and dict keys.
  std::string repr() const;
  // The name Python gives the type ("str", "int", "dict", "NoneType", ...).
  std::string type_name() const;

  // From / to JSON (tojson has its own writer: json_dumps).
  static Value from_json(const nlohmann::ordered_json& j);

 private:
  using Storage = std::variant<std::shared_ptr<const Undefined>, std::monostate, bool, int64_t, double, std::string,
                               std::shared_ptr<const List>, std::shared_ptr<const Dict>, std::shared_ptr<Object>>;
  explicit Value(Storage s) : v_(std::move(s)) {}
  Storage v_;
  bool markup_ = false;
};

struct Dict {
  std::vector<std::pair<Value, Value>> items;  // insertion order
  uint32_t depth = 1;                          // set by Value::dict
  const Value* find(const Value& key) const;
  const Value* find(std::string_view key) const;
  // Inserts, or replaces the value of an equal key in place (Python's d[k] = v).
  void set(Value key, Value value);
};

// Python's ==, <, hash-ability. py_less throws ValueError-like Error through
// `fail` when the types do not order ("'<' not supported between ...").
bool py_equal(const Value& a, const Value& b);
// -1, 0, 1; nullopt when Python would raise TypeError.
std::optional<int> py_compare(const Value& a, const Value& b);
bool py_hashable(const Value& v);

// Python's repr(float) (shortest round-trip digits; "1e+16", "0.0001", "1.0").
std::string float_repr(double d);
// Python's repr of a dict; a dict met again inside itself (through a
// namespace) prints as {...}, as Python prints it. Nesting too deep to print
// throws std::length_error.
std::string dict_repr(const Dict& d);

// Python's repr(str): quotes and escapes as Python 3 does.
std::string string_repr(std::string_view s);
// markupsafe.escape of a str: & < > " ' as entities.
std::string html_escape(std::string_view s);

// json.dumps(value, ensure_ascii, indent, separators, sort_keys), as
// transformers' tojson filter calls it. `indent` nullopt: one line; a string
// indent is used as given. Throws std::runtime_error text that the caller
// turns into a template error ("Object of type Undefined is not JSON serializable").
struct JsonOptions {
  bool ensure_ascii = false;
  std::optional<std::string> indent;
  std::optional<std::pair<std::string, std::string>> separators;
  bool sort_keys = false;
  size_t max_bytes = SIZE_MAX;  // longer output is an error (a huge indent)
};
std::string json_dumps(const Value& v, const JsonOptions& opt);

}  // namespace kvgraph::chat::jinja
