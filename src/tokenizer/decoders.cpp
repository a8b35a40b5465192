// tokenizers' decoders: ByteLevel, Metaspace, Replace, ByteFallback, Fuse,
// Strip, BPEDecoder and Sequence. Token strings may carry raw bytes once a
// ByteLevel or ByteFallback step has run; the caller makes the result UTF-8.
#include "tokenizer/components.h"
#include "tokenizer/json_util.h"
#include "tokenizer/utf8.h"

namespace kvgraph::tok {

namespace {

class SequenceDecoder final : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> parts) : parts_(std::move(parts)) {}
  void apply(std::vector<std::string>& tokens, DecodeState& state) const override {
    for (const auto& p : parts_) p->apply(tokens, state);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> parts_;
};

// Byte-level characters back to bytes, all tokens fused into one string. A
// token with a character outside the table (an added token such as
// "<|im end|>" with a space) is kept as its own UTF-8 bytes.
class ByteLevelDecoder final : public Decoder {
 public:
  void apply(std::vector<std::string>& tokens, DecodeState&) const override {
    const ByteLevelTable& t = byte_level_table();
    std::string out;
    std::string bytes;
    for (const std::string& tok : tokens) {
      bytes.clear();
      bool all = true;
      size_t i = 0;
      while (i < tok.size()) {
        const char32_t cp = next_cp(tok, i);
        if (cp >= t.cp_to_byte.size() || t.cp_to_byte[cp] < 0) {
          all = false;
          break;
        }
        bytes.push_back(static_cast<char>(t.cp_to_byte[cp]));
      }
      out += all ? bytes : tok;
    }
    tokens.assign(1, std::move(out));
  }
};

class MetaspaceDecoder final : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, bool drop_first) : rep_(std::move(replacement)), drop_first_(drop_first) {}
  void apply(std::vector<std::string>& tokens, DecodeState&) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      // In the first token every replacement goes (tokenizers does the same).
      const std::string_view with = (i == 0 && drop_first_) ? "" : " ";
      std::string out;
      const std::string& t = tokens[i];
      size_t last = 0, at;
      while ((at = t.find(rep_, last)) != std::string::npos) {
        out.append(t, last, at - last);
        out += with;
        last = at + rep_.size();
      }
      out.append(t, last);
      tokens[i] = std::move(out);
    }
  }

 private:
  std::string rep_;
  bool drop_first_;
};

class ReplaceDecoder final : public Decoder {
 public:
  ReplaceDecoder(ReplacePattern pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void apply(std::vector<std::string>& tokens, DecodeState&) const override {
    for (std::string& t : tokens) t = replace_all(pattern_, t, content_);
  }

 private:
  ReplacePattern pattern_;
  std::string content_;
};

// "<0xNN>" -> the byte; runs of bytes become their UTF-8 text, or one U+FFFD
// per byte if the run is not valid UTF-8 (see DecodeState for streaming).
class ByteFallbackDecoder final : public Decoder {
 public:
  void apply(std::vector<std::string>& tokens, DecodeState& state) const override {
    std::vector<std::string> out;
    out.reserve(tokens.size());
    std::string run;
    auto flush = [&](bool last) {
      if (run.empty()) return;
      if (state.stream) {
        size_t held = 0;
        std::string text = utf8_lossy(run, last && state.hold_tail, &held);
        if (held) state.held = true;
        if (!text.empty()) out.push_back(std::move(text));
      } else if (is_valid_utf8(run)) {
        out.push_back(run);
      } else {
        for (size_t k = 0; k < run.size(); ++k) out.emplace_back("\xEF\xBF\xBD");
      }
      run.clear();
    };
    for (std::string& t : tokens) {
      if (int b = byte_of(t); b >= 0) {
        run.push_back(static_cast<char>(b));
      } else {
        flush(false);
        out.push_back(std::move(t));
      }
    }
    flush(true);
    tokens = std::move(out);
  }

 private:
  static int hex(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  }
  static int byte_of(const std::string& t) {
    if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
    const int hi = hex(t[3]), lo = hex(t[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
  }
};

class FuseDecoder final : public Decoder {
 public:
  void apply(std::vector<std::string>& tokens, DecodeState&) const override {
    std::string out;
    for (const std::string& t : tokens) out += t;
    tokens.assign(1, std::move(out));
  }
};

// Removes up to `start` leading and `stop` trailing copies of `content` from each token.
class StripDecoder final : public Decoder {
 public:
  StripDecoder(std::string content, size_t start, size_t stop)
      : content_(std::move(content)), start_(start), stop_(stop) {}
  void apply(std::vector<std::string>& tokens, DecodeState&) const override {
    const size_t n = content_.size();
    for (std::string& t : tokens) {
      size_t b = 0, e = t.size();
      for (size_t k = 0; k < start_ && e - b >= n && t.compare(b, n, content_) == 0; ++k) b += n;
      for (size_t k = 0; k < stop_ && e - b >= n && t.compare(e - n, n, content_) == 0; ++k) e -= n;
      t = t.substr(b, e - b);
    }
  }

 private:
  std::string content_;
  size_t start_, stop_;
};

// Classic BPE end-of-word suffix: a space between words, none at the end.
class BpeSuffixDecoder final : public Decoder {
 public:
  explicit BpeSuffixDecoder(std::string suffix) : suffix_(std::move(suffix)) {}
  void apply(std::vector<std::string>& tokens, DecodeState&) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      const std::string_view with = i + 1 == tokens.size() ? "" : " ";
      std::string out;
      const std::string& t = tokens[i];
      size_t last = 0, at;
      while (!suffix_.empty() && (at = t.find(suffix_, last)) != std::string::npos) {
        out.append(t, last, at - last);
        out += with;
        last = at + suffix_.size();
      }
      out.append(t, last);
      tokens[i] = std::move(out);
    }
  }

 private:
  std::string suffix_;
};

}  // namespace

std::unique_ptr<Decoder> parse_decoder(const json& j, const std::string& where) {
  const std::string type = type_of(j, where);
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Decoder>> parts;
    const json& list = need_array(j, "decoders", where);
    for (size_t i = 0; i < list.size(); ++i) {
      if (list[i].is_null()) continue;
      parts.push_back(parse_decoder(list[i], fmt::format("{}.decoders[{}]", where, i)));
    }
    return std::make_unique<SequenceDecoder>(std::move(parts));
  }
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "Metaspace") {
    const std::string rep = opt_string(j, "replacement", "\u2581", where);
    if (rep.empty()) bad_json(where, "empty replacement");
    bool never = opt_string(j, "prepend_scheme", "always", where) == "never";
    if (!opt_bool(j, "add_prefix_space", true, where)) never = true;
    return std::make_unique<MetaspaceDecoder>(rep, !never);
  }
  if (type == "Replace") {
    return std::make_unique<ReplaceDecoder>(parse_replace_pattern(j, where), need_string(j, "content", where));
  }
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Strip") {
    const std::string content = need_string(j, "content", where);
    const int64_t start = opt_int(j, "start", 0, where), stop = opt_int(j, "stop", 0, where);
    if (content.empty() || start < 0 || stop < 0) bad_json(where, "Strip needs a content character and counts >= 0");
    return std::make_unique<StripDecoder>(content, static_cast<size_t>(start), static_cast<size_t>(stop));
  }
  if (type == "BPEDecoder") return std::make_unique<BpeSuffixDecoder>(opt_string(j, "suffix", "</w>", where));
  unsupported_type(where, type, "Sequence, ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip, BPEDecoder");
}

}  // namespace kvgraph::tok
