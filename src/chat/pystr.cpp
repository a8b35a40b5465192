#include "chat/pystr.h"

#include <algorithm>
#include <span>
#include <stdexcept>

#include "chat/unicode_tables.h"

namespace kvgraph::chat::pystr {

namespace ut = unicode_tables;

namespace {

bool in_ranges(std::span<const ut::Range> r, char32_t c) {
  auto it = std::upper_bound(r.begin(), r.end(), c, [](char32_t v, const ut::Range& x) { return v < x.first; });
  return it != r.begin() && c <= std::prev(it)->last;
}

// The full mapping of c in `map` appended to out; c itself when it has none.
void map_char(std::span<const ut::CaseMapping> map, char32_t c, std::u32string& out) {
  auto it = std::lower_bound(map.begin(), map.end(), c, [](const ut::CaseMapping& m, char32_t v) { return m.cp < v; });
  if (it == map.end() || it->cp != c) {
    out.push_back(c);
    return;
  }
  for (char32_t t : it->to)
    if (t) out.push_back(t);
}

std::span<const ut::CaseMapping> upper_map() { return {ut::kUpperMap, ut::kUpperMapSize}; }
std::span<const ut::CaseMapping> lower_map() { return {ut::kLowerMap, ut::kLowerMapSize}; }
std::span<const ut::CaseMapping> title_map() { return {ut::kTitleMap, ut::kTitleMapSize}; }

bool is_case_ignorable(char32_t c) { return in_ranges({ut::kCaseIgnorable, ut::kCaseIgnorableSize}, c); }
bool is_titlecase(char32_t c) { return is_cased(c) && !is_upper(c) && !is_lower(c); }

// CPython's lower_ucs4: the final-sigma rule for U+03A3, else the lowercase mapping.
void lower_at(const std::u32string& s, size_t i, std::u32string& out) {
  const char32_t c = s[i];
  if (c != 0x3A3) {
    map_char(lower_map(), c, out);
    return;
  }
  ptrdiff_t j = static_cast<ptrdiff_t>(i) - 1;
  while (j >= 0 && is_case_ignorable(s[j])) --j;
  bool final_sigma = j >= 0 && is_cased(s[j]);
  if (final_sigma && i + 1 < s.size()) {
    size_t k = i + 1;
    while (k < s.size() && is_case_ignorable(s[k])) ++k;
    final_sigma = k == s.size() || !is_cased(s[k]);
  }
  out.push_back(final_sigma ? 0x3C2 : 0x3C3);
}

// Python slice bounds [start, end) clamped to [0, n].
std::pair<int64_t, int64_t> bounds(int64_t n, std::optional<int64_t> start, std::optional<int64_t> end) {
  int64_t a = start.value_or(0), b = end.value_or(n);
  if (a < 0) a = std::max<int64_t>(0, a + n);
  if (b < 0) b = std::max<int64_t>(0, b + n);
  return {std::min(a, n), std::min(b, n)};
}

}  // namespace

void append(std::string& out, char32_t cp) {
  if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0xFFFD;  // a lone surrogate has no UTF-8 form
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::u32string decode(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char b = static_cast<unsigned char>(s[i]);
    if (b < 0x80) {
      out.push_back(b);
      ++i;
      continue;
    }
    size_t n = b >= 0xF0 && b <= 0xF4 ? 4 : b >= 0xE0 ? 3 : b >= 0xC2 && b < 0xE0 ? 2 : 0;
    char32_t cp = n == 2 ? b & 0x1F : n == 3 ? b & 0x0F : b & 0x07;
    bool ok = n > 0 && i + n <= s.size();
    for (size_t k = 1; ok && k < n; ++k) {
      const unsigned char c = static_cast<unsigned char>(s[i + k]);
      if ((c & 0xC0) != 0x80) ok = false;
      cp = (cp << 6) | (c & 0x3F);
    }
    if (ok && ((n == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF))))
      ok = false;
    if (!ok) {
      out.push_back(0xFFFD);
      ++i;
      continue;
    }
    out.push_back(cp);
    i += n;
  }
  return out;
}

std::string encode(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) append(out, c);
  return out;
}

size_t length(std::string_view s) {
  size_t n = 0;
  for (char c : s)
    if ((static_cast<unsigned char>(c) & 0xC0) != 0x80) ++n;
  return n;
}

