// tokenizers' pre-tokenizers: ByteLevel, Split, Metaspace, Digits,
// Punctuation, Whitespace, WhitespaceSplit, BertPreTokenizer,
// CharDelimiterSplit, FixedLength and Sequence.
#include <algorithm>
#include <utility>

#include "tokenizer/components.h"
#include "tokenizer/json_util.h"
#include "tokenizer/regex.h"
#include "tokenizer/utf8.h"

namespace kvgraph::tok {

namespace {

// Unicode White_Space and Rust's `\w`, as PCRE2 class contents.
constexpr std::string_view kSpaceClass =
    R"(\t-\r\x20\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";
constexpr std::string_view kWordClass = R"(\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\x{200C}\x{200D})";

// Oniguruma's `\s` is Unicode White_Space (it includes U+0085, PCRE2's does
// not): rewrite \s / \S into explicit classes so both engines agree.
std::string onig_to_pcre2(std::string_view pattern) {
  std::string out;
  bool in_class = false;
  size_t class_start = 0;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char n = pattern[i + 1];
      if (n == 's') {
        out += in_class ? std::string(kSpaceClass) : "[" + std::string(kSpaceClass) + "]";
      } else if (n == 'S' && !in_class) {
        out += "[^" + std::string(kSpaceClass) + "]";
      } else {
        out += c;
        out += n;
      }
      ++i;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      class_start = i;
    } else if (in_class && c == ']') {
      // A ']' right after '[' or '[^' is a literal.
      const bool literal = i == class_start + 1 || (i == class_start + 2 && pattern[class_start + 1] == '^');
      if (!literal) in_class = false;
    }
    out += c;
  }
  return out;
}

enum class Behavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

Behavior parse_behavior(const json& j, const std::string& where, Behavior dflt) {
  const std::string b = opt_string(j, "behavior", "", where);
  if (b.empty()) return dflt;
  if (b == "Removed") return Behavior::Removed;
  if (b == "Isolated") return Behavior::Isolated;
  if (b == "MergedWithPrevious") return Behavior::MergedWithPrevious;
  if (b == "MergedWithNext") return Behavior::MergedWithNext;
  if (b == "Contiguous") return Behavior::Contiguous;
  bad_json(where, fmt::format("unknown split behavior \"{}\"", b));
}

// NormalizedString::split: `matches` (sorted, non-overlapping byte ranges of
// p.text) cut the piece according to `behavior`; empty results are dropped.
void split_piece(Piece& p, const std::vector<std::pair<size_t, size_t>>& matches, Behavior behavior, bool invert,
                 std::vector<Piece>& out) {
  struct Seg {
    size_t b, e;
    bool match;
  };
  std::vector<Seg> segs;
  size_t prev = 0;
  for (auto [b, e] : matches) {
    if (prev != b) segs.push_back({prev, b, invert});
    segs.push_back({b, e, !invert});
    prev = e;
  }
  if (prev != p.text.size()) segs.push_back({prev, p.text.size(), invert});

  std::vector<Seg> keep;  // .match now means "remove"
  switch (behavior) {
    case Behavior::Isolated:
      for (Seg s : segs) keep.push_back({s.b, s.e, false});
      break;
    case Behavior::Removed:
      keep = segs;
      break;
    case Behavior::Contiguous: {
      bool prev_match = false;
      for (Seg s : segs) {
        if (s.match == prev_match && !keep.empty()) {
          keep.back().e = s.e;
        } else {
          keep.push_back({s.b, s.e, false});
        }
        prev_match = s.match;
      }
      break;
    }
    case Behavior::MergedWithPrevious: {
      bool prev_match = false;
      for (Seg s : segs) {
        if (s.match && !prev_match && !keep.empty()) {
          keep.back().e = s.e;
        } else {
          keep.push_back({s.b, s.e, false});
        }
        prev_match = s.match;
      }
      break;
    }
    case Behavior::MergedWithNext: {
      bool prev_match = false;
      for (auto it = segs.rbegin(); it != segs.rend(); ++it) {
        if (it->match && !prev_match && !keep.empty()) {
          keep.back().b = it->b;
        } else {
          keep.push_back({it->b, it->e, false});
        }
        prev_match = it->match;
      }
      std::reverse(keep.begin(), keep.end());
      break;
    }
  }
  for (const Seg& s : keep) {
    if (s.match || s.e == s.b) continue;
    out.push_back({p.text.substr(s.b, s.e - s.b), p.at_origin && s.b == 0});
  }
}

// Splits each piece by the matches of `re`.
void split_all(std::vector<Piece>& pieces, const Regex& re, Behavior behavior, bool invert) {
  std::vector<Piece> out;
  out.reserve(pieces.size());
  std::vector<std::pair<size_t, size_t>> matches;
  for (Piece& p : pieces) {
    matches.clear();
    re.find_all(p.text, matches);
    split_piece(p, matches, behavior, invert, out);
  }
  pieces = std::move(out);
}

