#pragma once
// The pipeline stages of a tokenizers tokenizer.json, each parsed from its
// JSON object: normalizer -> pre-tokenizer -> (model) ... decoder.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "tokenizer/regex.h"

namespace kvgraph::tok {

// A Replace pattern, {"String": "..."} (kept literal) or {"Regex": "..."}.
struct ReplacePattern {
  std::string literal;
  std::unique_ptr<Regex> regex;
};
// From the "pattern" member of `j`.
ReplacePattern parse_replace_pattern(const nlohmann::json& j, const std::string& where);
// `s` with every match replaced by `content`. Literal patterns work on raw
// bytes; a regex needs UTF-8, so invalid input is made valid (U+FFFD) first.
std::string replace_all(const ReplacePattern& pattern, std::string_view s, std::string_view content);

// ---- normalizers ----------------------------------------------------------

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // Rewrites `s` (valid UTF-8) in place.
  virtual void apply(std::string& s) const = 0;
};

// `j` is a non-null "normalizer" object; `where` names it in errors.
std::unique_ptr<Normalizer> parse_normalizer(const nlohmann::json& j, const std::string& where);

// ---- pre-tokenizers -------------------------------------------------------

// A piece of normalized text on its way to the model.
struct Piece {
  std::string text;
  bool at_origin;  // starts at offset 0 of the original input (Metaspace prepend_scheme "first")
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Splits / rewrites every piece; empty pieces are dropped.
  virtual void apply(std::vector<Piece>& pieces) const = 0;
};

std::unique_ptr<PreTokenizer> parse_pre_tokenizer(const nlohmann::json& j, const std::string& where);

// ---- decoders -------------------------------------------------------------

struct DecodeState {
  // Streaming. tokenizers turns a run of <0xNN> tokens that is not valid UTF-8
  // into one U+FFFD per byte, so a later byte could change how the earlier
  // ones decode. A stream can't take back text, so with `stream` each invalid
  // sequence becomes one U+FFFD instead (as from_utf8_lossy), which valid runs
  // don't notice; with `hold_tail` as well, an unfinished character at the end
  // of the last run is left out (and `held` set) for later tokens to finish.
  bool stream = false;
  bool hold_tail = false;
  bool held = false;
};

class Decoder {
 public:
  virtual ~Decoder() = default;
  // tokenizers' decode_chain. Strings may hold raw bytes (ByteLevel,
  // ByteFallback output); the caller makes the joined result valid UTF-8.
  virtual void apply(std::vector<std::string>& tokens, DecodeState& state) const = 0;
};

std::unique_ptr<Decoder> parse_decoder(const nlohmann::json& j, const std::string& where);

}  // namespace kvgraph::tok
