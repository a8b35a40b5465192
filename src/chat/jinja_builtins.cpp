// jinja2's built-in filters, tests and globals (filters.py, tests.py,
// defaults.py), transformers' additions (tojson without HTML escaping,
// raise_exception, strftime_now), and the str / dict / list methods the
// sandbox lets a template call. Each follows the Python original; where a
// Python type has no equivalent here (generators, dict views, range
// objects) a list stands in, which renders the same unless printed whole.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <ctime>
#include <functional>

#include <fmt/format.h>

#include "chat/jinja_eval.h"
#include "chat/pystr.h"

namespace kvgraph::chat::jinja {

namespace {

// ---- argument binding ----

// Binds a call's arguments to named parameters, as Python does.
class Params {
 public:
  Params(Interpreter& in, CallArgs& args, std::string_view fn, std::initializer_list<const char*> names)
      : in_(in), values_(names.size()) {
    std::vector<const char*> n(names);
    if (args.pos.size() > n.size())
      in.fail(fmt::format("{}() takes at most {} argument{} ({} given)", fn, n.size(), n.size() == 1 ? "" : "s",
                          args.pos.size()));
    for (size_t i = 0; i < args.pos.size(); ++i) values_[i] = args.pos[i];
    for (auto& kv : args.kw) {
      const std::string& k = kv.first;
      auto it = std::find_if(n.begin(), n.end(), [&](const char* x) { return k == x; });
      if (it == n.end()) in.fail(fmt::format("{}() got an unexpected keyword argument '{}'", fn, k));
      auto& slot = values_[static_cast<size_t>(it - n.begin())];
      if (slot) in.fail(fmt::format("{}() got multiple values for argument '{}'", fn, k));
      slot = kv.second;
    }
  }
  bool has(size_t i) const { return values_[i].has_value(); }
  Value get(size_t i, Value dflt = Value::none()) const { return values_[i] ? *values_[i] : std::move(dflt); }
  int64_t get_int(size_t i, int64_t dflt, const char* what) const {
    if (!values_[i]) return dflt;
    if (!values_[i]->is_integral())
      in_.fail(fmt::format("'{}' object cannot be interpreted as an integer ({})", values_[i]->type_name(), what));
    return values_[i]->as_int();
  }
  bool get_bool(size_t i, bool dflt) const { return values_[i] ? values_[i]->truthy() : dflt; }
  std::optional<std::string> get_str_or_none(size_t i) const {
    if (!values_[i] || values_[i]->is_none()) return std::nullopt;
    return values_[i]->str();
  }

 private:
  Interpreter& in_;
  std::vector<std::optional<Value>> values_;
};

void no_args(Interpreter& in, CallArgs& args, std::string_view fn) { Params p(in, args, fn, {}); }

Value obj(std::shared_ptr<Object> o) { return Value(std::move(o)); }

// The result of a filter jinja2 implements as a generator: computed now, an
// error kept for when it is iterated (limits are not deferred).
template <class F>
Value lazy(Interpreter& in, const char* python_type, const char* function, F compute) {
  std::shared_ptr<IteratorObject> it;
  try {
    std::vector<Value> items = compute();
    in.check_size(items.size() * sizeof(Value));
    it = std::make_shared<IteratorObject>(python_type, function, std::move(items));
  } catch (const TemplateLimitError&) {
    throw;
  } catch (const TemplateError& e) {
    it = std::make_shared<IteratorObject>(python_type, function, e);
  }
  in.track(it);
  return obj(std::move(it));
}

// ---- Python conversions ----

std::optional<int64_t> parse_int(std::string_view text, int base) {
  std::string s = pystr::strip(text, std::nullopt, true, true);
  bool neg = false;
  size_t i = 0;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) neg = s[i++] == '-';
  if ((base == 16 || base == 8 || base == 2 || base == 0) && i + 1 < s.size() && s[i] == '0') {
    const char k = static_cast<char>(s[i + 1] | 0x20);
    const int b = k == 'x' ? 16 : k == 'o' ? 8 : k == 'b' ? 2 : 0;
    if (b && (base == 0 || base == b)) {
      base = b;
      i += 2;
      if (i < s.size() && s[i] == '_') ++i;
    }
  }
  if (base == 0) base = 10;
  std::string digits;
  for (size_t k = i; k < s.size(); ++k) {
    if (s[k] == '_' && k > i && k + 1 < s.size() && s[k + 1] != '_') continue;
    digits += s[k];
  }
  if (digits.empty()) return std::nullopt;
  uint64_t v = 0;
  auto r = std::from_chars(digits.data(), digits.data() + digits.size(), v, base);
  if (r.ec != std::errc() || r.ptr != digits.data() + digits.size()) return std::nullopt;
  if (v > static_cast<uint64_t>(INT64_MAX) + (neg ? 1 : 0)) return std::nullopt;
  return neg ? static_cast<int64_t>(0 - v) : static_cast<int64_t>(v);
}

std::optional<double> parse_float(std::string_view text) {
  std::string s = pystr::strip(text, std::nullopt, true, true);
  std::string lower = pystr::lower(s);
  size_t i = 0;
  double sign = 1;
  if (i < lower.size() && (lower[i] == '+' || lower[i] == '-')) sign = lower[i++] == '-' ? -1 : 1;
  const std::string rest = lower.substr(i);
  if (rest == "inf" || rest == "infinity") return sign * HUGE_VAL;
  if (rest == "nan") return std::nan("");
  // digits with single underscores between digits, '.', exponent
  std::string clean;
  for (size_t k = 0; k < rest.size(); ++k) {
    const char c = rest[k];
    if (c == '_') {
      if (k == 0 || k + 1 >= rest.size() || !std::isdigit(static_cast<unsigned char>(rest[k - 1])) ||
          !std::isdigit(static_cast<unsigned char>(rest[k + 1])))
        return std::nullopt;
      continue;
    }
    if (!(std::isdigit(static_cast<unsigned char>(c)) || c == '.' || c == 'e' || c == '+' || c == '-'))
      return std::nullopt;
    clean += c;
  }
  if (clean.empty() || clean[0] == '+' || clean[0] == '-') return std::nullopt;
  double v = 0;
  auto r = std::from_chars(clean.data(), clean.data() + clean.size(), v);
  if (r.ec == std::errc::result_out_of_range) {
    v = clean.find('e') != std::string::npos && clean[clean.find('e') + 1] == '-' ? 0.0 : HUGE_VAL;
  } else if (r.ec != std::errc() || r.ptr != clean.data() + clean.size()) {
    return std::nullopt;
  }
  return sign * v;
}

int64_t py_len(Interpreter& in, const Value& v) {
  switch (v.kind()) {
    case Value::Kind::undefined: return 0;
    case Value::Kind::string: return static_cast<int64_t>(pystr::length(v.as_string()));
    case Value::Kind::list: return static_cast<int64_t>(v.items().size());
    case Value::Kind::dict: return static_cast<int64_t>(v.dict().items.size());
    case Value::Kind::object:
      if (v.object()->type_name() == "LoopContext") return static_cast<int64_t>(in.iterate(v).size());
      [[fallthrough]];
    default: in.fail(fmt::format("object of type '{}' has no len()", v.type_name()));
  }
}

// jinja2's make_attrgetter: "a.b.0" looked up part by part with getitem.
std::vector<Value> attribute_parts(const Value& attr) {
  std::vector<Value> parts;
  if (attr.is_none()) return parts;
  if (!attr.is_string()) return {attr};
  for (const std::string& p : pystr::split(attr.as_string(), std::string("."), -1, false)) {
    const bool digits = !p.empty() && std::all_of(p.begin(), p.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (digits && p.size() < 18)
      parts.emplace_back(static_cast<int64_t>(std::stoll(p)));
    else
      parts.emplace_back(p);
  }
  return parts;
}

Value lookup_parts(Interpreter& in, Value item, const std::vector<Value>& parts, const Value* dflt = nullptr) {
  for (const Value& p : parts) {
    item = in.get_item(item, p);
    if (dflt && !dflt->is_none() && item.is_undefined()) item = *dflt;
  }
  return item;
}

Value ignore_case(const Value& v) { return v.is_string() ? Value(pystr::lower(v.as_string())) : v; }

int compare_or_fail(Interpreter& in, const Value& a, const Value& b) {
  if (a.is_undefined()) in.fail_undefined(a);
  if (b.is_undefined()) in.fail_undefined(b);
  auto c = py_compare(a, b);
  if (!c) in.fail(fmt::format("'<' not supported between instances of '{}' and '{}'", a.type_name(), b.type_name()));
  return *c == 2 ? 0 : *c;
}

// Python's sorted(items, key, reverse): stable, and equal items keep their order when reversed.
std::vector<Value> sorted_by(Interpreter& in, std::vector<Value> items, const std::function<Value(const Value&)>& key,
                             bool reverse) {
  std::vector<std::pair<Value, Value>> keyed;
  keyed.reserve(items.size());
  for (Value& v : items) {
    in.step();
    keyed.emplace_back(key(v), std::move(v));
  }
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
    return reverse ? compare_or_fail(in, b.first, a.first) < 0 : compare_or_fail(in, a.first, b.first) < 0;
  });
  std::vector<Value> out;
  out.reserve(keyed.size());
  for (auto& kv : keyed) out.push_back(std::move(kv.second));
  return out;
}

// ---- filters ----

Value f_abs(Interpreter& in, const Value& v, CallArgs& a) {
  no_args(in, a, "abs");
  if (v.is_integral()) {
    if (v.as_int() == INT64_MIN) in.fail("integer overflow");
    return Value(std::abs(v.as_int()));
  }
  if (v.is_float()) return Value(std::fabs(v.as_float()));
  if (v.is_undefined()) in.fail_undefined(v);
  in.fail(fmt::format("bad operand type for abs(): '{}'", v.type_name()));
}

Value f_attr(Interpreter& in, const Value& v, CallArgs& a) {
  Params p(in, a, "attr", {"name"});
  const Value name = p.get(0);
  if (!name.is_string()) in.fail("attribute name must be string");
  if (v.is_undefined()) in.fail_undefined(v);
  const std::string& n = name.as_string();
  if (n.size() >= 2 && n.compare(0, 2, "__") == 0) return in.get_attr(v, n);
  if (v.is_object()) {
    if (auto r = v.object()->attr(n)) return *r;
  } else if (auto m = builtin_method(v, n)) {
    return *m;
  }
  return Value::undefined(fmt::format("'{} object' has no attribute '{}'", v.type_name(), n));
}

