#include "chat/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

#include "chat/pystr.h"

namespace kvgraph::chat::jinja {

std::optional<Value> Object::attr(std::string_view) const { return std::nullopt; }

Value Object::call(Interpreter&, CallArgs&, int) const {
  throw std::runtime_error(fmt::format("'{}' object is not callable", type_name()));
}

std::string Object::str() const { return fmt::format("<{} object>", type_name()); }

Value Value::undefined(std::string message, bool unsafe) {
  return Value(Storage(std::make_shared<const Undefined>(Undefined{std::move(message), unsafe})));
}

uint32_t Value::nesting() const {
  if (is_list()) return std::get<6>(v_)->depth;
  if (is_dict()) return std::get<7>(v_)->depth;
  return 0;
}

namespace {

[[noreturn]] void too_deep() {
  throw std::length_error("lists and dicts nested more than " + std::to_string(kMaxValueDepth) + " deep");
}

}  // namespace

Value Value::list(std::vector<Value> items, bool tuple) {
  uint32_t depth = 1;
  for (const Value& v : items) depth = std::max(depth, v.nesting() + 1);
  if (depth > kMaxValueDepth) too_deep();
  return Value(Storage(std::make_shared<const List>(List{std::move(items), tuple, nullptr, depth})));
}

Value Value::view(std::vector<Value> items, const char* name) {
  Value v = list(std::move(items));
  return Value(Storage(std::make_shared<const List>(List{v.items(), false, name, std::get<6>(v.v_)->depth})));
}

Value Value::dict(Dict d) {
  uint32_t depth = 1;
  for (const auto& [k, v] : d.items) depth = std::max({depth, k.nesting() + 1, v.nesting() + 1});
  if (depth > kMaxValueDepth) too_deep();
  d.depth = depth;
  return Value(Storage(std::make_shared<const Dict>(std::move(d))));
}

double Value::as_float() const {
  switch (kind()) {
    case Kind::floating: return std::get<4>(v_);
    case Kind::integer: return static_cast<double>(std::get<3>(v_));
    case Kind::boolean: return std::get<2>(v_) ? 1.0 : 0.0;
    default: return 0.0;
  }
}

bool Value::truthy() const {
  switch (kind()) {
    case Kind::undefined:
    case Kind::none: return false;
    case Kind::boolean: return as_bool();
    case Kind::integer: return as_int() != 0;
    case Kind::floating: return as_float() != 0.0;
    case Kind::string: return !as_string().empty();
    case Kind::list: return !items().empty();
    case Kind::dict: return !dict().items.empty();
    case Kind::object: return true;
  }
  return false;
}

std::string Value::type_name() const {
  switch (kind()) {
    case Kind::undefined: return "Undefined";
    case Kind::none: return "NoneType";
    case Kind::boolean: return "bool";
    case Kind::integer: return "int";
    case Kind::floating: return "float";
    case Kind::string: return "str";
    case Kind::list: return view_name() ? view_name() : is_tuple() ? "tuple" : "list";
    case Kind::dict: return "dict";
    case Kind::object: return object()->type_name();
  }
  return "object";
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  // Shortest round-trip digits, then Python's layout: positional for
  // exponents in [-4, 16), scientific (at least two exponent digits) beyond.
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  const size_t e = sci.find('e');
  std::string digits = sci.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int exp = std::stoi(sci.substr(e + 1));
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  if (exp >= -4 && exp < 16) {
    std::string out;
    if (exp < 0) {
      out = "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
    } else if (static_cast<size_t>(exp) + 1 >= digits.size()) {
      out = digits + std::string(static_cast<size_t>(exp) + 1 - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, static_cast<size_t>(exp) + 1) + "." + digits.substr(static_cast<size_t>(exp) + 1);
    }
    return sign + out;
  }
  std::string mant = digits.size() > 1 ? digits.substr(0, 1) + "." + digits.substr(1) : digits;
  return fmt::format("{}{}e{}{:02d}", sign, mant, exp < 0 ? '-' : '+', std::abs(exp));
}

std::string string_repr(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (char32_t c : pystr::decode(s)) {
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20 || c == 0x7F) {
      out += fmt::format("\\x{:02x}", static_cast<unsigned>(c));
    } else if (c < 0x7F) {
      out += static_cast<char>(c);
    } else if (!pystr::is_printable(c)) {
      if (c <= 0xFF)
        out += fmt::format("\\x{:02x}", static_cast<unsigned>(c));
      else if (c <= 0xFFFF)
        out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
      else
        out += fmt::format("\\U{:08x}", static_cast<unsigned>(c));
    } else {
      pystr::append(out, c);
    }
  }
  out += quote;
  return out;
}

std::string html_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

