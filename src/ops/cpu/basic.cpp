#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <type_traits>
#include <vector>

#include "kvgraph/error.h"
#include "kvgraph/quant.h"
#include "ops/cpu/kernels.h"

namespace kvgraph::cpu {

namespace {

// Rows of an embedding table (f32 or bf16 storage), scaled.
template <typename W>
void embed_rows(const W* table, int64_t V, const int32_t* ids, int T, int D, float scale, float* out) {
  for (int t = 0; t < T; ++t) {
    const int32_t id = ids[t];
    if (id < 0 || id >= V) fail("embedding", "token id {} out of range [0, {})", id, V);
    const W* row = table + static_cast<int64_t>(id) * D;
    for (int d = 0; d < D; ++d) {
      float v;
      if constexpr (std::is_same_v<W, float>) v = row[d];
      else v = bf16_to_f32(row[d]);
      out[static_cast<int64_t>(t) * D + d] = v * scale;
    }
  }
}

// out[t, n] (rows ldo apart) = dot(x[t], w[n]) for T tokens and n rows of K:
// rows_product up to kRowsMaxT tokens, else BLAS.
void product(const float* x, int T, const float* w, int n, int K, float* out, int ldo) {
  if (T <= kRowsMaxT)
    rows_product(x, T, w, n, K, out, ldo);
  else
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, n, K, 1.0f, x, K, w, K, 0.0f, out, ldo);
}

// out [T, N] = x [T, K] @ W^T for a matrix stored in another format, widened
// to f32 a panel of rows at a time by widen(n0, n, panel) (rows n0..n0+n-1).
// Panels of about 64K weights (256 KB as f32, cache resident while the
// product reads them).
template <typename Widen>
void panelled_product(const float* x, int T, int N, int K, float* out, Widen widen) {
  const int rows = std::clamp((1 << 16) / std::max(K, 1), 1, N);
  thread_local std::vector<float> panel;
  panel.resize(static_cast<size_t>(rows) * K);
  for (int n0 = 0; n0 < N; n0 += rows) {
    const int n = std::min(rows, N - n0);
    widen(n0, n, panel.data());
    product(x, T, panel.data(), n, K, out + n0, N);
  }
}

}  // namespace

void embedding(const float* table, int64_t V, const int32_t* ids, int T, int D, float scale, float* out) {
  embed_rows(table, V, ids, T, D, scale, out);
}

void embedding_bf16(const uint16_t* table, int64_t V, const int32_t* ids, int T, int D, float scale, float* out) {
  embed_rows(table, V, ids, T, D, scale, out);
}

void rms_norm(const float* x, const float* w, float* out, int64_t rows, int D, float eps, bool plus_one) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * D;
    float* o = out + r * D;
    float ss = 0.f;
    for (int d = 0; d < D; ++d) ss += xr[d] * xr[d];
    const float inv = 1.0f / std::sqrt(ss / D + eps);
    for (int d = 0; d < D; ++d) o[d] = xr[d] * inv * (plus_one ? 1.0f + w[d] : w[d]);
  }
}

void linear(const float* x, const float* w, const float* bias, float* out, int T, int N, int K) {
  product(x, T, w, N, K, out, N);
  if (bias)
    for (int t = 0; t < T; ++t)
      for (int n = 0; n < N; ++n) out[static_cast<int64_t>(t) * N + n] += bias[n];
}

void linear_bf16(const float* x, const uint16_t* w, const uint16_t* bias, float* out, int T, int N, int K) {
  panelled_product(x, T, N, K, out, [&](int n0, int n, float* panel) {
    const uint16_t* src = w + static_cast<int64_t>(n0) * K;
    for (int64_t i = 0; i < static_cast<int64_t>(n) * K; ++i) panel[i] = bf16_to_f32(src[i]);
  });
  if (bias)
    for (int t = 0; t < T; ++t)
      for (int n = 0; n < N; ++n) out[static_cast<int64_t>(t) * N + n] += bf16_to_f32(bias[n]);
}

void AffineRows::dequantize_row(int64_t n, int K, float* out) const {
  const int64_t groups = K / group;
  const uint32_t* row = words + n * (int64_t(K) * bits / 32);
  auto each = [&](auto widen, const auto* s, const auto* b) {
    for (int64_t g = 0; g < groups; ++g) {
      const float sg = widen(s[n * groups + g]), bg = widen(b[n * groups + g]);
      for (int j = 0; j < group; ++j) {
        const int64_t k = g * group + j;
        out[k] = affine_value(sg, affine_code(row, k, bits), bg);
      }
    }
  };
  if (scales_bf16)
    each(bf16_to_f32, static_cast<const uint16_t*>(scales), static_cast<const uint16_t*>(biases));
  else
    each([](float v) { return v; }, static_cast<const float*>(scales), static_cast<const float*>(biases));
}

void linear_affine(const float* x, const AffineRows& w, const void* bias, float* out, int T, int N, int K) {
  panelled_product(x, T, N, K, out, [&](int n0, int n, float* panel) {
    for (int r = 0; r < n; ++r) w.dequantize_row(n0 + r, K, panel + static_cast<int64_t>(r) * K);
  });
  if (bias)
    for (int t = 0; t < T; ++t)
      for (int n = 0; n < N; ++n)
        out[static_cast<int64_t>(t) * N + n] += w.scales_bf16 ? bf16_to_f32(static_cast<const uint16_t*>(bias)[n])
                                                              : static_cast<const float*>(bias)[n];
}