Value f_batch(Interpreter& in, const Value& v, CallArgs& a) {
  return lazy(in, "generator", "do_batch", [&] {
  Params p(in, a, "batch", {"linecount", "fill_with"});
  const int64_t n = p.get_int(0, 1, "linecount");
  if (n <= 0) in.fail("batch() linecount must be positive");
  const Value fill = p.get(1);
  std::vector<Value> out, cur;
  for (Value& x : in.iterate(v)) {
    if (static_cast<int64_t>(cur.size()) == n) {
      out.push_back(in.make_list(std::move(cur)));
      cur.clear();
    }
    cur.push_back(std::move(x));
  }
  if (!cur.empty()) {
    if (!fill.is_none())
      while (static_cast<int64_t>(cur.size()) < n) cur.push_back(fill);
    out.push_back(in.make_list(std::move(cur)));
  }
  return out;
  });
}

Value f_capitalize(Interpreter& in, const Value& v, CallArgs& a) {
  no_args(in, a, "capitalize");
  return in.make_string_like(v, pystr::capitalize(v.str()));
}

std::string center(Interpreter& in, const std::string& s, int64_t width, const std::string& fill) {
  const int64_t len = static_cast<int64_t>(pystr::length(s));
  if (width <= len) return s;
  in.check_size(static_cast<size_t>(width) * fill.size());
  const int64_t marg = width - len;
  const int64_t left = marg / 2 + (marg & width & 1);
  std::string out;
  for (int64_t i = 0; i < left; ++i) out += fill;
  out += s;
  for (int64_t i = 0; i < marg - left; ++i) out += fill;
  return out;
}

Value f_center(Interpreter& in, const Value& v, CallArgs& a) {
  Params p(in, a, "center", {"width"});
  return in.make_string_like(v, center(in, v.str(), p.get_int(0, 80, "width"), " "));
}

Value f_length(Interpreter& in, const Value& v, CallArgs& a) {
  no_args(in, a, "length");
  return Value(py_len(in, v));
}

Value f_default(Interpreter& in, const Value& v, CallArgs& a) {
  Params p(in, a, "default", {"default_value", "boolean"});
  if (v.is_undefined() || (p.get_bool(1, false) && !v.truthy())) return p.get(0, Value(""));
  return v;
}

Value f_dictsort(Interpreter& in, const Value& v, CallArgs& a) {
  Params p(in, a, "dictsort", {"case_sensitive", "by", "reverse"});
  if (!v.is_dict()) in.fail(fmt::format("'{}' object has no attribute 'items'", v.type_name()));
  const std::string by = p.get(1, Value("key")).str();
  if (by != "key" && by != "value") in.fail("You can only sort by either \"key\" or \"value\"");
  const size_t pos = by == "key" ? 0 : 1;
  const bool cs = p.get_bool(0, false);
  std::vector<Value> items;
  for (const auto& [k, x] : v.dict().items) items.push_back(Value::list({k, x}, true));
  return in.make_list(sorted_by(
      in, std::move(items), [&](const Value& it) { return cs ? it.items()[pos] : ignore_case(it.items()[pos]); },
      p.get_bool(2, false)));
}

Value f_escape(Interpreter& in, const Value& v, CallArgs& a) {
  no_args(in, a, "escape");
  if (v.is_markup()) return v;
  return Value::markup(in.make_string(html_escape(v.str())).as_string());
}

Value f_forceescape(Interpreter& in, const Value& v, CallArgs& a) {
  no_args(in, a, "forceescape");
  return Value::markup(in.make_string(html_escape(v.str())).as_string());
}

Value f_first(Interpreter& in, const Value& v, CallArgs& a) {
  no_args(in, a, "first");
  if (v.is_object())
    if (auto* it = dynamic_cast<IteratorObject*>(v.object().get())) {
      if (auto x = it->next(in)) return *x;
      return Value::undefined("No first item, sequence was empty.");
    }
  std::vector<Value> items = in.iterate(v);
  if (items.empty()) return Value::undefined("No first item, sequence was empty.");
  return items.front();
}

Value f_last(Interpreter& in, const Value& v, CallArgs& a) {
  no_args(in, a, "last");
  if (v.is_object() && dynamic_cast<IteratorObject*>(v.object().get()))
    in.fail(fmt::format("'{}' object is not reversible", v.type_name()));
  std::vector<Value> items = in.iterate(v);
  if (items.empty()) return Value::undefined("No last item, sequence was empty.");
  return items.back();
}

Value f_float(Interpreter& in, const Value& v, CallArgs& a) {
  Params p(in, a, "float", {"default"});
  const Value dflt = p.get(0, Value(0.0));
  if (v.is_undefined()) in.fail_undefined(v);
  if (v.is_number()) return Value(v.as_float());
  if (v.is_string())
    if (auto d = parse_float(v.as_string())) return Value(*d);
  return dflt;
}

Value f_format(Interpreter& in, const Value& v, CallArgs& a) {
  if (!a.pos.empty() && !a.kw.empty()) in.fail("can't handle positional and keyword arguments at the same time");
  Value args;
  if (!a.kw.empty()) {
    auto d = std::make_shared<Dict>();
    for (auto& [k, x] : a.kw) d->set(Value(k), x);
    args = Value::dict(std::move(*d));
  } else {
    args = Value::list(a.pos, true);
  }
  return in.make_string_like(v, percent_format(in, v.str(), args, v.is_markup()));
}

Value f_groupby(Interpreter& in, const Value& v, CallArgs& a) {
  Params p(in, a, "groupby", {"attribute", "default", "case_sensitive"});
  const auto parts = attribute_parts(p.get(0));
  const Value dflt = p.get(1);
  const bool cs = p.get_bool(2, false);
  auto key = [&](const Value& x) {
    Value k = lookup_parts(in, x, parts, &dflt);
    return cs ? k : ignore_case(k);
  };
  std::vector<Value> sorted = sorted_by(in, in.iterate(v), key, false);
  std::vector<Value> groups;
  size_t i = 0;
  while (i < sorted.size()) {
    const Value k = key(sorted[i]);
    std::vector<Value> members;
    size_t j = i;
    while (j < sorted.size() && py_equal(key(sorted[j]), k)) members.push_back(sorted[j++]);
    const Value shown = cs ? k : lookup_parts(in, members[0], parts, &dflt);
    groups.push_back(Value::list({shown, in.make_list(std::move(members))}, true));
    i = j;
  }
  return in.make_list(std::move(groups));
}

Value f_indent(Interpreter& in, const Value& v, CallArgs& a) {
  Params p(in, a, "indent", {"width", "first", "blank"});
  std::string indention;
  const Value w = p.get(0, Value(int64_t{4}));
  if (w.is_string()) {
    indention = w.as_string();
  } else {
    const int64_t n = p.get_int(0, 4, "width");
    in.check_size(static_cast<size_t>(std::max<int64_t>(0, n)));
    indention = std::string(static_cast<size_t>(std::max<int64_t>(0, n)), ' ');
  }
  if (v.is_undefined()) in.fail_undefined(v);
  if (!v.is_string()) in.fail(fmt::format("indent: expected a string, not {}", v.type_name()));
  const std::vector<std::string> lines = pystr::splitlines(v.as_string() + "\n", false);
  std::string rv;
  if (p.get_bool(2, false)) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i) rv += "\n" + indention;
      rv += lines[i];
      in.check_size(rv.size());
    }
  } else {
    rv = lines.empty() ? "" : lines[0];
    for (size_t i = 1; i < lines.size(); ++i) {
      rv += "\n";
      if (!lines[i].empty()) rv += indention;
      rv += lines[i];
      in.check_size(rv.size());
    }
  }
  if (p.get_bool(1, false)) rv = indention + rv;
  return in.make_string_like(v, std::move(rv));
}

Value f_int(Interpreter& in, const Value& v, CallArgs& a) {
  Params p(in, a, "int", {"default", "base"});
  const Value dflt = p.get(0, Value(int64_t{0}));
  const int64_t base = p.get_int(1, 10, "base");
  if (v.is_undefined()) in.fail_undefined(v);
  if (v.is_integral()) return Value(v.as_int());
  auto from_float = [&](double d) -> Value {
    if (!std::isfinite(d) || std::fabs(d) >= 9.2e18) return dflt;
    return Value(static_cast<int64_t>(std::trunc(d)));
  };
  if (v.is_float()) return from_float(v.as_float());
  if (v.is_string()) {
    if (base == 0 || (base >= 2 && base <= 36))
      if (auto i = parse_int(v.as_string(), static_cast<int>(base))) return Value(*i);
    if (auto d = parse_float(v.as_string())) return from_float(*d);
  }
  return dflt;
}

Value f_items(Interpreter& in, const Value& v, CallArgs& a) {
  no_args(in, a, "items");
  return lazy(in, "generator", "do_items", [&] {
    std::vector<Value> out;
    if (v.is_undefined()) return out;
    if (!v.is_dict()) in.fail("Can only get item pairs from a mapping.");
    for (const auto& [k, x] : v.dict().items) out.push_back(Value::list({k, x}, true));
    return out;
  });
}

Value f_join(Interpreter& in, const Value& v, CallArgs& a) {
  Params p(in, a, "join", {"d", "attribute"});
  const std::string sep = p.get(0, Value("")).str();
  const auto parts = attribute_parts(p.get(1));
  std::string out;
  bool first = true;
  for (const Value& x : in.iterate(v)) {
    in.step();
    if (!first) out += sep;
    first = false;
    out += lookup_parts(in, x, parts).str();
    in.check_size(out.size());
  }
  return in.make_string(std::move(out));
}

Value f_list(Interpreter& in, const Value& v, CallArgs& a) {
  no_args(in, a, "list");
  return in.make_list(in.iterate(v));
}

