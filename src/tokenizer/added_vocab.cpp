#include "tokenizer/added_vocab.h"

#include <algorithm>

#include "tokenizer/regex.h"
#include "tokenizer/utf8.h"

namespace kvgraph::tok {

namespace {

// Rust regex `\w` (Unicode): what single_word treats as part of a word.
const Regex& word_char_regex() {
  static const Regex re(R"([\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\x{200C}\x{200D}])", "added tokens");
  return re;
}

char32_t last_cp(std::string_view s) {
  size_t i = s.size();
  while (i > 0 && (static_cast<unsigned char>(s[i - 1]) & 0xC0) == 0x80) --i;
  if (i > 0) --i;
  return next_cp(s, i);
}

bool is_word_char(char32_t c) {
  std::string s;
  append_utf8(s, c);
  return word_char_regex().search(s);
}

// Start of the run of white space that ends `s`.
size_t trailing_space_start(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    size_t b = end;
    while (b > 0 && (static_cast<unsigned char>(s[b - 1]) & 0xC0) == 0x80) --b;
    if (b > 0) --b;
    size_t j = b;
    if (!is_white_space(next_cp(s, j))) break;
    end = b;
  }
  return end;
}

// Length of the run of white space that starts `s`.
size_t leading_space_len(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    size_t j = i;
    if (!is_white_space(next_cp(s, j))) break;
    i = j;
  }
  return i;
}

}  // namespace

void AddedTokenMatcher::add(const AddedToken& token, std::string pattern) {
  if (pattern.empty()) return;
  const auto first = static_cast<unsigned char>(pattern[0]);
  entries_.push_back({std::move(pattern), token});
  auto& bucket = by_first_byte_[first];
  bucket.push_back(static_cast<uint32_t>(entries_.size() - 1));
  std::stable_sort(bucket.begin(), bucket.end(), [&](uint32_t a, uint32_t b) {
    return entries_[a].pattern.size() > entries_[b].pattern.size();
  });
}

std::vector<TextSplit> AddedTokenMatcher::split(std::string_view text) const {
  std::vector<TextSplit> out;
  if (text.empty()) return out;
  size_t start_offset = 0;  // end of the last emitted split
  size_t pos = 0;           // where the next leftmost-longest search starts
  while (pos < text.size()) {
    // Leftmost-longest match at or after pos.
    const Entry* hit = nullptr;
    size_t at = pos;
    for (; at < text.size() && !hit; ++at) {
      for (uint32_t idx : by_first_byte_[static_cast<unsigned char>(text[at])]) {
        const Entry& e = entries_[idx];
        if (text.compare(at, e.pattern.size(), e.pattern) == 0) {
          hit = &e;
          break;
        }
      }
    }
    if (!hit) break;
    size_t start = at - 1, stop = start + hit->pattern.size();
    pos = stop;
    const AddedToken& tok = hit->token;
    if (tok.single_word) {
      const bool start_ok = start == 0 || !is_word_char(last_cp(text.substr(0, start)));
      size_t j = stop;
      const bool stop_ok = stop == text.size() || !is_word_char(next_cp(text, j));
      if (!start_ok || !stop_ok) continue;
    }
    if (tok.lstrip) start = std::max(trailing_space_start(text.substr(0, start)), start_offset);
    if (tok.rstrip) stop += leading_space_len(text.substr(stop));
    if (start < start_offset) start = start_offset;  // overlaps what a previous rstrip took
    if (start > start_offset) out.push_back({start_offset, start, -1});
    out.push_back({start, stop, tok.id});
    start_offset = stop;
    pos = std::max(pos, stop);
  }
  if (start_offset < text.size()) out.push_back({start_offset, text.size(), -1});
  return out;
}

}  // namespace kvgraph::tok
