#pragma once
// Python's str semantics over UTF-8 std::string, for the Jinja interpreter:
// code-point indexing, whitespace, case mappings and character classes as
// Python's str methods define them (tables generated from Python by
// gen_unicode_tables.py). Invalid UTF-8 decodes as U+FFFD.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvgraph::chat::pystr {

std::u32string decode(std::string_view s);
std::string encode(std::u32string_view s);
void append(std::string& out, char32_t cp);
size_t length(std::string_view s);  // in code points

bool is_space(char32_t c);  // str.isspace of one character
bool is_printable(char32_t c);
bool is_alpha(char32_t c);
bool is_decimal(char32_t c);
bool is_digit(char32_t c);
bool is_numeric(char32_t c);
bool is_upper(char32_t c);
bool is_lower(char32_t c);
bool is_cased(char32_t c);

std::string upper(std::string_view s);
std::string lower(std::string_view s);
std::string title(std::string_view s);       // str.title
std::string capitalize(std::string_view s);  // str.capitalize (first character title-cased)
std::string swapcase(std::string_view s);

// str.strip / lstrip / rstrip; `chars` nullopt: whitespace.
std::string strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right);
// str.split / rsplit; `sep` nullopt: runs of whitespace. maxsplit < 0: no limit.
std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit,
                               bool from_right);
std::vector<std::string> splitlines(std::string_view s, bool keepends);
// str.replace (count < 0: all).
std::string replace(std::string_view s, std::string_view old, std::string_view repl, int64_t count);
// str.find / rfind in code points over s[start:end] (Python slice bounds); -1 when absent.
int64_t find(std::string_view s, std::string_view sub, std::optional<int64_t> start, std::optional<int64_t> end,
             bool from_right);
int64_t count(std::string_view s, std::string_view sub, std::optional<int64_t> start, std::optional<int64_t> end);
// Python's predicates over a whole string (false for "").
bool all_of(std::string_view s, bool (*pred)(char32_t));
bool is_upper_str(std::string_view s);  // str.isupper
bool is_lower_str(std::string_view s);  // str.islower
bool is_title_str(std::string_view s);  // str.istitle

}  // namespace kvgraph::chat::pystr
