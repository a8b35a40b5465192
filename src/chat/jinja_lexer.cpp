// The lexer follows jinja2's (lexer.py) rule for rule, as transformers
// configures it, because the whitespace of the output depends on it:
// - `{%-`, `{{-`, `{#-` strip all whitespace before the tag; `-%}`, `-}}`,
//   `-#}` all whitespace after it;
// - trim_blocks: `%}` and `#}` eat one newline right after them;
// - lstrip_blocks: spaces and tabs from the start of a line to `{%` or `{#`
//   are dropped (not before `{{`), unless the tag says `{%+`;
// - a single trailing newline of the template is dropped, \r\n and \r are \n;
// - inside a tag, a `%}` or `}}` that closes nothing only ends the tag when
//   every bracket opened in it is closed.
#include "chat/jinja_lexer.h"

#include <charconv>
#include <cstring>

#include <fmt/format.h>

#include "chat/jinja.h"
#include "chat/pystr.h"

namespace kvgraph::chat::jinja {

namespace {

// The code point at s[p] and its length in bytes (invalid bytes: U+FFFD, 1).
char32_t cp_at(std::string_view s, size_t p, size_t* len) {
  const unsigned char b = static_cast<unsigned char>(s[p]);
  if (b < 0x80) {
    *len = 1;
    return b;
  }
  const size_t n = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC0 ? 2 : 1;
  if (n == 1 || p + n > s.size()) {
    *len = 1;
    return 0xFFFD;
  }
  const std::u32string u = pystr::decode(s.substr(p, n));
  *len = u.size() == 1 ? n : 1;
  return u.size() == 1 ? u[0] : 0xFFFD;
}

bool is_ws_at(std::string_view s, size_t p, size_t* len) { return pystr::is_space(cp_at(s, p, len)); }

// End of a run of whitespace starting at p (\s*).
size_t skip_ws(std::string_view s, size_t p) {
  size_t len = 0;
  while (p < s.size() && is_ws_at(s, p, &len)) p += len;
  return p;
}

// s without its trailing whitespace (Python's str.rstrip()).
std::string_view rstrip_ws(std::string_view s) {
  const std::u32string u = pystr::decode(s);
  size_t keep = u.size();
  while (keep > 0 && pystr::is_space(u[keep - 1])) --keep;
  size_t bytes = 0;
  for (size_t i = 0; i < keep; ++i) {
    size_t len = 0;
    cp_at(s, bytes, &len);
    bytes += len;
  }
  return s.substr(0, bytes);
}

bool all_ws(std::string_view s) {
  if (s.empty()) return false;  // jinja2 tests `\s+` on the text: empty does not match
  for (char32_t c : pystr::decode(s))
    if (!pystr::is_space(c)) return false;
  return true;
}

int count_newlines(std::string_view s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || static_cast<unsigned char>(c) >= 0x80;
}
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

// The end of `(\d+_)*\d+` at p, or p when there is no digit.
size_t match_digits(std::string_view s, size_t p) {
  if (p >= s.size() || !is_digit(s[p])) return p;
  while (p < s.size() && is_digit(s[p])) ++p;
  while (p + 1 < s.size() && s[p] == '_' && is_digit(s[p + 1])) {
    ++p;
    while (p < s.size() && is_digit(s[p])) ++p;
  }
  return p;
}

// jinja2's float_re at p; returns the end or p.
size_t match_float(std::string_view s, size_t p) {
  if (p > 0 && s[p - 1] == '.') return p;
  const size_t a = match_digits(s, p);
  if (a == p) return p;
  auto exponent = [&](size_t q) -> size_t {
    if (q < s.size() && (s[q] == 'e' || s[q] == 'E')) {
      size_t r = q + 1;
      if (r < s.size() && (s[r] == '+' || s[r] == '-')) ++r;
      const size_t e = match_digits(s, r);
      if (e > r) return e;
    }
    return q;
  };
  // (\.digits)? e[+-]?digits
  size_t q = a;
  if (q < s.size() && s[q] == '.') {
    const size_t f = match_digits(s, q + 1);
    if (f > q + 1) {
      const size_t e = exponent(f);
      return e > f ? e : f;  // with or without an exponent: both alternatives match
    }
  }
  const size_t e = exponent(a);
  return e > a ? e : p;
}

// jinja2's integer_re at p; returns the end or p.
size_t match_integer(std::string_view s, size_t p, int* base) {
  auto lower = [](char c) { return static_cast<char>(c >= 'A' && c <= 'Z' ? c + 32 : c); };
  auto run = [&](size_t q, auto is_d) {  // (_?d)+
    size_t r = q;
    while (true) {
      if (r < s.size() && is_d(lower(s[r]))) {
        ++r;
      } else if (r + 1 < s.size() && s[r] == '_' && is_d(lower(s[r + 1]))) {
        r += 2;
      } else {
        break;
      }
    }
    return r;
  };
  if (p + 1 < s.size() && s[p] == '0') {
    const char k = lower(s[p + 1]);
    size_t e = p;
    if (k == 'b') e = run(p + 2, [](char c) { return c == '0' || c == '1'; }), *base = 2;
    if (k == 'o') e = run(p + 2, [](char c) { return c >= '0' && c <= '7'; }), *base = 8;
    if (k == 'x') e = run(p + 2, [](char c) { return is_digit(c) || (c >= 'a' && c <= 'f'); }), *base = 16;
    if (e > p + 2) return e;
  }
  *base = 10;
  if (p < s.size() && s[p] >= '1' && s[p] <= '9') return run(p + 1, is_digit) > p + 1 ? run(p + 1, is_digit) : p + 1;
  if (p < s.size() && s[p] == '0') return run(p + 1, [](char c) { return c == '0'; });
  return p;
}

// Python's unicode-escape decoding of the literal's text after
// backslashreplace (which is how jinja2 reads string literals).
std::string decode_string(std::string_view raw, int line) {
  std::string ascii;
  for (char32_t c : pystr::decode(raw)) {
    if (c < 0x80)
      ascii += static_cast<char>(c);
    else if (c <= 0xFF)
      ascii += fmt::format("\\x{:02x}", static_cast<unsigned>(c));
    else if (c <= 0xFFFF)
      ascii += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
    else
      ascii += fmt::format("\\U{:08x}", static_cast<unsigned>(c));
  }
  std::string out;
  auto hex = [&](size_t at, int n, const char* what) -> char32_t {
    char32_t v = 0;
    for (int k = 0; k < n; ++k) {
      const char c = at + k < ascii.size() ? ascii[at + k] : '\0';
      int d = is_digit(c) ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : -1;
      if (d < 0) throw TemplateError(line, fmt::format("truncated {} escape", what));
      v = v * 16 + static_cast<char32_t>(d);
    }
    return v;
  };
  for (size_t i = 0; i < ascii.size(); ++i) {
    const char c = ascii[i];
    if (c != '\\' || i + 1 >= ascii.size()) {
      out += c;
      continue;
    }
    const char n = ascii[++i];
    switch (n) {
      case '\n': break;
      case '\\': out += '\\'; break;
      case '\'': out += '\''; break;
      case '"': out += '"'; break;
      case 'a': out += '\a'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'n': out += '\n'; break;
      case 'r': out += '\r'; break;
      case 't': out += '\t'; break;
      case 'v': out += '\v'; break;
      case 'x': pystr::append(out, hex(i + 1, 2, "\\xXX")); i += 2; break;
      case 'u': pystr::append(out, hex(i + 1, 4, "\\uXXXX")); i += 4; break;
      case 'U': {
        const char32_t v = hex(i + 1, 8, "\\UXXXXXXXX");
        if (v > 0x10FFFF) throw TemplateError(line, "illegal Unicode character");
        pystr::append(out, v);
        i += 8;
        break;
      }
      case 'N': throw TemplateError(line, "\\N{...} escapes are not supported");
      default:
        if (n >= '0' && n <= '7') {
          char32_t v = static_cast<char32_t>(n - '0');
          for (int k = 0; k < 2 && i + 1 < ascii.size() && ascii[i + 1] >= '0' && ascii[i + 1] <= '7'; ++k)
            v = v * 8 + static_cast<char32_t>(ascii[++i] - '0');
          pystr::append(out, v);
        } else {
          out += '\\';
          out += n;
        }
    }
  }
  return out;
}

class Lexer {
 public:
  explicit Lexer(std::string source) : s_(std::move(source)) {}

