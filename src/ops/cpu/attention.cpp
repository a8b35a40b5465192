#include "ops/cpu/attention.h"

#include <algorithm>

#include <cmath>
#include <limits>
#include <vector>

#include "kvgraph/cache/kv_quant.h"
#include "kvgraph/cache/plan.h"
#include "ops/cpu/kernels.h"

namespace kvgraph::cpu {

namespace {

// One pool of a layer in its format: a row is one token of one KV head. The
// rows are stored (quantized) on write and read back into a scratch row of
// f32 values for each key: never a dequantized copy of the cache.
struct PoolRows {
  uint8_t* codes;
  uint8_t* aux;  // null for plain formats
  KvFormat f;
  int D;
  int64_t code_row, aux_row;  // bytes per row
  PoolRows(void* c, void* a, KvFormat fmt, int d)
      : codes(static_cast<uint8_t*>(c)), aux(static_cast<uint8_t*>(a)), f(fmt), D(d),
        code_row(fmt.code_bytes(d)), aux_row(fmt.aux_bytes(d)) {}
  void store(int64_t row, const float* x) const {
    kv_quantize_row(f, x, D, codes + row * code_row, aux ? aux + row * aux_row : nullptr);
  }
  // The row's values: the pool itself for f32, else `scratch` (D floats).
  const float* load(int64_t row, float* scratch) const {
    if (f.type == KvType::F32) return reinterpret_cast<const float*>(codes + row * code_row);
    kv_dequantize_row(f, codes + row * code_row, aux ? aux + row * aux_row : nullptr, D, scratch);
    return scratch;
  }
};

void run(const ops::AttendCall& a) {
  const StepPlan& p = *a.plan;
  const int T = p.T, Hq = a.n_q_heads, Hkv = a.n_kv_heads, D = a.head_dim;
  const int64_t pool = a.rule.pool;
  const PoolRows K(a.k_pool, a.k_aux, a.k_format, D), V(a.v_pool, a.v_aux, a.v_format, D);
  const int64_t q_stride = a.q_stride ? a.q_stride : int64_t(Hq) * D;
  const int64_t k_stride = a.k_stride ? a.k_stride : int64_t(Hkv) * D;
  const int64_t v_stride = a.v_stride ? a.v_stride : int64_t(Hkv) * D;

  // q / new k head after the prologue (a copy; the inputs stay as they are).
  // RoPE's cos/sin depend only on the position: computed once per position
  // (the same f32 angle and std::cos/std::sin as cpu::rope).
  std::vector<float> head(D), cos_t(D / 2), sin_t(D / 2);
  int32_t table_pos = -1;
  auto prologue = [&](const float* src, const float* norm, int32_t position) -> const float* {
    if (!norm && !a.rope_inv_freq) return src;
    std::copy_n(src, D, head.begin());
    if (norm) rms_norm(head.data(), norm, head.data(), 1, D, a.norm_eps, a.norm_plus_one);
    if (a.rope_inv_freq) {
      const int half = D / 2;
      if (position != table_pos) {
        for (int i = 0; i < half; ++i) {
          const float ang = static_cast<float>(position) * a.rope_inv_freq[i];
          cos_t[i] = std::cos(ang);
          sin_t[i] = std::sin(ang);
        }
        table_pos = position;
      }
      for (int i = 0; i < half; ++i) {
        const float x0 = head[i], x1 = head[i + half];
        head[i] = x0 * cos_t[i] - x1 * sin_t[i];
        head[i + half] = x1 * cos_t[i] + x0 * sin_t[i];
      }
    }
    return head.data();
  };

  // 1. Write the step's rows, run by run.
  int t = 0;
  for (int r = 0; r < p.n_write; ++r) {
    const SlotRun& run = p.write[r];
    for (int i = 0; i < run.len; ++i, ++t) {
      for (int h = 0; h < Hkv; ++h) {
        const int64_t row = h * pool + run.slot + i;
        K.store(row, prologue(a.k + t * k_stride + static_cast<int64_t>(h) * D, a.k_norm, p.position + t));
        V.store(row, a.v + t * v_stride + static_cast<int64_t>(h) * D);
      }
    }
  }

  // 2. Attend. Rows are visited in logical order over the read runs.
  const int group = Hq / Hkv;
  const int n_rows = p.position + T - p.read_begin;
  std::vector<float> scores(n_rows), acc(D), k_row(D), v_row(D);
  for (int tq = 0; tq < T; ++tq) {
    const int32_t qpos = p.position + tq;
    const int32_t lo = first_visible(a.rule, qpos);
    for (int h = 0; h < Hq; ++h) {
      const int hk = h / group;
      const float* q = prologue(a.q + tq * q_stride + static_cast<int64_t>(h) * D, a.q_norm, qpos);
      float mx = -std::numeric_limits<float>::infinity();
      int j = 0;
      for (int r = 0; r < p.n_read; ++r) {
        const SlotRun& run = p.read[r];
        for (int i = 0; i < run.len; ++i, ++j) {
          const int32_t pos = run.position + i;
          if (pos < lo || pos > qpos) { scores[j] = -std::numeric_limits<float>::infinity(); continue; }
          const float* kr = K.load(hk * pool + run.slot + i, k_row.data());
          float s = 0.f;
          for (int d = 0; d < D; ++d) s += q[d] * kr[d];
          s *= a.scale;
          if (a.softcap > 0.f) s = kvgraph::softcap(s, a.softcap);
          scores[j] = s;
          if (s > mx) mx = s;
        }
      }
      float sum = 0.f;
      for (int i = 0; i < n_rows; ++i) {
        float e = std::isinf(scores[i]) ? 0.f : std::exp(scores[i] - mx);
        scores[i] = e;
        sum += e;
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      j = 0;
      for (int r = 0; r < p.n_read; ++r) {
        const SlotRun& run = p.read[r];
        for (int i = 0; i < run.len; ++i, ++j) {
          const float w = scores[j];
          if (w == 0.f) continue;
          const float* vr = V.load(hk * pool + run.slot + i, v_row.data());
          for (int d = 0; d < D; ++d) acc[d] += w * vr[d];
        }
      }
      float* o = a.out + (static_cast<int64_t>(tq) * Hq + h) * D;
      const float inv = 1.f / sum;
      for (int d = 0; d < D; ++d) o[d] = acc[d] * inv;
    }
  }
}

}  // namespace

void update_and_attend(const ops::AttendCall& a) { run(a); }

}  // namespace kvgraph::cpu
