#include "tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <memory>

#include "kvgraph/error.h"

namespace kvgraph::tok {

namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof(buf));
  return reinterpret_cast<const char*>(buf);
}

struct MatchDataDeleter {
  void operator()(pcre2_match_data* m) const { pcre2_match_data_free(m); }
};

}  // namespace

Regex::Regex(std::string_view pattern, std::string_view what) : pattern_(pattern) {
  int err = 0;
  PCRE2_SIZE offset = 0;
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                        PCRE2_UTF | PCRE2_UCP, &err, &offset, nullptr);
  if (!code_) {
    fail("tokenizer", "{}: regex /{}/ does not compile at offset {}: {}", what, pattern, offset,
         pcre2_message(err));
  }
  // JIT is an optimisation only: without it pcre2_match interprets.
  pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);
}

Regex::~Regex() { pcre2_code_free(code_); }

void Regex::find_all(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const {
  std::unique_ptr<pcre2_match_data, MatchDataDeleter> md(pcre2_match_data_create_from_pattern(code_, nullptr));
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.empty() ? "" : s.data());
  size_t pos = 0;
  while (pos <= s.size()) {
    int rc = pcre2_match(code_, subject, s.size(), pos, PCRE2_NO_UTF_CHECK, md.get(), nullptr);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      // Deep backtracking on a long input: the interpreter keeps its frames on the heap.
      rc = pcre2_match(code_, subject, s.size(), pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md.get(), nullptr);
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) fail("tokenizer", "regex /{}/ failed on a {}-byte input: {}", pattern_, s.size(), pcre2_message(rc));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    const size_t b = ov[0], e = ov[1];
    out.emplace_back(b, e);
    if (e > b) {
      pos = e;
    } else {
      // Empty match: step over one code point so the scan moves on.
      if (e >= s.size()) break;
      pos = e + 1;
      while (pos < s.size() && (static_cast<unsigned char>(s[pos]) & 0xC0) == 0x80) ++pos;
    }
  }
}

bool Regex::search(std::string_view s) const {
  std::unique_ptr<pcre2_match_data, MatchDataDeleter> md(pcre2_match_data_create_from_pattern(code_, nullptr));
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.empty() ? "" : s.data());
  int rc = pcre2_match(code_, subject, s.size(), 0, PCRE2_NO_UTF_CHECK, md.get(), nullptr);
  if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
    rc = pcre2_match(code_, subject, s.size(), 0, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md.get(), nullptr);
  }
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) fail("tokenizer", "regex /{}/ failed: {}", pattern_, pcre2_message(rc));
  return true;
}

std::string regex_escape(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (std::string_view("\\^$.|?*+()[]{}-/#&~ ").find(c) != std::string_view::npos) out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

}  // namespace kvgraph::tok
