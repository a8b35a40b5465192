#pragma once
// Unicode data for Python-like str methods (pystr.cpp); the definitions are
// generated (unicode_tables.cpp, by gen_unicode_tables.py). Tables are sorted
// by code point.
#include <cstddef>
#include <cstdint>

namespace kvgraph::chat::unicode_tables {

struct CaseMapping {
  char32_t cp;
  char32_t to[3];  // full mapping, 0-padded
};
struct Range {
  char32_t first, last;
};

extern const char* const kUnicodeVersion;
extern const CaseMapping kUpperMap[], kLowerMap[], kTitleMap[];
extern const size_t kUpperMapSize, kLowerMapSize, kTitleMapSize;
extern const Range kCased[], kCaseIgnorable[], kPrintable[], kAlpha[], kDecimal[], kDigit[], kNumeric[], kIsupper[],
    kIslower[];
extern const size_t kCasedSize, kCaseIgnorableSize, kPrintableSize, kAlphaSize, kDecimalSize, kDigitSize,
    kNumericSize, kIsupperSize, kIslowerSize;

}  // namespace kvgraph::chat::unicode_tables
