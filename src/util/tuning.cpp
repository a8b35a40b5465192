#include "kvgraph/tuning.h"

#include <charconv>

#include "kvgraph/error.h"

namespace kvgraph {

namespace {

constexpr std::string_view kGemvNames[] = {"auto", "block2", "warp2", "warp4", "mma", "mma8", "mma16", "mmax"};
constexpr std::string_view kMultiNames[] = {"auto", "r8u2", "r4u2", "r8u1", "r4u4", "p4u2", "p2u4", "p8u1", "h8u1", "h4u2", "h4u1", "s8x3", "s4x4", "s4x6"};
constexpr std::string_view kAttnNames[] = {"auto", "fast", "staged", "legacy", "mma"};

int parse_count(std::string_view key, std::string_view v) {
  if (v == "auto") return 0;
  int n = -1;
  auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
  if (ec != std::errc() || end != v.data() + v.size() || n < 0 || n > (1 << 20))
    fail("tuning", "{}={}: expected auto or a whole number in [0, {}]", key, v, 1 << 20);
  return n;
}

std::string count_str(int n) { return n == 0 ? "auto" : std::to_string(n); }

std::string qring_str(const Tuning& t) {
  if (t.qring_chunk == 0) return "auto";
  std::string s = fmt::format("{}x{}", t.qring_chunk, t.qring_stages);
  if (t.qring_blocks) s += fmt::format("x{}", t.qring_blocks);
  return s;
}

// "auto", "CxS" (as many blocks an SM as fit) or "CxSxB" (at most B, 1..8).
void parse_qring(std::string_view v, Tuning& t) {
  t.qring_chunk = t.qring_stages = t.qring_blocks = 0;
  if (v == "auto") return;
  int n[3] = {0, 0, 0}, parts = 0;
  const char* p = v.data();
  const char* end = v.data() + v.size();
  bool ok = true;
  while (ok && parts < 3) {
    auto [q, ec] = std::from_chars(p, end, n[parts]);
    ok = ec == std::errc() && q != p;
    ++parts;
    p = q;
    if (!ok || p == end) break;
    ok = *p++ == 'x' && p != end;
  }
  ok = ok && p == end && parts >= 2;
  bool compiled = false;
  std::string shapes;
  for (const auto& r : Tuning::kQRings) {
    compiled = compiled || (r[0] == n[0] && r[1] == n[1]);
    shapes += fmt::format("{}{}x{}", shapes.empty() ? "" : ", ", r[0], r[1]);
  }
  if (!ok || !compiled || (parts == 3 && (n[2] < 1 || n[2] > 8)))
    fail("tuning", "qring={}: expected auto, CxS or CxSxB with CxS one of {} and B in 1..8", v, shapes);
  t.qring_chunk = n[0];
  t.qring_stages = n[1];
  t.qring_blocks = parts == 3 ? n[2] : 0;
}

// The index of `v` in `names`; else [tuning] "key=v: expected a, b or c".
template <size_t N>
int parse_name(std::string_view key, std::string_view v, const std::string_view (&names)[N]) {
  for (size_t i = 0; i < N; ++i)
    if (v == names[i]) return static_cast<int>(i);
  std::string expected(names[0]);
  for (size_t i = 1; i < N; ++i) expected += fmt::format("{}{}", i + 1 < N ? ", " : " or ", names[i]);
  fail("tuning", "{}={}: expected {}", key, v, expected);
}

}  // namespace

std::string Tuning::describe() const {
  return fmt::format("gemv={},attn={},attn-heads={},verify-heads={},attn-chunk={},attn-merge={},attn-prefetch={},pdl={},qx={},qgemv={},qring={},mt={},prefill-attn={},qmma={}",
                     kGemvNames[static_cast<int>(gemv)],
                     kAttnNames[static_cast<int>(decode_attn)],
                     count_str(attn_heads), count_str(verify_heads), count_str(attn_chunk),
                     attn_merge == AttnMerge::cluster ? "cluster" : "global", attn_prefetch ? "on" : "off", programmatic_launch ? "on" : "off",
                     quantized_int8_x ? "int8" : "f32", quantized_blocks ? "blocks" : quantized_stream ? "stream" : "regs", qring_str(*this), kMultiNames[static_cast<int>(multi)],
                     prefill_attn == PrefillAttn::flash ? "flash" : "legacy",
                     qmma_tokens < 0 ? std::string("auto") : std::to_string(qmma_tokens));
}

Tuning Tuning::parse(std::string_view spec) {
  Tuning t;
  while (!spec.empty()) {
    const size_t comma = spec.find(',');
    const std::string_view item = spec.substr(0, comma);
    spec = comma == std::string_view::npos ? std::string_view{} : spec.substr(comma + 1);
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos) fail("tuning", "\"{}\": expected key=value", item);
    const std::string_view key = item.substr(0, eq), v = item.substr(eq + 1);
    if (key == "gemv") {
      t.gemv = static_cast<Gemv>(parse_name(key, v, kGemvNames));
    } else if (key == "attn") {
      t.decode_attn = static_cast<Tuning::DecodeAttn>(parse_name(key, v, kAttnNames));
    } else if (key == "attn-heads") {
      t.attn_heads = parse_count(key, v);
      if (t.attn_heads != 0 && t.attn_heads != 1 && t.attn_heads != 2 && t.attn_heads != 4 && t.attn_heads != 8)
        fail("tuning", "attn-heads={}: expected auto, 1, 2, 4 or 8", v);
    } else if (key == "verify-heads") {
      t.verify_heads = parse_count(key, v);
      if (t.verify_heads != 0 && t.verify_heads != 1 && t.verify_heads != 2 && t.verify_heads != 4 && t.verify_heads != 8)
        fail("tuning", "verify-heads={}: expected auto, 1, 2, 4 or 8", v);
    } else if (key == "attn-chunk") {
      t.attn_chunk = parse_count(key, v);
    } else if (key == "attn-merge") {
      if (v != "cluster" && v != "global") fail("tuning", "attn-merge={}: expected cluster or global", v);
      t.attn_merge = v == "cluster" ? Tuning::AttnMerge::cluster : Tuning::AttnMerge::global;
    } else if (key == "attn-prefetch") {
      if (v != "on" && v != "off") fail("tuning", "attn-prefetch={}: expected on or off", v);
      t.attn_prefetch = v == "on";
    } else if (key == "pdl") {
      if (v != "on" && v != "off") fail("tuning", "pdl={}: expected on or off", v);
      t.programmatic_launch = v == "on";
    } else if (key == "qx") {
      if (v != "f32" && v != "int8") fail("tuning", "qx={}: expected f32 or int8", v);
      t.quantized_int8_x = v == "int8";
    } else if (key == "qgemv") {
      if (v != "stream" && v != "regs" && v != "blocks") fail("tuning", "qgemv={}: expected stream, regs or blocks", v);
      t.quantized_stream = v != "regs";
      t.quantized_blocks = v == "blocks";
    } else if (key == "qring") {
      parse_qring(v, t);
    } else if (key == "mt") {
      t.multi = static_cast<Multi>(parse_name(key, v, kMultiNames));
    } else if (key == "prefill-attn") {
      if (v != "legacy" && v != "flash") fail("tuning", "prefill-attn={}: expected legacy or flash", v);
      t.prefill_attn = v == "flash" ? PrefillAttn::flash : PrefillAttn::legacy;
    } else if (key == "qmma") {
      t.qmma_tokens = v == "auto" ? -1 : parse_count(key, v);
    } else {
      fail("tuning", "unknown key \"{}\" (keys: gemv, attn, attn-heads, verify-heads, attn-chunk, attn-merge, attn-prefetch, pdl, qx, qgemv, qring, mt, prefill-attn, qmma)", key);
    }
  }
  return t;
}

}  // namespace kvgraph
