#pragma once
// Added tokens (tokenizer.json "added_tokens"): found in the text before
// pre-tokenization, the way tokenizers' AddedVocabulary does it (leftmost-
// longest matching, then single_word / lstrip / rstrip).
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kvgraph::tok {

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
  bool special = false;
};

// A piece of text: an added token (id >= 0) or text to tokenize (id < 0).
struct TextSplit {
  size_t begin, end;  // byte range
  int32_t id;
};

class AddedTokenMatcher {
 public:
  // `patterns[i]` is what to look for (the token's content, normalized for
  // normalized tokens); `tokens[i]` its flags. Empty patterns are ignored.
  void add(const AddedToken& token, std::string pattern);

  bool empty() const { return entries_.empty(); }

  // Splits `text` into added tokens and the text between them, covering it
  // entirely; no empty text splits.
  std::vector<TextSplit> split(std::string_view text) const;

 private:
  struct Entry {
    std::string pattern;
    AddedToken token;
  };
  std::vector<Entry> entries_;
  std::array<std::vector<uint32_t>, 256> by_first_byte_;  // entry indices, longest pattern first
};

}  // namespace kvgraph::tok