Value f_lower(Interpreter& in, const Value& v, CallArgs& a) {
  no_args(in, a, "lower");
  return in.make_string_like(v, pystr::lower(v.str()));
}

Value f_upper(Interpreter& in, const Value& v, CallArgs& a) {
  no_args(in, a, "upper");
  return in.make_string_like(v, pystr::upper(v.str()));
}

Value f_map(Interpreter& in, const Value& v, CallArgs& a) {
  return lazy(in, "generator", "sync_do_map", [&] {
  std::vector<Value> out;
  if (!v.truthy()) return out;
  const bool by_attr = a.pos.empty() && std::any_of(a.kw.begin(), a.kw.end(), [](auto& k) { return k.first == "attribute"; });
  if (by_attr) {
    Params p(in, a, "map", {"attribute", "default"});
    const auto parts = attribute_parts(p.get(0));
    const Value dflt = p.get(1);
    for (const Value& x : in.iterate(v)) out.push_back(lookup_parts(in, x, parts, &dflt));
    return out;
  }
  if (a.pos.empty()) in.fail("map requires a filter argument");
  const std::string name = a.pos[0].str();
  CallArgs rest{std::vector<Value>(a.pos.begin() + 1, a.pos.end()), a.kw};
  for (const Value& x : in.iterate(v)) {
    CallArgs each = rest;
    out.push_back(in.filter(name, x, each));
  }
  return out;
  });
}

Value min_max(Interpreter& in, const Value& v, CallArgs& a, bool is_max) {
  Params p(in, a, is_max ? "max" : "min", {"case_sensitive", "attribute"});
  const bool cs = p.get_bool(0, false);
  const auto parts = attribute_parts(p.get(1));
  std::vector<Value> items = in.iterate(v);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  auto key = [&](const Value& x) {
    Value k = lookup_parts(in, x, parts);
    return cs ? k : ignore_case(k);
  };
  size_t best = 0;
  Value best_key = key(items[0]);
  for (size_t i = 1; i < items.size(); ++i) {
    Value k = key(items[i]);
    const int c = compare_or_fail(in, k, best_key);
    if (is_max ? c > 0 : c < 0) {
      best = i;
      best_key = std::move(k);
    }
  }
  return items[best];
}

Value f_max(Interpreter& in, const Value& v, CallArgs& a) { return min_max(in, v, a, true); }
Value f_min(Interpreter& in, const Value& v, CallArgs& a) { return min_max(in, v, a, false); }

Value select_reject(Interpreter& in, const Value& v, CallArgs& a, bool select, bool by_attr) {
  return lazy(in, "generator", "select_or_reject", [&] {
  std::vector<Value> out;
  if (!v.truthy()) return out;
  std::vector<Value> parts;
  size_t off = 0;
  if (by_attr) {
    if (a.pos.empty()) in.fail("Missing parameter for attribute name");
    parts = attribute_parts(a.pos[0]);
    off = 1;
  }
  const bool has_test = a.pos.size() > off;
  const std::string test = has_test ? a.pos[off].str() : "";
  CallArgs rest;
  if (has_test) rest.pos.assign(a.pos.begin() + static_cast<std::ptrdiff_t>(off + 1), a.pos.end());
  rest.kw = a.kw;
  for (const Value& x : in.iterate(v)) {
    const Value t = lookup_parts(in, x, parts);
    CallArgs each = rest;
    const bool ok = has_test ? in.test(test, t, each) : t.truthy();
    if (ok == select) out.push_back(x);
  }
  return out;
  });
}

Value f_select(Interpreter& in, const Value& v, CallArgs& a) { return select_reject(in, v, a, true, false); }
Value f_reject(Interpreter& in, const Value& v, CallArgs& a) { return select_reject(in, v, a, false, false); }
Value f_selectattr(Interpreter& in, const Value& v, CallArgs& a) { return select_reject(in, v, a, true, true); }
Value f_rejectattr(Interpreter& in, const Value& v, CallArgs& a) { return select_reject(in, v, a, false, true); }

Value f_replace(Interpreter& in, const Value& v, CallArgs& a) {
  Params p(in, a, "replace", {"old", "new", "count"});
  const std::string old = p.get(0).str(), repl = p.get(1).str();
  const int64_t count = p.has(2) && !p.get(2).is_none() ? p.get_int(2, -1, "count") : -1;
  const std::string s = v.str();
  const int64_t hits = old.empty() ? static_cast<int64_t>(pystr::length(s)) + 1 : pystr::count(s, old, {}, {});
  const int64_t n = count < 0 ? hits : std::min(count, hits);
  if (repl.size() > old.size()) in.check_size(s.size() + static_cast<size_t>(n) * (repl.size() - old.size()));
  return in.make_string(pystr::replace(s, old, repl, count));
}

Value f_reverse(Interpreter& in, const Value& v, CallArgs& a) {
  no_args(in, a, "reverse");
  if (v.is_string()) {
    std::u32string u = pystr::decode(v.as_string());
    std::reverse(u.begin(), u.end());
    return in.make_string(pystr::encode(u));
  }
  // reversed(): an iterator for a list, tuple or dict; anything else iterable
  // (a generator) becomes a reversed list.
  const bool reversible = v.is_list() || v.is_dict() || v.is_undefined();
  if (!reversible && !(v.is_object() && dynamic_cast<IteratorObject*>(v.object().get())))
    in.fail("argument must be iterable");
  std::vector<Value> items = in.iterate(v);
  std::reverse(items.begin(), items.end());
  if (!reversible) return in.make_list(std::move(items));
  const char* type = v.is_dict() ? "dict_reversekeyiterator" : v.is_tuple() || v.is_undefined() ? "reversed"
                                                                                               : "list_reverseiterator";
  return lazy(in, type, "", [&] { return std::move(items); });
}

Value f_round(Interpreter& in, const Value& v, CallArgs& a) {
  Params p(in, a, "round", {"precision", "method"});
  const int64_t precision = p.get_int(0, 0, "precision");
  const std::string method = p.get(1, Value("common")).str();
  if (method != "common" && method != "ceil" && method != "floor") in.fail("method must be common, ceil or floor");
  if (v.is_undefined()) in.fail_undefined(v);
  if (!v.is_number()) in.fail(fmt::format("type {} doesn't define __round__ method", v.type_name()));
  if (method != "common") {
    const double scale = std::pow(10.0, static_cast<double>(precision));
    const double x = v.as_float() * scale;
    return Value((method == "ceil" ? std::ceil(x) : std::floor(x)) / scale);
  }
  if (v.is_integral()) {
    if (precision >= 0) return Value(v.as_int());
    // round(int, -n): to a multiple of 10^n, ties to even.
    if (precision < -18) return Value(int64_t{0});
    int64_t m = 1;
    for (int64_t i = 0; i < -precision; ++i) m *= 10;
    const int64_t x = v.as_int();
    int64_t q = x / m, r = x % m;
    if (r < 0) {
      r += m;
      q -= 1;
    }
    if (2 * r > m || (2 * r == m && (q & 1))) q += 1;
    return Value(q * m);
  }
  const double x = v.as_float();
  if (!std::isfinite(x)) return Value(x);
  if (precision > 300) return Value(x);
  if (precision < 0) {
    const double m = std::pow(10.0, static_cast<double>(-precision));
    return Value(std::nearbyint(x / m) * m);
  }
  // Correctly rounded to `precision` decimals (ties to even on the exact binary
  // value), as Python's round() does through dtoa.
  char buf[512];
  auto r = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::fixed, static_cast<int>(precision));
  double y = 0;
  std::from_chars(buf, r.ptr, y);
  if (y == 0) y = std::copysign(0.0, x);
  return Value(y);
}

Value f_safe(Interpreter& in, const Value& v, CallArgs& a) {
  no_args(in, a, "safe");
  if (v.is_markup()) return v;
  return Value::markup(v.is_string() ? v.as_string() : in.make_string(v.str()).as_string());
}

Value f_slice(Interpreter& in, const Value& v, CallArgs& a) {
  return lazy(in, "generator", "sync_do_slice", [&] {
  Params p(in, a, "slice", {"slices", "fill_with"});
  const int64_t slices = p.get_int(0, 1, "slices");
  if (slices <= 0) in.fail("slice() slices must be positive");
  const Value fill = p.get(1);
  std::vector<Value> seq = in.iterate(v);
  const int64_t length = static_cast<int64_t>(seq.size());
  const int64_t per = length / slices, extra = length % slices;
  int64_t offset = 0;
  std::vector<Value> out;
  for (int64_t n = 0; n < slices; ++n) {
    in.step();
    const int64_t start = offset + n * per;
    if (n < extra) ++offset;
    const int64_t end = offset + (n + 1) * per;
    std::vector<Value> tmp(seq.begin() + start, seq.begin() + end);
    if (!fill.is_none() && n >= extra) tmp.push_back(fill);
    out.push_back(in.make_list(std::move(tmp)));
  }
  return out;
  });
}

Value f_sort(Interpreter& in, const Value& v, CallArgs& a) {
  Params p(in, a, "sort", {"reverse", "case_sensitive", "attribute"});
  const bool cs = p.get_bool(1, false);
  // make_multi_attrgetter: "a,b" sorts by several attributes.
  std::vector<std::vector<Value>> keys;
  const Value attr = p.get(2);
  if (attr.is_string())
    for (const std::string& s : pystr::split(attr.as_string(), std::string(","), -1, false))
      keys.push_back(attribute_parts(Value(s)));
  else
    keys.push_back(attribute_parts(attr));
  auto key = [&](const Value& x) {
    std::vector<Value> k;
    for (const auto& parts : keys) {
      Value one = lookup_parts(in, x, parts);
      k.push_back(cs ? one : ignore_case(one));
    }
    return Value::list(std::move(k));
  };
  return in.make_list(sorted_by(in, in.iterate(v), key, p.get_bool(0, false)));
}

Value f_string(Interpreter& in, const Value& v, CallArgs& a) {
  no_args(in, a, "string");
  return v.is_string() ? v : in.make_string(v.str());
}

Value f_sum(Interpreter& in, const Value& v, CallArgs& a) {
  Params p(in, a, "sum", {"attribute", "start"});
  const auto parts = attribute_parts(p.get(0));
  Value rv = p.get(1, Value(int64_t{0}));
  for (const Value& x : in.iterate(v)) {
    in.step();
    rv = in.binary("+", rv, lookup_parts(in, x, parts));
  }
  return rv;
}