bool is_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}
bool is_printable(char32_t c) { return in_ranges({ut::kPrintable, ut::kPrintableSize}, c); }
bool is_alpha(char32_t c) { return in_ranges({ut::kAlpha, ut::kAlphaSize}, c); }
bool is_decimal(char32_t c) { return in_ranges({ut::kDecimal, ut::kDecimalSize}, c); }
bool is_digit(char32_t c) { return in_ranges({ut::kDigit, ut::kDigitSize}, c); }
bool is_numeric(char32_t c) { return in_ranges({ut::kNumeric, ut::kNumericSize}, c); }
bool is_upper(char32_t c) { return in_ranges({ut::kIsupper, ut::kIsupperSize}, c); }
bool is_lower(char32_t c) { return in_ranges({ut::kIslower, ut::kIslowerSize}, c); }
bool is_cased(char32_t c) { return in_ranges({ut::kCased, ut::kCasedSize}, c); }

std::string upper(std::string_view s) {
  std::u32string out;
  for (char32_t c : decode(s)) map_char(upper_map(), c, out);
  return encode(out);
}

std::string lower(std::string_view s) {
  const std::u32string u = decode(s);
  std::u32string out;
  for (size_t i = 0; i < u.size(); ++i) lower_at(u, i, out);
  return encode(out);
}

std::string title(std::string_view s) {
  const std::u32string u = decode(s);
  std::u32string out;
  bool previous_cased = false;
  for (size_t i = 0; i < u.size(); ++i) {
    if (previous_cased)
      lower_at(u, i, out);
    else
      map_char(title_map(), u[i], out);
    previous_cased = is_cased(u[i]);
  }
  return encode(out);
}

std::string capitalize(std::string_view s) {
  const std::u32string u = decode(s);
  std::u32string out;
  for (size_t i = 0; i < u.size(); ++i) {
    if (i == 0)
      map_char(title_map(), u[i], out);
    else
      lower_at(u, i, out);
  }
  return encode(out);
}

std::string swapcase(std::string_view s) {
  const std::u32string u = decode(s);
  std::u32string out;
  for (size_t i = 0; i < u.size(); ++i) {
    if (is_upper(u[i]))
      lower_at(u, i, out);
    else if (is_lower(u[i]))
      map_char(upper_map(), u[i], out);
    else
      out.push_back(u[i]);
  }
  return encode(out);
}

std::string strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right) {
  const std::u32string u = decode(s);
  std::u32string set;
  if (chars) set = decode(*chars);
  auto strippable = [&](char32_t c) { return chars ? set.find(c) != std::u32string::npos : is_space(c); };
  size_t a = 0, b = u.size();
  if (left)
    while (a < b && strippable(u[a])) ++a;
  if (right)
    while (b > a && strippable(u[b - 1])) --b;
  return encode(std::u32string_view(u).substr(a, b - a));
}

std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit,
                               bool from_right) {
  std::vector<std::string> parts;
  if (sep && sep->empty()) throw std::invalid_argument("empty separator");
  if (maxsplit < 0) maxsplit = INT64_MAX;
  if (sep) {
    if (!from_right) {
      size_t at = 0;
      while (maxsplit-- > 0) {
        const size_t hit = s.find(*sep, at);
        if (hit == std::string_view::npos) break;
        parts.emplace_back(s.substr(at, hit - at));
        at = hit + sep->size();
      }
      parts.emplace_back(s.substr(at));
    } else {
      size_t end = s.size();
      while (maxsplit-- > 0 && end >= sep->size()) {
        const size_t hit = s.rfind(*sep, end - sep->size());
        if (hit == std::string_view::npos) break;
        parts.emplace_back(s.substr(hit + sep->size(), end - hit - sep->size()));
        end = hit;
      }
      parts.emplace_back(s.substr(0, end));
      std::reverse(parts.begin(), parts.end());
    }
    return parts;
  }
  // Runs of whitespace; no empty strings at either end.
  const std::u32string u = decode(s);
  if (!from_right) {
    size_t i = 0;
    while (true) {
      while (i < u.size() && is_space(u[i])) ++i;
      if (i == u.size()) break;
      if (maxsplit-- <= 0) {
        size_t end = u.size();
        while (end > i && is_space(u[end - 1])) --end;
        parts.push_back(encode(std::u32string_view(u).substr(i, end - i)));
        break;
      }
      size_t j = i;
      while (j < u.size() && !is_space(u[j])) ++j;
      parts.push_back(encode(std::u32string_view(u).substr(i, j - i)));
      i = j;
    }
  } else {
    size_t i = u.size();
    while (true) {
      while (i > 0 && is_space(u[i - 1])) --i;
      if (i == 0) break;
      if (maxsplit-- <= 0) {
        size_t start = 0;
        while (start < i && is_space(u[start])) ++start;
        parts.push_back(encode(std::u32string_view(u).substr(start, i - start)));
        break;
      }
      size_t j = i;
      while (j > 0 && !is_space(u[j - 1])) --j;
      parts.push_back(encode(std::u32string_view(u).substr(j, i - j)));
      i = j;
    }
    std::reverse(parts.begin(), parts.end());
  }
  return parts;
}

