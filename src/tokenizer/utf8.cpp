#include "tokenizer/utf8.h"

namespace kvgraph::tok {

char32_t next_cp(std::string_view s, size_t& i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) {
    i += 1;
    return b0;
  }
  auto cont = [&](size_t k) { return static_cast<char32_t>(static_cast<unsigned char>(s[i + k]) & 0x3F); };
  char32_t cp;
  if (b0 < 0xE0) {
    cp = (static_cast<char32_t>(b0 & 0x1F) << 6) | cont(1);
    i += 2;
  } else if (b0 < 0xF0) {
    cp = (static_cast<char32_t>(b0 & 0x0F) << 12) | (cont(1) << 6) | cont(2);
    i += 3;
  } else {
    cp = (static_cast<char32_t>(b0 & 0x07) << 18) | (cont(1) << 12) | (cont(2) << 6) | cont(3);
    i += 4;
  }
  return cp;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

namespace {

// Length of the UTF-8 sequence at bytes[i]: > 0 a complete valid sequence;
// otherwise -n where n >= 1 is the length of the maximal invalid subpart, and
// *incomplete says whether it ran into the end of the input while still valid.
int sequence_at(std::string_view bytes, size_t i, bool* incomplete) {
  *incomplete = false;
  const auto b0 = static_cast<unsigned char>(bytes[i]);
  if (b0 < 0x80) return 1;
  int need;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 == 0xE0) {
    need = 3, lo = 0xA0;
  } else if ((b0 >= 0xE1 && b0 <= 0xEC) || b0 == 0xEE || b0 == 0xEF) {
    need = 3;
  } else if (b0 == 0xED) {
    need = 3, hi = 0x9F;
  } else if (b0 == 0xF0) {
    need = 4, lo = 0x90;
  } else if (b0 >= 0xF1 && b0 <= 0xF3) {
    need = 4;
  } else if (b0 == 0xF4) {
    need = 4, hi = 0x8F;
  } else {
    return -1;
  }
  for (int k = 1; k < need; ++k) {
    if (i + k >= bytes.size()) {
      *incomplete = true;
      return -k;
    }
    const auto b = static_cast<unsigned char>(bytes[i + k]);
    const unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (b < l || b > h) return -k;
  }
  return need;
}

}  // namespace

Utf8Scan scan_utf8(std::string_view bytes) {
  Utf8Scan r;
  size_t i = 0;
  while (i < bytes.size()) {
    bool incomplete;
    const int n = sequence_at(bytes, i, &incomplete);
    if (n < 0) {
      r.valid_len = i;
      (incomplete ? r.incomplete : r.invalid) = true;
      return r;
    }
    i += static_cast<size_t>(n);
  }
  r.valid_len = i;
  return r;
}

std::string utf8_lossy(std::string_view bytes, bool hold_incomplete, size_t* held) {
  std::string out;
  out.reserve(bytes.size());
  if (held) *held = 0;
  size_t i = 0;
  while (i < bytes.size()) {
    bool incomplete;
    const int n = sequence_at(bytes, i, &incomplete);
    if (n > 0) {
      out.append(bytes.substr(i, static_cast<size_t>(n)));
      i += static_cast<size_t>(n);
      continue;
    }
    if (incomplete && hold_incomplete) {
      if (held) *held = bytes.size() - i;
      break;
    }
    append_utf8(out, kReplacementChar);
    i += static_cast<size_t>(-n);
  }
  return out;
}

bool is_white_space(char32_t c) {
  if (c <= 0x20) return c == 0x20 || (c >= 0x09 && c <= 0x0D);
  if (c < 0x85) return false;
  return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
         c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

const ByteLevelTable& byte_level_table() {
  static const ByteLevelTable table = [] {
    ByteLevelTable t;
    t.cp_to_byte.fill(-1);
    auto printable = [](int b) {
      return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const char32_t cp = printable(b) ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
      append_utf8(t.byte_to_utf8[b], cp);
      t.cp_to_byte[cp] = static_cast<int16_t>(b);
    }
    return t;
  }();
  return table;
}

}  // namespace kvgraph::tok