Value f_title(Interpreter& in, const Value& v, CallArgs& a) {
  no_args(in, a, "title");
  // jinja2 splits on runs of [-\s({\[<] and capitalises each piece's first
  // character (not str.title()).
  const std::u32string u = pystr::decode(v.str());
  auto sep = [](char32_t c) {
    return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || pystr::is_space(c);
  };
  std::string out;
  size_t i = 0;
  while (i < u.size()) {
    size_t j = i;
    const bool s = sep(u[i]);
    while (j < u.size() && sep(u[j]) == s) ++j;
    const std::string piece = pystr::encode(std::u32string_view(u).substr(i, j - i));
    if (s) {
      out += piece;
    } else {
      std::string first;
      pystr::append(first, u[i]);
      out += pystr::upper(first) + pystr::lower(pystr::encode(std::u32string_view(u).substr(i + 1, j - i - 1)));
    }
    i = j;
  }
  return in.make_string(std::move(out));
}

Value f_tojson(Interpreter& in, const Value& v, CallArgs& a) {
  Params p(in, a, "tojson", {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonOptions o;
  o.ensure_ascii = p.get_bool(0, false);
  const Value indent = p.get(1);
  if (indent.is_string()) {
    o.indent = indent.as_string();
  } else if (indent.is_integral()) {
    const int64_t n = std::max<int64_t>(0, indent.as_int());
    in.check_size(static_cast<size_t>(n));
    o.indent = std::string(static_cast<size_t>(n), ' ');
  } else if (!indent.is_none()) {
    in.fail(fmt::format("indent must be an int or a str, not {}", indent.type_name()));
  }
  const Value seps = p.get(2);
  if (seps.is_list() && seps.items().size() == 2)
    o.separators = std::make_pair(seps.items()[0].str(), seps.items()[1].str());
  else if (!seps.is_none())
    in.fail("separators must be a pair of strings");
  o.sort_keys = p.get_bool(3, false);
  o.max_bytes = in.options().limits.max_output;
  try {
    return in.make_string(json_dumps(v, o));
  } catch (const std::runtime_error& e) {
    in.fail(e.what());
  }
}

Value f_trim(Interpreter& in, const Value& v, CallArgs& a) {
  Params p(in, a, "trim", {"chars"});
  return in.make_string_like(v, pystr::strip(v.str(), p.get_str_or_none(0), true, true));
}

Value f_truncate(Interpreter& in, const Value& v, CallArgs& a) {
  Params p(in, a, "truncate", {"length", "killwords", "end", "leeway"});
  const int64_t length = p.get_int(0, 255, "length");
  const bool killwords = p.get_bool(1, false);
  const std::string end = p.get(2, Value("...")).str();
  const int64_t leeway = p.has(3) && !p.get(3).is_none() ? p.get_int(3, 5, "leeway") : 5;
  const int64_t end_len = static_cast<int64_t>(pystr::length(end));
  if (length < end_len) in.fail(fmt::format("expected length >= {}, got {}", end_len, length));
  if (leeway < 0) in.fail(fmt::format("expected leeway >= 0, got {}", leeway));
  if (v.is_undefined()) return v;  // len(Undefined) is 0
  if (!v.is_string()) {
    if (py_len(in, v) <= length + leeway) return v;  // a list or dict short enough comes back as it is
    in.fail(fmt::format("can only concatenate {} (not \"str\") to {}", v.type_name(), v.type_name()));
  }
  const std::string& s = v.as_string();
  const std::u32string u = pystr::decode(s);
  if (static_cast<int64_t>(u.size()) <= length + leeway) return v;
  const std::string head = pystr::encode(std::u32string_view(u).substr(0, static_cast<size_t>(length - end_len)));
  const std::string tail = v.is_markup() ? html_escape(end) : end;  // Markup + str escapes the str
  if (killwords) return in.make_string_like(v, head + tail);
  return in.make_string_like(v, pystr::split(head, std::string(" "), 1, true)[0] + tail);
}

Value f_unique(Interpreter& in, const Value& v, CallArgs& a) {
  return lazy(in, "generator", "sync_do_unique", [&] {
  Params p(in, a, "unique", {"case_sensitive", "attribute"});
  const bool cs = p.get_bool(0, false);
  const auto parts = attribute_parts(p.get(1));
  std::vector<Value> seen, out;
  for (const Value& x : in.iterate(v)) {
    in.step();
    Value k = lookup_parts(in, x, parts);
    if (!cs) k = ignore_case(k);
    if (!py_hashable(k)) in.fail(fmt::format("unhashable type: '{}'", k.type_name()));
    if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return py_equal(s, k); })) continue;
    seen.push_back(std::move(k));
    out.push_back(x);
  }
  return out;
  });
}

Value f_wordcount(Interpreter& in, const Value& v, CallArgs& a) {
  no_args(in, a, "wordcount");
  int64_t n = 0;
  bool in_word = false;
  for (char32_t c : pystr::decode(v.str())) {
    const bool w = c == '_' || pystr::is_alpha(c) || pystr::is_numeric(c);
    if (w && !in_word) ++n;
    in_word = w;
  }
  return Value(n);
}

template <const char* Name>
Value f_unsupported(Interpreter& in, const Value&, CallArgs&) {
  in.fail(fmt::format("the filter '{}' is not supported in chat templates", Name));
}
constexpr char kFilesizeformat[] = "filesizeformat", kPprint[] = "pprint", kRandom[] = "random",
               kStriptags[] = "striptags", kUrlencode[] = "urlencode", kUrlize[] = "urlize", kWordwrap[] = "wordwrap",
               kXmlattr[] = "xmlattr";

// ---- tests ----

int64_t int_or_fail(Interpreter& in, const Value& v) {
  if (v.is_undefined()) in.fail_undefined(v);
  if (!v.is_integral()) in.fail(fmt::format("expected an integer, not {}", v.type_name()));
  return v.as_int();
}

Value test_arg(Interpreter& in, CallArgs& a, const char* name) {
  Params p(in, a, name, {"other"});
  if (!p.has(0)) in.fail(fmt::format("{}() missing 1 required positional argument", name));
  return p.get(0);
}

bool t_odd(Interpreter& in, const Value& v, CallArgs& a) {
  no_args(in, a, "odd");
  if (v.is_float()) return std::fmod(std::fabs(v.as_float()), 2.0) == 1.0;
  return (int_or_fail(in, v) % 2 + 2) % 2 == 1;
}
bool t_even(Interpreter& in, const Value& v, CallArgs& a) {
  no_args(in, a, "even");
  if (v.is_float()) return std::fmod(v.as_float(), 2.0) == 0.0;
  return int_or_fail(in, v) % 2 == 0;
}
bool t_divisibleby(Interpreter& in, const Value& v, CallArgs& a) {
  const Value n = test_arg(in, a, "divisibleby");
  const Value m = in.binary("%", v, n);
  return py_equal(m, Value(int64_t{0}));
}
bool t_defined(Interpreter& in, const Value& v, CallArgs& a) {
  no_args(in, a, "defined");
  return !v.is_undefined();
}
bool t_undefined(Interpreter& in, const Value& v, CallArgs& a) {
  no_args(in, a, "undefined");
  return v.is_undefined();
}
bool t_filter(Interpreter& in, const Value& v, CallArgs& a) {
  no_args(in, a, "filter");
  return v.is_string() && in.has_filter(v.as_string());
}
bool t_test(Interpreter& in, const Value& v, CallArgs& a) {
  no_args(in, a, "test");
  return v.is_string() && in.has_test(v.as_string());
}
bool t_none(Interpreter& in, const Value& v, CallArgs& a) {
  no_args(in, a, "none");
  return v.is_none();
}
bool t_boolean(Interpreter& in, const Value& v, CallArgs& a) {
  no_args(in, a, "boolean");
  return v.is_bool();
}
bool t_false(Interpreter& in, const Value& v, CallArgs& a) {
  no_args(in, a, "false");
  return v.is_bool() && !v.as_bool();
}
bool t_true(Interpreter& in, const Value& v, CallArgs& a) {
  no_args(in, a, "true");
  return v.is_bool() && v.as_bool();
}
bool t_integer(Interpreter& in, const Value& v, CallArgs& a) {
  no_args(in, a, "integer");
  return v.is_int();
}
bool t_float(Interpreter& in, const Value& v, CallArgs& a) {
  no_args(in, a, "float");
  return v.is_float();
}
bool t_lower(Interpreter& in, const Value& v, CallArgs& a) {
  no_args(in, a, "lower");
  return pystr::is_lower_str(v.str());
}
bool t_upper(Interpreter& in, const Value& v, CallArgs& a) {
  no_args(in, a, "upper");
  return pystr::is_upper_str(v.str());
}
bool t_string(Interpreter& in, const Value& v, CallArgs& a) {
  no_args(in, a, "string");
  return v.is_string();
}
bool t_mapping(Interpreter& in, const Value& v, CallArgs& a) {
  no_args(in, a, "mapping");
  return v.is_dict();
}
bool t_number(Interpreter& in, const Value& v, CallArgs& a) {
  no_args(in, a, "number");
  return v.is_number();
}
bool t_sequence(Interpreter& in, const Value& v, CallArgs& a) {
  no_args(in, a, "sequence");
  // len() and __getitem__: str, list, tuple, dict, and jinja2's Undefined.
  return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
}
bool t_iterable(Interpreter& in, const Value& v, CallArgs& a) {
  no_args(in, a, "iterable");
  return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined() ||
         (v.is_object() &&
          (v.object()->type_name() == "LoopContext" || dynamic_cast<const IteratorObject*>(v.object().get())));
}
bool t_callable(Interpreter& in, const Value& v, CallArgs& a) {
  no_args(in, a, "callable");
  // Undefined defines __call__ (which raises), so Python's callable() is true.
  return v.is_undefined() || (v.is_object() && v.object()->callable());
}
bool t_sameas(Interpreter& in, const Value& v, CallArgs& a) {
  const Value o = test_arg(in, a, "sameas");
  if (v.kind() != o.kind()) return false;
  switch (v.kind()) {
    case Value::Kind::list: return v.items().empty() && o.items().empty() ? v.is_tuple() && o.is_tuple() : false;
    case Value::Kind::dict: return v.dict_ptr() == o.dict_ptr();
    case Value::Kind::object: return v.object() == o.object();
    case Value::Kind::undefined: return false;
    default: return py_equal(v, o);
  }
}
bool t_escaped(Interpreter& in, const Value& v, CallArgs& a) {
  no_args(in, a, "escaped");
  return v.is_markup();
}
bool t_in(Interpreter& in, const Value& v, CallArgs& a) { return in.contains(test_arg(in, a, "in"), v); }
bool t_eq(Interpreter& in, const Value& v, CallArgs& a) { return py_equal(v, test_arg(in, a, "eq")); }
bool t_ne(Interpreter& in, const Value& v, CallArgs& a) { return !py_equal(v, test_arg(in, a, "ne")); }
bool t_lt(Interpreter& in, const Value& v, CallArgs& a) { return compare_or_fail(in, v, test_arg(in, a, "lt")) < 0; }
bool t_le(Interpreter& in, const Value& v, CallArgs& a) { return compare_or_fail(in, v, test_arg(in, a, "le")) <= 0; }
bool t_gt(Interpreter& in, const Value& v, CallArgs& a) { return compare_or_fail(in, v, test_arg(in, a, "gt")) > 0; }
bool t_ge(Interpreter& in, const Value& v, CallArgs& a) { return compare_or_fail(in, v, test_arg(in, a, "ge")) >= 0; }