std::vector<std::string> splitlines(std::string_view s, bool keepends) {
  const std::u32string u = decode(s);
  auto is_break = [](char32_t c) {
    return c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D || c == 0x1E || c == 0x85 ||
           c == 0x2028 || c == 0x2029;
  };
  std::vector<std::string> lines;
  size_t i = 0;
  while (i < u.size()) {
    size_t j = i;
    while (j < u.size() && !is_break(u[j])) ++j;
    size_t eol = j;
    if (j < u.size()) {
      j += (u[j] == '\r' && j + 1 < u.size() && u[j + 1] == '\n') ? 2 : 1;
    }
    lines.push_back(encode(std::u32string_view(u).substr(i, (keepends ? j : eol) - i)));
    i = j;
  }
  return lines;
}

std::string replace(std::string_view s, std::string_view old, std::string_view repl, int64_t count) {
  if (count < 0) count = INT64_MAX;
  std::string out;
  if (old.empty()) {
    // Python inserts `repl` before every code point and at the end.
    const std::u32string u = decode(s);
    size_t i = 0;
    for (; i < u.size() && count > 0; ++i, --count) {
      out += repl;
      append(out, u[i]);
    }
    if (count > 0) {
      out += repl;
    }
    out += encode(std::u32string_view(u).substr(i));
    return out;
  }
  size_t at = 0;
  while (count-- > 0) {
    const size_t hit = s.find(old, at);
    if (hit == std::string_view::npos) break;
    out += s.substr(at, hit - at);
    out += repl;
    at = hit + old.size();
  }
  out += s.substr(at);
  return out;
}

int64_t find(std::string_view s, std::string_view sub, std::optional<int64_t> start, std::optional<int64_t> end,
             bool from_right) {
  const std::u32string u = decode(s), v = decode(sub);
  auto [a, b] = bounds(static_cast<int64_t>(u.size()), start, end);
  if (b - a < static_cast<int64_t>(v.size())) return -1;
  const std::u32string_view hay = std::u32string_view(u).substr(a, b - a);
  const size_t hit = from_right ? hay.rfind(v) : hay.find(v);
  return hit == std::u32string_view::npos ? -1 : a + static_cast<int64_t>(hit);
}

int64_t count(std::string_view s, std::string_view sub, std::optional<int64_t> start, std::optional<int64_t> end) {
  const std::u32string u = decode(s), v = decode(sub);
  auto [a, b] = bounds(static_cast<int64_t>(u.size()), start, end);
  if (b - a < static_cast<int64_t>(v.size())) return 0;
  if (v.empty()) return b - a + 1;
  const std::u32string_view hay = std::u32string_view(u).substr(a, b - a);
  int64_t n = 0;
  for (size_t at = hay.find(v); at != std::u32string_view::npos; at = hay.find(v, at + v.size())) ++n;
  return n;
}

bool all_of(std::string_view s, bool (*pred)(char32_t)) {
  const std::u32string u = decode(s);
  return !u.empty() && std::all_of(u.begin(), u.end(), pred);
}

bool is_upper_str(std::string_view s) {
  bool cased = false;
  for (char32_t c : decode(s)) {
    if (is_lower(c) || is_titlecase(c)) return false;
    if (is_upper(c)) cased = true;
  }
  return cased;
}

bool is_lower_str(std::string_view s) {
  bool cased = false;
  for (char32_t c : decode(s)) {
    if (is_upper(c) || is_titlecase(c)) return false;
    if (is_lower(c)) cased = true;
  }
  return cased;
}

bool is_title_str(std::string_view s) {
  bool cased = false, previous_cased = false;
  for (char32_t c : decode(s)) {
    if (is_upper(c) || is_titlecase(c)) {
      if (previous_cased) return false;
      previous_cased = cased = true;
    } else if (is_lower(c)) {
      if (!previous_cased) return false;
      previous_cased = cased = true;
    } else {
      previous_cased = false;
    }
  }
  return cased;
}

}  // namespace kvgraph::chat::pystr
