// tokenizers' normalizers: NFC/NFD/NFKC/NFKD, Lowercase, StripAccents, Strip,
// Prepend, Replace and Sequence.
#include <optional>

#include "tokenizer/components.h"
#include "tokenizer/json_util.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode_norm.h"
#include "tokenizer/utf8.h"

namespace kvgraph::tok {

namespace {

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> parts) : parts_(std::move(parts)) {}
  void apply(std::string& s) const override {
    for (const auto& p : parts_) p->apply(s);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

class UnicodeNormalizer final : public Normalizer {
 public:
  explicit UnicodeNormalizer(NormalForm form) : form_(form) {}
  void apply(std::string& s) const override { s = unicode_normalize(s, form_); }

 private:
  NormalForm form_;
};

class LowercaseNormalizer final : public Normalizer {
 public:
  void apply(std::string& s) const override { s = unicode_lowercase(s); }
};

class StripAccentsNormalizer final : public Normalizer {
 public:
  void apply(std::string& s) const override { s = strip_nonspacing_marks(s); }
};

class StripNormalizer final : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  void apply(std::string& s) const override {
    size_t b = 0, e = s.size();
    if (left_) {
      while (b < e) {
        size_t j = b;
        if (!is_white_space(next_cp(s, j))) break;
        b = j;
      }
    }
    if (right_) {
      while (e > b) {
        size_t k = e - 1;
        while (k > b && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
        size_t j = k;
        if (!is_white_space(next_cp(s, j))) break;
        e = k;
      }
    }
    s = s.substr(b, e - b);
  }

 private:
  bool left_, right_;
};

class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  void apply(std::string& s) const override {
    if (!s.empty()) s.insert(0, prefix_);
  }

 private:
  std::string prefix_;
};

}  // namespace

ReplacePattern parse_replace_pattern(const json& j, const std::string& where) {
  const json& p = need_field(j, "pattern", where);
  ReplacePattern out;
  if (const json* s = opt_field(p, "String"); s && s->is_string()) {
    out.literal = s->get<std::string>();
    if (out.literal.empty()) bad_json(where, "empty \"String\" pattern");
  } else if (const json* r = opt_field(p, "Regex"); r && r->is_string()) {
    out.regex = std::make_unique<Regex>(r->get<std::string>(), where);
  } else {
    bad_json(where, "\"pattern\" must be {\"String\": ...} or {\"Regex\": ...}");
  }
  return out;
}

std::string replace_all(const ReplacePattern& pattern, std::string_view s, std::string_view content) {
  std::string out;
  if (!pattern.regex) {
    size_t last = 0, at;
    while ((at = s.find(pattern.literal, last)) != std::string_view::npos) {
      out.append(s.substr(last, at - last));
      out.append(content);
      last = at + pattern.literal.size();
    }
    out.append(s.substr(last));
    return out;
  }
  std::string valid;
  if (!is_valid_utf8(s)) {
    valid = utf8_lossy(s);
    s = valid;
  }
  std::vector<std::pair<size_t, size_t>> matches;
  pattern.regex->find_all(s, matches);
  size_t last = 0;
  for (auto [b, e] : matches) {
    out.append(s.substr(last, b - last));
    out.append(content);
    last = e;
  }
  out.append(s.substr(last));
  return out;
}

namespace {

class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(ReplacePattern pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void apply(std::string& s) const override { s = replace_all(pattern_, s, content_); }

 private:
  ReplacePattern pattern_;
  std::string content_;
};

}  // namespace

std::unique_ptr<Normalizer> parse_normalizer(const json& j, const std::string& where) {
  const std::string type = type_of(j, where);
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Normalizer>> parts;
    const json& list = need_array(j, "normalizers", where);
    for (size_t i = 0; i < list.size(); ++i) {
      if (list[i].is_null()) continue;
      parts.push_back(parse_normalizer(list[i], fmt::format("{}.normalizers[{}]", where, i)));
    }
    return std::make_unique<SequenceNormalizer>(std::move(parts));
  }
  if (type == "NFC") return std::make_unique<UnicodeNormalizer>(NormalForm::NFC);
  if (type == "NFD") return std::make_unique<UnicodeNormalizer>(NormalForm::NFD);
  if (type == "NFKC") return std::make_unique<UnicodeNormalizer>(NormalForm::NFKC);
  if (type == "NFKD") return std::make_unique<UnicodeNormalizer>(NormalForm::NFKD);
  if (type == "Lowercase") return std::make_unique<LowercaseNormalizer>();
  if (type == "StripAccents") return std::make_unique<StripAccentsNormalizer>();
  if (type == "Strip") {
    return std::make_unique<StripNormalizer>(opt_bool(j, "strip_left", true, where),
                                             opt_bool(j, "strip_right", true, where));
  }
  if (type == "Prepend") return std::make_unique<PrependNormalizer>(need_string(j, "prepend", where));
  if (type == "Replace") {
    return std::make_unique<ReplaceNormalizer>(parse_replace_pattern(j, where), need_string(j, "content", where));
  }
  unsupported_type(where, type, "Sequence, NFC, NFD, NFKC, NFKD, Lowercase, StripAccents, Strip, Prepend, Replace");
}

}  // namespace kvgraph::tok