class SequencePre final : public PreTokenizer {
 public:
  explicit SequencePre(std::vector<std::unique_ptr<PreTokenizer>> parts) : parts_(std::move(parts)) {}
  void apply(std::vector<Piece>& pieces) const override {
    for (const auto& p : parts_) p->apply(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

// GPT-2's pre-tokenizer regex, the one ByteLevel uses when use_regex is true.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class ByteLevelPre final : public PreTokenizer {
 public:
  ByteLevelPre(bool add_prefix_space, bool use_regex) : add_prefix_space_(add_prefix_space) {
    if (use_regex) regex_ = std::make_unique<Regex>(onig_to_pcre2(kGpt2Pattern), "ByteLevel pre-tokenizer");
  }
  void apply(std::vector<Piece>& pieces) const override {
    if (add_prefix_space_) {
      for (Piece& p : pieces) {
        if (p.text.empty() || p.text[0] != ' ') p.text.insert(0, 1, ' ');
      }
    }
    if (regex_) split_all(pieces, *regex_, Behavior::Isolated, false);
    const ByteLevelTable& t = byte_level_table();
    for (Piece& p : pieces) {
      std::string mapped;
      mapped.reserve(p.text.size() * 2);
      for (unsigned char c : p.text) mapped += t.byte_to_utf8[c];
      p.text = std::move(mapped);
    }
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Regex> regex_;
};

class SplitPre final : public PreTokenizer {
 public:
  SplitPre(const std::string& pattern, Behavior behavior, bool invert, const std::string& where)
      : regex_(pattern, where), behavior_(behavior), invert_(invert) {}
  void apply(std::vector<Piece>& pieces) const override { split_all(pieces, regex_, behavior_, invert_); }

 private:
  Regex regex_;
  Behavior behavior_;
  bool invert_;
};

enum class PrependScheme { Always, First, Never };

class MetaspacePre final : public PreTokenizer {
 public:
  MetaspacePre(std::string replacement, PrependScheme scheme, bool split)
      : rep_(std::move(replacement)), scheme_(scheme), split_(split) {}
  void apply(std::vector<Piece>& pieces) const override {
    std::vector<Piece> out;
    for (Piece& p : pieces) {
      std::string s;
      s.reserve(p.text.size() + rep_.size());
      for (char c : p.text) {
        if (c == ' ') {
          s += rep_;
        } else {
          s += c;
        }
      }
      const bool starts_with_rep = s.compare(0, rep_.size(), rep_) == 0;
      if (!starts_with_rep && (scheme_ == PrependScheme::Always || (scheme_ == PrependScheme::First && p.at_origin))) {
        s.insert(0, rep_);
      }
      if (!split_) {
        if (!s.empty()) out.push_back({std::move(s), p.at_origin});
        continue;
      }
      // MergedWithNext on the replacement: a new piece starts at each one.
      size_t start = 0;
      for (size_t at = s.find(rep_, 1); at != std::string::npos; at = s.find(rep_, at + rep_.size())) {
        if (at > start) out.push_back({s.substr(start, at - start), p.at_origin && start == 0});
        start = at;
      }
      if (start < s.size()) out.push_back({s.substr(start), p.at_origin && start == 0});
    }
    pieces = std::move(out);
  }

 private:
  std::string rep_;
  PrependScheme scheme_;
  bool split_;
};

class FixedLengthPre final : public PreTokenizer {
 public:
  explicit FixedLengthPre(size_t length) : length_(length) {}
  void apply(std::vector<Piece>& pieces) const override {
    std::vector<Piece> out;
    for (Piece& p : pieces) {
      size_t start = 0, i = 0, n = 0;
      while (i < p.text.size()) {
        i += cp_len(static_cast<unsigned char>(p.text[i]));
        if (++n == length_) {
          out.push_back({p.text.substr(start, i - start), p.at_origin && start == 0});
          start = i, n = 0;
        }
      }
      if (start < p.text.size()) out.push_back({p.text.substr(start), p.at_origin && start == 0});
    }
    pieces = std::move(out);
  }

 private:
  size_t length_;
};

// A pre-tokenizer that is one or more regex splits.
class RegexSplitsPre final : public PreTokenizer {
 public:
  void add(std::string_view pattern, Behavior behavior, bool invert, const std::string& where) {
    steps_.push_back({std::make_unique<Regex>(pattern, where), behavior, invert});
  }
  void apply(std::vector<Piece>& pieces) const override {
    for (const Step& s : steps_) split_all(pieces, *s.regex, s.behavior, s.invert);
  }

 private:
  struct Step {
    std::unique_ptr<Regex> regex;
    Behavior behavior;
    bool invert;
  };
  std::vector<Step> steps_;
};

std::string space_class() { return "[" + std::string(kSpaceClass) + "]"; }
std::string non_space_run() { return "[^" + std::string(kSpaceClass) + "]+"; }
// Rust's char::is_ascii_punctuation() || general category P.
constexpr std::string_view kPunctuation = R"([\p{P}\x21-\x2F\x3A-\x40\x5B-\x60\x7B-\x7E])";

}  // namespace

std::unique_ptr<PreTokenizer> parse_pre_tokenizer(const json& j, const std::string& where) {
  const std::string type = type_of(j, where);
  if (type == "Sequence") {
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    const json& list = need_array(j, "pretokenizers", where);
    for (size_t i = 0; i < list.size(); ++i) {
      if (list[i].is_null()) continue;
      parts.push_back(parse_pre_tokenizer(list[i], fmt::format("{}.pretokenizers[{}]", where, i)));
    }
    return std::make_unique<SequencePre>(std::move(parts));
  }
  if (type == "ByteLevel") {
    return std::make_unique<ByteLevelPre>(opt_bool(j, "add_prefix_space", true, where),
                                          opt_bool(j, "use_regex", true, where));
  }
  if (type == "Split") {
    const json& p = need_field(j, "pattern", where);
    std::string pattern;
    if (const json* s = opt_field(p, "String"); s && s->is_string()) {
      pattern = regex_escape(s->get<std::string>());
    } else if (const json* r = opt_field(p, "Regex"); r && r->is_string()) {
      pattern = onig_to_pcre2(r->get<std::string>());
    } else {
      bad_json(where, "\"pattern\" must be {\"String\": ...} or {\"Regex\": ...}");
    }
    return std::make_unique<SplitPre>(pattern, parse_behavior(j, where, Behavior::Removed),
                                      opt_bool(j, "invert", false, where), where);
  }
  if (type == "Metaspace") {
    const std::string rep = opt_string(j, "replacement", "\u2581", where);
    if (rep.empty()) bad_json(where, "empty replacement");
    PrependScheme scheme = PrependScheme::Always;
    const std::string s = opt_string(j, "prepend_scheme", "always", where);
    if (s == "first") {
      scheme = PrependScheme::First;
    } else if (s == "never") {
      scheme = PrependScheme::Never;
    } else if (s != "always") {
      bad_json(where, fmt::format("unknown prepend_scheme \"{}\"", s));
    }
    // Older files: add_prefix_space false means never.
    if (!opt_bool(j, "add_prefix_space", true, where)) scheme = PrependScheme::Never;
    return std::make_unique<MetaspacePre>(rep, scheme, opt_bool(j, "split", true, where));
  }
  if (type == "Digits") {
    auto pre = std::make_unique<RegexSplitsPre>();
    const bool individual = opt_bool(j, "individual_digits", false, where);
    pre->add(R"(\p{N})", individual ? Behavior::Isolated : Behavior::Contiguous, false, where);
    return pre;
  }
  if (type == "Punctuation") {
    auto pre = std::make_unique<RegexSplitsPre>();
    pre->add(kPunctuation, parse_behavior(j, where, Behavior::Isolated), false, where);
    return pre;
  }
  if (type == "Whitespace") {
    auto pre = std::make_unique<RegexSplitsPre>();
    const std::string w(kWordClass), s(kSpaceClass);
    pre->add("[" + w + "]+|[^" + w + s + "]+", Behavior::Removed, true, where);
    return pre;
  }
  if (type == "WhitespaceSplit") {
    auto pre = std::make_unique<RegexSplitsPre>();
    pre->add(non_space_run(), Behavior::Removed, true, where);
    return pre;
  }
  if (type == "BertPreTokenizer") {
    auto pre = std::make_unique<RegexSplitsPre>();
    pre->add(space_class(), Behavior::Removed, false, where);
    pre->add(kPunctuation, Behavior::Isolated, false, where);
    return pre;
  }
  if (type == "CharDelimiterSplit") {
    auto pre = std::make_unique<RegexSplitsPre>();
    pre->add(regex_escape(need_string(j, "delimiter", where)), Behavior::Removed, false, where);
    return pre;
  }
  if (type == "FixedLength") {
    const int64_t n = opt_int(j, "length", 5, where);
    if (n <= 0) bad_json(where, "\"length\" must be positive");
    return std::make_unique<FixedLengthPre>(static_cast<size_t>(n));
  }
  unsupported_type(where, type,
                   "Sequence, ByteLevel, Split, Metaspace, Digits, Punctuation, Whitespace, WhitespaceSplit, "
                   "BertPreTokenizer, CharDelimiterSplit, FixedLength");
}

}  // namespace kvgraph::tok