namespace {

// Python's Py_ReprEnter: the containers being printed, innermost last.
thread_local std::vector<const void*> g_printing;

struct ReprGuard {
  bool recursive = false;
  bool pushed = false;
  explicit ReprGuard(const void* p) {
    recursive = std::find(g_printing.begin(), g_printing.end(), p) != g_printing.end();
    if (recursive) return;
    if (g_printing.size() >= 2 * kMaxValueDepth) throw std::length_error("values nested too deeply to print");
    g_printing.push_back(p);
    pushed = true;
  }
  ~ReprGuard() {
    if (pushed) g_printing.pop_back();
  }
  ReprGuard(const ReprGuard&) = delete;
  ReprGuard& operator=(const ReprGuard&) = delete;
};

}  // namespace

std::string dict_repr(const Dict& d) {
  ReprGuard guard(&d);
  if (guard.recursive) return "{...}";
  std::string out = "{";
  bool first = true;
  for (const auto& [k, v] : d.items) {
    if (!first) out += ", ";
    first = false;
    out += k.repr() + ": " + v.repr();
  }
  return out + "}";
}

std::string Value::str() const {
  switch (kind()) {
    case Kind::undefined: return "";
    case Kind::string: return as_string();
    case Kind::object: return object()->str();
    default: return repr();
  }
}

std::string Value::repr() const {
  switch (kind()) {
    case Kind::undefined: return "Undefined";
    case Kind::none: return "None";
    case Kind::boolean: return as_bool() ? "True" : "False";
    case Kind::integer: return std::to_string(as_int());
    case Kind::floating: return float_repr(as_float());
    case Kind::string: return is_markup() ? "Markup(" + string_repr(as_string()) + ")" : string_repr(as_string());
    case Kind::list: {
      const auto& xs = items();
      ReprGuard guard(std::get<6>(v_).get());
      if (guard.recursive) return "[...]";
      std::string out = is_tuple() ? "(" : "[";
      for (size_t i = 0; i < xs.size(); ++i) {
        if (i) out += ", ";
        out += xs[i].repr();
      }
      if (is_tuple() && xs.size() == 1) out += ",";
      out += is_tuple() ? ")" : "]";
      return view_name() ? std::string(view_name()) + "(" + out + ")" : out;
    }
    case Kind::dict: return dict_repr(dict());
    case Kind::object: return object()->str();
  }
  return "";
}

Value Value::from_json(const nlohmann::ordered_json& j) {
  using T = nlohmann::ordered_json::value_t;
  switch (j.type()) {
    case T::null: return none();
    case T::boolean: return Value(j.get<bool>());
    case T::number_integer: return Value(j.get<int64_t>());
    case T::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      if (u <= static_cast<uint64_t>(INT64_MAX)) return Value(static_cast<int64_t>(u));
      return Value(static_cast<double>(u));
    }
    case T::number_float: return Value(j.get<double>());
    case T::string: return Value(j.get<std::string>());
    case T::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& x : j) items.push_back(from_json(x));
      return list(std::move(items));
    }
    case T::object: {
      auto d = std::make_shared<Dict>();
      d->items.reserve(j.size());
      for (const auto& [k, v] : j.items()) d->items.emplace_back(Value(k), from_json(v));
      return Value::dict(std::move(*d));
    }
    default: throw std::runtime_error("binary JSON values are not supported");
  }
}

const Value* Dict::find(const Value& key) const {
  for (const auto& [k, v] : items)
    if (py_equal(k, key)) return &v;
  return nullptr;
}

const Value* Dict::find(std::string_view key) const {
  for (const auto& [k, v] : items)
    if (k.is_string() && k.as_string() == key) return &v;
  return nullptr;
}

void Dict::set(Value key, Value value) {
  for (auto& [k, v] : items) {
    if (py_equal(k, key)) {
      v = std::move(value);
      return;
    }
  }
  items.emplace_back(std::move(key), std::move(value));
}

namespace {

// Exact comparison of an integer with a double, as Python does.
int compare_int_float(int64_t i, double f) {
  if (std::isnan(f)) return 2;  // unordered
  if (f >= 9.3e18) return -1;
  if (f <= -9.3e18) return 1;
  const double t = std::trunc(f);
  const int64_t ti = static_cast<int64_t>(t);
  if (i != ti) return i < ti ? -1 : 1;
  if (f == t) return 0;
  return f > t ? -1 : 1;
}

std::optional<int> compare_numbers(const Value& a, const Value& b) {
  if (a.is_integral() && b.is_integral()) {
    const int64_t x = a.as_int(), y = b.as_int();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_float() && b.is_float()) {
    const double x = a.as_float(), y = b.as_float();
    if (std::isnan(x) || std::isnan(y)) return 2;
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_integral()) return compare_int_float(a.as_int(), b.as_float());
  const int c = compare_int_float(b.as_int(), a.as_float());
  return c == 2 ? 2 : -c;
}

}  // namespace

