// Unicode normalization (UAX #15): decompose, order marks canonically,
// recompose. Tables in unicode_tables.cpp; Hangul syllables by formula.
#include "tokenizer/unicode_norm.h"

#include <algorithm>
#include <vector>

#include "tokenizer/unicode_tables.h"
#include "tokenizer/utf8.h"

namespace kvgraph::tok {

namespace {

namespace ut = unicode_tables;

constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

int ccc(char32_t c) {
  if (c < 0x300) return 0;
  const ut::CccRange* end = ut::kCombiningClass + ut::kCombiningClassSize;
  const ut::CccRange* it =
      std::upper_bound(ut::kCombiningClass, end, c, [](char32_t v, const ut::CccRange& r) { return v < r.first; });
  if (it == ut::kCombiningClass) return 0;
  --it;
  return c <= it->last ? it->ccc : 0;
}

const ut::Decomposition* find(const ut::Decomposition* table, size_t size, char32_t c) {
  const ut::Decomposition* end = table + size;
  const ut::Decomposition* it =
      std::lower_bound(table, end, c, [](const ut::Decomposition& d, char32_t v) { return d.cp < v; });
  return it != end && it->cp == c ? it : nullptr;
}

void decompose(char32_t c, bool compat, std::vector<char32_t>& out) {
  if (c >= kSBase && c < kSBase + kSCount) {
    const char32_t s = c - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount) out.push_back(kTBase + s % kTCount);
    return;
  }
  if (c >= 0xA0) {
    if (compat) {
      if (const ut::Decomposition* d = find(ut::kCompat, ut::kCompatSize, c)) {
        out.insert(out.end(), ut::kCompatPool + d->offset, ut::kCompatPool + d->offset + d->length);
        return;
      }
    }
    if (const ut::Decomposition* d = find(ut::kCanonical, ut::kCanonicalSize, c)) {
      out.insert(out.end(), ut::kCanonicalPool + d->offset, ut::kCanonicalPool + d->offset + d->length);
      return;
    }
  }
  out.push_back(c);
}

// 0 when the pair does not compose.
char32_t compose(char32_t a, char32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount) {
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  }
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase && b < kTBase + kTCount) {
    return a + (b - kTBase);
  }
  const ut::Composition* end = ut::kComposition + ut::kCompositionSize;
  const ut::Composition* it = std::lower_bound(ut::kComposition, end, std::make_pair(a, b),
                                               [](const ut::Composition& c, const std::pair<char32_t, char32_t>& v) {
                                                 return c.first != v.first ? c.first < v.first : c.second < v.second;
                                               });
  return it != end && it->first == a && it->second == b ? it->composite : 0;
}

std::string to_utf8(const std::vector<char32_t>& cps) {
  std::string out;
  out.reserve(cps.size());
  for (char32_t c : cps) append_utf8(out, c);
  return out;
}

}  // namespace

std::string unicode_normalize(std::string_view s, NormalForm form) {
  const bool compat = form == NormalForm::NFKC || form == NormalForm::NFKD;
  const bool composed = form == NormalForm::NFC || form == NormalForm::NFKC;
  // Fast paths: ASCII is invariant; below U+0300 nothing decomposes under NFC.
  bool ascii = true, below_300 = true;
  for (size_t i = 0; i < s.size(); ++i) {
    const auto b = static_cast<unsigned char>(s[i]);
    if (b >= 0x80) {
      ascii = false;
      if (b >= 0xCC) below_300 = false;  // lead bytes of U+0300 and up
    }
  }
  if (ascii || (form == NormalForm::NFC && below_300)) return std::string(s);

  std::vector<char32_t> d;
  d.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) decompose(next_cp(s, i), compat, d);
  // Canonical ordering: stable-sort each run of non-starters by class.
  for (size_t k = 0; k < d.size();) {
    if (ccc(d[k]) == 0) {
      ++k;
      continue;
    }
    size_t e = k;
    while (e < d.size() && ccc(d[e]) != 0) ++e;
    std::stable_sort(d.begin() + static_cast<ptrdiff_t>(k), d.begin() + static_cast<ptrdiff_t>(e),
                     [](char32_t a, char32_t b) { return ccc(a) < ccc(b); });
    k = e;
  }
  if (!composed || d.empty()) return to_utf8(d);

  // Canonical composition (the Unicode sample algorithm).
  size_t starter = 0, out = 1;
  int last_class = ccc(d[0]) ? 256 : 0;  // text starting with a mark: nothing composes until a starter
  for (size_t k = 1; k < d.size(); ++k) {
    const char32_t c = d[k];
    const int cls = ccc(c);
    const char32_t composite = last_class == 256 ? 0 : compose(d[starter], c);
    if (composite && (last_class < cls || last_class == 0)) {
      d[starter] = composite;
      continue;
    }
    if (cls == 0) {
      starter = out;
      last_class = 0;
    } else {
      last_class = cls;
    }
    d[out++] = c;
  }
  d.resize(out);
  return to_utf8(d);
}

std::string unicode_lowercase(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<unsigned char>(s[i]);
    if (b < 0x80) {
      out.push_back(b >= 'A' && b <= 'Z' ? static_cast<char>(b + 32) : static_cast<char>(b));
      ++i;
      continue;
    }
    const char32_t c = next_cp(s, i);
    if (const ut::Decomposition* d = find(ut::kLowercase, ut::kLowercaseSize, c)) {
      for (uint32_t k = 0; k < d->length; ++k) append_utf8(out, ut::kLowercasePool[d->offset + k]);
    } else {
      append_utf8(out, c);
    }
  }
  return out;
}

std::string strip_nonspacing_marks(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const size_t b = i;
    const char32_t c = next_cp(s, i);
    const ut::Range* end = ut::kNonspacingMark + ut::kNonspacingMarkSize;
    const ut::Range* it =
        std::upper_bound(ut::kNonspacingMark, end, c, [](char32_t v, const ut::Range& r) { return v < r.first; });
    const bool mark = it != ut::kNonspacingMark && c <= (it - 1)->last;
    if (!mark) out.append(s.substr(b, i - b));
  }
  return out;
}

}  // namespace kvgraph::tok