  std::vector<Token> run() {
    while (pos_ < s_.size()) root();
    push(TokenType::eof, "");
    return std::move(out_);
  }

 private:
  enum class Tag { variable, block, comment, raw };

  void push(TokenType t, std::string text, int line = 0) {
    out_.push_back(Token{t, std::move(text), 0, 0, line ? line : line_});
  }

  // Text up to the next tag, then the tag.
  void root() {
    size_t t = pos_;
    Tag kind = Tag::variable;
    size_t after = 0;  // end of the opening delimiter and its sign
    char sign = 0;
    for (;; ++t) {
      t = s_.find('{', t);
      if (t == std::string::npos || t + 1 >= s_.size()) {
        t = std::string::npos;
        break;
      }
      const char k = s_[t + 1];
      if (k != '{' && k != '%' && k != '#') continue;
      sign = t + 2 < s_.size() && (s_[t + 2] == '-' || s_[t + 2] == '+') ? s_[t + 2] : 0;
      after = t + 2 + (sign ? 1 : 0);
      kind = k == '{' ? Tag::variable : k == '#' ? Tag::comment : Tag::block;
      if (kind == Tag::block) {
        // {% raw %} / {%- raw -%}
        size_t q = skip_ws(s_, after);
        if (s_.compare(q, 3, "raw") == 0) {
          q = skip_ws(s_, q + 3);
          if (s_.compare(q, 3, "-%}") == 0) {
            kind = Tag::raw;
            after = skip_ws(s_, q + 3);
          } else if (s_.compare(q, 2, "%}") == 0) {
            kind = Tag::raw;
            after = q + 2;
          }
        }
      }
      break;
    }
    if (t == std::string::npos) {
      emit_data(std::string_view(s_).substr(pos_), 0, false);
      pos_ = s_.size();
      return;
    }
    emit_data(std::string_view(s_).substr(pos_, t - pos_), sign, kind != Tag::variable);
    pos_ = after;
    line_starting_ = false;
    switch (kind) {
      case Tag::comment: comment(); break;
      case Tag::raw: raw(); break;
      case Tag::variable:
      case Tag::block: tag(kind); break;
    }
  }