bool py_equal(const Value& a, const Value& b) {
  using K = Value::Kind;
  if (a.is_number() && b.is_number()) return compare_numbers(a, b) == 0;
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case K::undefined:
    case K::none: return true;
    case K::string: return a.as_string() == b.as_string();
    case K::list: {
      if (a.is_tuple() != b.is_tuple()) return false;
      const auto &x = a.items(), &y = b.items();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i)
        if (!py_equal(x[i], y[i])) return false;
      return true;
    }
    case K::dict: {
      const auto &x = a.dict(), &y = b.dict();
      if (x.items.size() != y.items.size()) return false;
      for (const auto& [k, v] : x.items) {
        const Value* w = y.find(k);
        if (!w || !py_equal(v, *w)) return false;
      }
      return true;
    }
    case K::object: return a.object() == b.object();
    default: return false;
  }
}

std::optional<int> py_compare(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    auto c = compare_numbers(a, b);
    if (c == 2) return 2;  // NaN: every comparison false
    return c;
  }
  if (a.is_string() && b.is_string()) {
    const int c = a.as_string().compare(b.as_string());  // UTF-8 byte order is code point order
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
    const auto &x = a.items(), &y = b.items();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (py_equal(x[i], y[i])) continue;
      return py_compare(x[i], y[i]);
    }
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  return std::nullopt;
}

bool py_hashable(const Value& v) {
  if (v.is_dict()) return false;
  if (v.is_list()) {
    if (!v.is_tuple()) return false;
    for (const auto& x : v.items())
      if (!py_hashable(x)) return false;
  }
  return true;
}

namespace {

void json_string(std::string& out, std::string_view s, bool ensure_ascii) {
  out += '"';
  for (char32_t c : pystr::decode(s)) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
        } else if (ensure_ascii && c > 0x7E) {
          if (c >= 0x10000) {
            const char32_t v = c - 0x10000;
            out += fmt::format("\\u{:04x}\\u{:04x}", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
          } else {
            out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
          }
        } else {
          pystr::append(out, c);
        }
    }
  }
  out += '"';
}

std::string json_float(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d < 0 ? "-Infinity" : "Infinity";
  return float_repr(d);
}

// A dict key as json.dumps converts it (str, int, float, bool, None).
std::string json_key(const Value& k) {
  switch (k.kind()) {
    case Value::Kind::string: return k.as_string();
    case Value::Kind::boolean: return k.as_bool() ? "true" : "false";
    case Value::Kind::none: return "null";
    case Value::Kind::integer: return std::to_string(k.as_int());
    case Value::Kind::floating: return json_float(k.as_float());
    default: throw std::runtime_error("keys must be str, int, float, bool or None, not " + k.type_name());
  }
}

void dump(std::string& out, const Value& v, const JsonOptions& o, int level, int depth) {
  if (depth > 256) throw std::runtime_error("value too deeply nested for tojson");
  const std::string item_sep = o.separators ? o.separators->first : (o.indent ? "," : ", ");
  const std::string key_sep = o.separators ? o.separators->second : ": ";
  auto newline = [&](int lvl) {
    if (out.size() + 1 + static_cast<size_t>(lvl) * o.indent->size() > o.max_bytes)
      throw std::runtime_error("tojson output too large");
    out += '\n';
    for (int i = 0; i < lvl; ++i) out += *o.indent;
  };
  switch (v.kind()) {
    case Value::Kind::none: out += "null"; return;
    case Value::Kind::boolean: out += v.as_bool() ? "true" : "false"; return;
    case Value::Kind::integer: out += std::to_string(v.as_int()); return;
    case Value::Kind::floating: out += json_float(v.as_float()); return;
    case Value::Kind::string: json_string(out, v.as_string(), o.ensure_ascii); return;
    case Value::Kind::list: {
      const auto& xs = v.items();
      if (xs.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < xs.size(); ++i) {
        if (i) out += item_sep;
        if (o.indent) newline(level + 1);
        dump(out, xs[i], o, level + 1, depth + 1);
      }
      if (o.indent) newline(level);
      out += ']';
      return;
    }
    case Value::Kind::dict: {
      const auto& d = v.dict();
      if (d.items.empty()) {
        out += "{}";
        return;
      }
      std::vector<std::pair<std::string, const Value*>> entries;
      for (const auto& [k, x] : d.items) entries.emplace_back(json_key(k), &x);
      if (o.sort_keys) {
        for (const auto& [k, x] : d.items)
          if (!k.is_string()) throw std::runtime_error("'<' not supported between dict keys of different types");
        std::stable_sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
      }
      out += '{';
      for (size_t i = 0; i < entries.size(); ++i) {
        if (i) out += item_sep;
        if (o.indent) newline(level + 1);
        json_string(out, entries[i].first, o.ensure_ascii);
        out += key_sep;
        dump(out, *entries[i].second, o, level + 1, depth + 1);
      }
      if (o.indent) newline(level);
      out += '}';
      return;
    }
    default: throw std::runtime_error("Object of type " + v.type_name() + " is not JSON serializable");
  }
}

}  // namespace

std::string json_dumps(const Value& v, const JsonOptions& opt) {
  std::string out;
  dump(out, v, opt, 0, 0);
  return out;
}

}  // namespace kvgraph::chat::jinja
