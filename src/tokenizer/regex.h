#pragma once
// A compiled PCRE2 pattern (UTF + Unicode properties, JIT when available),
// used for the pre-tokenizer splits that tokenizers runs through Oniguruma.
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

struct pcre2_real_code_8;

namespace kvgraph::tok {

class Regex {
 public:
  // Throws kvgraph::Error naming `what` (e.g. "Split pre-tokenizer") if the
  // pattern does not compile.
  Regex(std::string_view pattern, std::string_view what);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Appends the byte ranges [begin, end) of all non-overlapping matches in
  // `s` (valid UTF-8), left to right, as Oniguruma's find_iter reports them.
  void find_all(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const;

  // True if the pattern matches somewhere in `s`.
  bool search(std::string_view s) const;

 private:
  pcre2_real_code_8* code_ = nullptr;
  std::string pattern_;
};

// `text` with every PCRE2 metacharacter escaped, for literal patterns.
std::string regex_escape(std::string_view text);

}  // namespace kvgraph::tok