// ---- callables ----

using Fn = std::function<Value(Interpreter&, CallArgs&)>;

class Builtin : public Object {
 public:
  Builtin(std::string name, Fn fn, std::string owner = "")
      : name_(std::move(name)), owner_(std::move(owner)), fn_(std::move(fn)) {}
  std::string type_name() const override { return "builtin_function_or_method"; }
  bool callable() const override { return true; }
  Value call(Interpreter& in, CallArgs& args, int) const override { return fn_(in, args); }
  std::string str() const override {
    return owner_.empty() ? fmt::format("<built-in function {}>", name_)
                          : fmt::format("<built-in method {} of {} object>", name_, owner_);
  }

 private:
  std::string name_, owner_;
  Fn fn_;
};

Value builtin(std::string name, Fn fn) { return obj(std::make_shared<Builtin>(std::move(name), std::move(fn))); }

class JoinerObject : public Object {
 public:
  explicit JoinerObject(std::string sep) : sep_(std::move(sep)) {}
  std::string type_name() const override { return "Joiner"; }
  bool callable() const override { return true; }
  Value call(Interpreter&, CallArgs&, int) const override {
    if (!used_) {
      used_ = true;
      return Value("");
    }
    return Value(sep_);
  }

 private:
  std::string sep_;
  mutable bool used_ = false;
};

class CyclerObject : public Object {
 public:
  explicit CyclerObject(std::vector<Value> items) : items_(std::move(items)) {}
  std::string type_name() const override { return "Cycler"; }
  std::optional<Value> attr(std::string_view name) const override {
    if (name == "current") return items_[pos_];
    if (name == "next")
      return builtin("next", [this](Interpreter&, CallArgs&) {
        Value v = items_[pos_];
        pos_ = (pos_ + 1) % items_.size();
        return v;
      });
    if (name == "reset")
      return builtin("reset", [this](Interpreter&, CallArgs&) {
        pos_ = 0;
        return Value::none();
      });
    return std::nullopt;
  }

 private:
  std::vector<Value> items_;
  mutable size_t pos_ = 0;
};

Value make_dict(Interpreter& in, CallArgs& a, const char* fn) {
  auto d = std::make_shared<Dict>();
  if (a.pos.size() > 1) in.fail(fmt::format("{} expected at most 1 argument, got {}", fn, a.pos.size()));
  if (!a.pos.empty()) {
    const Value& src = a.pos[0];
    if (src.is_dict()) {
      *d = src.dict();
    } else {
      for (const Value& pair : in.iterate(src)) {
        std::vector<Value> kv = in.iterate(pair);
        if (kv.size() != 2) in.fail("dictionary update sequence element has the wrong length; 2 is required");
        if (!py_hashable(kv[0])) in.fail(fmt::format("unhashable type: '{}'", kv[0].type_name()));
        d->set(kv[0], kv[1]);
      }
    }
  }
  for (auto& [k, v] : a.kw) d->set(Value(k), v);
  return Value::dict(std::move(*d));
}

