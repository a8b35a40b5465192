// Tokenizer unit tests on small handwritten tokenizer.json files whose
// expected ids follow from their construction; no fixtures needed.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvgraph/error.h"
#include "kvgraph/tokenizer.h"
#include "support/errors.h"
#include "tokenizer/unicode_norm.h"
#include "tokenizer/utf8.h"

namespace kvgraph {
namespace {

using kvgraph::testing::error_of;

using nlohmann::json;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Ids = std::vector<int32_t>;

// ---- builders -------------------------------------------------------------

// GPT-2 style byte-level BPE. Ids 0..255 are the bytes (id == byte value),
// then the merges, in rank order:
//   256 "he"  257 "ll"  258 "hell"  259 "hello"  260 "Ġw"  261 "Ġwo"
// and the added tokens 262 "<|end|>" (special) and 263 "<mask>" (lstrip, special).
json byte_level_json() {
  const auto& table = tok::byte_level_table();
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[table.byte_to_utf8[b]] = b;
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {"\xC4\xA0", "w"}, {"\xC4\xA0w", "o"}};
  json merge_list = json::array();
  for (const auto& [a, b] : merges) {
    vocab[a + b] = static_cast<int>(vocab.size());
    merge_list.push_back(json::array({a, b}));
  }
  json j;
  j["version"] = "1.0";
  j["added_tokens"] = json::array({
      {{"id", 262}, {"content", "<|end|>"}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
       {"normalized", false}, {"special", true}},
      {{"id", 263}, {"content", "<mask>"}, {"single_word", false}, {"lstrip", true}, {"rstrip", false},
       {"normalized", false}, {"special", true}},
  });
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  j["post_processor"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}, {"use_regex", true}};
  j["decoder"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}};
  j["model"] = {{"type", "BPE"},          {"dropout", nullptr},       {"unk_token", nullptr},
                {"fuse_unk", false},      {"byte_fallback", false},   {"ignore_merges", false},
                {"vocab", vocab},         {"merges", merge_list}};
  return j;
}