  // Data before a tag, stripped by the tag's sign or by lstrip_blocks.
  void emit_data(std::string_view text, char sign, bool lstrip) {
    const int newlines = count_newlines(text);
    if (sign == '-') {
      text = rstrip_ws(text);
    } else if (sign != '+' && lstrip) {
      const size_t nl = text.rfind('\n');
      const size_t l_pos = nl == std::string_view::npos ? 0 : nl + 1;
      if ((l_pos > 0 || line_starting_) && all_ws(text.substr(l_pos))) text = text.substr(0, l_pos);
    }
    if (!text.empty()) push(TokenType::data, std::string(text));
    line_ += newlines;
  }

  void comment() {
    const int start = line_;
    for (size_t p = pos_; p < s_.size(); ++p) {
      size_t end = 0;
      if (s_.compare(p, 3, "+#}") == 0) {
        end = p + 3;
      } else if (s_.compare(p, 3, "-#}") == 0) {
        end = skip_ws(s_, p + 3);
      } else if (s_.compare(p, 2, "#}") == 0) {
        end = p + 2 + (p + 2 < s_.size() && s_[p + 2] == '\n' ? 1 : 0);
      } else {
        continue;
      }
      line_ += count_newlines(std::string_view(s_).substr(pos_, end - pos_));
      line_starting_ = s_[end - 1] == '\n';
      pos_ = end;
      return;
    }
    throw TemplateError(start, "Missing end of comment tag");
  }

  void raw() {
    const int start = line_;
    for (size_t p = s_.find("{%", pos_); p != std::string::npos; p = s_.find("{%", p + 1)) {
      const char sign = p + 2 < s_.size() && (s_[p + 2] == '-' || s_[p + 2] == '+') ? s_[p + 2] : 0;
      size_t q = skip_ws(s_, p + 2 + (sign ? 1 : 0));
      if (s_.compare(q, 6, "endraw") != 0) continue;
      q = skip_ws(s_, q + 6);
      size_t end = 0;
      if (s_.compare(q, 3, "+%}") == 0)
        end = q + 3;
      else if (s_.compare(q, 3, "-%}") == 0)
        end = skip_ws(s_, q + 3);
      else if (s_.compare(q, 2, "%}") == 0)
        end = q + 2 + (q + 2 < s_.size() && s_[q + 2] == '\n' ? 1 : 0);
      else
        continue;
      emit_data(std::string_view(s_).substr(pos_, p - pos_), sign, true);
      line_ += count_newlines(std::string_view(s_).substr(p, end - p));
      line_starting_ = s_[end - 1] == '\n';
      pos_ = end;
      return;
    }
    throw TemplateError(start, "Missing end of raw directive");
  }

