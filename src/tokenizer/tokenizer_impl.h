#pragma once
// The loaded tokenizer behind kvgraph::Tokenizer: the tokenizers pipeline
// (added tokens -> normalizer -> pre-tokenizer -> BPE -> post-processor, and
// back through the decoder).
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvgraph/tokenizer.h"
#include "tokenizer/added_vocab.h"
#include "tokenizer/bpe.h"
#include "tokenizer/components.h"

namespace kvgraph {

struct Tokenizer::Impl {
  std::unique_ptr<tok::Normalizer> normalizer;       // may be null
  std::unique_ptr<tok::PreTokenizer> pre_tokenizer;  // may be null
  std::unique_ptr<tok::Decoder> decoder;             // null: tokens joined by " "
  std::unique_ptr<tok::Bpe> model;

  std::vector<tok::AddedToken> added;  // tokenizer.json "added_tokens"
  tok::Vocab added_ids;                // content -> id
  tok::AddedTokenMatcher raw_matcher;         // normalized == false, matched on the input
  tok::AddedTokenMatcher normalized_matcher;  // normalized == true, matched after normalizing

  // Indexed by id, [0, vocab_size): the token string (added tokens win over
  // the model's), whether the id exists, whether it is special.
  std::vector<std::string> tokens;
  std::vector<uint8_t> flags;
  static constexpr uint8_t kExists = 1, kSpecial = 2, kNormalizedForm = 4;
  // What decode feeds the decoder for added tokens with "normalized": true:
  // their normalized form (tokenizers 0.23 does, per its fixtures: so that a
  // Prepend "▁" comes back out as a space). Indexed like `tokens`; only
  // entries with kNormalizedForm are set.
  std::vector<std::string> normalized_forms;

  std::vector<int32_t> prefix_ids, suffix_ids;  // added by encode(..., add_special_tokens=true)
  std::optional<int32_t> bos, eos;

  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const;
  enum class DecodeMode {
    Full,         // as tokenizers' decode
    StreamStep,   // streaming: invalid byte sequences -> U+FFFD each, unfinished tail left out
    StreamFlush,  // streaming, end of stream: the unfinished tail becomes U+FFFD
  };
  // *held (StreamStep): whether an unfinished character was left out.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens, DecodeMode mode,
                     bool* held = nullptr) const;
};

}  // namespace kvgraph
