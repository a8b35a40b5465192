#pragma once
// Unicode data for unicode_norm.cpp; the definitions are generated
// (unicode_tables.cpp, by gen_unicode_tables.py). Every table is sorted by
// its first field.
#include <cstddef>
#include <cstdint>

namespace kvgraph::tok::unicode_tables {

struct CccRange {
  char32_t first, last;
  uint8_t ccc;  // canonical combining class, non-zero
};
struct Decomposition {
  char32_t cp;
  uint32_t offset, length;  // into the matching *Pool array
};
struct Composition {
  char32_t first, second, composite;
};
struct Range {
  char32_t first, last;
};

extern const char* const kUnicodeVersion;
extern const CccRange kCombiningClass[];
extern const size_t kCombiningClassSize;
extern const Decomposition kCanonical[];  // full canonical decomposition (NFD)
extern const size_t kCanonicalSize;
extern const char32_t kCanonicalPool[];
extern const size_t kCanonicalPoolSize;
extern const Decomposition kCompat[];  // full compatibility decomposition, where it differs from NFD
extern const size_t kCompatSize;
extern const char32_t kCompatPool[];
extern const size_t kCompatPoolSize;
extern const Composition kComposition[];  // primary composites
extern const size_t kCompositionSize;
extern const Decomposition kLowercase[];
extern const size_t kLowercaseSize;
extern const char32_t kLowercasePool[];
extern const size_t kLowercasePoolSize;
extern const Range kNonspacingMark[];
extern const size_t kNonspacingMarkSize;

}  // namespace kvgraph::tok::unicode_tables
