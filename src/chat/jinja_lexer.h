#pragma once
// The Jinja lexer: template text -> tokens, with jinja2's whitespace rules
// as transformers configures them (trim_blocks, lstrip_blocks, `-` / `+`
// markers on tags, one trailing newline of the template dropped, \r\n and \r
// read as \n).
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kvgraph::chat::jinja {

enum class TokenType : uint8_t {
  data,         // template text (already stripped as the whitespace rules say)
  var_begin,    // {{
  var_end,      // }}
  block_begin,  // {%
  block_end,    // %}
  name,         // identifiers and keywords (and, or, not, in, is, if, else, ...)
  string,       // a string literal, escapes decoded
  integer,
  floating,
  op,           // + - * / // % ** ~ == != < <= > >= = . : | , ( ) [ ] { } ;
  eof,
};

struct Token {
  TokenType type;
  std::string text;  // data, name, decoded string, operator
  int64_t integer = 0;
  double floating = 0;
  int line = 1;
};

// Throws TemplateError (jinja.h) with the line of the problem.
std::vector<Token> tokenize(std::string_view source);

}  // namespace kvgraph::chat::jinja