void embedding_affine(const AffineRows& table, int64_t V, const int32_t* ids, int T, int D, float scale, float* out) {
  for (int t = 0; t < T; ++t) {
    const int32_t id = ids[t];
    if (id < 0 || id >= V) fail("embedding", "token id {} out of range [0, {})", id, V);
    float* o = out + static_cast<int64_t>(t) * D;
    table.dequantize_row(id, D, o);
    for (int d = 0; d < D; ++d) o[d] *= scale;
  }
}

void rope(float* x, int32_t pos0, const float* inv_freq, int T, int H, int D) {
  const int half = D / 2;
  const int64_t row_stride = static_cast<int64_t>(H) * D;
  for (int t = 0; t < T; ++t) {
    const float p = static_cast<float>(pos0 + t);
    for (int i = 0; i < half; ++i) {
      const float ang = p * inv_freq[i];  // f32 product, as torch does
      const float c = std::cos(ang), s = std::sin(ang);
      for (int h = 0; h < H; ++h) {
        float* v = x + t * row_stride + static_cast<int64_t>(h) * D;
        const float a = v[i], b = v[i + half];
        v[i] = a * c - b * s;
        v[i + half] = b * c + a * s;
      }
    }
  }
}

void act_mul(const float* gate, const float* up, float* out, int64_t n, Activation act) {
  for (int64_t i = 0; i < n; ++i) out[i] = activate(gate[i], act) * up[i];
}

void add(const float* a, const float* b, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void softcap(float* x, int64_t n, float cap) {
  for (int64_t i = 0; i < n; ++i) x[i] = kvgraph::softcap(x[i], cap);
}

namespace {

// The logits as sampling sees them (repetition penalty, bans) in `l`; false
// when one is NaN or +inf.
bool sampling_logits(const float* logits, int V, const ops::SamplingParams& p, const int32_t* banned, int n_banned,
                     const uint8_t* seen, std::vector<float>& l) {
  const float ninf = -std::numeric_limits<float>::infinity();
  l.assign(logits, logits + V);
  if (p.repetition_penalty != 1.0f && seen)
    for (int i = 0; i < V; ++i)
      if (seen[i]) l[i] = l[i] > 0 ? l[i] / p.repetition_penalty : l[i] * p.repetition_penalty;
  for (int i = 0; i < n_banned; ++i)
    if (banned[i] >= 0 && banned[i] < V) l[banned[i]] = ninf;
  // A NaN or +inf logit (a broken weight or an overflow upstream) has no
  // meaningful pick: report it as token -1, as the CUDA kernel does.
  for (int i = 0; i < V; ++i)
    if (std::isnan(l[i]) || l[i] == -ninf) return false;
  return true;
}

int32_t arg_max(const std::vector<float>& l) {  // lowest index among maxima
  int32_t best = 0;
  for (int i = 1; i < static_cast<int>(l.size()); ++i)
    if (l[i] > l[best]) best = i;
  return best;
}

// Candidates sorted by logit (desc), ties by id (asc), cut to top-k then
// top-p, weighted exp((l - max) / temperature): `idx` and `prob` hold
// `keep` of them, `sum` their total.
void candidates(const std::vector<float>& l, const ops::SamplingParams& p, std::vector<int32_t>& idx,
                std::vector<float>& prob, int& keep, float& sum) {
  const int V = static_cast<int>(l.size());
  idx.resize(V);
  std::iota(idx.begin(), idx.end(), 0);
  keep = (p.top_k > 0 && p.top_k < V) ? p.top_k : V;
  auto cmp = [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); };
  std::partial_sort(idx.begin(), idx.begin() + keep, idx.end(), cmp);
  const float mx = l[idx[0]];
  prob.resize(keep);
  sum = 0.f;
  for (int i = 0; i < keep; ++i) sum += (prob[i] = std::exp((l[idx[i]] - mx) / p.temperature));
  if (p.top_p < 1.0f) {
    float c = 0.f;
    int n = 0;
    while (n < keep) {
      c += prob[n++] / sum;
      if (c >= p.top_p) break;
    }
    keep = n;
    sum = 0.f;
    for (int i = 0; i < keep; ++i) sum += prob[i];
  }
}

}  // namespace

int32_t sample(const float* logits, int V, const ops::SamplingParams& p, const int32_t* banned, int n_banned,
               const uint8_t* seen, int32_t pos) {
  thread_local std::vector<float> l;
  if (!sampling_logits(logits, V, p, banned, n_banned, seen, l)) return -1;
  if (p.temperature <= 0.0f) return arg_max(l);  // greedy
  thread_local std::vector<int32_t> idx;
  thread_local std::vector<float> prob;
  int keep = 0;
  float sum = 0.f;
  candidates(l, p, idx, prob, keep, sum);
  const float u = uniform01(p.seed, pos) * sum;
  float c = 0.f;
  for (int i = 0; i < keep; ++i) {
    c += prob[i];
    if (u < c) return idx[i];
  }
  return idx[keep - 1];
}

}  // namespace kvgraph::cpu

namespace kvgraph::ops {

SampleCandidates sampling_candidates(const float* logits, int V, const SamplingParams& p, const int32_t* banned,
                                     int n_banned, const uint8_t* seen) {
  SampleCandidates c;
  std::vector<float> l;
  if (!cpu::sampling_logits(logits, V, p, banned, n_banned, seen, l)) {
    c.finite = false;
    return c;
  }
  if (p.temperature <= 0.0f) {
    c.ids = {cpu::arg_max(l)};
    c.weights = {1.0f};
    c.sum = 1.0f;
    return c;
  }
  std::vector<int32_t> idx;
  int keep = 0;
  cpu::candidates(l, p, idx, c.weights, keep, c.sum);
  c.ids.assign(idx.begin(), idx.begin() + keep);
  c.weights.resize(keep);
  return c;
}

}  // namespace kvgraph::ops