Value g_range(Interpreter& in, CallArgs& a) {
  if (!a.kw.empty()) in.fail("range() takes no keyword arguments");
  if (a.pos.empty() || a.pos.size() > 3)
    in.fail(fmt::format("range expected at most 3 arguments, got {}", a.pos.size()));
  std::vector<int64_t> n;
  for (const Value& v : a.pos) n.push_back(int_or_fail(in, v));
  const int64_t start = n.size() > 1 ? n[0] : 0, stop = n.size() > 1 ? n[1] : n[0], step = n.size() > 2 ? n[2] : 1;
  if (step == 0) in.fail("range() arg 3 must not be zero");
  // jinja2's sandbox refuses ranges of more than MAX_RANGE = 100000 items.
  const long double count = step > 0 ? std::ceil((static_cast<long double>(stop) - start) / step)
                                     : std::ceil((static_cast<long double>(start) - stop) / -static_cast<long double>(step));
  if (count > 100000) in.fail("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
  std::vector<Value> out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.emplace_back(i);
  return in.make_list(std::move(out));
}

// ---- methods of str, dict, list ----

std::optional<int64_t> opt_index(Interpreter& in, const Params& p, size_t i) {
  if (!p.has(i) || p.get(i).is_none()) return std::nullopt;
  return p.get_int(i, 0, "slice index");
}

bool starts_or_ends(Interpreter& in, const std::string& self, CallArgs& a, bool ends) {
  Params p(in, a, ends ? "endswith" : "startswith", {"prefix", "start", "end"});
  const Value what = p.get(0);
  std::vector<std::string> options;
  if (what.is_string()) {
    options.push_back(what.as_string());
  } else if (what.is_tuple()) {
    for (const Value& x : what.items()) {
      if (!x.is_string()) in.fail("tuple for startswith must only contain str");
      options.push_back(x.as_string());
    }
  } else {
    in.fail(fmt::format("{} first arg must be str or a tuple of str, not {}", ends ? "endswith" : "startswith",
                        what.type_name()));
  }
  const std::u32string u = pystr::decode(self);
  const int64_t n = static_cast<int64_t>(u.size());
  int64_t s = opt_index(in, p, 1).value_or(0), e = opt_index(in, p, 2).value_or(n);
  if (s < 0) s = std::max<int64_t>(0, s + n);
  if (e < 0) e = std::max<int64_t>(0, e + n);
  e = std::min(e, n);
  if (s > n) return false;
  const std::u32string_view part = s <= e ? std::u32string_view(u).substr(s, e - s) : std::u32string_view();
  if (s > e) return false;
  for (const std::string& o : options) {
    const std::u32string w = pystr::decode(o);
    if (w.size() > part.size()) continue;
    if (ends ? part.substr(part.size() - w.size()) == w : part.substr(0, w.size()) == w) return true;
  }
  return false;
}

std::string format_spec(Interpreter& in, const Value& v, const std::string& spec);

// str.format: {} {0} {name} {0.attr} {0[key]} {!r} {:spec}.
std::string str_format(Interpreter& in, const std::string& f, CallArgs& a) {
  std::string out;
  size_t auto_index = 0;
  bool manual = false, automatic = false;
  size_t i = 0;
  while (i < f.size()) {
    const char c = f[i];
    if (c == '}') {
      if (i + 1 < f.size() && f[i + 1] == '}') {
        out += '}';
        i += 2;
        continue;
      }
      in.fail("Single '}' encountered in format string");
    }
    if (c != '{') {
      out += c;
      ++i;
      continue;
    }
    if (i + 1 < f.size() && f[i + 1] == '{') {
      out += '{';
      i += 2;
      continue;
    }
    // The field up to its matching '}' (a spec may hold nested {} which we do not expand).
    size_t depth = 1, j = i + 1;
    while (j < f.size() && depth) {
      if (f[j] == '{') ++depth;
      if (f[j] == '}') --depth;
      if (depth) ++j;
    }
    if (j >= f.size()) in.fail("expected '}' before end of string");
    std::string field = f.substr(i + 1, j - i - 1);
    i = j + 1;
    std::string spec, conv;
    if (size_t colon = field.find(':'); colon != std::string::npos) {
      spec = field.substr(colon + 1);
      field.resize(colon);
    }
    if (size_t bang = field.find('!'); bang != std::string::npos) {
      conv = field.substr(bang + 1);
      field.resize(bang);
    }
    size_t k = 0;
    while (k < field.size() && field[k] != '.' && field[k] != '[') ++k;
    const std::string head = field.substr(0, k);
    Value v;
    if (head.empty()) {
      if (manual) in.fail("cannot switch from manual field specification to automatic field numbering");
      automatic = true;
      if (auto_index >= a.pos.size()) in.fail(fmt::format("Replacement index {} out of range for positional args tuple", auto_index));
      v = a.pos[auto_index++];
    } else if (std::all_of(head.begin(), head.end(), [](char d) { return d >= '0' && d <= '9'; })) {
      if (automatic) in.fail("cannot switch from automatic field numbering to manual field specification");
      manual = true;
      const size_t idx = head.size() < 9 ? std::stoul(head) : SIZE_MAX;
      if (idx >= a.pos.size()) in.fail(fmt::format("Replacement index {} out of range for positional args tuple", head));
      v = a.pos[idx];
    } else {
      auto it = std::find_if(a.kw.begin(), a.kw.end(), [&](const auto& kv) { return kv.first == head; });
      if (it == a.kw.end()) in.fail(fmt::format("'{}'", head));
      v = it->second;
    }
    while (k < field.size()) {
      if (field[k] == '.') {
        size_t e = k + 1;
        while (e < field.size() && field[e] != '.' && field[e] != '[') ++e;
        v = in.get_attr(v, field.substr(k + 1, e - k - 1));
        k = e;
      } else {
        const size_t e = field.find(']', k);
        if (e == std::string::npos) in.fail("Missing ']' in format string");
        const std::string key = field.substr(k + 1, e - k - 1);
        const bool digits = !key.empty() && std::all_of(key.begin(), key.end(), [](char d) { return d >= '0' && d <= '9'; });
        v = in.get_item(v, digits && key.size() < 18 ? Value(static_cast<int64_t>(std::stoll(key))) : Value(key));
        k = e + 1;
      }
    }
    if (v.is_undefined() && v.undefined_info() && v.undefined_info()->unsafe) in.fail_undefined(v);
    if (conv == "r" || conv == "a")
      v = Value(v.repr());
    else if (conv == "s")
      v = Value(v.str());
    else if (!conv.empty())
      in.fail(fmt::format("Unknown conversion specifier {}", conv));
    out += format_spec(in, v, spec);
    in.check_size(out.size());
  }
  return out;
}

// Python's format mini-language for str, int and float:
// [[fill]align][sign][#][0][width][,|_][.precision][type]
std::string format_spec(Interpreter& in, const Value& v, const std::string& spec) {
  if (spec.empty()) return v.str();
  const std::u32string s = pystr::decode(spec);
  size_t i = 0;
  char32_t fill = ' ';
  char align = 0;
  auto is_align = [](char32_t c) { return c == '<' || c == '>' || c == '^' || c == '='; };
  if (s.size() >= 2 && is_align(s[1])) {
    fill = s[0];
    align = static_cast<char>(s[1]);
    i = 2;
  } else if (!s.empty() && is_align(s[0])) {
    align = static_cast<char>(s[0]);
    i = 1;
  }
  char sign = '-';
  if (i < s.size() && (s[i] == '+' || s[i] == '-' || s[i] == ' ')) sign = static_cast<char>(s[i++]);
  bool alt = false;
  if (i < s.size() && s[i] == '#') alt = true, ++i;
  if (i < s.size() && s[i] == '0') {
    if (!align) fill = '0', align = '=';
    ++i;
  }
  int64_t width = 0;
  while (i < s.size() && s[i] >= '0' && s[i] <= '9') width = std::min<int64_t>(width * 10 + (s[i++] - '0'), 1 << 30);
  char grouping = 0;
  if (i < s.size() && (s[i] == ',' || s[i] == '_')) grouping = static_cast<char>(s[i++]);
  int64_t precision = -1;
  if (i < s.size() && s[i] == '.') {
    ++i;
    precision = 0;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') precision = std::min<int64_t>(precision * 10 + (s[i++] - '0'), 1000);
  }
  char type = 0;
  if (i < s.size()) type = static_cast<char>(s[i++]);
  if (i != s.size()) in.fail("Invalid format specifier");
  in.check_size(static_cast<size_t>(width));

  std::string body, prefix;
  if (v.is_string() || (!v.is_number() && (type == 0 || type == 's'))) {
    if (type && type != 's') in.fail(fmt::format("Unknown format code '{}' for object of type 'str'", type));
    std::u32string u = pystr::decode(v.str());
    if (precision >= 0 && static_cast<int64_t>(u.size()) > precision) u.resize(static_cast<size_t>(precision));
    body = pystr::encode(u);
    if (!align) align = '<';
  } else if (v.is_number()) {
    const bool integral = v.is_integral() && (type == 0 || type == 'd' || type == 'x' || type == 'X' || type == 'o' ||
                                             type == 'b' || type == 'c' || type == 'n');
    bool negative = false;
    if (integral) {
      const int64_t x = v.as_int();
      negative = x < 0;
      const uint64_t mag = negative ? 0 - static_cast<uint64_t>(x) : static_cast<uint64_t>(x);
      switch (type) {
        case 'x': body = fmt::format("{:x}", mag); if (alt) prefix = "0x"; break;
        case 'X': body = fmt::format("{:X}", mag); if (alt) prefix = "0X"; break;
        case 'o': body = fmt::format("{:o}", mag); if (alt) prefix = "0o"; break;
        case 'b': body = fmt::format("{:b}", mag); if (alt) prefix = "0b"; break;
        case 'c': pystr::append(body, static_cast<char32_t>(mag)); break;
        default: body = std::to_string(mag);
      }
    } else {
      if (type && !std::strchr("eEfFgG%", type)) in.fail(fmt::format("Unknown format code '{}' for object of type 'float'", type));
      double x = v.as_float();
      negative = std::signbit(x) && !std::isnan(x);
      x = std::fabs(x);
      const int p = static_cast<int>(precision < 0 ? 6 : precision);
      switch (type) {
        case 'e': body = fmt::format("{:.{}e}", x, p); break;
        case 'E': body = fmt::format("{:.{}E}", x, p); break;
        case 'f': body = fmt::format("{:.{}f}", x, p); break;
        case 'F': body = fmt::format("{:.{}F}", x, p); break;
        case '%': body = fmt::format("{:.{}f}%", x * 100, p); break;
        case 'g': body = fmt::format("{:.{}g}", x, p == 0 ? 1 : p); break;
        case 'G': body = fmt::format("{:.{}G}", x, p == 0 ? 1 : p); break;
        default:
          body = precision < 0 ? float_repr(x) : fmt::format("{:.{}g}", x, precision == 0 ? 1 : static_cast<int>(precision));
      }
      if (std::isnan(v.as_float())) body = type && std::isupper(static_cast<unsigned char>(type)) ? "NAN" : "nan";
      if (std::isinf(v.as_float())) body = type && std::isupper(static_cast<unsigned char>(type)) ? "INF" : "inf";
    }
    if (grouping) {
      size_t digits_end = body.find_first_not_of("0123456789");
      if (digits_end == std::string::npos) digits_end = body.size();
      std::string grouped;
      for (size_t k = 0; k < digits_end; ++k) {
        if (k && (digits_end - k) % 3 == 0) grouped += grouping;
        grouped += body[k];
      }
      body = grouped + body.substr(digits_end);
    }
    prefix = (negative ? "-" : sign == '+' ? "+" : sign == ' ' ? " " : "") + prefix;
    if (!align) align = '>';
  } else {
    in.fail(fmt::format("unsupported format string passed to {}.__format__", v.type_name()));
  }
  const int64_t len = static_cast<int64_t>(pystr::length(prefix) + pystr::length(body));
  if (width <= len) return prefix + body;
  std::string pad;
  auto pads = [&](int64_t n) {
    std::string r;
    for (int64_t k = 0; k < n; ++k) pystr::append(r, fill);
    return r;
  };
  const int64_t marg = width - len;
  switch (align) {
    case '<': return prefix + body + pads(marg);
    case '^': return pads(marg / 2) + prefix + body + pads(marg - marg / 2);
    case '=': return prefix + pads(marg) + body;
    default: return pads(marg) + prefix + body;
  }
}

Value str_method_plain(Interpreter& in, const std::string& self, const std::string& name, CallArgs& a) {
  auto chars_arg = [&](const char* fn) {
    Params p(in, a, fn, {"chars"});
    return p.get_str_or_none(0);
  };
  if (name == "strip") return in.make_string(pystr::strip(self, chars_arg("strip"), true, true));
  if (name == "lstrip") return in.make_string(pystr::strip(self, chars_arg("lstrip"), true, false));
  if (name == "rstrip") return in.make_string(pystr::strip(self, chars_arg("rstrip"), false, true));
  if (name == "split" || name == "rsplit") {
    Params p(in, a, name, {"sep", "maxsplit"});
    std::vector<Value> out;
    try {
      for (std::string& s : pystr::split(self, p.get_str_or_none(0), p.get_int(1, -1, "maxsplit"), name == "rsplit"))
        out.emplace_back(std::move(s));
    } catch (const std::invalid_argument& e) {
      in.fail(e.what());
    }
    return in.make_list(std::move(out));
  }
  if (name == "splitlines") {
    Params p(in, a, name, {"keepends"});
    std::vector<Value> out;
    for (std::string& s : pystr::splitlines(self, p.get_bool(0, false))) out.emplace_back(std::move(s));
    return in.make_list(std::move(out));
  }
  if (name == "startswith" || name == "endswith") return Value(starts_or_ends(in, self, a, name == "endswith"));
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize" || name == "swapcase" ||
      name == "casefold") {
    no_args(in, a, name);
    if (name == "upper") return in.make_string(pystr::upper(self));
    if (name == "title") return in.make_string(pystr::title(self));
    if (name == "capitalize") return in.make_string(pystr::capitalize(self));
    if (name == "swapcase") return in.make_string(pystr::swapcase(self));
    return in.make_string(pystr::lower(self));
  }
  if (name == "replace") {
    Params p(in, a, name, {"old", "new", "count"});
    const Value o = p.get(0), n = p.get(1);
    if (!o.is_string() || !n.is_string()) in.fail("replace() arguments must be str");
    CallArgs fa{{o, n}, {}};
    if (p.has(2)) fa.pos.push_back(p.get(2));
    return f_replace(in, Value(self), fa);  // on a Markup the caller makes the result one
  }
  if (name == "format") return in.make_string(str_format(in, self, a));
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
    Params p(in, a, name, {"sub", "start", "end"});
    const Value sub = p.get(0);
    if (!sub.is_string()) in.fail(fmt::format("must be str, not {}", sub.type_name()));
    if (name == "count") return Value(pystr::count(self, sub.as_string(), opt_index(in, p, 1), opt_index(in, p, 2)));
    const int64_t r = pystr::find(self, sub.as_string(), opt_index(in, p, 1), opt_index(in, p, 2), name[0] == 'r');
    if (r < 0 && (name == "index" || name == "rindex")) in.fail("substring not found");
    return Value(r);
  }
  if (name == "join") {
    Params p(in, a, name, {"iterable"});
    std::string out;
    bool first = true;
    for (const Value& x : in.iterate(p.get(0))) {
      if (!x.is_string()) in.fail(fmt::format("sequence item: expected str instance, {} found", x.type_name()));
      if (!first) out += self;
      first = false;
      out += x.as_string();
      in.check_size(out.size());
    }
    return in.make_string(std::move(out));
  }
  if (name == "isdigit" || name == "isalpha" || name == "isalnum" || name == "isspace" || name == "isdecimal" ||
      name == "isnumeric" || name == "islower" || name == "isupper" || name == "istitle" || name == "isascii") {
    no_args(in, a, name);
    if (name == "isdigit") return Value(pystr::all_of(self, pystr::is_digit));
    if (name == "isalpha") return Value(pystr::all_of(self, pystr::is_alpha));
    if (name == "isdecimal") return Value(pystr::all_of(self, pystr::is_decimal));
    if (name == "isnumeric") return Value(pystr::all_of(self, pystr::is_numeric));
    if (name == "isspace") return Value(pystr::all_of(self, pystr::is_space));
    if (name == "islower") return Value(pystr::is_lower_str(self));
    if (name == "isupper") return Value(pystr::is_upper_str(self));
    if (name == "istitle") return Value(pystr::is_title_str(self));
    if (name == "isascii")
      return Value(std::all_of(self.begin(), self.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; }));
    return Value(pystr::all_of(self, [](char32_t c) {
      return pystr::is_alpha(c) || pystr::is_decimal(c) || pystr::is_digit(c) || pystr::is_numeric(c);
    }));
  }
  if (name == "center" || name == "ljust" || name == "rjust") {
    Params p(in, a, name, {"width", "fillchar"});
    const int64_t width = p.get_int(0, 0, "width");
    const std::string fill = p.get(1, Value(" ")).str();
    if (pystr::length(fill) != 1) in.fail("The fill character must be exactly one character long");
    if (name == "center") return in.make_string(center(in, self, width, fill));
    const int64_t len = static_cast<int64_t>(pystr::length(self));
    if (width <= len) return Value(self);
    in.check_size(static_cast<size_t>(width) * fill.size());
    std::string pad;
    for (int64_t i = len; i < width; ++i) pad += fill;
    return in.make_string(name == "ljust" ? self + pad : pad + self);
  }
  if (name == "zfill") {
    Params p(in, a, name, {"width"});
    const int64_t width = p.get_int(0, 0, "width");
    const int64_t len = static_cast<int64_t>(pystr::length(self));
    if (width <= len) return Value(self);
    in.check_size(static_cast<size_t>(width));
    const bool sign = !self.empty() && (self[0] == '+' || self[0] == '-');
    return in.make_string((sign ? self.substr(0, 1) : "") + std::string(static_cast<size_t>(width - len), '0') +
                          self.substr(sign ? 1 : 0));
  }
  if (name == "partition" || name == "rpartition") {
    Params p(in, a, name, {"sep"});
    const std::string sep = p.get(0).str();
    if (sep.empty()) in.fail("empty separator");
    const size_t at = name == "partition" ? self.find(sep) : self.rfind(sep);
    if (at == std::string::npos)
      return name == "partition" ? Value::list({Value(self), Value(""), Value("")}, true)
                                 : Value::list({Value(""), Value(""), Value(self)}, true);
    return Value::list({Value(self.substr(0, at)), Value(sep), Value(self.substr(at + sep.size()))}, true);
  }
  if (name == "removeprefix" || name == "removesuffix") {
    Params p(in, a, name, {"affix"});
    const std::string x = p.get(0).str();
    if (name == "removeprefix") return Value(self.rfind(x, 0) == 0 ? self.substr(x.size()) : self);
    return Value(!x.empty() && self.size() >= x.size() && self.compare(self.size() - x.size(), x.size(), x) == 0
                     ? self.substr(0, self.size() - x.size())
                     : self);
  }
  if (name == "expandtabs") {
    Params p(in, a, name, {"tabsize"});
    const int64_t tab = p.get_int(0, 8, "tabsize");
    std::string out;
    int64_t col = 0;
    for (char32_t c : pystr::decode(self)) {
      if (c == '\t') {
        if (tab > 0) {
          const int64_t n = tab - col % tab;
          in.check_size(out.size() + static_cast<size_t>(n));
          out += std::string(static_cast<size_t>(n), ' ');
          col += n;
        }
      } else {
        pystr::append(out, c);
        col = (c == '\n' || c == '\r') ? 0 : col + 1;
      }
    }
    return in.make_string(std::move(out));
  }
  in.fail(fmt::format("str.{}() is not supported in chat templates", name));
}

