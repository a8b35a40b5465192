#pragma once
// A Hugging Face tokenizer read from tokenizer.json (and tokenizer_config.json
// beside it when present), matching the `tokenizers` library token for token.
//
// Supported: the BPE model, byte-level (GPT-2, Llama-3, Qwen2 pre-tokenizer
// regexes + ByteLevel) and SentencePiece-style (Metaspace or Prepend/Replace
// normalizers, byte_fallback <0xNN> tokens); added/special tokens matched in
// the raw text; TemplateProcessing / ByteLevel / Roberta / Bert post-processors.
// Anything else in tokenizer.json (another model type, an unknown normalizer,
// ...) fails at load with one kvgraph::Error naming it.
//
// Thread safety: a loaded Tokenizer is immutable apart from an internal,
// locked BPE cache, so encode/decode may be called from several threads.
// Copies share the loaded data.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvgraph {

struct ModelConfig;

class Tokenizer {
 public:
  // `path` is a tokenizer.json file or a folder holding one. tokenizer_config.json
  // in the same folder, when present, supplies bos/eos and add_bos_token /
  // add_eos_token. Throws kvgraph::Error ("[tokenizer] ...") on a missing file,
  // malformed JSON or an unsupported component.
  static Tokenizer from_file(const std::filesystem::path& path);

  // From JSON text. `config_json` is tokenizer_config.json's text, empty for none.
  static Tokenizer from_json(std::string_view tokenizer_json, std::string_view config_json = {});

  // Text -> ids, as tokenizers' `encode(text, add_special_tokens)`. Added and
  // special tokens written in the text are always recognised; with
  // `add_special_tokens` the post-processor's tokens (e.g. BOS) are added.
  // Invalid UTF-8 in `text` is replaced by U+FFFD first.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const;

  // Ids -> text, as tokenizers' `decode(ids, skip_special_tokens)`. Unknown ids
  // are skipped; bytes that do not form UTF-8 come out as U+FFFD.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::optional<std::string> id_to_token(int32_t id) const;

  // One past the largest id of the model vocabulary and the added tokens: the
  // number of rows an embedding table needs at least.
  int32_t vocab_size() const;

  // From tokenizer_config.json ("bos_token": "<s>" or {"content": "<s>", ...});
  // without that file, guessed from well-known names (<s>, <|begin_of_text|>,
  // <bos>; </s>, <|end_of_text|>, <|endoftext|>, <eos>).
  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;

  // True for added tokens marked "special" (what skip_special_tokens drops).
  bool is_special(int32_t id) const;

  // The ids `encode(text, true)` puts before / after the text's own tokens.
  std::span<const int32_t> prefix_special_ids() const;
  std::span<const int32_t> suffix_special_ids() const;

  // The tokenizer.json it was read from; empty when made from_json.
  const std::filesystem::path& source() const { return source_; }

  struct Impl;  // src/tokenizer/tokenizer_impl.h

 private:
  friend class StreamDecoder;
  explicit Tokenizer(std::shared_ptr<const Impl> impl);
  std::shared_ptr<const Impl> impl_;
  std::filesystem::path source_;
};

// Throws [tokenizer] naming both files and both sizes when `tokenizer` has an
// id (in its vocabulary or its added tokens) that `config`'s vocab_size has no
// embedding row for: the tokenizer belongs to another model, and its ids
// would read past the embedding table. A vocab_size larger than the
// tokenizer's (rows padded for speed) is fine. Returns `tokenizer`, so a
// loader can write `return check_vocab(Tokenizer::from_file(p), config);`.
Tokenizer check_vocab(Tokenizer tokenizer, const ModelConfig& config);

// Decodes a stream of ids one at a time (generation). `step` returns only
// complete UTF-8: bytes of a character split over several tokens (byte-level
// or <0xNN> byte-fallback tokens) are held back until the character is
// complete. The concatenation of every `step` and the final `flush` equals
// `tokenizer.decode(all ids)`, with one exception: where <0xNN> tokens form
// invalid UTF-8, decode (as tokenizers) turns every byte of that run into
// U+FFFD, even bytes already shown; the stream replaces each invalid sequence
// with one U+FFFD and keeps the characters it already emitted.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens = false);

  // The text that `id` completes; often "" (held bytes, a skipped special token).
  std::string step(int32_t id);
  // Whatever is still held, incomplete bytes as U+FFFD; then starts afresh.
  std::string flush();
  void reset();

 private:
  Tokenizer tokenizer_;
  bool skip_special_;
  std::vector<int32_t> ids_;  // the window decoded each step: context + pending ids
  std::string prefix_;        // complete text of ids_[0, prefix_ids_), already emitted
  size_t prefix_ids_ = 0;
};

}  // namespace kvgraph
