// libFuzzer target: tokenizer.json through Tokenizer::from_json, then a
// round of use of whatever loaded: encode, decode, streaming decode and the
// id <-> token lookups.
//
// Input layout: TOKENIZER_JSON [ '\0' TEXT [ '\0' TOKENIZER_CONFIG_JSON ] ].
// Without a TEXT part a fixed sample (scripts, digits, spaces, special-token
// look-alikes, invalid UTF-8) is encoded, so seeds that are plain
// tokenizer.json files exercise encoding too.
//
// Contract under test: loading either succeeds or throws kvgraph::Error; a
// loaded tokenizer encodes and decodes anything, giving ids inside its
// vocabulary. The only error use may raise is kvgraph::Error (PCRE2's match
// limit on a pathological Split regex).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kvgraph/error.h"
#include "kvgraph/tokenizer.h"

namespace {

constexpr std::string_view kSample =
    "Hello, world! It's 2024: caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e  tabs\tand\nnewlines "
    "\xf0\x9f\x98\x80 <s></s><|endoftext|><bos> 12345 \xff\xfe bad utf-8 \xe2\x82";

// The bytes up to the next NUL (or the end); `found` says whether a NUL ended them.
std::string_view next_part(std::string_view& rest, bool& found) {
  const size_t nul = rest.find('\0');
  found = nul != std::string_view::npos;
  const std::string_view part = rest.substr(0, nul);
  rest = found ? rest.substr(nul + 1) : std::string_view();
  return part;
}

void use(const kvgraph::Tokenizer& tok, std::string_view text) {
  const int32_t vocab = tok.vocab_size();
  if (vocab < 0) std::abort();
  for (bool special : {true, false}) {
    const std::vector<int32_t> ids = tok.encode(text, special);
    for (int32_t id : ids) {
      if (id < 0 || id >= vocab) std::abort();  // every id has an embedding row
    }
    (void)tok.decode(ids, /*skip_special_tokens=*/false);
    (void)tok.decode(ids, /*skip_special_tokens=*/true);
    kvgraph::StreamDecoder stream(tok);
    for (int32_t id : ids) (void)stream.step(id);
    (void)stream.flush();
  }
  // Ids a sampler or a user could hand in, including ones outside the vocabulary.
  const std::vector<int32_t> odd = {-1, 0, 1, vocab - 1, vocab, INT32_MAX, INT32_MIN};
  (void)tok.decode(odd);
  for (int32_t id : odd) {
    if (auto t = tok.id_to_token(id)) (void)tok.token_to_id(*t);
    (void)tok.is_special(id);
  }
  (void)tok.bos_id();
  (void)tok.eos_id();
  (void)tok.prefix_special_ids();
  (void)tok.suffix_special_ids();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view rest(reinterpret_cast<const char*>(data), size);
  bool has_text = false, has_config = false;
  const std::string_view json = next_part(rest, has_text);
  const std::string_view text = has_text ? next_part(rest, has_config) : kSample;
  const std::string_view config = has_config ? rest : std::string_view();

  std::optional<kvgraph::Tokenizer> tok;
  try {
    tok = kvgraph::Tokenizer::from_json(json, config);
  } catch (const kvgraph::Error&) {
    return 0;  // malformed or unsupported tokenizer.json: the expected outcome
  }
  try {
    use(*tok, text);
  } catch (const kvgraph::Error&) {
    // e.g. "[tokenizer] regex /.../ failed on a N-byte input: match limit exceeded"
  }
  return 0;
}