  // Inside {{ }} or {% %}.
  void tag(Tag kind) {
    push(kind == Tag::block ? TokenType::block_begin : TokenType::var_begin, "");
    std::vector<char> balance;  // closers expected, innermost last
    while (pos_ < s_.size()) {
      if (balance.empty() && end_of_tag(kind)) return;
      size_t len = 0;
      if (is_ws_at(s_, pos_, &len)) {
        const size_t end = skip_ws(s_, pos_);
        line_ += count_newlines(std::string_view(s_).substr(pos_, end - pos_));
        pos_ = end;
        continue;
      }
      const char c = s_[pos_];
      if (size_t e = match_float(s_, pos_); e > pos_) {
        std::string text = s_.substr(pos_, e - pos_);
        std::erase(text, '_');
        Token tok{TokenType::floating, text, 0, 0, line_};
        std::from_chars(text.data(), text.data() + text.size(), tok.floating);
        out_.push_back(std::move(tok));
        pos_ = e;
        continue;
      }
      int base = 10;
      if (size_t e = match_integer(s_, pos_, &base); e > pos_) {
        std::string text = s_.substr(pos_ + (base == 10 ? 0 : 2), e - pos_ - (base == 10 ? 0 : 2));
        std::erase(text, '_');
        Token tok{TokenType::integer, s_.substr(pos_, e - pos_), 0, 0, line_};
        auto r = std::from_chars(text.data(), text.data() + text.size(), tok.integer, base);
        if (r.ec != std::errc()) throw TemplateError(line_, fmt::format("integer literal {} is too large", tok.text));
        out_.push_back(std::move(tok));
        pos_ = e;
        continue;
      }
      if (is_name_start(c)) {
        size_t e = pos_;
        while (e < s_.size() && is_name_char(s_[e])) ++e;
        push(TokenType::name, s_.substr(pos_, e - pos_));
        pos_ = e;
        continue;
      }
      if (c == '\'' || c == '"') {
        size_t e = pos_ + 1;
        while (e < s_.size() && s_[e] != c) e += s_[e] == '\\' ? 2 : 1;
        if (e < s_.size()) {
          const int line = line_;
          const std::string_view raw = std::string_view(s_).substr(pos_ + 1, e - pos_ - 1);
          push(TokenType::string, decode_string(raw, line), line);
          line_ += count_newlines(raw);
          pos_ = e + 1;
          continue;
        }
        // An unterminated string is no token: jinja2 reports the quote.
      }
      static const char* const kTwo[] = {"//", "**", "==", "!=", ">=", "<="};
      std::string op;
      for (const char* t : kTwo)
        if (s_.compare(pos_, 2, t) == 0) op = t;
      if (op.empty() && c != 0 && std::strchr("+-/*%~[](){}<>=.:|,;", c)) op = std::string(1, c);
      if (op.empty()) {
        size_t n = 0;
        const char32_t cp = cp_at(s_, pos_, &n);
        std::string shown;
        pystr::append(shown, cp);
        throw TemplateError(line_, fmt::format("unexpected char '{}' at {}", shown, pos_));
      }
      if (op == "(" || op == "[" || op == "{") {
        balance.push_back(op == "(" ? ')' : op == "[" ? ']' : '}');
      } else if (op == ")" || op == "]" || op == "}") {
        if (balance.empty()) throw TemplateError(line_, fmt::format("unexpected '{}'", op));
        if (balance.back() != op[0])
          throw TemplateError(line_, fmt::format("unexpected '{}', expected '{}'", op, balance.back()));
        balance.pop_back();
      }
      push(TokenType::op, op);
      pos_ += op.size();
    }
    // The template ended inside the tag: the parser reports it.
  }

  bool end_of_tag(Tag kind) {
    size_t end = 0;
    if (kind == Tag::block) {
      if (s_.compare(pos_, 3, "+%}") == 0)
        end = pos_ + 3;
      else if (s_.compare(pos_, 3, "-%}") == 0)
        end = skip_ws(s_, pos_ + 3);
      else if (s_.compare(pos_, 2, "%}") == 0)
        end = pos_ + 2 + (pos_ + 2 < s_.size() && s_[pos_ + 2] == '\n' ? 1 : 0);  // trim_blocks
    } else {
      if (s_.compare(pos_, 3, "-}}") == 0)
        end = skip_ws(s_, pos_ + 3);
      else if (s_.compare(pos_, 2, "}}") == 0)
        end = pos_ + 2;
    }
    if (!end) return false;
    push(kind == Tag::block ? TokenType::block_end : TokenType::var_end, "");
    line_ += count_newlines(std::string_view(s_).substr(pos_, end - pos_));
    line_starting_ = s_[end - 1] == '\n';
    pos_ = end;
    return true;
  }

  std::string s_;
  size_t pos_ = 0;
  int line_ = 1;
  bool line_starting_ = true;
  std::vector<Token> out_;
};

// \r\n and \r become \n; one trailing newline is dropped (keep_trailing_newline=False).
std::string normalize(std::string_view source) {
  std::string s;
  s.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      s += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      s += source[i];
    }
  }
  if (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

}  // namespace

std::vector<Token> tokenize(std::string_view source) { return Lexer(normalize(source)).run(); }

}  // namespace kvgraph::chat::jinja