// Llama-2 style SentencePiece BPE: 0 <unk>, 1 <s>, 2 </s>, 3..258 <0x00>..<0xFF>,
// then 259 "▁", 260 "h", 261 "i", 262 "▁h", 263 "▁hi", 264 "!".
// Metaspace pre-tokenizer, byte fallback, <s> added by TemplateProcessing.
const std::string kMeta = "\xE2\x96\x81";  // U+2581 "▁"
json sentencepiece_json() {
  json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  for (int b = 0; b < 256; ++b) vocab[fmt::format("<0x{:02X}>", b)] = 3 + b;
  vocab[kMeta] = 259;
  vocab["h"] = 260;
  vocab["i"] = 261;
  vocab[kMeta + "h"] = 262;
  vocab[kMeta + "hi"] = 263;
  vocab["!"] = 264;
  json j;
  auto added = [](int id, const char* s) {
    return json{{"id", id},          {"content", s},         {"single_word", false}, {"lstrip", false},
                {"rstrip", false},   {"normalized", false},  {"special", true}};
  };
  j["added_tokens"] = json::array({added(0, "<unk>"), added(1, "<s>"), added(2, "</s>")});
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", kMeta}, {"prepend_scheme", "always"}, {"split", true}};
  j["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single", json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                              {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
      {"pair", json::array()},
      {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}};
  j["decoder"] = {{"type", "Sequence"},
                  {"decoders", json::array({{{"type", "Replace"}, {"pattern", {{"String", kMeta}}}, {"content", " "}},
                                            {{"type", "ByteFallback"}},
                                            {{"type", "Fuse"}},
                                            {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}};
  j["model"] = {{"type", "BPE"},
                {"unk_token", "<unk>"},
                {"fuse_unk", true},
                {"byte_fallback", true},
                {"vocab", vocab},
                {"merges", json::array({json::array({kMeta, "h"}), json::array({kMeta + "h", "i"})})}};
  return j;
}

Tokenizer load(const json& j, const json& config = nullptr) {
  return Tokenizer::from_json(j.dump(), config.is_null() ? "" : config.dump());
}

bool valid_utf8(const std::string& s) { return tok::is_valid_utf8(s); }

// ---- byte-level BPE ---------------------------------------------------------

TEST(TokenizerByteLevel, MergesFollowRankOrder) {
  const Tokenizer t = load(byte_level_json());
  // "hello" -> he, ll, hell, hello; " world" -> Ġw, Ġwo, then r l d bytes.
  EXPECT_THAT(t.encode("hello world"), ElementsAre(259, 261, 'r', 'l', 'd'));
  EXPECT_THAT(t.encode("hell"), ElementsAre(258));
  EXPECT_THAT(t.encode("help"), ElementsAre(256, 'l', 'p'));
}

TEST(TokenizerByteLevel, EveryByteHasAToken) {
  const Tokenizer t = load(byte_level_json());
  // U+1F600 is F0 9F 98 80; the GPT-2 regex keeps it one piece.
  EXPECT_THAT(t.encode("\xF0\x9F\x98\x80"), ElementsAre(0xF0, 0x9F, 0x98, 0x80));
  EXPECT_THAT(t.encode("\t\n"), ElementsAre('\t', '\n'));
  EXPECT_EQ(t.decode(t.encode("h\xC3\xA9llo \xF0\x9F\x98\x80!\n")), "h\xC3\xA9llo \xF0\x9F\x98\x80!\n");
}

TEST(TokenizerByteLevel, EmptyTextHasNoTokens) {
  const Tokenizer t = load(byte_level_json());
  EXPECT_TRUE(t.encode("").empty());
  EXPECT_EQ(t.decode(Ids{}), "");
}

TEST(TokenizerByteLevel, SpecialTokensAreMatchedInText) {
  const Tokenizer t = load(byte_level_json());
  EXPECT_THAT(t.encode("hi<|end|>hello"), ElementsAre('h', 'i', 262, 259));
  EXPECT_EQ(t.decode(Ids{'h', 'i', 262}), "hi<|end|>");
  EXPECT_EQ(t.decode(Ids{'h', 'i', 262}, /*skip_special_tokens=*/true), "hi");
  EXPECT_TRUE(t.is_special(262));
  EXPECT_FALSE(t.is_special('h'));
}

TEST(TokenizerByteLevel, LstripTokenTakesTheSpacesBeforeIt) {
  const Tokenizer t = load(byte_level_json());
  EXPECT_THAT(t.encode("x  <mask>"), ElementsAre('x', 263));
  // <|end|> has no lstrip: the space stays a token (Ġ is byte 0x20).
  EXPECT_THAT(t.encode("x <|end|>"), ElementsAre('x', ' ', 262));
}

TEST(TokenizerByteLevel, SingleWordAndRstripTokens) {
  json j = byte_level_json();
  j["added_tokens"].push_back({{"id", 264}, {"content", "ab"}, {"single_word", true}, {"lstrip", false},
                               {"rstrip", false}, {"normalized", false}, {"special", false}});
  j["added_tokens"].push_back({{"id", 265}, {"content", "<sep>"}, {"single_word", false}, {"lstrip", false},
                               {"rstrip", true}, {"normalized", false}, {"special", true}});
  const Tokenizer t = load(j);
  // "ab" only where no word character touches it: not in abc, xab, ab_.
  EXPECT_THAT(t.encode("ab abc xab ab_ ab,"),
              ElementsAre(264, ' ', 'a', 'b', 'c', ' ', 'x', 'a', 'b', ' ', 'a', 'b', '_', ' ', 264, ','));
  EXPECT_THAT(t.encode("x<sep> \t y"), ElementsAre('x', 265, 'y'));
  EXPECT_FALSE(t.is_special(264));
  EXPECT_EQ(t.decode(Ids{264, 265}, /*skip_special_tokens=*/true), "ab");
}

TEST(TokenizerByteLevel, InvalidUtf8InputBecomesReplacementCharacter) {
  const Tokenizer t = load(byte_level_json());
  EXPECT_EQ(t.encode("a\xFF"), t.encode("a\xEF\xBF\xBD"));
}

TEST(TokenizerByteLevel, DecodeOfBrokenBytesIsReplacementCharacter) {
  const Tokenizer t = load(byte_level_json());
  // As Rust's from_utf8_lossy: one U+FFFD per maximal invalid subpart.
  EXPECT_EQ(t.decode(Ids{0xF0, 0x9F, 'a'}), "\xEF\xBF\xBD" "a");
  EXPECT_EQ(t.decode(Ids{0xC0, 0x80}), "\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(TokenizerByteLevel, UnknownIdsAreSkippedInDecode) {
  const Tokenizer t = load(byte_level_json());
  EXPECT_EQ(t.decode(Ids{'a', -1, 99999, 'b'}), "ab");
}

TEST(TokenizerByteLevel, VocabularyLookups) {
  const Tokenizer t = load(byte_level_json());
  EXPECT_EQ(t.vocab_size(), 264);
  EXPECT_EQ(t.token_to_id("hello"), 259);
  EXPECT_EQ(t.token_to_id("<|end|>"), 262);
  EXPECT_EQ(t.token_to_id("nope"), std::nullopt);
  EXPECT_EQ(t.id_to_token(260), "\xC4\xA0w");
  EXPECT_EQ(t.id_to_token(5000), std::nullopt);
}

TEST(TokenizerByteLevel, IgnoreMergesTakesWholeWordsFromTheVocabulary) {
  json j = byte_level_json();
  j["model"]["vocab"]["xyz"] = 264;  // no merge builds "xyz"
  EXPECT_THAT(load(j).encode("xyz"), ElementsAre('x', 'y', 'z'));
  j["model"]["ignore_merges"] = true;
  EXPECT_THAT(load(j).encode("xyz"), ElementsAre(264));
}

TEST(TokenizerByteLevel, LegacyStringMergesMatchPairMerges) {
  json j = byte_level_json();
  json legacy = json::array();
  for (const json& m : j["model"]["merges"]) legacy.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
  j["model"]["merges"] = legacy;
  EXPECT_THAT(load(j).encode("hello world"), ElementsAre(259, 261, 'r', 'l', 'd'));
}

constexpr const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*)"
    R"(|\s*[\r\n]+|\s+(?!\S)|\s+)";

TEST(TokenizerByteLevel, Llama3SplitRegexKeepsDigitsInThrees) {
  json j = byte_level_json();
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       json::array({{{"type", "Split"},
                     {"pattern",
                      {{"Regex", kLlama3Pattern}}},
                     {"behavior", "Isolated"},
                     {"invert", false}},
                    {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}};
  // Add "12" and "123" and merges for them, to see the pre-token boundaries.
  j["model"]["vocab"]["12"] = 264;
  j["model"]["vocab"]["123"] = 265;
  j["model"]["merges"].push_back(json::array({"1", "2"}));
  j["model"]["merges"].push_back(json::array({"12", "3"}));
  const Tokenizer t = load(j);
  EXPECT_THAT(t.encode("1231234"), ElementsAre(265, 265, '4'));
}

TEST(TokenizerByteLevel, NfcNormalizerComposesBeforeTokenizing) {
  json j = byte_level_json();
  j["normalizer"] = {{"type", "NFC"}};
  const Tokenizer t = load(j);
  EXPECT_EQ(t.encode("e\xCC\x81"), t.encode("\xC3\xA9"));  // e + U+0301 -> U+00E9
}

// ---- SentencePiece-style BPE ------------------------------------------------

TEST(TokenizerSentencePiece, MetaspaceAndByteFallback) {
  const Tokenizer t = load(sentencepiece_json());
  // "hi 😀" -> "▁hi" "▁😀"; 😀 is not in the vocabulary: its 4 bytes.
  EXPECT_THAT(t.encode("hi \xF0\x9F\x98\x80"), ElementsAre(1, 263, 259, 3 + 0xF0, 3 + 0x9F, 3 + 0x98, 3 + 0x80));
  EXPECT_THAT(t.encode("hi", /*add_special_tokens=*/false), ElementsAre(263));
  EXPECT_EQ(t.decode(t.encode("hi \xF0\x9F\x98\x80")), "<s> hi \xF0\x9F\x98\x80");
  EXPECT_EQ(t.decode(t.encode("hi \xF0\x9F\x98\x80"), /*skip_special_tokens=*/true), "hi \xF0\x9F\x98\x80");
}

TEST(TokenizerSentencePiece, InvalidByteRunDecodesToOneReplacementPerByte) {
  const Tokenizer t = load(sentencepiece_json());
  // tokenizers' ByteFallback: a run that is not UTF-8 gives one U+FFFD per byte.
  EXPECT_EQ(t.decode(Ids{263, 3 + 0xF0, 3 + 0x9F, 264}), "hi\xEF\xBF\xBD\xEF\xBF\xBD!");
}

TEST(TokenizerSentencePiece, LegacyNormalizerFormMatchesMetaspace) {
  json j = sentencepiece_json();
  j["pre_tokenizer"] = nullptr;
  const json prepend = {{"type", "Prepend"}, {"prepend", kMeta}};
  const json replace = {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kMeta}};
  j["normalizer"] = {{"type", "Sequence"}, {"normalizers", json::array({prepend, replace})}};
  const Tokenizer t = load(j);
  EXPECT_THAT(t.encode("hi hi!"), ElementsAre(1, 263, 263, 264));
  EXPECT_EQ(t.decode(t.encode("hi hi!"), true), "hi hi!");
}

TEST(TokenizerSentencePiece, UnknownCharacterWithoutByteFallbackIsUnk) {
  json j = sentencepiece_json();
  j["model"]["byte_fallback"] = false;
  // Fused: one <unk> for the run of unknown characters.
  EXPECT_THAT(load(j).encode("hi \xCE\xB1\xCE\xB2", false), ElementsAre(263, 259, 0));
  j["model"]["fuse_unk"] = false;
  EXPECT_THAT(load(j).encode("hi \xCE\xB1\xCE\xB2", false), ElementsAre(263, 259, 0, 0));
}

TEST(TokenizerSentencePiece, ConfigGivesBosEosAndAddBosToken) {
  const json config = {{"bos_token", {{"__type", "AddedToken"}, {"content", "<s>"}}},
                       {"eos_token", "</s>"},
                       {"add_bos_token", false}};
  const Tokenizer t = load(sentencepiece_json(), config);
  EXPECT_EQ(t.bos_id(), 1);
  EXPECT_EQ(t.eos_id(), 2);
  EXPECT_THAT(t.encode("hi"), ElementsAre(263));  // add_bos_token false wins over the template

  json no_template = sentencepiece_json();
  no_template["post_processor"] = nullptr;
  const json add_both = {{"bos_token", "<s>"}, {"eos_token", "</s>"}, {"add_bos_token", true}, {"add_eos_token", true}};
  EXPECT_THAT(load(no_template, add_both).encode("hi"), ElementsAre(1, 263, 2));
  EXPECT_THAT(load(no_template, add_both).encode("hi", false), ElementsAre(263));
}

TEST(TokenizerSentencePiece, BosEosGuessedWithoutConfig) {
  const Tokenizer t = load(sentencepiece_json());
  EXPECT_EQ(t.bos_id(), 1);
  EXPECT_EQ(t.eos_id(), 2);
  EXPECT_THAT(t.prefix_special_ids(), ElementsAre(1));
  EXPECT_TRUE(t.suffix_special_ids().empty());
}

// ---- streaming ----------------------------------------------------------------

TEST(TokenizerStream, EmojiSplitOverByteFallbackTokensComesOutWhole) {
  const Tokenizer t = load(sentencepiece_json());
  const Ids ids = t.encode("hi \xF0\x9F\x98\x80!", false);  // ▁hi ▁ F0 9F 98 80 !
  ASSERT_THAT(ids, ElementsAre(263, 259, 3 + 0xF0, 3 + 0x9F, 3 + 0x98, 3 + 0x80, 264));
  StreamDecoder stream(t);
  std::vector<std::string> out;
  for (int32_t id : ids) out.push_back(stream.step(id));
  out.push_back(stream.flush());
  for (const std::string& s : out) EXPECT_TRUE(valid_utf8(s)) << s;
  EXPECT_THAT(out, ElementsAre("hi", " ", "", "", "", "\xF0\x9F\x98\x80", "!", ""));
}

TEST(TokenizerStream, ByteLevelEmojiComesOutWhole) {
  const Tokenizer t = load(byte_level_json());
  StreamDecoder stream(t);
  EXPECT_EQ(stream.step('a'), "a");
  EXPECT_EQ(stream.step(0xF0), "");
  EXPECT_EQ(stream.step(0x9F), "");
  EXPECT_EQ(stream.step(0x98), "");
  EXPECT_EQ(stream.step(0x80), "\xF0\x9F\x98\x80");
  EXPECT_EQ(stream.flush(), "");
}

TEST(TokenizerStream, FlushTurnsHeldBytesIntoReplacementCharacters) {
  const Tokenizer bl = load(byte_level_json());
  StreamDecoder a(bl);
  EXPECT_EQ(a.step(0xF0), "");
  EXPECT_EQ(a.step(0x9F), "");
  EXPECT_EQ(a.flush(), "\xEF\xBF\xBD");  // one maximal subpart, as decode
  EXPECT_EQ(a.step('x'), "x");            // flush started afresh

  const Tokenizer sp = load(sentencepiece_json());
  StreamDecoder b(sp);
  EXPECT_EQ(b.step(3 + 0xF0), "");
  EXPECT_EQ(b.step(3 + 0x9F), "");
  EXPECT_EQ(b.flush(), "\xEF\xBF\xBD");
  // decode follows tokenizers' ByteFallback: one U+FFFD per byte of the run.
  EXPECT_EQ(sp.decode(Ids{3 + 0xF0, 3 + 0x9F}), "\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(TokenizerStream, CharactersOfAByteRunComeOutAsTheyComplete) {
  const Tokenizer t = load(sentencepiece_json());
  StreamDecoder stream(t);
  // 中 (E4 B8 AD) then 文 (E6 96 87), all byte-fallback tokens.
  const Ids ids = {3 + 0xE4, 3 + 0xB8, 3 + 0xAD, 3 + 0xE6, 3 + 0x96, 3 + 0x87};
  std::vector<std::string> out;
  for (int32_t id : ids) out.push_back(stream.step(id));
  EXPECT_THAT(out, ElementsAre("", "", "\xE4\xB8\xAD", "", "", "\xE6\x96\x87"));
  EXPECT_EQ(stream.flush(), "");
}

TEST(TokenizerStream, BrokenSequenceIsReplacedOnceTheNextTokenShowsIt) {
  const Tokenizer t = load(sentencepiece_json());
  StreamDecoder stream(t);
  std::vector<std::string> out;
  for (int32_t id : Ids{263, 3 + 0xE4, 3 + 0xB8, 264}) out.push_back(stream.step(id));  // E4 B8 lacks a byte
  out.push_back(stream.flush());
  EXPECT_THAT(out, ElementsAre("hi", "", "", "\xEF\xBF\xBD!", ""));
  // decode, like tokenizers, gives one U+FFFD per byte of the broken run.
  EXPECT_EQ(t.decode(Ids{263, 3 + 0xE4, 3 + 0xB8, 264}), "hi\xEF\xBF\xBD\xEF\xBF\xBD!");
}

TEST(TokenizerStream, SkipsSpecialTokensWhenAsked) {
  const Tokenizer t = load(byte_level_json());
  StreamDecoder stream(t, /*skip_special_tokens=*/true);
  std::string all;
  for (int32_t id : Ids{'h', 'i', 262, '!'}) all += stream.step(id);
  EXPECT_EQ(all + stream.flush(), "hi!");
}

TEST(TokenizerStream, RandomIdsNeverEmitInvalidUtf8) {
  for (const json& j : {byte_level_json(), sentencepiece_json()}) {
    const Tokenizer t = load(j);
    uint32_t state = 12345;
    for (int run = 0; run < 200; ++run) {
      Ids ids;
      for (int k = 0; k < 16; ++k) {
        state = state * 1664525u + 1013904223u;
        ids.push_back(static_cast<int32_t>((state >> 8) % static_cast<uint32_t>(t.vocab_size())));
      }
      StreamDecoder stream(t);
      std::string all;
      for (int32_t id : ids) {
        const std::string s = stream.step(id);
        ASSERT_TRUE(valid_utf8(s));
        all += s;
      }
      const std::string tail = stream.flush();
      ASSERT_TRUE(valid_utf8(tail));
      // Invalid <0xNN> runs decode differently (see StreamDecoder); all else is equal.
      const std::string want = t.decode(ids);
      if (want.find("\xEF\xBF\xBD") == std::string::npos || !t.token_to_id("<0x00>")) {
        EXPECT_EQ(all + tail, want);
      }
    }
  }
}

// ---- errors -------------------------------------------------------------------

TEST(TokenizerErrors, MalformedJsonNamesTheByte) {
  EXPECT_THAT(error_of([] { Tokenizer::from_json("{\"model\": {\"type\": "); }),
              HasSubstr("[tokenizer] tokenizer.json: parse error at byte 20"));
}

TEST(TokenizerErrors, UnsupportedModelType) {
  const std::string msg =
      error_of([] { Tokenizer::from_json(R"({"model": {"type": "WordPiece", "vocab": {"a": 0}}})"); });
  EXPECT_THAT(msg, HasSubstr("model type \"WordPiece\" is not supported (supported: BPE)"));
}

TEST(TokenizerErrors, UnsupportedComponentIsNamed) {
  json j = byte_level_json();
  j["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", json::array({{{"type", "UnicodeScripts"}}})}};
  EXPECT_THAT(error_of([&] { load(j); }),
              HasSubstr("pre_tokenizer.pretokenizers[0] type \"UnicodeScripts\" is not supported"));
  j = byte_level_json();
  j["normalizer"] = {{"type", "Precompiled"}, {"precompiled_charsmap", "AAAA"}};
  EXPECT_THAT(error_of([&] { load(j); }), HasSubstr("normalizer type \"Precompiled\" is not supported"));
}

TEST(TokenizerErrors, MergeOfUnknownTokenIsRejected) {
  json j = byte_level_json();
  j["model"]["merges"].push_back(json::array({"h", "zzz"}));
  EXPECT_THAT(error_of([&] { load(j); }), HasSubstr("uses \"zzz\", which is not in the vocabulary"));
}

TEST(TokenizerErrors, MissingModel) {
  EXPECT_THAT(error_of([] { Tokenizer::from_json("{}"); }), HasSubstr("missing \"model\""));
}

TEST(TokenizerErrors, MissingFileIsNamed) {
  const std::filesystem::path p = std::filesystem::temp_directory_path() / "kvgraph-no-such-dir" / "tokenizer.json";
  EXPECT_THAT(error_of([&] { Tokenizer::from_file(p); }), HasSubstr(p.string() + ": file not found"));
}

TEST(TokenizerErrors, FromFileReadsTheFolderAndItsConfig) {
  const auto dir = std::filesystem::temp_directory_path() / fmt::format("kvgraph-tok-{}", ::getpid());
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "tokenizer.json") << sentencepiece_json().dump();
  std::ofstream(dir / "tokenizer_config.json") << R"({"bos_token": "<s>", "eos_token": "<unk>"})";
  const Tokenizer t = Tokenizer::from_file(dir);
  EXPECT_EQ(t.eos_id(), 0);
  std::ofstream(dir / "tokenizer_config.json") << "{oops";
  EXPECT_THAT(error_of([&] { Tokenizer::from_file(dir / "tokenizer.json"); }),
              HasSubstr("tokenizer_config.json: parse error at byte"));
  std::filesystem::remove_all(dir);
}

// ---- Unicode helpers ----------------------------------------------------------

TEST(TokenizerUnicode, NormalForms) {
  using tok::NormalForm;
  EXPECT_EQ(tok::unicode_normalize("e\xCC\x81", NormalForm::NFC), "\xC3\xA9");
  EXPECT_EQ(tok::unicode_normalize("\xC3\xA9", NormalForm::NFD), "e\xCC\x81");
  EXPECT_EQ(tok::unicode_normalize("\xEF\xAC\x81", NormalForm::NFKC), "fi");            // U+FB01 ligature
  EXPECT_EQ(tok::unicode_normalize("\xEF\xAC\x81", NormalForm::NFC), "\xEF\xAC\x81");
  EXPECT_EQ(tok::unicode_normalize("\xED\x95\x9C", NormalForm::NFD), "\xE1\x84\x92\xE1\x85\xA1\xE1\x86\xAB");  // 한
  EXPECT_EQ(tok::unicode_normalize("\xE1\x84\x92\xE1\x85\xA1\xE1\x86\xAB", NormalForm::NFC), "\xED\x95\x9C");
  // Marks are put in canonical order: dot below (220) before dot above (230).
  EXPECT_EQ(tok::unicode_normalize("q\xCC\x87\xCC\xA3", NormalForm::NFC), "q\xCC\xA3\xCC\x87");
}

TEST(TokenizerUnicode, LossyUtf8HoldsAnUnfinishedTail) {
  size_t held = 0;
  EXPECT_EQ(tok::utf8_lossy("ab\xF0\x9F", /*hold_incomplete=*/true, &held), "ab");
  EXPECT_EQ(held, 2u);
  EXPECT_EQ(tok::utf8_lossy("ab\xF0\x9F"), "ab\xEF\xBF\xBD");
  EXPECT_EQ(tok::utf8_lossy("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate: 3 subparts
}

}  // namespace
}  // namespace kvgraph