// A str method; on a Markup, as markupsafe wraps it: string arguments are
// escaped and the string results are Markup.
Value str_method(Interpreter& in, const Value& self, const std::string& name, CallArgs& a) {
  if (!self.is_markup()) return str_method_plain(in, self.as_string(), name, a);
  auto escape = [](Value& v) {
    if (v.is_string() && !v.is_markup()) v = Value::markup(html_escape(v.as_string()));
  };
  if (name == "join") {
    Params p(in, a, name, {"iterable"});
    std::vector<Value> items;
    for (Value x : in.iterate(p.get(0))) {
      escape(x);
      items.push_back(std::move(x));
    }
    CallArgs escaped{{Value::list(std::move(items))}, {}};
    return Value::markup(str_method_plain(in, self.as_string(), name, escaped).as_string());
  }
  for (Value& v : a.pos) escape(v);
  for (auto& [k, v] : a.kw) escape(v);
  Value r = str_method_plain(in, self.as_string(), name, a);
  if (r.is_string()) {
    static const char* const kKeepsMarkup[] = {"capitalize", "title", "lower", "upper", "replace", "ljust", "rjust",
                                               "lstrip", "rstrip", "center", "strip", "expandtabs", "swapcase",
                                               "zfill", "casefold", "removeprefix", "removesuffix", "format"};
    for (const char* n : kKeepsMarkup)
      if (name == n) return Value::markup(r.as_string());
    return r;
  }
  if (r.is_list() && (name == "split" || name == "rsplit" || name == "splitlines" || name == "partition" ||
                      name == "rpartition")) {
    std::vector<Value> items;
    for (const Value& x : r.items()) items.push_back(Value::markup(x.as_string()));
    return Value::list(std::move(items), r.is_tuple());
  }
  return r;
}

Value dict_method(Interpreter& in, const Value& self, const std::string& name, CallArgs& a) {
  const Dict& d = self.dict();
  if (name == "get") {
    Params p(in, a, "get", {"key", "default"});
    const Value k = p.get(0);
    if (!py_hashable(k)) in.fail(fmt::format("unhashable type: '{}'", k.type_name()));
    if (const Value* v = d.find(k)) return *v;
    return p.get(1);
  }
  no_args(in, a, name);
  std::vector<Value> out;
  for (const auto& [k, v] : d.items) {
    if (name == "items") out.push_back(Value::list({k, v}, true));
    else if (name == "keys") out.push_back(k);
    else out.push_back(v);
  }
  if (name == "copy") return self;
  in.check_size(out.size() * sizeof(Value));
  return Value::view(std::move(out), name == "items" ? "dict_items" : name == "keys" ? "dict_keys" : "dict_values");
}

Value list_method(Interpreter& in, const Value& self, const std::string& name, CallArgs& a) {
  const auto& xs = self.items();
  if (name == "copy") {
    no_args(in, a, name);
    return self;
  }
  if (name == "count") {
    Params p(in, a, name, {"value"});
    const Value x = p.get(0);
    return Value(static_cast<int64_t>(std::count_if(xs.begin(), xs.end(), [&](const Value& y) { return py_equal(x, y); })));
  }
  Params p(in, a, name, {"value", "start", "stop"});
  const Value x = p.get(0);
  const int64_t n = static_cast<int64_t>(xs.size());
  int64_t s = opt_index(in, p, 1).value_or(0), e = opt_index(in, p, 2).value_or(n);
  if (s < 0) s = std::max<int64_t>(0, s + n);
  if (e < 0) e = std::max<int64_t>(0, e + n);
  for (int64_t i = s; i < std::min(e, n); ++i)
    if (py_equal(xs[static_cast<size_t>(i)], x)) return Value(i);
  in.fail(fmt::format("{} is not in list", x.repr()));
}

bool is_one_of(const std::string& name, std::initializer_list<const char*> names) {
  return std::any_of(names.begin(), names.end(), [&](const char* n) { return name == n; });
}

}  // namespace

// ---- registries ----

std::optional<Value> NamespaceObject::attr(std::string_view name) const {
  if (const Value* v = attrs.find(name)) return *v;
  return std::nullopt;
}

std::string NamespaceObject::str() const { return "<Namespace " + dict_repr(attrs) + ">"; }

std::optional<Value> builtin_method(const Value& self, const std::string& name) {
  auto bound = [&](auto fn) -> Value {
    return obj(std::make_shared<Builtin>(
        name, [self, name, fn](Interpreter& in, CallArgs& a) { return fn(in, self, name, a); }, self.type_name()));
  };
  auto unsafe = [&]() -> Value {
    return Value::undefined(fmt::format("access to attribute '{}' of '{}' object is unsafe.", name, self.type_name()),
                            true);
  };
  if (self.is_string()) {
    if (is_one_of(name, {"strip", "lstrip", "rstrip", "split", "rsplit", "splitlines", "startswith", "endswith", "upper",
                         "lower", "title", "capitalize", "swapcase", "casefold", "replace", "format", "find", "rfind",
                         "index", "rindex", "count", "join", "isdigit", "isalpha", "isalnum", "isspace", "isdecimal",
                         "isnumeric", "islower", "isupper", "istitle", "isascii", "center", "ljust", "rjust", "zfill",
                         "partition", "rpartition", "removeprefix", "removesuffix", "expandtabs", "encode",
                         "format_map", "isidentifier", "isprintable", "maketrans", "translate"}))
      return bound([](Interpreter& in, const Value& s, const std::string& n, CallArgs& a) {
        return str_method(in, s, n, a);
      });
    return std::nullopt;
  }
  if (self.is_dict()) {
    if (is_one_of(name, {"get", "items", "keys", "values", "copy"})) return bound(dict_method);
    if (is_one_of(name, {"pop", "popitem", "setdefault", "update", "clear", "fromkeys"})) return unsafe();
    return std::nullopt;
  }
  if (self.is_list()) {
    if (is_one_of(name, {"count", "index"}) || (!self.is_tuple() && name == "copy")) return bound(list_method);
    if (!self.is_tuple() && is_one_of(name, {"append", "extend", "insert", "pop", "remove", "reverse", "sort", "clear"}))
      return unsafe();
  }
  return std::nullopt;
}

