#pragma once
// UTF-8 helpers for the tokenizer: decoding, lossy conversion the way Rust's
// String::from_utf8_lossy does it, and the GPT-2 byte <-> unicode table.
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kvgraph::tok {

inline constexpr char32_t kReplacementChar = 0xFFFD;

// Decodes the code point starting at s[i] and advances i. Precondition: s is
// valid UTF-8 and i < s.size().
char32_t next_cp(std::string_view s, size_t& i);

// Byte length of the code point starting with lead byte b (valid UTF-8).
inline size_t cp_len(unsigned char b) {
  return b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
}

void append_utf8(std::string& out, char32_t cp);

// Result of scanning bytes as UTF-8.
struct Utf8Scan {
  size_t valid_len = 0;    // bytes before the first invalid sequence (or the incomplete tail)
  bool invalid = false;    // an invalid sequence was found at valid_len
  bool incomplete = false; // the bytes end inside a sequence that could still be completed
};
Utf8Scan scan_utf8(std::string_view bytes);

inline bool is_valid_utf8(std::string_view bytes) {
  Utf8Scan s = scan_utf8(bytes);
  return !s.invalid && !s.incomplete;
}

// Converts bytes to valid UTF-8, replacing each maximal invalid subpart with
// U+FFFD (exactly as Rust's from_utf8_lossy). With `hold_incomplete`, a
// trailing sequence that is a valid but unfinished prefix of a code point is
// left out instead; *held (if given) receives its length in bytes.
std::string utf8_lossy(std::string_view bytes, bool hold_incomplete = false, size_t* held = nullptr);

// Unicode White_Space (what Rust's char::is_whitespace and regex `\s` accept).
bool is_white_space(char32_t c);

// GPT-2's bytes_to_unicode(): every byte maps to a printable code point.
struct ByteLevelTable {
  std::array<std::string, 256> byte_to_utf8;  // byte -> UTF-8 of its code point
  std::array<int16_t, 324> cp_to_byte;        // code point (< 324) -> byte, -1 if none
};
const ByteLevelTable& byte_level_table();

}  // namespace kvgraph::tok