const std::unordered_map<std::string, FilterFn>& builtin_filters() {
  static const std::unordered_map<std::string, FilterFn> filters = {
      {"abs", f_abs},
      {"attr", f_attr},
      {"batch", f_batch},
      {"capitalize", f_capitalize},
      {"center", f_center},
      {"count", f_length},
      {"d", f_default},
      {"default", f_default},
      {"dictsort", f_dictsort},
      {"e", f_escape},
      {"escape", f_escape},
      {"first", f_first},
      {"float", f_float},
      {"forceescape", f_forceescape},
      {"format", f_format},
      {"groupby", f_groupby},
      {"indent", f_indent},
      {"int", f_int},
      {"items", f_items},
      {"join", f_join},
      {"last", f_last},
      {"length", f_length},
      {"list", f_list},
      {"lower", f_lower},
      {"map", f_map},
      {"max", f_max},
      {"min", f_min},
      {"reject", f_reject},
      {"rejectattr", f_rejectattr},
      {"replace", f_replace},
      {"reverse", f_reverse},
      {"round", f_round},
      {"safe", f_safe},
      {"select", f_select},
      {"selectattr", f_selectattr},
      {"slice", f_slice},
      {"sort", f_sort},
      {"string", f_string},
      {"sum", f_sum},
      {"title", f_title},
      {"tojson", f_tojson},
      {"trim", f_trim},
      {"truncate", f_truncate},
      {"unique", f_unique},
      {"upper", f_upper},
      {"wordcount", f_wordcount},
      {"filesizeformat", f_unsupported<kFilesizeformat>},
      {"pprint", f_unsupported<kPprint>},
      {"random", f_unsupported<kRandom>},
      {"striptags", f_unsupported<kStriptags>},
      {"urlencode", f_unsupported<kUrlencode>},
      {"urlize", f_unsupported<kUrlize>},
      {"wordwrap", f_unsupported<kWordwrap>},
      {"xmlattr", f_unsupported<kXmlattr>},
  };
  return filters;
}

const std::unordered_map<std::string, TestFn>& builtin_tests() {
  static const std::unordered_map<std::string, TestFn> tests = {
      {"odd", t_odd},         {"even", t_even},         {"divisibleby", t_divisibleby}, {"defined", t_defined},
      {"undefined", t_undefined}, {"filter", t_filter}, {"test", t_test},               {"none", t_none},
      {"boolean", t_boolean}, {"false", t_false},       {"true", t_true},               {"integer", t_integer},
      {"float", t_float},     {"lower", t_lower},       {"upper", t_upper},             {"string", t_string},
      {"mapping", t_mapping}, {"number", t_number},     {"sequence", t_sequence},       {"iterable", t_iterable},
      {"callable", t_callable}, {"sameas", t_sameas},   {"escaped", t_escaped},         {"in", t_in},
      {"==", t_eq},           {"eq", t_eq},             {"equalto", t_eq},              {"!=", t_ne},
      {"ne", t_ne},           {">", t_gt},              {"gt", t_gt},                   {"greaterthan", t_gt},
      {">=", t_ge},           {"ge", t_ge},             {"<", t_lt},                    {"lt", t_lt},
      {"lessthan", t_lt},     {"<=", t_le},             {"le", t_le},
  };
  return tests;
}

void add_builtin_globals(Scope& g) {
  g.vars["range"] = builtin("range", g_range);
  g.vars["dict"] = builtin("dict", [](Interpreter& in, CallArgs& a) { return make_dict(in, a, "dict"); });
  g.vars["namespace"] = builtin("namespace", [](Interpreter& in, CallArgs& a) {
    auto ns = std::make_shared<NamespaceObject>();
    ns->attrs = make_dict(in, a, "namespace").dict();
    in.track(ns);
    return obj(ns);
  });
  g.vars["joiner"] = builtin("joiner", [](Interpreter& in, CallArgs& a) {
    Params p(in, a, "joiner", {"sep"});
    return obj(std::make_shared<JoinerObject>(p.get(0, Value(", ")).str()));
  });
  g.vars["cycler"] = builtin("cycler", [](Interpreter& in, CallArgs& a) {
    if (!a.kw.empty()) in.fail("cycler() takes no keyword arguments");
    if (a.pos.empty()) in.fail("at least one item has to be provided");
    return obj(std::make_shared<CyclerObject>(a.pos));
  });
  // transformers' globals
  g.vars["raise_exception"] = builtin("raise_exception", [](Interpreter& in, CallArgs& a) -> Value {
    Params p(in, a, "raise_exception", {"message"});
    throw TemplateError(in.line(), p.get(0).str());
  });
  g.vars["strftime_now"] = builtin("strftime_now", [](Interpreter& in, CallArgs& a) {
    Params p(in, a, "strftime_now", {"format"});
    const std::string f = p.get(0).str();
    const auto now = in.options().now.value_or(std::chrono::system_clock::now());
    const std::time_t t = std::chrono::system_clock::to_time_t(now);
    std::tm tm{};
    localtime_r(&t, &tm);
    if (f.empty()) return Value("");
    std::vector<char> buf(256 + f.size() * 16);
    const size_t n = std::strftime(buf.data(), buf.size(), f.c_str(), &tm);
    return in.make_string(std::string(buf.data(), n));
  });
}

std::string percent_format(Interpreter& in, const std::string& f, const Value& args, bool escape_args) {
  const bool mapping = args.is_dict();
  std::vector<Value> pos;
  if (args.is_tuple())
    pos = args.items();
  else if (!mapping)
    pos = {args};
  size_t next = 0;
  bool used_mapping = false;
  std::string out;
  auto take = [&]() -> Value {
    if (mapping && pos.empty()) return args;
    if (next >= pos.size()) in.fail("not enough arguments for format string");
    return pos[next++];
  };
  for (size_t i = 0; i < f.size(); ++i) {
    if (f[i] != '%') {
      out += f[i];
      continue;
    }
    if (++i >= f.size()) in.fail("incomplete format");
    Value v;
    bool have = false;
    if (f[i] == '(') {
      const size_t close = f.find(')', i);
      if (close == std::string::npos) in.fail("incomplete format key");
      if (!mapping) in.fail("format requires a mapping");
      const Value* x = args.dict().find(std::string_view(f).substr(i + 1, close - i - 1));
      if (!x) in.fail(fmt::format("'{}'", f.substr(i + 1, close - i - 1)));
      v = *x;
      have = used_mapping = true;
      i = close + 1;
    }
    std::string flags;
    while (i < f.size() && std::strchr("-+ #0", f[i])) flags += f[i++];
    std::string width, precision;
    if (i < f.size() && f[i] == '*') {
      width = std::to_string(int_or_fail(in, take()));
      ++i;
    } else {
      while (i < f.size() && std::isdigit(static_cast<unsigned char>(f[i]))) width += f[i++];
    }
    bool has_precision = false;
    if (i < f.size() && f[i] == '.') {
      has_precision = true;
      ++i;
      if (i < f.size() && f[i] == '*') {
        precision = std::to_string(int_or_fail(in, take()));
        ++i;
      } else {
        while (i < f.size() && std::isdigit(static_cast<unsigned char>(f[i]))) precision += f[i++];
      }
    }
    while (i < f.size() && std::strchr("hlL", f[i])) ++i;
    if (i >= f.size()) in.fail("incomplete format");
    const char type = f[i];
    if (type == '%') {
      out += '%';
      continue;
    }
    if (!have) v = take();
    // Through the format mini-language, which covers printf's flags.
    std::string spec;
    const bool left = flags.find('-') != std::string::npos;
    const bool zero = !left && flags.find('0') != std::string::npos && type != 's' && type != 'r' && type != 'a';
    if (left)
      spec += '<';
    else if (!zero)
      spec += '>';  // printf pads on the left
    if (flags.find('+') != std::string::npos)
      spec += '+';
    else if (flags.find(' ') != std::string::npos)
      spec += ' ';
    if (flags.find('#') != std::string::npos) spec += '#';
    if (zero) spec += '0';
    if (width.size() > 9) in.fail("width too big");
    spec += width;
    if (has_precision) spec += "." + (precision.empty() ? std::string("0") : precision);
    Value shown = v;
    auto text = [&](std::string s) { return Value(escape_args && !v.is_markup() ? html_escape(s) : std::move(s)); };
    switch (type) {
      case 's': shown = text(v.str()); break;
      case 'r':
      case 'a': shown = text(v.repr()); break;
      case 'd':
      case 'i':
      case 'u':
        if (!v.is_number()) in.fail(fmt::format("%{} format: a real number is required, not {}", type, v.type_name()));
        if (v.is_float()) {
          if (!std::isfinite(v.as_float())) in.fail("cannot convert float to integer");
          shown = Value(static_cast<int64_t>(std::trunc(v.as_float())));
        } else {
          shown = Value(v.as_int());
        }
        if (has_precision) spec.erase(spec.find('.'));
        spec += 'd';
        break;
      case 'x':
      case 'X':
      case 'o':
        if (!v.is_integral()) in.fail(fmt::format("%{} format: an integer is required, not {}", type, v.type_name()));
        spec += type;
        break;
      case 'e':
      case 'E':
      case 'f':
      case 'F':
      case 'g':
      case 'G':
        if (!v.is_number()) in.fail(fmt::format("must be real number, not {}", v.type_name()));
        shown = Value(v.as_float());
        spec += type;
        break;
      case 'c':
        if (v.is_integral()) {
          std::string c;
          pystr::append(c, static_cast<char32_t>(v.as_int()));
          shown = Value(c);
        }
        break;
      default: in.fail(fmt::format("unsupported format character '{}'", type));
    }
    out += format_spec(in, shown, spec);
    in.check_size(out.size());
  }
  if (!mapping && next < pos.size()) in.fail("not all arguments converted during string formatting");
  (void)used_mapping;
  return out;
}

}  // namespace kvgraph::chat::jinja
