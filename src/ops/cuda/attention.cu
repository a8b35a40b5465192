// update_and_attend: write a step's K/V rows into a layer's pool, then attend
// every query over the rows it may see (causal, sliding window, GQA).
//
// One kernel serves decode and prefill. A block owns one KV head, up to kMaxG
// query heads of its GQA group (so each K/V row is read once for the whole
// group) and one chunk of the visible keys. Inside a block the head dim is
// split into 8-element slices: GS = head_dim / 8 lanes cooperate on one key,
// a warp handles 32 / GS keys at a time, 4 warps per block. Each group of
// lanes keeps an online softmax (max, sum, output slice) per query head; the
// states are merged across lanes (shuffles), warps (shared memory) and, for
// split-KV decode, blocks (the last block of a head merges the partials in
// split order). Every merge runs in a fixed order: results are deterministic.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>

#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include "ops/cuda/async_copy.cuh"
#include "ops/cuda/common.cuh"
#include "ops/cuda/kv_codec.cuh"
#include "ops/cuda/mma.cuh"

namespace kvgraph::cuda {
namespace {

// acc + q[0..8) . k[0..8) as a chain of fmaf in element order, q 16-byte
// aligned in shared memory (both score loops use it, so T = 1 and T > 1
// round alike). acc = -0.0f makes the first term exactly q[0] * k[0].
__device__ __forceinline__ float dot8(const float* q, const float* k, float acc) {
  const float4 qa = *reinterpret_cast<const float4*>(q);
  const float4 qb = *reinterpret_cast<const float4*>(q + 4);
  acc = fmaf(qa.x, k[0], acc);
  acc = fmaf(qa.y, k[1], acc);
  acc = fmaf(qa.z, k[2], acc);
  acc = fmaf(qa.w, k[3], acc);
  acc = fmaf(qb.x, k[4], acc);
  acc = fmaf(qb.y, k[5], acc);
  acc = fmaf(qb.z, k[6], acc);
  return fmaf(qb.w, k[7], acc);
}

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;

template <typename S>
struct AttnArgs {
  const float* q;
  const float* k;
  const float* v;
  int64_t q_stride, k_stride, v_stride;  // elements between tokens
  S* k_pool;   // [Hkv, pool, D]; quantized formats (S = QKV<KS, VS>): u8 codes [Hkv, pool, k_code_row]
  S* v_pool;   // [Hkv, pool, D]; quantized: u8 codes [Hkv, pool, v_code_row]
  // Quantized formats only (kv_codec.cuh): scales (and biases) u8 [Hkv, pool,
  // *_aux_row], bytes per row of codes and of aux, affine group.
  const uint8_t* k_aux;
  const uint8_t* v_aux;
  int k_code_row, v_code_row, k_aux_row, v_aux_row, k_group, v_group;
  float* out;  // [T, Hq, D]
  const int32_t* pos;
  SlotRule rule;
  int T, Hq, Hkv, D, G, zgroups;
  float scale, softcap;
  int min_chunk;
  int ws_splits;     // row stride of the partials (workspace max_splits)
  float* part_o;     // [Hq, ws_splits, D]
  float* part_ml;    // [Hq, ws_splits, 2]
  unsigned* counters;  // [Hkv * zgroups]
  int chunk_group;     // decode_mma_kernel_q: chunks a merge group holds
  int group_slots;     // ... and group counters a (kv head, head group)
  bool fused_write;  // T == 1: this kernel writes the new row; reads of it use k/v directly
  bool cluster_merge;  // decode_kernel(_q): the splits are one cluster and merge in shared memory (merge_cluster)
  bool prefetch;       // decode_kernel(_q): prefetch_rows of the first tile before the prologue (Tuning::attn_prefetch)
  int one_token_splits;  // host: a several-query decode step's split count when its blocks carry other heads than a one-token step's (0: its own)
  const float* q_norm;
  const float* k_norm;
  float norm_eps;
  bool norm_plus_one;
  const float* inv_freq;
  __device__ bool prologue() const { return q_norm || k_norm || inv_freq; }
};

// Per-head RMSNorm then rotate-half RoPE (when inv_freq) of n head rows of D
// floats in shared memory, in place, at position `pos`. Rows below nw use the
// norm weights w, the rest w2 (decode passes the q heads and the new k row in
// one call); a null weight skips the norm of its rows. Called by every thread
// of the block (blockDim.x a multiple of 32); ends synchronised. The same
// arithmetic as the rms_norm and rope kernels: a lane-strided sum of squares
// reduced by warp_sum, precise sine and cosine of one f32 angle.
__device__ void head_prologue(float* rows, int n, int nw, int D, const float* w, const float* w2, float eps,
                              bool plus_one, const float* inv_freq, int32_t pos) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw_ = blockDim.x / 32;
  if (w || w2) {
    for (int g = warp; g < n; g += nw_) {
      const float* wg = g < nw ? w : w2;
      if (!wg) continue;
      float* r = rows + g * D;
      float ss = 0.f;
      for (int d = lane; d < D; d += 32) ss += r[d] * r[d];
      ss = detail::warp_sum(ss);
      const float inv = rsqrtf(ss / D + eps);
      for (int d = lane; d < D; d += 32) r[d] = r[d] * inv * (plus_one ? 1.0f + wg[d] : wg[d]);
    }
    __syncthreads();
  }
  if (inv_freq) {
    const int half = D / 2, lg = __ffs(half) - 1;  // D is a power of two
    for (int i = threadIdx.x; i < n * half; i += blockDim.x) {
      const int g = i >> lg, j = i & (half - 1);
      const float ang = static_cast<float>(pos) * inv_freq[j];
      float s, c;
      sincosf(ang, &s, &c);
      float* r = rows + g * D;
      const float x0 = r[j], x1 = r[j + half];
      r[j] = x0 * c - x1 * s;
      r[j + half] = x1 * c + x0 * s;
    }
    __syncthreads();
  }
}

template <typename S>
__device__ __forceinline__ detail::Pack8<S> pack8_rounded(const float* src) {
  detail::Pack8<S> r;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const S e = detail::from_f32<S>(src[i]);
    memcpy(reinterpret_cast<char*>(&r) + i * sizeof(S), &e, sizeof(S));
  }
  return r;
}

template <typename S>
__device__ __forceinline__ detail::Pack8<S> pack8_zero() {
  detail::Pack8<S> r;
  memset(&r, 0, sizeof(r));
  return r;
}

// The new K/V row of position p into kv head h's pool slot, rounded to the
// storage type, by the calling block's threads. A position the pool cannot
// hold is skipped (the host rejects such steps; this keeps a bad one in bounds).
template <typename S>
__device__ void store_row(const AttnArgs<S>& a, int h, int32_t p, const float* k_row, const float* v_row) {
  const int32_t slot = slot_of(a.rule, p);
  if (p < 0 || slot >= a.rule.pool) return;
  S* kw = a.k_pool + (size_t(h) * a.rule.pool + slot) * a.D;
  S* vw = a.v_pool + (size_t(h) * a.rule.pool + slot) * a.D;
  for (int d = threadIdx.x; d < a.D; d += blockDim.x) {
    kw[d] = detail::from_f32<S>(k_row[d]);
    vw[d] = detail::from_f32<S>(v_row[d]);
  }
}

constexpr int kMaxSplits = 128;  // AttentionWorkspace caps max_splits here

// The keys [c0, c1) that split `split` of `splits` attends for the query at
// position p, and how many splits have keys at all (the others exit).
struct SplitRange {
  int32_t c0, c1, n_active;
};

template <typename S>
__device__ __forceinline__ SplitRange split_range(const AttnArgs<S>& a, int32_t p, int split, int splits) {
  const int32_t lo = first_visible(a.rule, p);
  const int32_t L = p - lo + 1;
  int32_t chunk = L, n_active = 1;
  if (splits > 1) {  // unsigned division: shorter than signed on the critical path
    chunk = max(a.min_chunk, static_cast<int32_t>((unsigned(L) + splits - 1) / unsigned(splits)));
    n_active = static_cast<int32_t>((unsigned(L) + chunk - 1) / unsigned(chunk));
  }
  const int32_t c0 = lo + split * chunk;
  // A flat pool never holds positions >= pool: the host rejects such steps;
  // clamping keeps a bad step from reading out of bounds.
  const int32_t c1 = min(min(c0 + chunk, p + 1), a.rule.window > 0 ? p + 1 : a.rule.pool);
  return {c0, c1, n_active};
}

// Split-KV finish, called by every block of a (kv head, query-head group)
// after it stored its partial (unnormalised O, running max m and sum l per
// query head; head hq0 + g's partials in row part0 + g). The last block to
// arrive (`counter` counts them) merges them into `out` (the rows of one
// token): out = sum_s w_s O_s / sum_s w_s l_s, w_s = exp(m_s - max m).
// Built for latency: the (m, l) pairs are read once, in parallel, and turned
// into weights per head (one warp per head, lane per split); each output
// element then streams its partials with the loads in flight together.
// Fixed order everywhere, so the result is deterministic.
template <typename S, int kMaxG>
__device__ void merge_splits(const AttnArgs<S>& a, unsigned* counter, int hq0, int part0, int Gz, int n_active,
                             float* out) {
  __shared__ int s_last;
  __shared__ float w_s[kMaxG][kMaxSplits];
  __shared__ float l_s[kMaxG];
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) s_last = atomicAdd(counter, 1u) == unsigned(n_active - 1);
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int g = warp; g < Gz; g += kWarps) {
    const float* ml = a.part_ml + size_t(part0 + g) * a.ws_splits * 2;
    constexpr int kPerLane = kMaxSplits / 32;
    float m[kPerLane], l[kPerLane], mx = -INFINITY;
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      const int s = lane + 32 * k;
      m[k] = s < n_active ? __ldcg(ml + 2 * s) : -INFINITY;
      l[k] = s < n_active ? __ldcg(ml + 2 * s + 1) : 0.f;
      mx = fmaxf(mx, m[k]);
    }
    const float M = detail::warp_max(mx);
    float sum = 0.f;
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      const float w = m[k] == -INFINITY ? 0.f : expf(m[k] - M);
      w_s[g][lane + 32 * k] = w;
      sum += l[k] * w;
    }
    sum = detail::warp_sum(sum);
    if (lane == 0) l_s[g] = sum;
  }
  __syncthreads();
  // Thread t owns the float4s t, t + kThreads, ... of the Gz * D outputs (at
  // most kPer4); eight splits' loads go out together (the merge of 128
  // chunks' partials is the kernel's tail: with a load or two in flight a
  // thread it took ~100 us). Each output still sums its splits in split
  // order.
  constexpr int kPer4 = (kMaxG * 256 / 4 + kThreads - 1) / kThreads;
  const int D = a.D, n4 = Gz * D / 4;
  const float* po[kPer4];
  int gk[kPer4];
  float4 O[kPer4];
  const int lgD = __ffs(D) - 1;  // D is a power of two (>= 8)
#pragma unroll
  for (int k = 0; k < kPer4; ++k) {
    const int i = min(int(threadIdx.x) + k * kThreads, n4 - 1) * 4;
    gk[k] = i >> lgD;
    po[k] = a.part_o + size_t(part0 + gk[k]) * a.ws_splits * D + (i & (D - 1));
    O[k] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
#pragma unroll 8
  for (int s = 0; s < n_active; ++s) {
#pragma unroll
    for (int k = 0; k < kPer4; ++k)
      if (threadIdx.x + k * kThreads < n4) {
        const float4 v = __ldcg(reinterpret_cast<const float4*>(po[k] + size_t(s) * D));
        const float w = w_s[gk[k]][s];
        O[k].x = fmaf(v.x, w, O[k].x);
        O[k].y = fmaf(v.y, w, O[k].y);
        O[k].z = fmaf(v.z, w, O[k].z);
        O[k].w = fmaf(v.w, w, O[k].w);
      }
  }
#pragma unroll
  for (int k = 0; k < kPer4; ++k) {
    const int i = (threadIdx.x + k * kThreads) * 4;
    if (i < Gz * D) {
      float* o = out + size_t(hq0) * D + i;
      const float l = l_s[gk[k]];
      o[0] = O[k].x / l;
      o[1] = O[k].y / l;
      o[2] = O[k].z / l;
      o[3] = O[k].w / l;
    }
  }
  if (threadIdx.x == 0) *counter = 0;  // ready for the next step
}

// Split-KV finish of a decode step launched as clusters of its splits
// (Tuning::AttnMerge::cluster): block `split` of the cluster holds its
// partial in its own shared memory (unnormalised O of head g at o_s[g * D],
// m_s[g], l_s[g]); after a cluster barrier the blocks that own outputs read
// every split's partial over distributed shared memory and write out = sum_s
// w_s O_s / sum_s w_s l_s. No global partials, fence or counter; the same
// arithmetic in the same order as merge_splits (so the bits are those of a
// global merge). A second barrier keeps every block's shared memory alive
// until the reads are done. Every block of the cluster calls it, those
// without keys too (n_active 1: nothing to merge, only the barriers).
template <int kMaxG>
__device__ void merge_cluster(int D, int Gz, int n_active, const float* o_s, const float* m_s, const float* l_s,
                              float* out) {
  namespace cg = cooperative_groups;
  __shared__ float w_s[kMaxG][Tuning::kMaxClusterSplits];
  __shared__ float L_s[kMaxG];
  cg::cluster_group cl = cg::this_cluster();
  cl.sync();
  const int n4 = Gz * D / 4;
  const int first = int(cl.block_rank()) * kThreads;  // this block's float4s of the Gz * D outputs
  if (n_active > 1 && first < n4) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int g = warp; g < Gz; g += kWarps) {
      const bool has = lane < n_active;
      const float m = has ? cl.map_shared_rank(m_s, lane)[g] : -INFINITY;
      const float l = has ? cl.map_shared_rank(l_s, lane)[g] : 0.f;
      const float M = detail::warp_max(m);
      const float w = m == -INFINITY ? 0.f : expf(m - M);
      if (lane < Tuning::kMaxClusterSplits) w_s[g][lane] = w;
      const float sum = detail::warp_sum(l * w);
      if (lane == 0) L_s[g] = sum;
    }
    __syncthreads();
    const int i4 = first + threadIdx.x;
    if (i4 < n4) {
      const int lgD = __ffs(D) - 1;
      const int i = i4 * 4, g = i >> lgD;
      float4 O = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 8
      for (int s = 0; s < n_active; ++s) {
        const float4 v = *reinterpret_cast<const float4*>(cl.map_shared_rank(o_s, s) + i);
        const float w = w_s[g][s];
        O.x = fmaf(v.x, w, O.x);
        O.y = fmaf(v.y, w, O.y);
        O.z = fmaf(v.z, w, O.z);
        O.w = fmaf(v.w, w, O.w);
      }
      const float L = L_s[g];
      float* o = out + i;
      o[0] = O.x / L;
      o[1] = O.y / L;
      o[2] = O.z / L;
      o[3] = O.w / L;
    }
  }
  cl.sync();
}

// Merges `count` (<= 32) split-KV partials of Gz heads (partial rows part0
// + g) held in slots first, first + stride, ..., in slot order: into the
// output rows `out` (O / l), or, with out == nullptr, into slot `first` as
// one partial (unnormalised O, m, l). Loads of eight slots go out together.
// Deterministic; the caller has made the partials visible (fence + counter).
template <int kMaxG>
__device__ void merge_slots(int D, int ws, float* part_o, float* part_ml, int part0, int Gz, int first, int count,
                            int stride, float* out) {
  __shared__ float w_s[kMaxG][32];
  __shared__ float ml_s[kMaxG][2];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int g = warp; g < Gz; g += kWarps) {
    const float* ml = part_ml + size_t(part0 + g) * ws * 2;
    const int slot = first + lane * stride;
    const float m = lane < count ? __ldcg(ml + 2 * slot) : -INFINITY;
    const float l = lane < count ? __ldcg(ml + 2 * slot + 1) : 0.f;
    const float M = detail::warp_max(m);
    const float w = m == -INFINITY ? 0.f : expf(m - M);
    w_s[g][lane] = w;
    const float L = detail::warp_sum(l * w);
    if (lane == 0) ml_s[g][0] = M, ml_s[g][1] = L;
  }
  __syncthreads();
  const int lgD = __ffs(D) - 1;
  for (int i4 = threadIdx.x; i4 < Gz * D / 4; i4 += kThreads) {
    const int i = i4 * 4, g = i >> lgD, d = i & (D - 1);
    float* po = part_o + size_t(part0 + g) * ws * D + d;
    float4 O = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 8
    for (int s = 0; s < count; ++s) {
      const float4 v = __ldcg(reinterpret_cast<const float4*>(po + size_t(first + s * stride) * D));
      const float w = w_s[g][s];
      O.x = fmaf(v.x, w, O.x);
      O.y = fmaf(v.y, w, O.y);
      O.z = fmaf(v.z, w, O.z);
      O.w = fmaf(v.w, w, O.w);
    }
    if (out) {
      const float L = ml_s[g][1];
      float* o = out + size_t(g) * D + d;
      o[0] = O.x / L, o[1] = O.y / L, o[2] = O.z / L, o[3] = O.w / L;
    } else {
      *reinterpret_cast<float4*>(po + size_t(first) * D) = O;
    }
  }
  if (!out && threadIdx.x < Gz) {
    float* ml = part_ml + (size_t(part0 + threadIdx.x) * ws + first) * 2;
    ml[0] = ml_s[threadIdx.x][0];
    ml[1] = ml_s[threadIdx.x][1];
  }
}

// The end of an attend block (attend_kernel, attend_kernel_q): merge the
// key groups of each warp (lanes with the same slice of head dim, other
// keys), then the block's warps through shared memory (red_o [kWarps,
// kMaxG, D], red_ml [kWarps, kMaxG, 2]), in a fixed order; then the output
// when this is the only active split, else this split's partials, merged by
// the split that finishes last (merge_splits).
template <typename S, int kMaxG>
__device__ __forceinline__ void attend_block_finish(const AttnArgs<S>& a, float (&m)[kMaxG], float (&l)[kMaxG],
                                                    float (&acc)[kMaxG][8], float* red_o, float* red_ml, int GS,
                                                    int e0, int Gz, int hq0, int t, int h, int zg, int split,
                                                    int n_active) {
  const int D = a.D;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // Merge the key groups of a warp (lanes with the same slice, other keys).
  for (int off = GS; off < 32; off <<= 1) {
#pragma unroll
    for (int g = 0; g < kMaxG; ++g) {
      const float m2 = __shfl_xor_sync(0xffffffffu, m[g], off);
      const float l2 = __shfl_xor_sync(0xffffffffu, l[g], off);
      const float mn = fmaxf(m[g], m2);
      const float c1 = m[g] == -INFINITY ? 0.f : expf(m[g] - mn);
      const float c2 = m2 == -INFINITY ? 0.f : expf(m2 - mn);
      l[g] = l[g] * c1 + l2 * c2;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float a2 = __shfl_xor_sync(0xffffffffu, acc[g][e], off);
        acc[g][e] = acc[g][e] * c1 + a2 * c2;
      }
      m[g] = mn;
    }
  }

  // Merge the warps of the block.
  if (lane < GS) {
#pragma unroll
    for (int g = 0; g < kMaxG; ++g) {
#pragma unroll
      for (int e = 0; e < 8; ++e) red_o[(warp * kMaxG + g) * D + e0 + e] = acc[g][e];
      if (lane == 0) {
        red_ml[(warp * kMaxG + g) * 2] = m[g];
        red_ml[(warp * kMaxG + g) * 2 + 1] = l[g];
      }
    }
  }
  __syncthreads();
  const bool single = n_active == 1;
  for (int i = threadIdx.x; i < Gz * D; i += kThreads) {
    const int g = i / D, d = i % D;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, red_ml[(w * kMaxG + g) * 2]);
    float Ls = 0.f, O = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float mw = red_ml[(w * kMaxG + g) * 2];
      const float c = mw == -INFINITY ? 0.f : expf(mw - M);
      Ls += red_ml[(w * kMaxG + g) * 2 + 1] * c;
      O += red_o[(w * kMaxG + g) * D + d] * c;
    }
    const int hq = hq0 + g;
    if (single) {
      a.out[(size_t(t) * a.Hq + hq) * D + d] = O / Ls;
    } else {
      a.part_o[(size_t(hq) * a.ws_splits + split) * D + d] = O;
      if (d == 0) {
        a.part_ml[(size_t(hq) * a.ws_splits + split) * 2] = M;
        a.part_ml[(size_t(hq) * a.ws_splits + split) * 2 + 1] = Ls;
      }
    }
  }
  if (single) return;

  merge_splits<S, kMaxG>(a, a.counters + h * a.zgroups + zg, hq0, hq0, Gz, n_active, a.out + size_t(t) * a.Hq * D);
}

template <typename S, int kMaxG>
__global__ void __launch_bounds__(kThreads) attend_kernel(AttnArgs<S> a) {
  constexpr int U = sizeof(S) == 4 ? 2 : 4;  // keys in flight per lane group
  extern __shared__ __align__(16) float smem[];
  const int D = a.D;
  float* q_s = smem;                                // [kMaxG, D]
  float* k_s = q_s + kMaxG * D;                     // [D]: the new k row after the prologue (T == 1)
  float* red_o = k_s + D;                           // [kWarps, kMaxG, D]
  float* red_ml = red_o + kWarps * kMaxG * D;       // [kWarps, kMaxG, 2]

  detail::griddep_launch_dependents();
  detail::griddep_wait();

  int bx = blockIdx.x;
  const int h = bx % a.Hkv;
  bx /= a.Hkv;
  const int zg = bx % a.zgroups;
  const int t = bx / a.zgroups;
  const int split = blockIdx.y, splits = gridDim.y;

  // The visible range of this query, from the position in device memory.
  const int32_t p = a.pos[0] + t;
  const SplitRange r = split_range(a, p, split, splits);
  const int32_t c0 = r.c0, c1 = r.c1, n_active = r.n_active;
  if (split >= n_active) return;  // block-uniform

  const int g0 = zg * kMaxG;
  const int Gz = min(kMaxG, a.G - g0);
  const int hq0 = h * a.G + g0;
  const S* kp = a.k_pool + size_t(h) * a.rule.pool * D;
  const S* vp = a.v_pool + size_t(h) * a.rule.pool * D;
  const float* k_new = a.k + t * a.k_stride + size_t(h) * D;
  const float* v_new = a.v + t * a.v_stride + size_t(h) * D;

  for (int i = threadIdx.x; i < kMaxG * D; i += kThreads) {
    const int g = i / D, d = i % D;
    q_s[i] = g < Gz ? a.q[t * a.q_stride + size_t(hq0 + g) * D + d] : 0.f;
  }
  if (a.fused_write)
    for (int d = threadIdx.x; d < D; d += kThreads) k_s[d] = k_new[d];
  __syncthreads();
  if (a.prologue()) {
    head_prologue(q_s, Gz, Gz, D, a.q_norm, nullptr, a.norm_eps, a.norm_plus_one, a.inv_freq, p);
    if (a.fused_write) head_prologue(k_s, 1, 1, D, a.k_norm, nullptr, a.norm_eps, a.norm_plus_one, a.inv_freq, p);
  }

  if (a.fused_write && split == 0 && zg == 0) store_row(a, h, p, k_s, v_new);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int GS = D / 8;       // lanes per key
  const int KPW = 32 / GS;    // keys per warp per step
  const int NKG = kWarps * KPW;
  const int e0 = (lane % GS) * 8;
  const int kq = lane / GS;   // key index within the warp's step

  float m[kMaxG], l[kMaxG], acc[kMaxG][8];
#pragma unroll
  for (int g = 0; g < kMaxG; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.f;
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[g][e] = 0.f;
  }

  // The loop bound is uniform across the warp (shuffles below need every lane).
  for (int32_t jb = c0 + warp * KPW; jb < c1; jb += NKG * U) {
    detail::Pack8<S> kr[U], vr[U];
    bool valid[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int32_t j = jb + kq + u * NKG;
      valid[u] = j < c1;
      if (!valid[u]) {
        kr[u] = pack8_zero<S>();
        vr[u] = pack8_zero<S>();
      } else if (a.fused_write && j == p) {  // the row this kernel is writing
        kr[u] = pack8_rounded<S>(k_s + e0);
        vr[u] = pack8_rounded<S>(v_new + e0);
      } else {
        const size_t off = size_t(slot_of(a.rule, j)) * D + e0;
        kr[u] = detail::load8(kp + off);
        vr[u] = detail::load8(vp + off);
      }
    }
    float s[U][kMaxG];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float kf[8];
      detail::unpack8(kr[u], kf);
#pragma unroll
      for (int g = 0; g < kMaxG; ++g) {
        float dot = dot8(q_s + g * D + e0, kf, -0.0f);
        for (int off = GS >> 1; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
        float x = dot * a.scale;
        if (a.softcap > 0.f) x = kvgraph::softcap(x, a.softcap);
        s[u][g] = valid[u] ? x : -INFINITY;
      }
    }
#pragma unroll
    for (int g = 0; g < kMaxG; ++g) {
      float mx = m[g];
#pragma unroll
      for (int u = 0; u < U; ++u) mx = fmaxf(mx, s[u][g]);
      const float corr = m[g] == -INFINITY ? 0.f : expf(m[g] - mx);
      l[g] *= corr;
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[g][e] *= corr;
      m[g] = mx;
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float vf[8];
      detail::unpack8(vr[u], vf);
#pragma unroll
      for (int g = 0; g < kMaxG; ++g) {
        const float pu = valid[u] ? expf(s[u][g] - m[g]) : 0.f;
        l[g] += pu;
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[g][e] = fmaf(pu, vf[e], acc[g][e]);
      }
    }
  }

  attend_block_finish<S, kMaxG>(a, m, l, acc, red_o, red_ml, GS, e0, Gz, hq0, t, h, zg, split, n_active);
}

// ---------------------------------------------------------------- tensor-core prefill (Tuning::prefill_attn)
//
// FlashAttention-2 style attention for steps of T > kMaxDecodeQueries tokens
// over 16-bit pools (S = bf16 or f16) at head dim 64, 128 or 256. A block of
// 4 warps owns a tile of kFlashBQ = 64 queries (16 rows a warp) of one query
// head; the keys its queries may see, [first_visible(first query), last
// query], stream through shared memory in tiles of BKV rows, gathered row by
// row by slot (ring pools wrap) with cp.async, the next tile in flight while
// the current one computes. Per tile and warp: S = Q K^T on the tensor cores
// (mma.sync m16n8k16, q rounded to S, f32 accumulate), scale, softcap and the
// causal/band mask in f32, an online softmax in f32 registers (running max
// and sum per row), P rounded to S and O += P V on the tensor cores. The row
// sum adds the rounded P, so O / l is a convex combination of the V rows.
// Fixed order everywhere (no atomics): results are deterministic.
constexpr int kFlashBQ = 64;
constexpr int kFlashWarps = 4;
constexpr int kFlashThreads = kFlashWarps * 32;

template <int D>
struct FlashShape {
  static constexpr int BKV = D == 256 ? 32 : 64;  // keys per tile (D = 256: shared memory, registers)
  static constexpr int LD = D + 8;                // row stride in elements: 16 bytes of padding, no bank conflicts
  static constexpr bool kQInRegs = D <= 128;      // q fragments held in registers (D = 256: read per tile)
  // Q tile, then two stages of K and of V, all [rows, LD] in S.
  static constexpr size_t kSmem = size_t(kFlashBQ + 4 * BKV) * LD * 2;
};

// Two stages of tiles: tile it + 1's copies go out (load_tile commits them),
// then the block waits for tile it's.
template <typename F>
__device__ __forceinline__ void pipeline_next(int it, int n_tiles, F&& load_tile) {
  if (it + 1 < n_tiles) {
    load_tile(it + 1);
    cp_async_wait<1>();
  } else {
    cp_async_wait<0>();
  }
  __syncthreads();
}

template <typename S, int D>
__global__ void __launch_bounds__(kFlashThreads) flash_attend_kernel(AttnArgs<S> a) {
  using Sh = FlashShape<D>;
  constexpr int BKV = Sh::BKV, LD = Sh::LD;
  constexpr int NB = BKV / 8;   // n-blocks of 8 keys in S = Q K^T
  constexpr int ND = D / 8;     // n-blocks of 8 head-dim columns in O
  constexpr int CH = D / 8;     // 16-byte chunks of a row
  constexpr float kLog2e = 1.4426950408889634f;
  extern __shared__ __align__(16) unsigned char flash_smem[];
  S* q_s = reinterpret_cast<S*>(flash_smem);  // [kFlashBQ, LD]
  S* k_s = q_s + kFlashBQ * LD;               // [2, BKV, LD]
  S* v_s = k_s + 2 * BKV * LD;                // [2, BKV, LD]

  detail::griddep_launch_dependents();
  detail::griddep_wait();

  const int hq = blockIdx.x;
  const int h = hq / a.G;
  // The last query tiles see the most keys: they start first.
  const int t0 = (gridDim.y - 1 - blockIdx.y) * kFlashBQ;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int32_t pos0 = a.pos[0];
  const int t_last = min(t0 + kFlashBQ, a.T) - 1;
  const int32_t kv_lo = first_visible(a.rule, pos0 + t0);
  const int32_t kv_hi = pos0 + t_last;  // every key of [kv_lo, kv_hi] is resident (span <= pool)
  const int n_tiles = (kv_hi - kv_lo) / BKV + 1;
  const S* kp = a.k_pool + size_t(h) * a.rule.pool * D;
  const S* vp = a.v_pool + size_t(h) * a.rule.pool * D;

  // K and V rows of key tile `it` into stage it % 2; rows past kv_hi are zeros.
  auto load_tile = [&](int it) {
    const int32_t j0 = kv_lo + it * BKV;
    S* ks = k_s + (it & 1) * BKV * LD;
    S* vs = v_s + (it & 1) * BKV * LD;
#pragma unroll
    for (int k = 0; k < BKV * CH / kFlashThreads; ++k) {
      const int i = threadIdx.x + k * kFlashThreads;
      const int r = i / CH, c = i % CH;
      const int32_t j = j0 + r;
      const bool valid = j <= kv_hi;
      const size_t off = valid ? size_t(slot_of(a.rule, j)) * D + c * 8 : 0;
      cp_async16(smem_addr(ks + r * LD + c * 8), kp + off, valid);
      cp_async16(smem_addr(vs + r * LD + c * 8), vp + off, valid);
    }
    cp_async_commit();
  };
  load_tile(0);

  // The warp's 16 query rows: f32 from global, the prologue at each row's own
  // position (the arithmetic of head_prologue, a lane holding elements lane +
  // 32 i, so both halves of each RoPE pair), then rounded to S in shared
  // memory. Rows go in batches of RB whose loads are all in flight together.
  {
    constexpr int E = D / 32, RB = 16 / E;  // 16 values a lane in flight (more spilled at D = 64)
    float wq[E], fr[E / 2];
#pragma unroll
    for (int i = 0; i < E; ++i) wq[i] = a.q_norm ? a.q_norm[lane + 32 * i] : 0.f;
#pragma unroll
    for (int i = 0; i < E / 2; ++i) fr[i] = a.inv_freq ? a.inv_freq[lane + 32 * i] : 0.f;
#pragma unroll 1
    for (int r0 = 0; r0 < 16; r0 += RB) {
      float x[RB][E];
#pragma unroll
      for (int rb = 0; rb < RB; ++rb) {
        const int t = t0 + warp * 16 + r0 + rb;
        const float* qr = a.q + t * a.q_stride + size_t(hq) * D;
#pragma unroll
        for (int i = 0; i < E; ++i) x[rb][i] = t < a.T ? qr[lane + 32 * i] : 0.f;
      }
#pragma unroll
      for (int rb = 0; rb < RB; ++rb) {
        const int row = warp * 16 + r0 + rb, t = t0 + row;
        if (a.q_norm) {
          float ss = 0.f;
#pragma unroll
          for (int i = 0; i < E; ++i) ss += x[rb][i] * x[rb][i];
          ss = detail::warp_sum(ss);
          const float inv = rsqrtf(ss / D + a.norm_eps);
#pragma unroll
          for (int i = 0; i < E; ++i) x[rb][i] = x[rb][i] * inv * (a.norm_plus_one ? 1.0f + wq[i] : wq[i]);
        }
        if (a.inv_freq && t < a.T) {
          const float pos = static_cast<float>(pos0 + t);
#pragma unroll
          for (int i = 0; i < E / 2; ++i) {
            float sn, cs;
            sincosf(pos * fr[i], &sn, &cs);
            const float x0 = x[rb][i], x1 = x[rb][i + E / 2];
            x[rb][i] = x0 * cs - x1 * sn;
            x[rb][i + E / 2] = x1 * cs + x0 * sn;
          }
        }
#pragma unroll
        for (int i = 0; i < E; ++i) q_s[row * LD + lane + 32 * i] = detail::from_f32<S>(x[rb][i]);
      }
    }
    __syncwarp();
  }

  // mma fragment coordinates: lane = 4 g + c; ldmatrix row addresses.
  const int g = lane / 4, c = lane % 4;
  const int lrow = lane % 8, lsel = lane / 8;
  // A (Q) 16x16 at (row 0, col kk): matrices rows 0-7 / 8-15 x cols 0-7 / 8-15.
  const uint32_t q_addr = smem_addr(q_s + (warp * 16 + lrow + (lsel & 1) * 8) * LD + (lsel >> 1) * 8);
  // B (K^T) for 16 keys x 16 dims: keys 0-7 / 8-15 (lsel >> 1) x dims 0-7 / 8-15 (lsel & 1).
  const int k_off = (lrow + (lsel >> 1) * 8) * LD + (lsel & 1) * 8;
  // B (V, transposed) for 16 keys x 16 dims: keys 0-7 / 8-15 (lsel & 1) x dims 0-7 / 8-15 (lsel >> 1).
  const int v_off = (lrow + (lsel & 1) * 8) * LD + (lsel >> 1) * 8;

  uint32_t qf[Sh::kQInRegs ? D / 16 : 1][4];
  if constexpr (Sh::kQInRegs) {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) ldmatrix_x4(qf[kk], q_addr + kk * 32);
  }

  // This thread's two rows (g, g + 8): positions, first visible key. Rows
  // past the step's end see every loaded key (finite, never stored).
  int32_t p_row[2], lo_row[2];
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const int t = t0 + warp * 16 + g + e * 8;
    p_row[e] = t < a.T ? pos0 + t : kv_hi;
    lo_row[e] = first_visible(a.rule, p_row[e]);
  }
  // The warp's rows span positions [w_lo, w_hi] and see keys from w_first.
  const int tw0 = t0 + warp * 16;
  const bool warp_live = tw0 < a.T;
  const int32_t w_hi = pos0 + min(tw0 + 15, a.T - 1);
  const int32_t w_first = first_visible(a.rule, pos0 + tw0);

  float o[ND][4];
#pragma unroll
  for (int n = 0; n < ND; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[n][e] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};

  for (int it = 0; it < n_tiles; ++it) {
    pipeline_next(it, n_tiles, load_tile);
    const int32_t j0 = kv_lo + it * BKV;
    // Warp-uniform: skip tiles no row of this warp sees.
    if (warp_live && j0 <= w_hi && j0 + BKV - 1 >= w_first) {
      const uint32_t ks = smem_addr(k_s + (it & 1) * BKV * LD + k_off);
      const uint32_t vs = smem_addr(v_s + (it & 1) * BKV * LD + v_off);
      // S = Q K^T.
      float s[NB][4];
#pragma unroll
      for (int n = 0; n < NB; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[n][e] = 0.f;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t af[4];
        if constexpr (Sh::kQInRegs) {
#pragma unroll
          for (int e = 0; e < 4; ++e) af[e] = qf[kk][e];
        } else {
          ldmatrix_x4(af, q_addr + kk * 32);
        }
#pragma unroll
        for (int n2 = 0; n2 < NB / 2; ++n2) {
          uint32_t b[4];
          ldmatrix_x4(b, ks + (n2 * 16 * LD + kk * 16) * 2);
          Mma<S>::mma(s[2 * n2], af, b[0], b[1]);
          Mma<S>::mma(s[2 * n2 + 1], af, b[2], b[3]);
        }
      }
      // Scale, softcap, mask; the tile's row maxima.
      float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int n = 0; n < NB; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e / 2;
          const int32_t j = j0 + n * 8 + 2 * c + (e & 1);
          float x = s[n][e] * a.scale;
          if (a.softcap > 0.f) x = kvgraph::softcap(x, a.softcap);
          x = j >= lo_row[r] && j <= p_row[r] ? x : -INFINITY;
          s[n][e] = x;
          mx[r] = fmaxf(mx[r], x);
        }
      float base[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        const float m_new = fmaxf(m_run[r], mx[r]);
        base[r] = m_new == -INFINITY ? 0.f : m_new * kLog2e;  // a row with nothing visible yet keeps zeros
        const float corr = exp2f(m_run[r] * kLog2e - base[r]);  // 0 when m_run is -inf
        m_run[r] = m_new;
        l_run[r] *= corr;
#pragma unroll
        for (int n = 0; n < ND; ++n) {
          o[n][2 * r] *= corr;
          o[n][2 * r + 1] *= corr;
        }
      }
      // O += P V, P rounded to S (A fragments straight from the S accumulators).
#pragma unroll
      for (int kc = 0; kc < BKV / 16; ++kc) {
        uint32_t pf[4];
        const float* s0 = s[2 * kc];
        const float* s1 = s[2 * kc + 1];
        pf[0] = Mma<S>::pack(exp2f(fmaf(s0[0], kLog2e, -base[0])), exp2f(fmaf(s0[1], kLog2e, -base[0])), l_run[0]);
        pf[1] = Mma<S>::pack(exp2f(fmaf(s0[2], kLog2e, -base[1])), exp2f(fmaf(s0[3], kLog2e, -base[1])), l_run[1]);
        pf[2] = Mma<S>::pack(exp2f(fmaf(s1[0], kLog2e, -base[0])), exp2f(fmaf(s1[1], kLog2e, -base[0])), l_run[0]);
        pf[3] = Mma<S>::pack(exp2f(fmaf(s1[2], kLog2e, -base[1])), exp2f(fmaf(s1[3], kLog2e, -base[1])), l_run[1]);
#pragma unroll
        for (int n2 = 0; n2 < ND / 2; ++n2) {
          uint32_t b[4];
          ldmatrix_x4_trans(b, vs + (kc * 16 * LD + n2 * 16) * 2);
          Mma<S>::mma(o[2 * n2], pf, b[0], b[1]);
          Mma<S>::mma(o[2 * n2 + 1], pf, b[2], b[3]);
        }
      }
    }
    __syncthreads();  // the next iteration's loads overwrite this stage
  }

  // Row sums across the quad (each thread summed its own columns), then O / l.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int t = t0 + warp * 16 + g + r * 8;
    if (t >= a.T) continue;
    const float inv = 1.f / l_run[r];
    float* orow = a.out + (size_t(t) * a.Hq + hq) * D + 2 * c;
#pragma unroll
    for (int n = 0; n < ND; ++n)
      *reinterpret_cast<float2*>(orow + n * 8) = make_float2(o[n][2 * r] * inv, o[n][2 * r + 1] * inv);
  }
}

// Decode attention, built for latency: T == 1, or (kMulti) each of a step's
// T <= kMaxDecodeQueries queries as its own decode step. The block's chunk of keys
// goes in tiles of kThreads keys: (1) scores with one thread per key, each
// reading its whole K row and dotting it with every query head of the group
// from shared memory (no shuffles on the critical path); (2) an online
// softmax per head, one warp per head; (3) P.V with threads across the head
// dim (8 values each) and the tile's keys split among thread groups. Partials
// are merged like attend_kernel's (last block, split order). Every reduction
// runs in a fixed order, so results are deterministic.
constexpr int kTile = kThreads;

// (2) of a decode tile: an online softmax over `keys` scores per head in sc
// [heads, kTile], one warp per head (Gz heads); the probabilities replace the
// scores, and corr[g] is what head g's accumulators are rescaled by.
__device__ __forceinline__ void tile_softmax(float* sc, float* m_run, float* l_run, float* corr, int Gz, int keys) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int g = warp; g < Gz; g += kWarps) {
    float mx = -INFINITY;
    for (int i = lane; i < keys; i += 32) mx = fmaxf(mx, sc[g * kTile + i]);
    mx = detail::warp_max(mx);
    const float m_new = fmaxf(m_run[g], mx);  // finite: every tile has a visible key
    float sum = 0.f;
    for (int i = lane; i < keys; i += 32) {
      const float pz = expf(sc[g * kTile + i] - m_new);  // exp(-inf) = 0 past the tile's end
      sc[g * kTile + i] = pz;
      sum += pz;
    }
    sum = detail::warp_sum(sum);
    if (lane == 0) {
      const float c = m_run[g] == -INFINITY ? 0.f : expf(m_run[g] - m_new);
      corr[g] = c;
      l_run[g] = l_run[g] * c + sum;
      m_run[g] = m_new;
    }
  }
}

template <typename S>
__device__ __forceinline__ float rounded(float x) {
  return detail::to_f32(detail::from_f32<S>(x));
}

template <typename S>
constexpr bool is_quant = false;
template <typename KS, typename VS>
constexpr bool is_quant<detail::QKV<KS, VS>> = true;

// The head of every decode kernel's dynamic shared memory (floats): the
// group's q rows, the new k and v rows, the q/k norm weights, the RoPE
// inverse frequencies.
struct DecodeHead {
  float* q_s;   // [kMaxG, D]
  float* k_s;   // [D]: the new k row (after the prologue)
  float* v_s;   // [D]: the new v row (rounded to the storage type for 16/32-bit pools)
  float* qn_s;  // [D]
  float* kn_s;  // [D]
  float* if_s;  // [D / 2]
  float* end;   // the kernel's own scratch starts here
};
__host__ __device__ constexpr size_t decode_head_floats(int kMaxG, int D) { return size_t(kMaxG) * D + 4 * D + D / 2; }
__device__ __forceinline__ DecodeHead decode_head(float* smem, int kMaxG, int D) {
  DecodeHead h;
  h.q_s = smem;
  h.k_s = h.q_s + kMaxG * D;
  h.v_s = h.k_s + D;
  h.qn_s = h.v_s + D;
  h.kn_s = h.qn_s + D;
  h.if_s = h.kn_s + D;
  h.end = h.if_s + D / 2;
  return h;
}

// A decode block's place in the grid (query, kv head, head group, split) and
// the keys [c0, c1) its split attends for the query at position p.
struct DecodeBlock {
  int t, h, zg, Gz, hq0, part_t, split;
  int32_t p, c0, c1, n_active;
  float* out_t;  // the query's output rows
};

// Every decode kernel's start: the norm/RoPE constants (their loads overlap
// the wait for the previous kernel), then the step's position and the new
// q/k/v rows in one round of loads, before the block knows whether its split
// has keys. False (block-uniform): the split has none, the block exits.
template <typename S, int kMaxG, bool kMulti>
__device__ bool decode_begin(const AttnArgs<S>& a, const DecodeHead& s, DecodeBlock& b) {
  const int D = a.D;
  detail::griddep_launch_dependents();
  for (int d = threadIdx.x; d < D; d += kThreads) {
    if (a.q_norm) s.qn_s[d] = a.q_norm[d];
    if (a.k_norm) s.kn_s[d] = a.k_norm[d];
    if (a.inv_freq && d < D / 2) s.if_s[d] = a.inv_freq[d];
  }
  detail::griddep_wait();
  const int pairs = a.zgroups * a.Hkv;
  b.t = kMulti ? blockIdx.x / pairs : 0;
  const int bx = kMulti ? blockIdx.x % pairs : blockIdx.x;
  b.h = bx % a.Hkv;
  b.zg = bx / a.Hkv;
  b.split = blockIdx.y;
  const int g0 = b.zg * kMaxG;
  b.Gz = min(kMaxG, a.G - g0);
  b.hq0 = b.h * a.G + g0;
  const float* q_t = kMulti ? a.q + b.t * a.q_stride : a.q;
  const float* k_t = kMulti ? a.k + b.t * a.k_stride : a.k;
  const float* v_t = kMulti ? a.v + b.t * a.v_stride : a.v;
  b.out_t = kMulti ? a.out + size_t(b.t) * a.Hq * D : a.out;
  b.part_t = kMulti ? b.t * a.Hq : 0;  // partial rows of this query's heads
  b.p = a.pos[0] + b.t;
  const int lgD = __ffs(D) - 1;  // D is a power of two
  for (int i = threadIdx.x; i < kMaxG * D; i += kThreads)
    s.q_s[i] = (i >> lgD) < b.Gz ? q_t[size_t(b.hq0) * D + i] : 0.f;
  for (int d = threadIdx.x; d < D; d += kThreads) {
    s.k_s[d] = k_t[size_t(b.h) * D + d];
    const float v = v_t[size_t(b.h) * D + d];
    if constexpr (is_quant<S>) {
      s.v_s[d] = v;  // quantized by the kernel
    } else {
      s.v_s[d] = detail::to_f32(detail::from_f32<S>(v));
    }
  }
  const SplitRange r = split_range(a, b.p, b.split, gridDim.y);
  b.c0 = r.c0;
  b.c1 = r.c1;
  b.n_active = r.n_active;
  return b.split < b.n_active;
}

// After decode_begin (and the kernel's own shared state set up): q heads and
// the new k row through the norm/RoPE prologue (k_s follows the kMaxG q rows;
// rows past Gz are zeros and stay zeros), in one pass. Ends synchronised.
template <typename S, int kMaxG>
__device__ void decode_prologue(const AttnArgs<S>& a, const DecodeHead& s, const DecodeBlock& b) {
  __syncthreads();
  if (a.prologue())
    head_prologue(s.q_s, kMaxG + 1, kMaxG, a.D, a.q_norm ? s.qn_s : nullptr, a.k_norm ? s.kn_s : nullptr, a.norm_eps,
                  a.norm_plus_one, a.inv_freq ? s.if_s : nullptr, b.p);
}

// A decode block's result for head hq0 + g, element d: the output (O / l)
// when the query has one active split, else the split's partial (O, and
// (m, l) once per head) for merge_splits.
template <typename S>
__device__ __forceinline__ void decode_store(const AttnArgs<S>& a, const DecodeBlock& b, int g, int d, float O, float m,
                                             float l) {
  const int hq = b.hq0 + g, row = b.part_t + hq;
  if (b.n_active == 1) {
    b.out_t[size_t(hq) * a.D + d] = O / l;
    return;
  }
  a.part_o[(size_t(row) * a.ws_splits + b.split) * a.D + d] = O;
  if (d == 0) {
    a.part_ml[(size_t(row) * a.ws_splits + b.split) * 2] = m;
    a.part_ml[(size_t(row) * a.ws_splits + b.split) * 2 + 1] = l;
  }
}

// The last step of a decode block: merge the query's splits (a no-op with one).
template <typename S, int kMaxG>
__device__ __forceinline__ void decode_finish(const AttnArgs<S>& a, const DecodeBlock& b) {
  if (b.n_active == 1) return;
  const int pairs = a.zgroups * a.Hkv;
  merge_splits<S, kMaxG>(a, a.counters + b.t * pairs + b.h * a.zgroups + b.zg, b.hq0, b.part_t + b.hq0, b.Gz,
                         b.n_active, b.out_t);
}

// The end of decode_kernel(_q), after each thread left its key group's sums
// in red [nKG, kMaxG, D]: the key groups summed in a fixed order, then the
// output (one active split), or the split's partial, merged by
// merge_cluster (a.cluster_merge: the partial stays in red[g * D + d], each
// element overwritten by the thread that summed it) or by merge_splits.
template <typename S, int kMaxG>
__device__ __forceinline__ void decode_block_end(const AttnArgs<S>& a, const DecodeBlock& b, float* red, int nKG,
                                                 const float* m_run, const float* l_run) {
  const int D = a.D;
  __syncthreads();
  const bool in_cluster = a.cluster_merge && b.n_active > 1;
  for (int i = threadIdx.x; i < b.Gz * D; i += kThreads) {
    const int g = i / D, d = i % D;
    float O = 0.f;
    for (int k = 0; k < nKG; ++k) O += red[(k * kMaxG + g) * D + d];
    if (in_cluster) {
      red[g * D + d] = O;
    } else {
      decode_store(a, b, g, d, O, m_run[g], l_run[g]);
    }
  }
  if (a.cluster_merge) {
    merge_cluster<kMaxG>(D, b.Gz, b.n_active, red, m_run, l_run, b.out_t + size_t(b.hq0) * D);
  } else {
    decode_finish<S, kMaxG>(a, b);
  }
}

// A decode block without keys (decode_begin returned false) leaves; in a
// cluster it first joins the merge's barriers.
template <typename S>
__device__ __forceinline__ void decode_idle(const AttnArgs<S>& a) {
  if (a.cluster_merge) merge_cluster<1>(a.D, 0, 1, nullptr, nullptr, nullptr, nullptr);
}

// kStaged (Tuning::DecodeAttn::staged, and automatic at head dim 256;
// 16-bit pools, head dim 64, 128 or 256): the tile loop reads K and V from
// shared memory instead. Tiles of kStagedBytes / D keys (128 / 64 / 32)
// are copied by cp.async, each warp's copies coalesced (consecutive
// threads, consecutive 16-byte chunks of a row), the next tile in flight while the current one computes (two
// stages). Scores give each key kThreads / keys threads (1 / 2 / 4, 64
// values each, reduced by shuffles); rows are padded by that many 16-byte
// chunks and each thread walks its chunks rotated by its part, so a
// quarter warp's 16-byte reads hit 8 different bank groups. Written
// against the one-thread-a-row kernel's global loads (a warp's 16-byte load
// touches 32 rows) and its serial load -> softmax -> P.V per tile, which
// read K/V at 1.0-1.6 TB/s at 8K-128K keys on the H200.
constexpr int kStagedBytes = 16384;  // bytes of K (and of V) a 16-bit tile holds, before padding

__host__ __device__ constexpr int staged_keys(int D) { return kStagedBytes / 2 / D; }
__host__ __device__ constexpr int staged_ld(int D) { return D + 8 * (kThreads / staged_keys(D)); }
// Bytes of the two stages of K and V tiles (16-bit).
__host__ __device__ constexpr size_t staged_tile_bytes(int D) { return size_t(4) * staged_keys(D) * staged_ld(D) * 2; }

// Asks L1 for the first tile's pool rows before the decode prologue, so
// they arrive while its norms and RoPE run: the rows of keys [c0, c0 + n)
// of one pool (`row_bytes` a row), the fresh key p excepted (another block
// may be writing it), one 128-byte line a prefetch, spread over the block.
// Nothing is held in registers (loading the rows into registers instead
// cost the 8B step at 512 keys 8-21%: 95 -> 164 registers, fewer blocks an
// SM; bench/results/h200-2026-12-07-session19-decode-loads.md). The later
// loads read the same addresses, so the sums are unchanged.
__device__ __forceinline__ void prefetch_rows(const SlotRule& rule, int32_t c0, int n, int32_t p, const void* pool,
                                              int row_bytes) {
  const int lines = (row_bytes + 127) / 128;
  for (int idx = threadIdx.x; idx < n * lines; idx += kThreads) {
    const int i = idx / lines;
    if (c0 + i == p) continue;
    const uint8_t* line = static_cast<const uint8_t*>(pool) + size_t(slot_of(rule, c0 + i)) * row_bytes +
                          (idx - i * lines) * 128;
    asm volatile("prefetch.global.L1 [%0];" ::"l"(line));
  }
}

template <typename S, int kMaxG, bool kMulti, bool kStaged = false>
__global__ void __launch_bounds__(kThreads) decode_kernel(AttnArgs<S> a) {
  extern __shared__ __align__(16) float smem[];
  __shared__ float m_run[kMaxG], l_run[kMaxG], corr[kMaxG];
  const int D = a.D;
  const int DS = D / 8;              // threads per V row in P.V (8 values each)
  const int nKG = kThreads / DS;     // key groups in P.V
  const DecodeHead hs = decode_head(smem, kMaxG, D);
  const float* q_s = hs.q_s;
  const float* k_s = hs.k_s;
  const float* v_s = hs.v_s;
  float* sc = hs.end;                // [kMaxG, kTile]: scores, then probabilities
  float* red = sc + kMaxG * kTile;   // [nKG, kMaxG, D]

  DecodeBlock b;
  if (!decode_begin<S, kMaxG, kMulti>(a, hs, b)) return decode_idle(a);
  const int h = b.h, zg = b.zg, Gz = b.Gz, split = b.split;
  const int32_t p = b.p, c0 = b.c0, c1 = b.c1;
  const S* kp = a.k_pool + size_t(h) * a.rule.pool * D;
  const S* vp = a.v_pool + size_t(h) * a.rule.pool * D;
  if (threadIdx.x < kMaxG) {
    m_run[threadIdx.x] = -INFINITY;
    l_run[threadIdx.x] = 0.f;
  }
  if (!kStaged && a.prefetch) {
    const int n = min(kTile, c1 - c0);
    prefetch_rows(a.rule, c0, n, p, kp, D * int(sizeof(S)));
    prefetch_rows(a.rule, c0, n, p, vp, D * int(sizeof(S)));
  }
  decode_prologue<S, kMaxG>(a, hs, b);
  if (!kMulti && split == 0 && zg == 0) store_row(a, h, p, k_s, v_s);

  const int kg = threadIdx.x / DS, e0 = (threadIdx.x % DS) * 8;
  float acc[kMaxG][8];
#pragma unroll
  for (int g = 0; g < kMaxG; ++g)
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[g][e] = 0.f;

  auto rescale = [&] {
#pragma unroll
    for (int g = 0; g < kMaxG; ++g) {
      const float c = g < Gz ? corr[g] : 0.f;
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[g][e] *= c;
    }
  };
  // (3) for key t0 + i of the tile, its V values vr (the fresh row from v_s).
  auto accumulate_key = [&](int32_t t0, int i, const detail::Pack8<S>& vr) {
    float vf[8];
    if (t0 + i == p) {
#pragma unroll
      for (int e = 0; e < 8; ++e) vf[e] = v_s[e0 + e];
    } else {
      detail::unpack8(vr, vf);
    }
#pragma unroll
    for (int g = 0; g < kMaxG; ++g) {
      const float pz = sc[g * kTile + i];
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[g][e] = fmaf(pz, vf[e], acc[g][e]);
    }
  };
  // (1) dot[g] += q_g . the 8 K values at v of a key: `row` (pool or tile),
  // or for the fresh key the new row as stored (k_s rounded to S).
  auto dot_chunk = [&](float (&dot)[kMaxG], bool fresh, const S* row, int v) {
    float kf[8];
    if (fresh) {
#pragma unroll
      for (int e = 0; e < 8; ++e) kf[e] = rounded<S>(k_s[v + e]);
    } else {
      detail::unpack8(detail::load8(row + v), kf);
    }
#pragma unroll
    for (int g = 0; g < kMaxG; ++g) dot[g] = dot8(q_s + g * D + v, kf, dot[g]);
  };
  // (1) the scores of key i of a tile of n (scale, softcap; -inf past n).
  auto put_scores = [&](const float (&dot)[kMaxG], int i, int n) {
#pragma unroll
    for (int g = 0; g < kMaxG; ++g) {
      float x = dot[g] * a.scale;
      if (a.softcap > 0.f) x = kvgraph::softcap(x, a.softcap);
      sc[g * kTile + i] = i < n ? x : -INFINITY;
    }
  };

  if constexpr (kStaged) {
    const int BK = staged_keys(D), TPK = kThreads / BK, LD = staged_ld(D);
    const int lgCH = __ffs(D / 8) - 1;  // 16-byte chunks a row, a power of two
    S* ktile = reinterpret_cast<S*>(red + nKG * kMaxG * D);  // [2, BK, LD]
    S* vtile = ktile + 2 * BK * LD;                           // [2, BK, LD]
    const int n_tiles = (c1 - c0 + BK - 1) / BK;
    // K and V rows of tile `it` into stage it % 2 (zeros past c1), one group.
    auto load_tile = [&](int it) {
      const int32_t j0 = c0 + it * BK;
      S* ks = ktile + (it & 1) * BK * LD;
      S* vs = vtile + (it & 1) * BK * LD;
#pragma unroll
      for (int k = 0; k < kStagedBytes / 2 / 8 / kThreads; ++k) {  // BK * D / 8 chunks, 8 a thread
        const int i = threadIdx.x + k * kThreads;
        const int r = i >> lgCH, c = i & ((1 << lgCH) - 1);
        const int32_t j = j0 + r;
        const bool valid = j < c1;
        const size_t off = valid ? size_t(slot_of(a.rule, j)) * D + c * 8 : 0;
        cp_async16(smem_addr(ks + r * LD + c * 8), kp + off, valid);
        cp_async16(smem_addr(vs + r * LD + c * 8), vp + off, valid);
      }
      cp_async_commit();
    };
    load_tile(0);
    const int key = threadIdx.x / TPK, part = threadIdx.x % TPK;  // scores: the key and its 64 values
    for (int it = 0; it < n_tiles; ++it) {
      pipeline_next(it, n_tiles, load_tile);
      const int32_t t0 = c0 + it * BK;
      const int n = min(BK, c1 - t0);
      const S* ks = ktile + (it & 1) * BK * LD;
      const S* vs = vtile + (it & 1) * BK * LD;
      // (1) Scores: TPK adjacent threads a key, 8 chunks each, then shuffles.
      {
        const int32_t j = t0 + key;
        const bool fresh = j == p;  // the new row as stored, from k_s: the pool row may be in flight
        float dot[kMaxG];
#pragma unroll
        for (int g = 0; g < kMaxG; ++g) dot[g] = 0.f;
        if (key < n) {
#pragma unroll
          for (int k = 0; k < 8; ++k) dot_chunk(dot, fresh, ks + key * LD, (part * 8 + ((k + part) & 7)) * 8);
        }
        for (int o = 1; o < TPK; o <<= 1)
#pragma unroll
          for (int g = 0; g < kMaxG; ++g) dot[g] += __shfl_xor_sync(0xffffffffu, dot[g], o);
        if (part == 0) put_scores(dot, key, n);
      }
      __syncthreads();
      tile_softmax(sc, m_run, l_run, corr, Gz, BK);
      __syncthreads();
      rescale();
      for (int i = kg; i < n; i += nKG)
        accumulate_key(t0, i, detail::load8(vs + i * LD + e0));
      __syncthreads();  // the next load overwrites this stage; sc and corr are rewritten
    }
  } else {
  // V rows of the first kPre keys a thread accumulates in (3), loaded before
  // the scores so their latency hides behind (1) and (2). The fresh row (j ==
  // p) is never read from the pool: another block may be writing it.
  constexpr int kPre = sizeof(S) == 4 ? 4 : 8;
  for (int32_t t0 = c0; t0 < c1; t0 += kTile) {
    const int n = min(kTile, c1 - t0);
    detail::Pack8<S> vpre[kPre];
#pragma unroll
    for (int m = 0; m < kPre; ++m) {
      const int i = kg + m * nKG;
      const int32_t j = t0 + i;
      vpre[m] = i < n && j != p ? detail::load8(vp + size_t(slot_of(a.rule, j)) * D + e0) : pack8_zero<S>();
    }
    // (1) Scores: thread i owns key t0 + i.
    {
      const int i = threadIdx.x;
      const int32_t j = t0 + i;
      float dot[kMaxG];
#pragma unroll
      for (int g = 0; g < kMaxG; ++g) dot[g] = 0.f;
      if (i < n) {
        const bool fresh = j == p;
        const S* kr = kp + size_t(slot_of(a.rule, j)) * D;
#pragma unroll 8
        for (int v = 0; v < D; v += 8) dot_chunk(dot, fresh, kr, v);
      }
      put_scores(dot, i, n);
    }
    __syncthreads();
    // (2) Online softmax, one warp per head.
    tile_softmax(sc, m_run, l_run, corr, Gz, kTile);
    __syncthreads();
    // (3) P.V: thread (kg, slice) accumulates keys kg, kg + nKG, ... of the tile.
    rescale();
    auto accumulate = [&](int i, const detail::Pack8<S>& vr) { accumulate_key(t0, i, vr); };
#pragma unroll
    for (int m = 0; m < kPre; ++m)
      if (kg + m * nKG < n) accumulate(kg + m * nKG, vpre[m]);
#pragma unroll 4
    for (int i = kg + kPre * nKG; i < n; i += nKG) {
      const int32_t j = t0 + i;
      accumulate(i, j == p ? pack8_zero<S>() : detail::load8(vp + size_t(slot_of(a.rule, j)) * D + e0));
    }
    __syncthreads();  // sc and corr are rewritten by the next tile
  }
  }

#pragma unroll
  for (int g = 0; g < kMaxG; ++g)
#pragma unroll
    for (int e = 0; e < 8; ++e) red[(kg * kMaxG + g) * D + e0 + e] = acc[g][e];
  decode_block_end<S, kMaxG>(a, b, red, nKG, m_run, l_run);
}

// Decode attention on the tensor cores (Tuning::DecodeAttn::mma; 16-bit
// pools at head dim 64/128/256; the long-span default). A block owns one
// KV head, up to 8 query heads of its group (so each K/V row is read once)
// and one split of the keys, like decode_kernel; its 4 warps work
// independently: warp w takes sub-tiles w, w + 4, ... of kMmaKeys keys, each
// copied to the warp's own ring of kMmaStages stages by cp.async (coalesced;
// two sub-tiles in flight while one computes; only __syncwarp inside the
// loop). Per sub-tile: S = Q K^T and O += P V with mma.sync m16n8k16, the
// query heads on rows 0-7 and what rounding them to the storage type lost on
// rows 8-15 (q = hi + lo, and P = hi + lo likewise), so the scores and the
// output carry about 16 bits of q and P, not 8: the error stays within the
// f32 kernels' bounds while the tensor cores do the multiplies. An online
// softmax per warp in f32 registers; the warps' states merge in warp order,
// the splits in split order (merge_splits): deterministic.
constexpr int kMmaKeys = 16;   // keys of a warp's sub-tile
constexpr int kMmaStages = 3;  // sub-tiles a warp holds (in flight or in use)
constexpr int kMmaHeads = 8;   // query heads a block carries (mma rows 0-7)

template <int D>
constexpr size_t decode_mma_smem() {
  return decode_head_floats(kMmaHeads, D) * sizeof(float) +
         size_t(2 * kMmaHeads + kWarps * kMmaStages * 2 * kMmaKeys) * (D + 8) * 2;
}

// One sub-tile's online-softmax step of a decode_mma lane: x holds its four
// scores of head g (keys 2 c, 2 c + 1, 8 + 2 c, 9 + 2 c; -inf past the
// span). The running max over the lane's quad, p = exp(x - m) into pr, l_run
// rescaled and extended; returns the factor the running output is rescaled by
// (0 while m_run was -inf).
__device__ __forceinline__ float mma_softmax_step(const float (&x)[4], float& m_run, float& l_run, float (&pr)[4]) {
  constexpr float kLog2e = 1.4426950408889634f;
  float mx = -INFINITY;
#pragma unroll
  for (int e = 0; e < 4; ++e) mx = fmaxf(mx, x[e]);
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
  const float m_new = fmaxf(m_run, mx);  // finite: a sub-tile holds a key below c1
  const float base = m_new * kLog2e;
  const float corr = exp2f(fmaf(m_run, kLog2e, -base));
  m_run = m_new;
#pragma unroll
  for (int e = 0; e < 4; ++e) pr[e] = exp2f(fmaf(x[e], kLog2e, -base));
  l_run = fmaf(l_run, corr, (pr[0] + pr[1]) + (pr[2] + pr[3]));
  return corr;
}

// O = O * corr + P V over output columns [16 n0, 16 n1) of a decode_mma
// lane: pf the P fragments (rows g hi / 8 + g lo), vaddr the lane's ldmatrix
// address into the warp's [16 keys, LD] V tile.
template <typename S, int D>
__device__ __forceinline__ void mma_pv(float (&o)[D / 8][4], const uint32_t (&pf)[4], float corr, uint32_t vaddr,
                                       int n0, int n1) {
#pragma unroll
  for (int n2 = n0; n2 < n1; ++n2) {
    uint32_t bv[4];
    ldmatrix_x4_trans(bv, vaddr + n2 * 32);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      o[2 * n2][e] *= corr;
      o[2 * n2 + 1][e] *= corr;
    }
    Mma<S>::mma(o[2 * n2], pf, bv[0], bv[1]);
    Mma<S>::mma(o[2 * n2 + 1], pf, bv[2], bv[3]);
  }
}

// The end of a decode_mma kernel, once every copy has landed: each warp's
// (O, m, l) of head g through shared memory (scratch: the warps' tiles, free
// now), merged in warp order, stored, the split finished. bias(n): added to
// the output columns of o[n] (a quantized V's bias sums; 0 otherwise);
// col(n, e): the output dim of the lane's column 2 c + e of n block n
// (8 n + 2 c + e unless the kernel permuted V's columns).
template <typename S, int D, int kMaxG, typename Bias, typename Col>
__device__ __forceinline__ void mma_block_finish(const AttnArgs<S>& a, const DecodeBlock& b, float* scratch,
                                                 const float (&o)[D / 8][4], float m_run, float l_run, Bias bias,
                                                 Col col, bool merge = true) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  l_run += __shfl_xor_sync(0xffffffffu, l_run, 1);
  l_run += __shfl_xor_sync(0xffffffffu, l_run, 2);
  __syncthreads();
  float* ow = scratch;                   // [kWarps, kMaxG, D]
  float* mlw = ow + kWarps * kMaxG * D;  // [kWarps, kMaxG, 2]
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
    const float add = bias(n);
    ow[(warp * kMaxG + g) * D + col(n, 0)] = o[n][0] + o[n][2] + add;
    ow[(warp * kMaxG + g) * D + col(n, 1)] = o[n][1] + o[n][3] + add;
  }
  if (c == 0) {
    mlw[(warp * kMaxG + g) * 2] = m_run;
    mlw[(warp * kMaxG + g) * 2 + 1] = l_run;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < b.Gz * D; i += kThreads) {
    const int gg = i / D, d = i % D;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, mlw[(w * kMaxG + gg) * 2]);
    float O = 0.f, L = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float mw = mlw[(w * kMaxG + gg) * 2];
      const float e = mw == -INFINITY ? 0.f : expf(mw - M);  // a warp without keys adds nothing
      O = fmaf(e, ow[(w * kMaxG + gg) * D + d], O);
      L = fmaf(e, mlw[(w * kMaxG + gg) * 2 + 1], L);
    }
    decode_store(a, b, gg, d, O, M, L);
  }
  if (merge) decode_finish<S, kMaxG>(a, b);
}

template <typename S, int D, bool kMulti>
__global__ void __launch_bounds__(kThreads) decode_mma_kernel(AttnArgs<S> a) {
  constexpr int kMaxG = kMmaHeads, LD = D + 8, CH = D / 8, BK = kMmaKeys, NS = kMmaStages;
  constexpr int kStage = 2 * BK * LD;      // elements of a stage: K rows, then V rows
  constexpr bool kQInRegs = D <= 128;       // D = 256: q fragments read per sub-tile
  extern __shared__ __align__(16) float smem[];
  const DecodeHead hs = decode_head(smem, kMaxG, D);
  S* qm = reinterpret_cast<S*>(hs.end);    // [16, LD]: row g = q_g rounded (hi), row 8 + g = the rest (lo)
  S* tiles = qm + 2 * kMaxG * LD;          // [kWarps, NS, kStage]

  DecodeBlock b;
  if (!decode_begin<S, kMaxG, kMulti>(a, hs, b)) return;
  decode_prologue<S, kMaxG>(a, hs, b);
  if (!kMulti && b.split == 0 && b.zg == 0) store_row(a, b.h, b.p, hs.k_s, hs.v_s);
  for (int i = threadIdx.x; i < kMaxG * D; i += kThreads) {
    const float x = hs.q_s[i];
    const S hi = detail::from_f32<S>(x);
    qm[(i / D) * LD + i % D] = hi;
    qm[(kMaxG + i / D) * LD + i % D] = detail::from_f32<S>(x - detail::to_f32(hi));
  }
  __syncthreads();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // mma fragment coordinates (lane = 4 g + c; g: the head of the lane's
  // rows) and ldmatrix row addresses, as in flash_attend_kernel: A (q) 16
  // rows x 16 dims; B (K^T) 16 keys x 16 dims; B (V, transposed) 16 keys x
  // 16 dims.
  const int c = lane % 4, lrow = lane % 8, lsel = lane / 8;
  const uint32_t q_addr = smem_addr(qm + (lrow + (lsel & 1) * 8) * LD + (lsel >> 1) * 8);
  const int k_off = (lrow + (lsel >> 1) * 8) * LD + (lsel & 1) * 8;
  const int v_off = (lrow + (lsel & 1) * 8) * LD + (lsel >> 1) * 8;
  uint32_t qf[kQInRegs ? D / 16 : 1][4];
  if constexpr (kQInRegs) {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) ldmatrix_x4(qf[kk], q_addr + kk * 32);
  }

  const S* kp = a.k_pool + size_t(b.h) * a.rule.pool * D;
  const S* vp = a.v_pool + size_t(b.h) * a.rule.pool * D;
  const int32_t p = b.p, c0 = b.c0, c1 = b.c1;
  const int n_sub = (c1 - c0 + BK - 1) / BK;
  const int mine = warp < n_sub ? (n_sub - 1 - warp) / kWarps + 1 : 0;  // the warp's sub-tiles
  S* wt = tiles + warp * NS * kStage;
  // The warp's sub-tile i into stage i % NS (rows past c1 and the fresh row
  // zero: the pool row of p may be in flight); always one commit group.
  auto load = [&](int i) {
    if (i < mine) {
      const int32_t j0 = c0 + (warp + i * kWarps) * BK;
      S* ks = wt + (i % NS) * kStage;
#pragma unroll
      for (int k = 0; k < BK * CH / 32; ++k) {
        const int idx = lane + 32 * k, r = idx / CH, cc = idx % CH;
        const int32_t j = j0 + r;
        const bool valid = j < c1 && j != p;
        const size_t off = valid ? size_t(slot_of(a.rule, j)) * D + cc * 8 : 0;
        cp_async16(smem_addr(ks + r * LD + cc * 8), kp + off, valid);
        cp_async16(smem_addr(ks + (BK + r) * LD + cc * 8), vp + off, valid);
      }
    }
    cp_async_commit();
  };
#pragma unroll
  for (int i = 0; i < NS - 1; ++i) load(i);

  float o[D / 8][4];  // O: [n][0..1] head g (hi rows), [n][2..3] head g (lo rows), dims 8 n + 2 c, + 1
#pragma unroll
  for (int n = 0; n < D / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[n][e] = 0.f;
  float m_run = -INFINITY, l_run = 0.f;  // head g; l_run sums this lane's keys only

  for (int i = 0; i < mine; ++i) {
    load(i + NS - 1);
    cp_async_wait<NS - 1>();
    __syncwarp();
    S* ks = wt + (i % NS) * kStage;
    const int32_t j0 = c0 + (warp + i * kWarps) * BK;
    if (j0 <= p && p < j0 + BK) {  // warp-uniform: the new row as stored
      const int r = p - j0;
      for (int d = lane; d < D; d += 32) {
        ks[r * LD + d] = detail::from_f32<S>(hs.k_s[d]);
        ks[(BK + r) * LD + d] = detail::from_f32<S>(hs.v_s[d]);
      }
      __syncwarp();
    }
    const uint32_t ka = smem_addr(ks + k_off), va = smem_addr(ks + BK * LD + v_off);
    // S = Q K^T: [n][0..1] hi rows, [n][2..3] lo rows, keys 8 n + 2 c, + 1.
    float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t af[4], bf[4];
      if constexpr (kQInRegs) {
#pragma unroll
        for (int e = 0; e < 4; ++e) af[e] = qf[kk][e];
      } else {
        ldmatrix_x4(af, q_addr + kk * 32);
      }
      ldmatrix_x4(bf, ka + kk * 32);
      Mma<S>::mma(s[0], af, bf[0], bf[1]);
      Mma<S>::mma(s[1], af, bf[2], bf[3]);
    }
    float x[4];  // keys 2 c, 2 c + 1, 8 + 2 c, 9 + 2 c
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float v = (s[n][e] + s[n][e + 2]) * a.scale;
        if (a.softcap > 0.f) v = kvgraph::softcap(v, a.softcap);
        x[2 * n + e] = j0 + n * 8 + 2 * c + e < c1 ? v : -INFINITY;
      }
    float pr[4];
    const float corr = mma_softmax_step(x, m_run, l_run, pr);
    uint32_t pf[4];  // A (P): rows g hi / 8 + g lo x keys 0-7 / 8-15
    split_pair<S>(pr[0], pr[1], pf[0], pf[1]);
    split_pair<S>(pr[2], pr[3], pf[2], pf[3]);
    mma_pv<S, D>(o, pf, corr, va, 0, D / 16);
    __syncwarp();  // the next load refills stage (i + NS) % NS... after every lane read this one
  }
  cp_async_wait<0>();
  mma_block_finish<S, D, kMaxG>(a, b, reinterpret_cast<float*>(tiles), o, m_run, l_run, [](int) { return 0.f; },
                                [&](int n, int e) { return n * 8 + 2 * (lane % 4) + e; });
}

// k/v rows of the step's T tokens -> pool slots (rounded to the storage type).
template <typename S>
__global__ void write_kv_kernel(AttnArgs<S> a) {
  detail::griddep_launch_dependents();
  detail::griddep_wait();
  const int t = blockIdx.x / a.Hkv, h = blockIdx.x % a.Hkv;
  const int32_t p = a.pos[0] + t;
  if (p < 0 || slot_of(a.rule, p) >= a.rule.pool) return;  // block-uniform; the host validates capacity
  const float* kr = a.k + t * a.k_stride + size_t(h) * a.D;
  __shared__ float k_s[256];
  for (int d = threadIdx.x; d < a.D; d += blockDim.x) k_s[d] = kr[d];
  __syncthreads();
  head_prologue(k_s, 1, 1, a.D, a.k_norm, nullptr, a.norm_eps, a.norm_plus_one, a.inv_freq, p);
  store_row(a, h, p, k_s, a.v + t * a.v_stride + size_t(h) * a.D);
}

// ---------------------------------------------------------------- quantized K/V (int8, int4, fp8)
//
// The same three kernels for pools of codes with their scales (kv_codec.cuh),
// instantiated per (K, V) format pair (S = detail::QKV<KS, VS>), so the
// plain-format kernels above are untouched. Codes are read with the widest
// loads a row allows and dequantized in registers: never a dequantized copy.

// Bytes of one stored row of a quantized format, at most (head_dim <= 256).
constexpr int kMaxCodeRow = 256, kMaxAuxRow = 32;

// The stored rows' bytes at pool slot `slot` of kv head h, from shared memory.
template <typename S>
__device__ void copy_stored_row(const AttnArgs<S>& a, int h, int32_t slot, const uint8_t* kc, const uint8_t* ka,
                                const uint8_t* vc, const uint8_t* va) {
  const size_t row = size_t(h) * a.rule.pool + slot;
  uint8_t* kd = reinterpret_cast<uint8_t*>(a.k_pool) + row * a.k_code_row;
  uint8_t* vd = reinterpret_cast<uint8_t*>(a.v_pool) + row * a.v_code_row;
  uint8_t* kad = const_cast<uint8_t*>(a.k_aux) + row * a.k_aux_row;
  uint8_t* vad = const_cast<uint8_t*>(a.v_aux) + row * a.v_aux_row;
  for (int i = threadIdx.x; i < a.k_code_row; i += blockDim.x) kd[i] = kc[i];
  for (int i = threadIdx.x; i < a.v_code_row; i += blockDim.x) vd[i] = vc[i];
  for (int i = threadIdx.x; i < a.k_aux_row; i += blockDim.x) kad[i] = ka[i];
  for (int i = threadIdx.x; i < a.v_aux_row; i += blockDim.x) vad[i] = va[i];
}

// k/v rows of the step's T tokens -> quantized pool slots (T > 1, and the
// legacy decode path).
template <typename KS, typename VS>
__global__ void write_kv_kernel_q(AttnArgs<detail::QKV<KS, VS>> a) {
  detail::griddep_launch_dependents();
  detail::griddep_wait();
  const int t = blockIdx.x / a.Hkv, h = blockIdx.x % a.Hkv;
  const int32_t p = a.pos[0] + t;
  if (p < 0 || slot_of(a.rule, p) >= a.rule.pool) return;  // block-uniform; the host validates capacity
  __shared__ float k_s[256], v_s[256];
  __shared__ uint32_t params_s[8];
  const float* kr = a.k + t * a.k_stride + size_t(h) * a.D;
  const float* vr = a.v + t * a.v_stride + size_t(h) * a.D;
  for (int d = threadIdx.x; d < a.D; d += blockDim.x) {
    k_s[d] = kr[d];
    v_s[d] = vr[d];
  }
  __syncthreads();
  head_prologue(k_s, 1, 1, a.D, a.k_norm, nullptr, a.norm_eps, a.norm_plus_one, a.inv_freq, p);
  const size_t row = size_t(h) * a.rule.pool + slot_of(a.rule, p);
  detail::quantize_row_block<KS>(k_s, a.D, a.k_group, reinterpret_cast<uint8_t*>(a.k_pool) + row * a.k_code_row,
                                 const_cast<uint8_t*>(a.k_aux) + row * a.k_aux_row, params_s);
  detail::quantize_row_block<VS>(v_s, a.D, a.v_group, reinterpret_cast<uint8_t*>(a.v_pool) + row * a.v_code_row,
                                 const_cast<uint8_t*>(a.v_aux) + row * a.v_aux_row, params_s);
}

// T > 1 (after write_kv_kernel_q): attend_kernel's scheme, each lane group
// dequantizing its 8 values of a key (codes and their group's params).
template <typename KS, typename VS, int kMaxG>
__global__ void __launch_bounds__(kThreads) attend_kernel_q(AttnArgs<detail::QKV<KS, VS>> a) {
  using S = detail::QKV<KS, VS>;
  constexpr int U = 4;  // keys in flight per lane group
  extern __shared__ __align__(16) float smem[];
  const int D = a.D;
  float* q_s = smem;                                // [kMaxG, D]
  float* red_o = q_s + kMaxG * D;                   // [kWarps, kMaxG, D]
  float* red_ml = red_o + kWarps * kMaxG * D;       // [kWarps, kMaxG, 2]

  detail::griddep_launch_dependents();
  detail::griddep_wait();

  int bx = blockIdx.x;
  const int h = bx % a.Hkv;
  bx /= a.Hkv;
  const int zg = bx % a.zgroups;
  const int t = bx / a.zgroups;
  const int split = blockIdx.y, splits = gridDim.y;

  const int32_t p = a.pos[0] + t;
  const SplitRange r = split_range(a, p, split, splits);
  const int32_t c0 = r.c0, c1 = r.c1, n_active = r.n_active;
  if (split >= n_active) return;  // block-uniform

  const int g0 = zg * kMaxG;
  const int Gz = min(kMaxG, a.G - g0);
  const int hq0 = h * a.G + g0;
  const uint8_t* kc = reinterpret_cast<const uint8_t*>(a.k_pool) + size_t(h) * a.rule.pool * a.k_code_row;
  const uint8_t* vc = reinterpret_cast<const uint8_t*>(a.v_pool) + size_t(h) * a.rule.pool * a.v_code_row;
  const uint8_t* ka = a.k_aux + size_t(h) * a.rule.pool * a.k_aux_row;
  const uint8_t* va = a.v_aux + size_t(h) * a.rule.pool * a.v_aux_row;

  for (int i = threadIdx.x; i < kMaxG * D; i += kThreads) {
    const int g = i / D, d = i % D;
    q_s[i] = g < Gz ? a.q[t * a.q_stride + size_t(hq0 + g) * D + d] : 0.f;
  }
  __syncthreads();
  if (a.prologue()) head_prologue(q_s, Gz, Gz, D, a.q_norm, nullptr, a.norm_eps, a.norm_plus_one, a.inv_freq, p);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int GS = D / 8;
  const int KPW = 32 / GS;
  const int NKG = kWarps * KPW;
  const int e0 = (lane % GS) * 8;
  const int kq = lane / GS;

  float m[kMaxG], l[kMaxG], acc[kMaxG][8];
#pragma unroll
  for (int g = 0; g < kMaxG; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.f;
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[g][e] = 0.f;
  }

  for (int32_t jb = c0 + warp * KPW; jb < c1; jb += NKG * U) {
    typename detail::QTraits<KS>::Codes8 kr[U];
    typename detail::QTraits<VS>::Codes8 vr[U];
    uint32_t kp[U], vp[U];
    bool valid[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int32_t j = jb + kq + u * NKG;
      valid[u] = j < c1;
      const size_t slot = valid[u] ? size_t(slot_of(a.rule, j)) : 0;  // row 0 stands in for a missing key
      kr[u] = detail::load_codes8<KS>(kc + slot * a.k_code_row, e0);
      vr[u] = detail::load_codes8<VS>(vc + slot * a.v_code_row, e0);
      kp[u] = detail::load_params<KS>(ka + slot * a.k_aux_row, e0, a.k_group);
      vp[u] = detail::load_params<VS>(va + slot * a.v_aux_row, e0, a.v_group);
    }
    float s[U][kMaxG];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float kf[8];
      detail::dequant8<KS>(kr[u], kp[u], kf);
#pragma unroll
      for (int g = 0; g < kMaxG; ++g) {
        float dot = dot8(q_s + g * D + e0, kf, -0.0f);
        for (int off = GS >> 1; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
        float x = dot * a.scale;
        if (a.softcap > 0.f) x = kvgraph::softcap(x, a.softcap);
        s[u][g] = valid[u] ? x : -INFINITY;
      }
    }
#pragma unroll
    for (int g = 0; g < kMaxG; ++g) {
      float mx = m[g];
#pragma unroll
      for (int u = 0; u < U; ++u) mx = fmaxf(mx, s[u][g]);
      const float corr = m[g] == -INFINITY ? 0.f : expf(m[g] - mx);
      l[g] *= corr;
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[g][e] *= corr;
      m[g] = mx;
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float vf[8];
      detail::dequant8<VS>(vr[u], vp[u], vf);
#pragma unroll
      for (int g = 0; g < kMaxG; ++g) {
        const float pu = valid[u] ? expf(s[u][g] - m[g]) : 0.f;
        l[g] += pu;
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[g][e] = fmaf(pu, valid[u] ? vf[e] : 0.f, acc[g][e]);
      }
    }
  }

  attend_block_finish<S, kMaxG>(a, m, l, acc, red_o, red_ml, GS, e0, Gz, hq0, t, h, zg, split, n_active);
}

// Decode (T == 1) over quantized pools: decode_kernel's tiles, with
//  - the new k (after the prologue) and v rows quantized once per block into
//    shared memory (the writer block copies those bytes to the pool), so the
//    fresh key is read exactly as stored;
//  - scores from 16-byte loads of codes (16 int8 / fp8 or 32 int4 values):
//    per chunk sum_e q_e c_e in f32, then scale * that (+ bias * sum_e q_e
//    for the affine formats, the chunk sums of q precomputed per block);
//  - V rows' params read once per key in the scores pass (into shared
//    memory), and P.V as (p * scale) * code (+ p * bias per group, added at
//    the end), in registers.
template <typename KS, typename VS, int kMaxG>
__global__ void __launch_bounds__(kThreads) decode_kernel_q(AttnArgs<detail::QKV<KS, VS>> a) {
  using S = detail::QKV<KS, VS>;
  using KT = detail::QTraits<KS>;
  using VT = detail::QTraits<VS>;
  constexpr int kKE = KT::kBits == 4 ? 32 : 16;  // K values per 16-byte chunk
  extern __shared__ __align__(16) float smem[];
  __shared__ float m_run[kMaxG], l_run[kMaxG], corr[kMaxG];
  __shared__ uint32_t kparams_s[8], vparams_s[8];
  const int D = a.D;
  const int DS = D / 8;              // threads per V row in P.V (8 values each)
  const int nKG = kThreads / DS;     // key groups in P.V
  const int n_chunks = a.k_code_row / 16;  // 16-byte chunks of a K row (<= 16)
  const DecodeHead hs = decode_head(smem, kMaxG, D);
  const float* q_s = hs.q_s;
  const float* k_s = hs.k_s;
  const float* v_s = hs.v_s;
  float* qsum_s = hs.end;            // [kMaxG, 16]: sum of q over each K chunk
  float* sc = qsum_s + kMaxG * 16;   // [kMaxG, kTile]: scores, then probabilities
  float* red = sc + kMaxG * kTile;   // [nKG, kMaxG, D]
  uint32_t* vpar_s = reinterpret_cast<uint32_t*>(red + nKG * kMaxG * D);  // [kTile, 8]: V params of the tile's keys
  uint8_t* kq_s = reinterpret_cast<uint8_t*>(vpar_s + kTile * 8);  // the new k row as stored: codes
  uint8_t* kqa_s = kq_s + kMaxCodeRow;                             // ... and aux
  uint8_t* vq_s = kqa_s + kMaxAuxRow;                              // the new v row as stored
  uint8_t* vqa_s = vq_s + kMaxCodeRow;

  DecodeBlock b;
  if (!decode_begin<S, kMaxG, false>(a, hs, b)) return decode_idle(a);
  const int h = b.h, zg = b.zg, Gz = b.Gz, split = b.split;
  const int32_t p = b.p, c0 = b.c0, c1 = b.c1;
  const uint8_t* kc = reinterpret_cast<const uint8_t*>(a.k_pool) + size_t(h) * a.rule.pool * a.k_code_row;
  const uint8_t* vc = reinterpret_cast<const uint8_t*>(a.v_pool) + size_t(h) * a.rule.pool * a.v_code_row;
  const uint8_t* ka = a.k_aux + size_t(h) * a.rule.pool * a.k_aux_row;
  const uint8_t* va = a.v_aux + size_t(h) * a.rule.pool * a.v_aux_row;
  if (threadIdx.x < kMaxG) {
    m_run[threadIdx.x] = -INFINITY;
    l_run[threadIdx.x] = 0.f;
  }
  if (a.prefetch) {
    const int n = min(kTile, c1 - c0);
    prefetch_rows(a.rule, c0, n, p, kc, a.k_code_row);
    prefetch_rows(a.rule, c0, n, p, vc, a.v_code_row);
    prefetch_rows(a.rule, c0, n, p, ka, a.k_aux_row);
    prefetch_rows(a.rule, c0, n, p, va, a.v_aux_row);
  }
  decode_prologue<S, kMaxG>(a, hs, b);
  detail::quantize_row_block<KS>(k_s, D, a.k_group, kq_s, kqa_s, kparams_s);
  detail::quantize_row_block<VS>(v_s, D, a.v_group, vq_s, vqa_s, vparams_s);
  if (split == 0 && zg == 0 && p >= 0 && slot_of(a.rule, p) < a.rule.pool)
    copy_stored_row(a, h, slot_of(a.rule, p), kq_s, kqa_s, vq_s, vqa_s);
  if constexpr (KT::kAffine) {
    for (int i = threadIdx.x; i < kMaxG * n_chunks; i += kThreads) {
      const int g = i / n_chunks, c = i % n_chunks;
      float sum = 0.f;
      for (int e = 0; e < kKE; ++e) sum += q_s[g * D + c * kKE + e];
      qsum_s[g * 16 + c] = sum;
    }
    __syncthreads();
  }

  const int kg = threadIdx.x / DS, e0 = (threadIdx.x % DS) * 8;
  const int vgi = VT::kAffine ? e0 / a.v_group : 0;  // this thread's V group
  float acc[kMaxG][8], accb[kMaxG];
#pragma unroll
  for (int g = 0; g < kMaxG; ++g) {
    accb[g] = 0.f;
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[g][e] = 0.f;
  }

  constexpr int kPre = 16;  // V codes of the first kPre keys a thread accumulates, loaded before the scores
  for (int32_t t0 = c0; t0 < c1; t0 += kTile) {
    const int n = min(kTile, c1 - t0);
    typename VT::Codes8 vpre[kPre];
#pragma unroll
    for (int m = 0; m < kPre; ++m) {
      const int i = kg + m * nKG;
      const int32_t j = t0 + i;
      vpre[m] = i < n ? detail::load_codes8<VS>(j == p ? vq_s : vc + size_t(slot_of(a.rule, j)) * a.v_code_row, e0)
                      : typename VT::Codes8{};
    }
    // (1) Scores: thread i owns key t0 + i; it also fetches that key's V params.
    {
      const int i = threadIdx.x;
      const int32_t j = t0 + i;
      float dot[kMaxG];
#pragma unroll
      for (int g = 0; g < kMaxG; ++g) dot[g] = 0.f;
      if (i < n) {
        const bool fresh = j == p;
        const size_t slot = size_t(slot_of(a.rule, j));
        const uint8_t* kr = fresh ? kq_s : kc + slot * a.k_code_row;
        const uint8_t* kar = fresh ? kqa_s : ka + slot * a.k_aux_row;
        const uint8_t* var = fresh ? vqa_s : va + slot * a.v_aux_row;
        const int vg = VT::kAffine ? D / a.v_group : 1;
        for (int k = 0; k < vg; ++k) vpar_s[i * 8 + k] = reinterpret_cast<const uint32_t*>(var)[k];
#pragma unroll 8
        for (int c = 0; c < n_chunks; ++c) {
          const uint4 w = *reinterpret_cast<const uint4*>(kr + c * 16);
          const uint32_t par = detail::load_params<KS>(kar, c * kKE, a.k_group);
          float part[kMaxG];
#pragma unroll
          for (int g = 0; g < kMaxG; ++g) part[g] = -0.0f;
#pragma unroll
          for (int wi = 0; wi < 4; ++wi) {
            const uint32_t u = wi == 0 ? w.x : wi == 1 ? w.y : wi == 2 ? w.z : w.w;
            float f[kKE / 4];
            detail::word_f<KS>(u, f);
#pragma unroll
            for (int g = 0; g < kMaxG; ++g) {
              const float* qg = q_s + g * D + c * kKE + wi * (kKE / 4);
#pragma unroll
              for (int e = 0; e < kKE / 4; ++e) part[g] = fmaf(qg[e], f[e], part[g]);
            }
          }
#pragma unroll
          for (int g = 0; g < kMaxG; ++g) {
            if constexpr (KT::kAffine) {
              dot[g] = fmaf(detail::half_lo(par), part[g], dot[g]);
              dot[g] = fmaf(detail::half_hi(par), qsum_s[g * 16 + c], dot[g]);
            } else {
              dot[g] = fmaf(__uint_as_float(par), part[g], dot[g]);
            }
          }
        }
      }
#pragma unroll
      for (int g = 0; g < kMaxG; ++g) {
        float x = dot[g] * a.scale;
        if (a.softcap > 0.f) x = kvgraph::softcap(x, a.softcap);
        sc[g * kTile + i] = i < n ? x : -INFINITY;
      }
    }
    __syncthreads();
    // (2) Online softmax, one warp per head.
    tile_softmax(sc, m_run, l_run, corr, Gz, kTile);
    __syncthreads();
    // (3) P.V: (p * scale) * code, and p * bias per group on the side.
#pragma unroll
    for (int g = 0; g < kMaxG; ++g) {
      const float c = g < Gz ? corr[g] : 0.f;
      accb[g] *= c;
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[g][e] *= c;
    }
    auto accumulate = [&](int i, const typename VT::Codes8& codes) {
      float vf[8];
      detail::codes_f<VS>(codes, vf);
      const uint32_t par = vpar_s[i * 8 + vgi];
#pragma unroll
      for (int g = 0; g < kMaxG; ++g) {
        const float pz = sc[g * kTile + i];
        float ps;
        if constexpr (VT::kAffine) {
          ps = pz * detail::half_lo(par);
          accb[g] = fmaf(pz, detail::half_hi(par), accb[g]);
        } else {
          ps = pz * __uint_as_float(par);
        }
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[g][e] = fmaf(ps, vf[e], acc[g][e]);
      }
    };
#pragma unroll
    for (int m = 0; m < kPre; ++m)
      if (kg + m * nKG < n) accumulate(kg + m * nKG, vpre[m]);
#pragma unroll 4
    for (int i = kg + kPre * nKG; i < n; i += nKG) {
      const int32_t j = t0 + i;
      accumulate(i, detail::load_codes8<VS>(j == p ? vq_s : vc + size_t(slot_of(a.rule, j)) * a.v_code_row, e0));
    }
    __syncthreads();  // sc, corr and vpar_s are rewritten by the next tile
  }

#pragma unroll
  for (int g = 0; g < kMaxG; ++g)
#pragma unroll
    for (int e = 0; e < 8; ++e) red[(kg * kMaxG + g) * D + e0 + e] = acc[g][e] + accb[g];
  decode_block_end<S, kMaxG>(a, b, red, nKG, m_run, l_run);
}

// Decode attention over quantized pools on the tensor cores (the
// decode_mma_kernel scheme; head dims 64 and 128, one-token steps; K and V
// of the formats decode_kernel_q takes). Blocks claim chunks of ~1024 keys
// from their head's counter until none is left, and the chunks' partials
// merge in two levels (see the end of the kernel). Each warp's stages hold
// the sub-tile's codes and scales as stored (cp.async), and the mma operands are built from
// them in registers: no f16 copy of a tile, no ldmatrix. The scores and the
// output are sums over head dims and keys, so the kernel is free to choose
// which dims and keys sit in which fragment slot, and chooses the ones that
// make each lane's codes contiguous bytes:
//   K (S = Q K^T, B operand): lane (g, c) supplies key 8 n + g of n block n;
//     within a scale segment (a group; fp8: 64 dims) it reads one run of
//     bytes, a quarter of the segment (c-th), and turns it into its
//     k-positions 2 c, 2 c + 1 / 2 c + 8, 2 c + 9 of the segment's k-steps
//     (k_frag, k_elem). The q fragments are built with the same map from the
//     f32 q rows, so q . k is unchanged. Codes become f16 with one PRMT or
//     LOP3 a pair, offset (int8: 1024 + c; int4: 64 + c, all exact); the
//     offset's share, offset * sum(q), is subtracted per group in f32.
//   V (O += P V, B operand): lane (g, c) supplies keys 2 c, 2 c + 1 (b0) and
//     2 c + 8, 2 c + 9 (b1) at output column g of each n block; n block t of
//     a segment maps column g to dim g * VT + t, so the lane reads one run of
//     VT dims per key and segment and pairs the same dim of two keys
//     (v_pairs). The output columns are permuted back when stored.
// K: one accumulator set per scale group, score = sum_g s_g (q_g . c_g) +
// b_g sum(q_g); V: the P operand of group g is p * s_g (hi + lo) and sum p *
// b_g goes on the side: the math of decode_kernel_q (scales factored out of
// sums of exact products), so its tests' bounds hold. K rows are stored with
// their 16-byte chunks XOR-swizzled and V rows padded by 16 bytes, so every
// fragment read is free of bank conflicts. Never a dequantized copy.

// A K or V row's scale segments: an affine format's group; fp8 (one scale a
// row) 64 dims.
template <typename Q, int G>
struct QSeg {
  static constexpr bool kAffine = detail::QTraits<Q>::kAffine;
  static constexpr bool kInt4 = std::is_same_v<Q, detail::q4>;
  static constexpr int kDims = kAffine ? G : 64;
  static constexpr int kBytes = kInt4 ? kDims / 2 : kDims;  // stored bytes of one row's segment
  // The code value is (f16 of the fragment) - kOffset: int8 codes as 1024 +
  // c, int4 as 64 + c (exact in f16), fp8 as its value.
  static constexpr float kOffset = kInt4 ? 64.f : kAffine ? 1024.f : 0.f;
};

// Bytes of a run: 4, 8 or 16 from shared memory into words.
template <int RB>
__device__ __forceinline__ void lds_run(const uint8_t* p, uint32_t* w) {
  if constexpr (RB == 16) {
    const uint4 v = *reinterpret_cast<const uint4*>(p);
    w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
  } else if constexpr (RB == 8) {
    const uint2 v = *reinterpret_cast<const uint2*>(p);
    w[0] = v.x, w[1] = v.y;
  } else if constexpr (RB == 4) {
    w[0] = *reinterpret_cast<const uint32_t*>(p);
  } else {
    static_assert(RB == 2, "runs of 2, 4, 8 or 16 bytes");
    w[0] = *reinterpret_cast<const uint16_t*>(p);
  }
}

__device__ __forceinline__ uint32_t fp8x2_f16x2(uint32_t two) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(two & 0xffffu), __NV_E4M3);
  uint32_t r;
  memcpy(&r, &h, 4);
  return r;
}
__device__ __forceinline__ uint32_t f16x2_sub(uint32_t w, uint32_t magic) {
  __half2 h, m;
  memcpy(&h, &w, 4);
  memcpy(&m, &magic, 4);
  h = __hsub2(h, m);
  uint32_t r;
  memcpy(&r, &h, 4);
  return r;
}

// K fragments of k-step j of a segment from the lane's run w (int8/fp8: 4
// bytes a k-step; int4: 4 bytes a pair of k-steps). b0 holds run elements
// k_elem(j, 0, 0..1), b1 k_elem(j, 1, 0..1), as f16 plus QSeg::kOffset.
template <typename Q>
__device__ __forceinline__ void k_frag(const uint32_t* w, int j, uint32_t& b0, uint32_t& b1) {
  if constexpr (std::is_same_v<Q, detail::q8>) {
    b0 = __byte_perm(w[j], 0x64646464u, 0x5140);  // bytes 0, 1 -> 0x64cc pairs: 1024 + c
    b1 = __byte_perm(w[j], 0x64646464u, 0x5342);
  } else if constexpr (std::is_same_v<Q, detail::q4>) {
    const uint32_t x = w[j >> 1];  // element 2 i: the low nibble of byte i; 0x54n0: 64 + n
    if (j & 1) {
      b0 = ((x >> 4) & 0x00f000f0u) | 0x54005400u;  // elements 2, 6
      b1 = ((x >> 8) & 0x00f000f0u) | 0x54005400u;  // 3, 7
    } else {
      b0 = ((x << 4) & 0x00f000f0u) | 0x54005400u;  // 0, 4
      b1 = (x & 0x00f000f0u) | 0x54005400u;         // 1, 5
    }
  } else {
    b0 = fp8x2_f16x2(w[j]);
    b1 = fp8x2_f16x2(w[j] >> 16);
  }
}
template <typename Q>
__host__ __device__ constexpr int k_elem(int j, int reg, int h) {
  return std::is_same_v<Q, detail::q4> ? 8 * (j / 2) + 2 * (j % 2) + reg + 4 * h : 4 * j + 2 * reg + h;
}

// V pairs: runs A and B (the same VT dims of two keys) -> out[t] = (A_t, B_t)
// as f16 values of the codes.
template <typename Q, int VT>
__device__ __forceinline__ void v_pairs(const uint32_t* A, const uint32_t* B, uint32_t* out) {
  if constexpr (std::is_same_v<Q, detail::q4>) {
    static_assert(VT == 8 || VT == 4, "int4 runs of 4 or 2 bytes");
#pragma unroll
    for (int h = 0; h < VT / 4; ++h) {
      const uint32_t x = __byte_perm(A[0], B[0], h ? 0x7632 : 0x5410);  // A byte 2h, 2h + 1, B's
      out[4 * h] = f16x2_sub((x & 0x000f000fu) | 0x64006400u, 0x64006400u);
      out[4 * h + 1] = f16x2_sub((x & 0x00f000f0u) | 0x54005400u, 0x54005400u);
      out[4 * h + 2] = f16x2_sub(((x >> 8) & 0x000f000fu) | 0x64006400u, 0x64006400u);
      out[4 * h + 3] = f16x2_sub(((x >> 8) & 0x00f000f0u) | 0x54005400u, 0x54005400u);
    }
  } else {
    static_assert(VT % 4 == 0, "8-bit runs of whole words");
#pragma unroll
    for (int w = 0; w < VT / 4; ++w) {
      const uint32_t x = __byte_perm(A[w], B[w], 0x5140);  // A0 B0 A1 B1
      const uint32_t y = __byte_perm(A[w], B[w], 0x7362);  // A2 B2 A3 B3
      if constexpr (std::is_same_v<Q, detail::q8>) {
        out[4 * w] = f16x2_sub(__byte_perm(x, 0x64646464u, 0x5140), 0x64006400u);
        out[4 * w + 1] = f16x2_sub(__byte_perm(x, 0x64646464u, 0x5342), 0x64006400u);
        out[4 * w + 2] = f16x2_sub(__byte_perm(y, 0x64646464u, 0x5140), 0x64006400u);
        out[4 * w + 3] = f16x2_sub(__byte_perm(y, 0x64646464u, 0x5342), 0x64006400u);
      } else {
        out[4 * w] = fp8x2_f16x2(x);
        out[4 * w + 1] = fp8x2_f16x2(x >> 16);
        out[4 * w + 2] = fp8x2_f16x2(y);
        out[4 * w + 3] = fp8x2_f16x2(y >> 16);
      }
    }
  }
}

// Stored bytes of a row: codes, and aux (affine: a u32 per group; e4m3: the f32 scale).
template <typename S, int D>
constexpr int code_bytes() {
  return std::is_same_v<S, detail::q4> ? D / 2 : D;
}
template <typename S, int D, int G>
constexpr int aux_bytes() {
  return detail::QTraits<S>::kAffine ? 4 * (D / G) : 4;
}
// Bytes of a warp's stage: K codes, V codes (rows padded by 16 bytes), K aux, V aux of kMmaKeys rows.
template <typename KS, typename VS, int D, int KG, int VG>
constexpr int mma_q_stage() {
  return kMmaKeys * (code_bytes<KS, D>() + code_bytes<VS, D>() + 16 + aux_bytes<KS, D, KG>() + aux_bytes<VS, D, VG>());
}
// Stages a warp holds: as many as leave kBlocks blocks an SM room (~60 KB
// of stages a block for three, ~90 KB for two).
template <typename KS, typename VS, int D, int KG, int VG, int kBlocks>
constexpr int mma_q_stages() {
  return std::clamp((kBlocks == 2 ? 92160 : 61440) / (kWarps * mma_q_stage<KS, VS, D, KG, VG>()), 3, 6);
}
template <typename KS, typename VS, int D, int KG, int VG, int kBlocks>
constexpr size_t decode_mma_q_smem() {
  return decode_head_floats(kMmaHeads, D) * sizeof(float) + size_t(kMmaHeads) * (D / 16) * sizeof(float) +
         2 * size_t(kMaxCodeRow + kMaxAuxRow) +
         size_t(kWarps) * mma_q_stages<KS, VS, D, KG, VG, kBlocks>() * mma_q_stage<KS, VS, D, KG, VG>();
}

template <typename KS, typename VS, int D, int KG, int VG, int kBlocks>
__global__ void __launch_bounds__(kThreads, kBlocks) decode_mma_kernel_q(AttnArgs<detail::QKV<KS, VS>> a) {
  using S = detail::QKV<KS, VS>;
  using F = detail::f16;
  using KQ = QSeg<KS, KG>;
  using VQ = QSeg<VS, VG>;
  constexpr int kMaxG = kMmaHeads, BK = kMmaKeys, NS = mma_q_stages<KS, VS, D, KG, VG, kBlocks>();
  constexpr int KCR = code_bytes<KS, D>(), VCR = code_bytes<VS, D>(), VLD = VCR + 16;
  constexpr int KAR = aux_bytes<KS, D, KG>(), VAR = aux_bytes<VS, D, VG>();
  constexpr int NKS = D / KQ::kDims, NVS = D / VQ::kDims;  // segments of a K / V row
  constexpr int NKG = KQ::kAffine ? NKS : 1;              // K scales a row
  constexpr int KSTEPS = KQ::kDims / 16;                  // mma k-steps a K segment
  constexpr int KRB = KQ::kBytes / 4;                     // bytes of a lane's K run (a quarter segment)
  constexpr int VT = VQ::kDims / 8;                       // V n blocks a segment = dims of a lane's V run
  constexpr int VRB = VQ::kBytes / 8;                     // bytes of a lane's V run
  constexpr int kStage = mma_q_stage<KS, VS, D, KG, VG>();
  // K chunk swizzle: the rows a wavefront's runs come from (2, 4 or 8 rows of
  // 4 runs) land in distinct banks.
  constexpr int kRowsPer128 = 128 / KCR, kWaveRows = 128 / (4 * KRB), kSwzUnit = 4 * KRB / 16;
  static_assert(kWaveRows >= kRowsPer128 && (kWaveRows / kRowsPer128 - 1) * kSwzUnit < KCR / 16, "K swizzle");
  static_assert(KCR % 16 == 0 && VCR % 16 == 0 && (BK * KAR) % 16 == 0, "stage parts 16-byte aligned");
  auto kphys = [](int r, int byte) {
    const int swz = ((r / kRowsPer128) % (kWaveRows / kRowsPer128)) * kSwzUnit;
    return r * KCR + ((((byte >> 4) ^ swz)) << 4) + (byte & 15);
  };
  extern __shared__ __align__(16) float smem[];
  __shared__ uint32_t kparams_s[8], vparams_s[8];
  const DecodeHead hs = decode_head(smem, kMaxG, D);
  float* qsum_s = hs.end;                                            // [kMaxG, D / 16]: sum of q over each group
  uint8_t* kq_s = reinterpret_cast<uint8_t*>(qsum_s + kMaxG * (D / 16));  // the new k row as stored: codes
  uint8_t* kqa_s = kq_s + kMaxCodeRow;                               // ... and aux
  uint8_t* vq_s = kqa_s + kMaxAuxRow;                                // the new v row as stored
  uint8_t* vqa_s = vq_s + kMaxCodeRow;
  uint8_t* wbase = vqa_s + kMaxAuxRow;                               // per warp: NS stages

  DecodeBlock b;
  decode_begin<S, kMaxG, false>(a, hs, b);  // every block takes part: chunks are claimed below
  decode_prologue<S, kMaxG>(a, hs, b);
  detail::quantize_row_block<KS>(hs.k_s, D, a.k_group, kq_s, kqa_s, kparams_s);
  detail::quantize_row_block<VS>(hs.v_s, D, a.v_group, vq_s, vqa_s, vparams_s);
  if (blockIdx.y == 0 && b.zg == 0 && b.p >= 0 && slot_of(a.rule, b.p) < a.rule.pool)
    copy_stored_row(a, b.h, slot_of(a.rule, b.p), kq_s, kqa_s, vq_s, vqa_s);
  for (int i = threadIdx.x; i < kMaxG * NKG; i += kThreads) {
    const int g = i / NKG, k = i % NKG;
    float sum = 0.f;
    for (int e = 0; e < D / NKG; ++e) sum += hs.q_s[g * D + k * (D / NKG) + e];
    qsum_s[i] = sum;
  }
  __syncthreads();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, c = lane % 4;
  // q fragments of head g in the K map: rows g (q rounded to f16) and g + 8
  // (what that lost); qoff: the codes' offset times q, per segment.
  uint32_t qf[D / 16][4];
  float qoff[NKS];
#pragma unroll
  for (int s = 0; s < NKS; ++s) {
    qoff[s] = 0.f;
#pragma unroll
    for (int j = 0; j < KSTEPS; ++j)
#pragma unroll
      for (int reg = 0; reg < 2; ++reg) {
        F hi[2], lo[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float x = hs.q_s[g * D + s * KQ::kDims + c * (KQ::kDims / 4) + k_elem<KS>(j, reg, h)];
          hi[h] = detail::from_f32<F>(x);
          lo[h] = detail::from_f32<F>(x - detail::to_f32(hi[h]));
          qoff[s] += KQ::kOffset * (detail::to_f32(hi[h]) + detail::to_f32(lo[h]));
        }
        memcpy(&qf[s * KSTEPS + j][2 * reg], hi, 4);
        memcpy(&qf[s * KSTEPS + j][2 * reg + 1], lo, 4);
      }
    qoff[s] += __shfl_xor_sync(0xffffffffu, qoff[s], 1);
    qoff[s] += __shfl_xor_sync(0xffffffffu, qoff[s], 2);
  }
  float qsum[NKG];
#pragma unroll
  for (int k = 0; k < NKG; ++k) qsum[k] = KQ::kAffine ? qsum_s[g * NKG + k] : 0.f;

  // Chunks of keys, claimed one at a time from the head's counter (blocks on
  // SMs that stream faster take more; a one-wave grid of fixed splits left
  // 30% of the SM time idle in its tail). Each chunk's partial depends only
  // on the chunk, and they merge in chunk order: deterministic.
  const int n_chunks = split_range(a, b.p, 0, a.ws_splits).n_active;
  unsigned* claim = a.counters + a.zgroups * a.Hkv + b.h * a.zgroups + b.zg;
  __shared__ int chunk_s;
  for (;;) {
  __syncthreads();  // the last chunk's reads of chunk_s and of the stages are done
  if (threadIdx.x == 0) {
    const int ch = static_cast<int>(atomicAdd(claim, 1u));
    chunk_s = ch;
    if (ch == n_chunks + int(gridDim.y) - 1) *claim = 0;  // the step's last claim: ready for the next step
  }
  __syncthreads();
  if (chunk_s >= n_chunks) break;
  {
    const SplitRange r = split_range(a, b.p, chunk_s, a.ws_splits);
    b.split = chunk_s;
    b.c0 = r.c0;
    b.c1 = r.c1;
    b.n_active = r.n_active;
  }
  const size_t row0 = size_t(b.h) * a.rule.pool;
  const uint8_t* kc = reinterpret_cast<const uint8_t*>(a.k_pool) + row0 * KCR;
  const uint8_t* vc = reinterpret_cast<const uint8_t*>(a.v_pool) + row0 * VCR;
  const uint8_t* ka = a.k_aux + row0 * KAR;
  const uint8_t* va = a.v_aux + row0 * VAR;
  const int32_t p = b.p, c0 = b.c0, c1 = b.c1;
  const int n_sub = (c1 - c0 + BK - 1) / BK;
  const int mine = warp < n_sub ? (n_sub - 1 - warp) / kWarps + 1 : 0;
  uint8_t* wst = wbase + warp * NS * kStage;
  // Stage parts: K codes [BK, KCR] (swizzled), V codes [BK, VLD], K aux [BK, KAR], V aux [BK, VAR].
  auto load = [&](int i) {
    if (i < mine) {
      const int32_t j0 = c0 + (warp + i * kWarps) * BK;
      uint8_t* st = wst + (i % NS) * kStage;
      const int32_t s0 = slot_of(a.rule, j0);
      if (j0 + BK <= c1 && (p < j0 || p >= j0 + BK) && s0 + BK <= a.rule.pool) {
        // Warp-uniform, the usual case: BK whole rows in consecutive slots,
        // so each part of the stage is one contiguous run of the pool.
        const uint8_t* ks = kc + size_t(s0) * KCR;
        const uint8_t* vs = vc + size_t(s0) * VCR;
#pragma unroll
        for (int k = 0; k < BK * KCR / 16 / 32; ++k) {
          const int idx = lane + 32 * k;
          cp_async16(smem_addr(st + kphys(idx / (KCR / 16), (idx % (KCR / 16)) * 16)), ks + idx * 16, true);
        }
#pragma unroll
        for (int k = 0; k < BK * VCR / 16 / 32; ++k) {
          const int idx = lane + 32 * k;
          cp_async16(smem_addr(st + BK * KCR + (idx / (VCR / 16)) * VLD + (idx % (VCR / 16)) * 16), vs + idx * 16,
                     true);
        }
        const uint8_t* kas = ka + size_t(s0) * KAR;  // 4-byte aligned only (an odd slot)
        const uint8_t* vas = va + size_t(s0) * VAR;
        for (int idx = lane; idx < BK * KAR / 4; idx += 32)
          cp_async4(smem_addr(st + BK * (KCR + VLD) + idx * 4), kas + idx * 4, true);
        for (int idx = lane; idx < BK * VAR / 4; idx += 32)
          cp_async4(smem_addr(st + BK * (KCR + VLD + KAR) + idx * 4), vas + idx * 4, true);
        cp_async_commit();
        return;
      }
      auto row_off = [&](int r, int row_bytes, bool& valid) {
        const int32_t j = j0 + r;
        valid = j < c1 && j != p;
        return valid ? size_t(slot_of(a.rule, j)) * row_bytes : 0;
      };
      static_assert((BK * KCR / 16) % 32 == 0 && (BK * VCR / 16) % 32 == 0, "whole rounds of 16-byte copies");
#pragma unroll
      for (int k = 0; k < BK * KCR / 16 / 32; ++k) {
        const int idx = lane + 32 * k, r = idx / (KCR / 16), cc = idx % (KCR / 16);
        bool valid;
        const size_t off = row_off(r, KCR, valid);
        cp_async16(smem_addr(st + kphys(r, cc * 16)), kc + off + (valid ? cc * 16 : 0), valid);
      }
#pragma unroll
      for (int k = 0; k < BK * VCR / 16 / 32; ++k) {
        const int idx = lane + 32 * k, r = idx / (VCR / 16), cc = idx % (VCR / 16);
        bool valid;
        const size_t off = row_off(r, VCR, valid);
        cp_async16(smem_addr(st + BK * KCR + r * VLD + cc * 16), vc + off + (valid ? cc * 16 : 0), valid);
      }
      auto rows4 = [&](uint8_t* dst, const uint8_t* src, int row_bytes) {
        const int per = row_bytes / 4;
        for (int idx = lane; idx < BK * per; idx += 32) {
          const int r = idx / per, cc = idx % per;
          bool valid;
          const size_t off = row_off(r, row_bytes, valid);
          cp_async4(smem_addr(dst + r * row_bytes + cc * 4), src + off + (valid ? cc * 4 : 0), valid);
        }
      };
      rows4(st + BK * (KCR + VLD), ka, KAR);
      rows4(st + BK * (KCR + VLD + KAR), va, VAR);
    }
    cp_async_commit();
  };
#pragma unroll
  for (int i = 0; i < NS - 1; ++i) load(i);

  float o[D / 8][4];  // n block n: [0..1] head g (hi rows), [2..3] head g (lo rows), columns 2 c, 2 c + 1
#pragma unroll
  for (int n = 0; n < D / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[n][e] = 0.f;
  float ob[NVS];  // sum of p * V bias, per V segment (affine V)
#pragma unroll
  for (int k = 0; k < NVS; ++k) ob[k] = 0.f;
  float m_run = -INFINITY, l_run = 0.f;

  for (int i = 0; i < mine; ++i) {
    load(i + NS - 1);
    cp_async_wait<NS - 1>();
    __syncwarp();
    uint8_t* st = wst + (i % NS) * kStage;
    uint8_t* vst = st + BK * KCR;
    const uint8_t* kas = st + BK * (KCR + VLD);
    const uint8_t* vas = kas + BK * KAR;
    const int32_t j0 = c0 + (warp + i * kWarps) * BK;
    if (j0 <= p && p < j0 + BK) {  // warp-uniform: the new row as stored
      const int r = p - j0;
      for (int x = lane; x < KCR; x += 32) st[kphys(r, x)] = kq_s[x];
      for (int x = lane; x < VCR; x += 32) vst[r * VLD + x] = vq_s[x];
      for (int x = lane; x < KAR; x += 32) st[BK * (KCR + VLD) + r * KAR + x] = kqa_s[x];
      for (int x = lane; x < VAR; x += 32) st[BK * (KCR + VLD + KAR) + r * VAR + x] = vqa_s[x];
      __syncwarp();
    }
    // S per K group: [k][n][0..1] hi rows, [2..3] lo rows, keys 8 n + 2 c, + 1.
    float s[NKG][2][4];
#pragma unroll
    for (int k = 0; k < NKG; ++k)
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[k][n][e] = 0.f;
    {
      uint32_t w[NKS][2][KRB / 4];  // the lane's runs: all loads first
#pragma unroll
      for (int sg = 0; sg < NKS; ++sg)
#pragma unroll
        for (int n = 0; n < 2; ++n) lds_run<KRB>(st + kphys(n * 8 + g, sg * KQ::kBytes + c * KRB), w[sg][n]);
      // k-step outermost: consecutive mmas go to independent accumulators
      // (the asm is volatile, so the source order is the issue order).
#pragma unroll
      for (int j = 0; j < KSTEPS; ++j)
#pragma unroll
        for (int sg = 0; sg < NKS; ++sg)
#pragma unroll
          for (int n = 0; n < 2; ++n) {
            uint32_t b0, b1;
            k_frag<KS>(w[sg][n], j, b0, b1);
            Mma<F>::mma(s[KQ::kAffine ? sg : 0][n], qf[sg * KSTEPS + j], b0, b1);
          }
    }
    float x[4];  // keys 2 c, 2 c + 1, 8 + 2 c, 9 + 2 c
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int r = n * 8 + 2 * c + e;
        uint32_t par[NKG];
        lds_run<4 * NKG>(kas + r * KAR, par);
        float v = 0.f;
#pragma unroll
        for (int k = 0; k < NKG; ++k) {
          const float part = s[k][n][e] + s[k][n][e + 2];
          if constexpr (KQ::kAffine) {
            v = fmaf(detail::half_lo(par[k]), part - qoff[k], v);
            v = fmaf(detail::half_hi(par[k]), qsum[k], v);
          } else {
            v = __uint_as_float(par[0]) * part;
          }
        }
        v *= a.scale;
        if (a.softcap > 0.f) v = kvgraph::softcap(v, a.softcap);
        x[2 * n + e] = j0 + r < c1 ? v : -INFINITY;
      }
    float pr[4];
    const float corr = mma_softmax_step(x, m_run, l_run, pr);
    if (__any_sync(0xffffffffu, corr != 1.f)) {  // the running max moved for some head
#pragma unroll
      for (int n = 0; n < D / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[n][e] *= corr;
    }
    // P V per V segment: A = p * scale (hi + lo); p * bias on the side.
    uint32_t vpar[4][VAR / 4];  // keys 2 c, 2 c + 1, 8 + 2 c, 9 + 2 c
#pragma unroll
    for (int e = 0; e < 4; ++e) lds_run<VAR>(vas + ((e / 2) * 8 + 2 * c + (e & 1)) * VAR, vpar[e]);
    uint32_t pf[4];
#pragma unroll
    for (int sg = 0; sg < NVS; ++sg) {
      if (VQ::kAffine || sg == 0) {
        float ps[4], pb = 0.f;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if constexpr (VQ::kAffine) {
            ps[e] = pr[e] * detail::half_lo(vpar[e][sg]);
            pb = fmaf(pr[e], detail::half_hi(vpar[e][sg]), pb);
          } else {
            ps[e] = pr[e] * __uint_as_float(vpar[e][0]);
          }
        }
        ob[sg] = fmaf(ob[sg], corr, pb);
        split_pair<F>(ps[0], ps[1], pf[0], pf[1]);
        split_pair<F>(ps[2], ps[3], pf[2], pf[3]);
      }
      uint32_t run[4][VRB >= 4 ? VRB / 4 : 1];
#pragma unroll
      for (int e = 0; e < 4; ++e)
        lds_run<VRB>(vst + ((e / 2) * 8 + 2 * c + (e & 1)) * VLD + sg * VQ::kBytes + g * VRB, run[e]);
      uint32_t lo[VT], hi[VT];
      v_pairs<VS, VT>(run[0], run[1], lo);
      v_pairs<VS, VT>(run[2], run[3], hi);
#pragma unroll
      for (int t = 0; t < VT; ++t) Mma<F>::mma(o[sg * VT + t], pf, lo[t], hi[t]);
    }
    __syncwarp();
  }
  cp_async_wait<0>();
#pragma unroll
  for (int k = 0; k < NVS; ++k) {
    ob[k] += __shfl_xor_sync(0xffffffffu, ob[k], 1);
    ob[k] += __shfl_xor_sync(0xffffffffu, ob[k], 2);
  }
  mma_block_finish<S, D, kMaxG>(
      a, b, reinterpret_cast<float*>(wbase), o, m_run, l_run,
      [&](int n) { return VQ::kAffine ? ob[n / VT] : 0.f; },
      [&](int n, int e) { return (n / VT) * VQ::kDims + (2 * c + e) * VT + n % VT; }, false);
  if (n_chunks > 1) {
    // Two-level merge: the block that completes a group of chunk_group
    // chunks merges them into the group's first slot; the block that
    // completes the last group merges the groups into the output. Most of
    // the merging overlaps other blocks' chunks, and the tail merges at most
    // 32 partials (one level over 128+ chunks took ~15 us alone).
    const int G = a.chunk_group, grp = b.split / G, g0 = grp * G, gn = min(G, n_chunks - g0);
    const int n_groups = (n_chunks + G - 1) / G;
    const int pair = b.h * a.zgroups + b.zg;
    unsigned* group_ctr = a.counters + 2 * a.zgroups * a.Hkv + pair * a.group_slots + grp;
    unsigned* all_ctr = a.counters + pair;
    __shared__ int last_s;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last_s = atomicAdd(group_ctr, 1u) == unsigned(gn - 1);
    __syncthreads();
    if (last_s) {
      __threadfence();
      float* out = n_groups == 1 ? b.out_t + size_t(b.hq0) * D : nullptr;
      merge_slots<kMaxG>(D, a.ws_splits, a.part_o, a.part_ml, b.part_t + b.hq0, b.Gz, g0, gn, 1, out);
      if (threadIdx.x == 0) *group_ctr = 0;
      if (n_groups > 1) {
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0) last_s = atomicAdd(all_ctr, 1u) == unsigned(n_groups - 1);
        __syncthreads();
        if (last_s) {
          __threadfence();
          merge_slots<kMaxG>(D, a.ws_splits, a.part_o, a.part_ml, b.part_t + b.hq0, b.Gz, 0, n_groups, G,
                             b.out_t + size_t(b.hq0) * D);
          if (threadIdx.x == 0) *all_ctr = 0;
        }
      }
    }
  }
  }
}

int group_bucket(int G) { return G >= 5 ? 8 : G >= 3 ? 4 : G; }
// Query heads a block of a several-query step (verify) under the fast
// kernel, automatic: H100, 5-token verify on llama3.1-8b 8.49 -> 8.10 ms
// (2 and 8 within 1%), llama3.2-1b 1.96 -> 1.85; 8 was slower on
// qwen2.5-0.5b (1.86 vs 1.76 ms).
constexpr int kAutoVerifyHeads = 4;

void validate(const AttentionParams& p) {
  const int D = p.head_dim;
  if (D < 8 || D > 256 || (D & (D - 1))) fail_op("attention", "head_dim must be a power of two in [8, 256], got " + std::to_string(D));
  if (p.n_kv_heads <= 0 || p.n_q_heads <= 0 || p.n_q_heads % p.n_kv_heads)
    fail_op("attention", "n_kv_heads must divide n_q_heads");
  if (p.T < 1) fail_op("attention", "T must be >= 1");
  if (p.rule.pool <= 0) fail_op("attention", "empty pool");
  if (p.rule.window > 0 && p.T > p.rule.pool - p.rule.window + 1)
    fail_op("attention", "ring step of " + std::to_string(p.T) + " rows exceeds max_write " +
                             std::to_string(p.rule.pool - p.rule.window + 1));
  if (!p.q || !p.k || !p.v || !p.k_pool || !p.v_pool || !p.out || !p.pos) fail_op("attention", "null pointer");
  if (reinterpret_cast<uintptr_t>(p.k_pool) % 16 || reinterpret_cast<uintptr_t>(p.v_pool) % 16)
    fail_op("attention", "pools must be 16-byte aligned");
  if ((p.k_format.quantized() && !p.k_aux) || (p.v_format.quantized() && !p.v_aux))
    fail_op("attention", "a quantized pool without its scales");
}

template <typename S>
AttnArgs<S> make_args(const AttentionParams& p) {
  AttnArgs<S> a{};
  a.q = p.q;
  a.k = p.k;
  a.v = p.v;
  a.q_stride = p.q_stride ? p.q_stride : int64_t(p.n_q_heads) * p.head_dim;
  a.k_stride = p.k_stride ? p.k_stride : int64_t(p.n_kv_heads) * p.head_dim;
  a.v_stride = p.v_stride ? p.v_stride : int64_t(p.n_kv_heads) * p.head_dim;
  a.k_pool = static_cast<S*>(p.k_pool);
  a.v_pool = static_cast<S*>(p.v_pool);
  a.k_aux = static_cast<const uint8_t*>(p.k_aux);
  a.v_aux = static_cast<const uint8_t*>(p.v_aux);
  a.k_code_row = static_cast<int>(p.k_format.code_bytes(p.head_dim));
  a.v_code_row = static_cast<int>(p.v_format.code_bytes(p.head_dim));
  a.k_aux_row = static_cast<int>(p.k_format.aux_bytes(p.head_dim));
  a.v_aux_row = static_cast<int>(p.v_format.aux_bytes(p.head_dim));
  a.k_group = p.k_format.group;
  a.v_group = p.v_format.group;
  a.out = p.out;
  a.pos = p.pos;
  a.rule = p.rule;
  a.T = p.T;
  a.Hq = p.n_q_heads;
  a.Hkv = p.n_kv_heads;
  a.D = p.head_dim;
  a.G = p.n_q_heads / p.n_kv_heads;
  a.scale = p.scale;
  a.softcap = p.softcap;
  a.q_norm = p.q_norm;
  a.k_norm = p.k_norm;
  a.norm_eps = p.norm_eps;
  a.norm_plus_one = p.norm_plus_one;
  a.inv_freq = p.rope_inv_freq;
  return a;
}

// max_splits: the most splits the layer's span can use. The grid takes no
// more blocks than fit on the GPU at once: a second wave would repeat every
// block's fixed latency (prologue, merge) for little work each (measured on
// the H200, llama3.1-8b at 8K keys: 5.90 -> 5.35 ms/token with 512 blocks of
// 256 keys instead of 1024 of 128).
// Several queries (a.T <= kMaxDecodeQueries): the one-token grid once per
// query, with the one-token kernel's split count (what makes each query's
// sums those of a decode step), partials in rows t * Hq + hq.
template <typename S>
constexpr bool is_16bit = std::is_same_v<S, detail::bf16> || std::is_same_v<S, detail::f16>;

// flash_attend_kernel's head dims (and the staged decode kernel's).
bool flash_head_dim(int D) { return D == 64 || D == 128 || D == 256; }

// Dynamic shared memory of decode_kernel at head dim D (kStaged: plus the tiles).
template <int kMaxG>
size_t decode_smem(int D, bool staged) {
  const int nKG = kThreads / (D / 8);
  return (size_t(kMaxG) * D + 4 * D + D / 2 + size_t(kMaxG) * kTile + size_t(nKG) * kMaxG * D) * sizeof(float) +
         (staged ? staged_tile_bytes(D) : 0);
}

// Lets `kernel` take `bytes` of dynamic shared memory: above 48 KB a kernel
// must opt in (once; callers keep a static flag).
template <typename K>
void allow_smem(K kernel, size_t bytes) {
  if (bytes > 48 * 1024)
    KVGRAPH_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

// Whether `kernel` can run as clusters of `splits` blocks (1 x splits) with
// `smem` bytes each on this GPU (above 8 blocks a cluster needs the
// non-portable opt-in, set here). Asked once per (kernel, splits, bytes).
template <typename K>
bool cluster_fits(K kernel, int splits, size_t smem) {
  static std::mutex mu;
  static std::map<std::tuple<const void*, int, size_t>, bool> known;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(reinterpret_cast<const void*>(kernel), splits, smem);
  if (auto it = known.find(key); it != known.end()) return it->second;
  bool fits = false;
  cudaError_t asked = splits <= 8 ? cudaSuccess
                                  : cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  if (asked == cudaSuccess) {
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(1, static_cast<unsigned>(splits));
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = smem;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = 1;
    attr[0].val.clusterDim.y = static_cast<unsigned>(splits);
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    int clusters = 0;
    asked = cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg);
    fits = asked == cudaSuccess && clusters > 0;
  }
  if (asked != cudaSuccess) (void)cudaGetLastError();  // a refusal is an answer here, not an error to report later
  return known[key] = fits;
}

// A one-token step's split count: as many blocks as fit on the GPU at once
// over its (kv head, head group) pairs, at most max_splits.
template <typename K>
int fitting_grid_splits(K one, size_t smem, int pairs, int max_splits) {
  int per_sm = 0;
  KVGRAPH_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, one, kThreads, smem));
  return std::clamp(per_sm * sm_count() / pairs, 1, max_splits);
}

// The decode grid: (query x kv head x head group, split) with as many splits
// as fit on the GPU at once (occupancy x SMs), at most max_splits. `one`
// serves one-token steps, `multi` steps of several queries (each query's
// split count that of a one-token step).
// clustered: the kernel merges its splits by merge_cluster when the step
// has 2..kMaxClusterSplits of them (Tuning::AttnMerge::cluster), else by
// merge_splits.
template <typename S, typename K>
void launch_decode_grid(K one, K multi, size_t smem, AttnArgs<S> a, int max_splits, const AttentionWorkspace& ws,
                        Launch stream, bool clustered = false) {
  const int pairs = a.zgroups * a.Hkv;
  const int splits = a.one_token_splits > 0 ? a.one_token_splits : fitting_grid_splits(one, smem, pairs, max_splits);
  a.prefetch = ws.tuning().attn_prefetch;
  a.cluster_merge = clustered && ws.tuning().attn_merge == Tuning::AttnMerge::cluster && splits > 1 &&
                    splits <= Tuning::kMaxClusterSplits && cluster_fits(a.T == 1 ? one : multi, splits, smem);
  const dim3 cluster(1, a.cluster_merge ? splits : 1);
  if (a.T == 1) {
    launch_clustered(one, dim3(static_cast<unsigned>(pairs), splits), dim3(kThreads), smem, stream, cluster, a);
    return;
  }
  a.ws_splits = splits;  // rows of `splits` partials (max_splits <= ws.fitting_splits: they fit)
  if (size_t(a.T) * a.Hq * splits * a.D > ws.partial_out_floats() || a.T * pairs > ws.counter_count())
    fail_op("attention", "a step of " + std::to_string(a.T) + " queries needs more split-KV scratch than the "
                         "workspace holds (" + std::to_string(a.Hq) + " heads of dim " + std::to_string(a.D) + ")");
  launch_clustered(multi, dim3(static_cast<unsigned>(a.T * pairs), splits), dim3(kThreads), smem, stream, cluster, a);
}

template <typename S, int kMaxG, bool kStaged>
void launch_decode_as(AttnArgs<S> a, int max_splits, const AttentionWorkspace& ws, Launch stream) {
  if constexpr (kStaged) {  // above 48 KB: opt in once, for the most any head dim needs
    static const bool opted_in = [] {
      const size_t most =
          std::max({decode_smem<kMaxG>(64, true), decode_smem<kMaxG>(128, true), decode_smem<kMaxG>(256, true)});
      allow_smem(decode_kernel<S, kMaxG, false, true>, most);
      allow_smem(decode_kernel<S, kMaxG, true, true>, most);
      return true;
    }();
    (void)opted_in;
  }
  launch_decode_grid(decode_kernel<S, kMaxG, false, kStaged>, decode_kernel<S, kMaxG, true, kStaged>,
                     decode_smem<kMaxG>(a.D, kStaged), a, max_splits, ws, stream, /*clustered=*/true);
}

template <typename S, int D>
void launch_decode_mma_d(const AttnArgs<S>& a, int max_splits, const AttentionWorkspace& ws, Launch stream) {
  constexpr size_t smem = decode_mma_smem<D>();
  static const bool opted_in = [] {
    allow_smem(decode_mma_kernel<S, D, false>, smem);
    allow_smem(decode_mma_kernel<S, D, true>, smem);
    return true;
  }();
  (void)opted_in;
  launch_decode_grid(decode_mma_kernel<S, D, false>, decode_mma_kernel<S, D, true>, smem, a, max_splits, ws, stream);
}

// zgroups must count groups of kMmaHeads query heads.
template <typename S>
void launch_decode_mma(const AttnArgs<S>& a, int max_splits, const AttentionWorkspace& ws, Launch stream) {
  switch (a.D) {
    case 64: launch_decode_mma_d<S, 64>(a, max_splits, ws, stream); break;
    case 128: launch_decode_mma_d<S, 128>(a, max_splits, ws, stream); break;
    default: launch_decode_mma_d<S, 256>(a, max_splits, ws, stream); break;
  }
}

// Whether decode_kernel stages its K/V tiles (cp.async) for this layer.
template <typename S>
bool decode_staged(const AttentionWorkspace& ws, int D) {
  if constexpr (is_16bit<S>) {
    using A = Tuning::DecodeAttn;
    const A mode = ws.tuning().decode_attn;
    return (mode == A::staged || (mode == A::automatic && D == 256)) && flash_head_dim(D);
  }
  return false;
}

template <typename S, int kMaxG>
void launch_decode(AttnArgs<S> a, int max_splits, const AttentionWorkspace& ws, Launch stream) {
  if constexpr (is_16bit<S>) {
    if (decode_staged<S>(ws, a.D)) {
      launch_decode_as<S, kMaxG, true>(a, max_splits, ws, stream);
      return;
    }
  }
  launch_decode_as<S, kMaxG, false>(a, max_splits, ws, stream);
}

// The split count launch_decode_grid gives a one-token step of this layer
// under the fast decode kernel with kMaxG heads a block.
template <typename S, int kMaxG>
int fast_decode_splits(const AttnArgs<S>& a, int max_splits) {
  return fitting_grid_splits(decode_kernel<S, kMaxG, false, false>, decode_smem<kMaxG>(a.D, false),
                             static_cast<int>(ceil_div(a.G, kMaxG)) * a.Hkv, max_splits);
}

// Fewest keys a decode split takes. Automatic (workspace min_chunk 0): about
// 8K key elements per split (128 keys at head_dim 64, 32 at 256), so a block's
// work stays short whatever the head size.
// The tensor-core kernel (mma): at least a sub-tile for each of its warps.
int decode_min_chunk(const AttentionWorkspace& ws, int head_dim, bool mma) {
  if (ws.tuning().attn_chunk > 0) return ws.tuning().attn_chunk;
  if (ws.min_chunk() > 0) return ws.min_chunk();
  return std::max(mma ? kWarps * kMmaKeys : 16, 8192 / head_dim);
}

// Whether a decode step takes decode_mma_kernel (16-bit pools) or
// decode_mma_kernel_q (quantized; head dims 64 and 128): under attn=mma, and
// by default (attn=auto) over spans of more than 2K keys at head dims 64 and
// 128 (H200: llama3.1-8b 7.62 -> 5.75 ms/token at 32K keys, 16.8 -> 9.3 at
// 128K). Head dim 64 lost to the fast kernel until the split merge kept its
// loads in flight (merge_splits: the merge of 49 splits by one block was
// most of the kernel); now H100, llama3.2-1b: 1.283 vs 1.310 ms at 8K keys,
// 1.571 vs 1.846 at 32K. At 256 the staged kernel still wins (gemma3-1b at
// 32K: 1.447 vs 1.628 on the H100). Figures:
// bench/results/h100-2026-12-06-kv-quant.md.
bool decode_on_mma(const AttentionWorkspace& ws, const AttentionParams& p) {
  using A = Tuning::DecodeAttn;
  if (!flash_head_dim(p.head_dim)) return false;
  const A mode = ws.tuning().decode_attn;
  const int32_t span = p.rule.window > 0 ? p.rule.window : p.rule.pool;
  return mode == A::mma || (mode == A::automatic && span > 2048 && (p.head_dim == 64 || p.head_dim == 128));
}

// Query heads per decode block. Measured on the H200 (notes in
// docs/design.md): the per-block critical path grows with the heads a block
// carries much faster than the work does, so short spans (up to 2K visible
// keys, where the re-read K/V rows come from L2) run one head per block; long
// spans share each K/V read between two heads.
int decode_heads(const AttentionWorkspace& ws, const SlotRule& rule) {
  if (ws.tuning().attn_heads > 0) return group_bucket(std::min(ws.tuning().attn_heads, 8));
  const int32_t span = rule.window > 0 ? rule.window : rule.pool;
  return span <= 2048 ? 1 : 2;
}

template <typename S, int kMaxG>
void launch_attend(AttnArgs<S> a, int splits, Launch stream) {
  const size_t smem = (size_t(kMaxG) * a.D * (1 + kWarps) + a.D + size_t(kWarps) * kMaxG * 2) * sizeof(float);
  const int64_t nx = int64_t(a.T) * a.zgroups * a.Hkv;
  launch(attend_kernel<S, kMaxG>, dim3(static_cast<unsigned>(nx), splits), dim3(kThreads), smem, stream, a);
}

// Grid: (query head, tile of kFlashBQ queries). Above 48 KB of shared memory
// (head dim 128 and 256) the kernel opts in once.
template <typename S, int D>
void launch_flash_d(const AttnArgs<S>& a, Launch stream) {
  constexpr size_t smem = FlashShape<D>::kSmem;
  static const bool opted_in = [] {
    allow_smem(flash_attend_kernel<S, D>, smem);
    return true;
  }();
  (void)opted_in;
  launch(flash_attend_kernel<S, D>, dim3(static_cast<unsigned>(a.Hq), ceil_div(a.T, kFlashBQ)),
         dim3(kFlashThreads), smem, stream, a);
}

template <typename S>
void launch_flash(const AttnArgs<S>& a, Launch stream) {
  switch (a.D) {
    case 64: launch_flash_d<S, 64>(a, stream); break;
    case 128: launch_flash_d<S, 128>(a, stream); break;
    default: launch_flash_d<S, 256>(a, stream); break;
  }
}

}  // namespace

// ---------------------------------------------------------------- workspace

AttentionWorkspace::AttentionWorkspace(int max_q_heads, int max_head_dim, int max_splits, int min_chunk)
    : max_q_heads_(max_q_heads), max_head_dim_(max_head_dim), max_splits_(max_splits), min_chunk_(min_chunk) {
  if (max_q_heads < 1 || max_head_dim < 1) fail_op("attention", "bad workspace shape");
  if (max_splits < 1 || max_splits > kMaxSplits)
    fail_op("attention", "max_splits must be in [1, " + std::to_string(kMaxSplits) + "]");
  if (min_chunk < 0) fail_op("attention", "min_chunk must be >= 0 (0: automatic)");
  partial_out_ = DeviceBuffer(partial_out_floats() * sizeof(float));
  // (m, l) pairs and counters for kMaxDecodeQueries queries of max_q_heads heads.
  partial_ml_ = DeviceBuffer(size_t(max_q_heads) * kMaxDecodeQueries * scratch_splits() * 2 * sizeof(float));
  counters_ = DeviceBuffer(size_t(counter_count()) * sizeof(unsigned));
  counters_.zero();
}

int AttentionWorkspace::choose_splits(int n_kv_heads, int64_t max_visible, int min_chunk) {
  const int target_blocks = 2 * sm_count();
  int64_t s = (target_blocks + n_kv_heads - 1) / std::max(n_kv_heads, 1);
  if (min_chunk <= 0) min_chunk = 16;  // automatic: the fewest keys any head dim takes
  const int64_t useful = (max_visible + min_chunk - 1) / min_chunk;
  s = std::min(s, useful);
  return static_cast<int>(std::clamp<int64_t>(s, 1, 64));
}

int AttentionWorkspace::fitting_splits(int n_q_heads, int head_dim) const {
  const size_t per_split = size_t(kMaxDecodeQueries) * n_q_heads;
  const size_t by_out = partial_out_floats() / (per_split * head_dim);
  const size_t by_ml = size_t(max_q_heads_) * kMaxDecodeQueries * scratch_splits() / per_split;
  return static_cast<int>(std::clamp<size_t>(std::min(by_out, by_ml), 1, size_t(max_splits_)));
}

// ---------------------------------------------------------------- entry points

namespace {


// Typed dispatch on the layer's K and V formats: f(tag) with tag float /
// bf16 / f16 (K and V in one plain format) or QKV<KS, VS> (quantized pairs
// with a kernel: one format for both, or K int8 with V int4).
template <typename F>
void dispatch_kv(KvFormat k, KvFormat v, F&& f) {
  using namespace detail;
  if (!k.quantized() && !v.quantized()) {
    if (k.type != v.type) fail_op("attention", kv_cuda_problem(KvStorage{k, v}));
    return dispatch_storage(k.dtype, "attention", f);
  }
  if (k.type == KvType::Int8 && v.type == KvType::Int8) return f(QKV<q8, q8>{});
  if (k.type == KvType::Int4 && v.type == KvType::Int4) return f(QKV<q4, q4>{});
  if (k.type == KvType::Fp8 && v.type == KvType::Fp8) return f(QKV<e4m3, e4m3>{});
  if (k.type == KvType::Int8 && v.type == KvType::Int4) return f(QKV<q8, q4>{});
  fail_op("attention", kv_cuda_problem(KvStorage{k, v}));
}

template <typename S>
void launch_write(const AttnArgs<S>& a, Launch stream) {
  const dim3 grid(static_cast<unsigned>(int64_t(a.T) * a.Hkv));
  if constexpr (is_quant<S>) {
    launch(write_kv_kernel_q<typename S::K, typename S::V>, grid, dim3(64), 0, stream, a);
  } else {
    launch(write_kv_kernel<S>, grid, dim3(64), 0, stream, a);
  }
}

// Dynamic shared memory of decode_kernel_q at head dim D.
template <int kMaxG>
size_t decode_q_smem(int D) {
  const int nKG = kThreads / (D / 8);
  return (size_t(kMaxG) * D + 4 * D + D / 2 + size_t(kMaxG) * 16 + size_t(kMaxG) * kTile + size_t(nKG) * kMaxG * D) *
             sizeof(float) +
         size_t(kTile) * 8 * sizeof(uint32_t) + 2 * size_t(kMaxCodeRow + kMaxAuxRow);
}

template <typename KS, typename VS, int kMaxG>
void launch_decode_q(AttnArgs<detail::QKV<KS, VS>> a, int max_splits, const AttentionWorkspace& ws, Launch stream) {
  // Above 48 KB (8 heads a block at head dim 128 and up) the kernel must opt
  // in, once, for the most any head dim needs.
  static const bool opted_in = [] {
    allow_smem(decode_kernel_q<KS, VS, kMaxG>, std::max(decode_q_smem<kMaxG>(128), decode_q_smem<kMaxG>(256)));
    return true;
  }();
  (void)opted_in;
  launch_decode_grid(decode_kernel_q<KS, VS, kMaxG>, decode_kernel_q<KS, VS, kMaxG>, decode_q_smem<kMaxG>(a.D), a,
                     max_splits, ws, stream, /*clustered=*/true);  // one-token steps only
}

template <typename KS, typename VS, int kMaxG>
void launch_attend_q(AttnArgs<detail::QKV<KS, VS>> a, int splits, Launch stream) {
  const size_t smem = (size_t(kMaxG) * a.D * (1 + kWarps) + size_t(kWarps) * kMaxG * 2) * sizeof(float);
  const int64_t nx = int64_t(a.T) * a.zgroups * a.Hkv;
  launch(attend_kernel_q<KS, VS, kMaxG>, dim3(static_cast<unsigned>(nx), splits), dim3(kThreads), smem, stream, a);
}

template <typename KS, typename VS, int D, int KG, int VG, int kBlocks>
void launch_decode_mma_q_blocks(AttnArgs<detail::QKV<KS, VS>> a, int max_splits, const AttentionWorkspace& ws,
                                Launch stream) {
  constexpr size_t smem = decode_mma_q_smem<KS, VS, D, KG, VG, kBlocks>();
  static const bool opted_in = [] {
    allow_smem(decode_mma_kernel_q<KS, VS, D, KG, VG, kBlocks>, smem);
    return true;
  }();
  (void)opted_in;
  const int pairs = a.zgroups * a.Hkv;
  const int splits = fitting_grid_splits(decode_mma_kernel_q<KS, VS, D, KG, VG, kBlocks>, smem, pairs, max_splits);
  // Chunks, claimed by the blocks as they go: at least one a block, ~1024
  // keys each over long spans, at most what the one-token scratch holds and
  // the two-level merge takes (groups of <= 32 chunks, <= 32 groups).
  // Counters: [pairs) groups merged, [pairs, 2 pairs) claims, then
  // group_slots a pair.
  const int32_t span = a.rule.window > 0 ? a.rule.window : a.rule.pool;
  const int slots = std::min(32, ws.counter_count() / pairs - 2);
  if (slots < 1) fail_op("attention", "workspace has too few counters");
  const size_t cap = std::min({size_t(32) * slots, ws.partial_out_floats() / (size_t(a.Hq) * a.D),
                               size_t(kMaxDecodeQueries) * ws.max_q_heads() * ws.scratch_splits() / a.Hq});
  // ~1024 keys a chunk: at 512 the per-chunk work (the block's merge of its
  // warps, the partial's store, fences and counters) took ~30% of the warps'
  // time; at 2048 the tail grows (H100, llama3.1-8b at 128K keys).
  constexpr size_t kChunkKeys = 1024;
  const int nc = static_cast<int>(
      std::clamp<size_t>(std::max<size_t>(splits, (size_t(span) + kChunkKeys - 1) / kChunkKeys), 1, cap));
  a.ws_splits = nc;
  a.group_slots = slots;
  a.chunk_group =
      std::min(32, std::max((nc + slots - 1) / slots, static_cast<int>(std::lround(std::sqrt(double(nc))))));
  launch(decode_mma_kernel_q<KS, VS, D, KG, VG, kBlocks>, dim3(static_cast<unsigned>(pairs), splits), dim3(kThreads),
         smem, stream, a);
}

// Blocks an SM (registers and stages are sized for it): three for 8-bit
// pools (more warps hide more of each warp's latency: llama3.1-8b int8 KV at
// 128K, 9.69 vs 10.25 ms/token on the H100), two for int4 K and V (its
// stages are small, so two blocks still hold six; 9.13 vs 9.27).
template <typename KS, typename VS, int D, int KG, int VG>
void launch_decode_mma_q_as(AttnArgs<detail::QKV<KS, VS>> a, int max_splits, const AttentionWorkspace& ws,
                            Launch stream) {
  constexpr int kBlocks = std::is_same_v<KS, detail::q4> && std::is_same_v<VS, detail::q4> ? 2 : 3;
  launch_decode_mma_q_blocks<KS, VS, D, KG, VG, kBlocks>(a, max_splits, ws, stream);
}

// Head dims 64 and 128: groups of 32 or 64 (fp8: its row scale), K and V of
// one format in one group size, or K int8 with V int4 in any. False: another
// shape, which decode_kernel_q takes.
template <typename KS, typename VS>
bool launch_decode_mma_q(AttnArgs<detail::QKV<KS, VS>> a, int max_splits, const AttentionWorkspace& ws,
                         Launch stream) {
  constexpr bool ka = detail::QTraits<KS>::kAffine, va = detail::QTraits<VS>::kAffine;
  if ((a.D != 64 && a.D != 128) || (ka && a.k_group != 32 && a.k_group != 64) ||
      (va && a.v_group != 32 && a.v_group != 64))
    return false;
  if constexpr (std::is_same_v<KS, VS> && ka)
    if (a.k_group != a.v_group) return false;
  auto with_d = [&](auto dc) {
    constexpr int D = decltype(dc)::value;
    if constexpr (!ka || !va) {
      static_assert(!ka && !va, "fp8 pairs with fp8 only");
      launch_decode_mma_q_as<KS, VS, D, 128, 128>(a, max_splits, ws, stream);
    } else if constexpr (std::is_same_v<KS, VS>) {
      if (a.k_group == 64) launch_decode_mma_q_as<KS, VS, D, 64, 64>(a, max_splits, ws, stream);
      else launch_decode_mma_q_as<KS, VS, D, 32, 32>(a, max_splits, ws, stream);
    } else {
      auto with_v = [&](auto kgc) {
        constexpr int KG = decltype(kgc)::value;
        if (a.v_group == 64) launch_decode_mma_q_as<KS, VS, D, KG, 64>(a, max_splits, ws, stream);
        else launch_decode_mma_q_as<KS, VS, D, KG, 32>(a, max_splits, ws, stream);
      };
      if (a.k_group == 64) with_v(std::integral_constant<int, 64>{});
      else with_v(std::integral_constant<int, 32>{});
    }
  };
  if (a.D == 64) with_d(std::integral_constant<int, 64>{});
  else with_d(std::integral_constant<int, 128>{});
  return true;
}

template <typename S, int kMaxG>
void launch_decode_any(AttnArgs<S> a, int splits, const AttentionWorkspace& ws, Launch stream) {
  if constexpr (is_quant<S>) {
    launch_decode_q<typename S::K, typename S::V, kMaxG>(a, splits, ws, stream);
  } else {
    launch_decode<S, kMaxG>(a, splits, ws, stream);
  }
}

template <typename S, int kMaxG>
void launch_attend_any(AttnArgs<S> a, int splits, Launch stream) {
  if constexpr (is_quant<S>) {
    launch_attend_q<typename S::K, typename S::V, kMaxG>(a, splits, stream);
  } else {
    launch_attend<S, kMaxG>(a, splits, stream);
  }
}

}  // namespace

void write_kv(const AttentionParams& p, Launch stream) {
  validate(p);
  dispatch_kv(p.k_format, p.v_format, [&](auto tag) { launch_write(make_args<decltype(tag)>(p), stream); });
}

void update_and_attend(const AttentionParams& p, AttentionWorkspace& ws, Launch stream) {
  validate(p);
  const int G = p.n_q_heads / p.n_kv_heads;
  const bool legacy = ws.tuning().decode_attn == Tuning::DecodeAttn::legacy;
  dispatch_kv(p.k_format, p.v_format, [&](auto tag) {
    using S = decltype(tag);
    // Steps of up to kMaxDecodeQueries tokens run each query as a decode step
    // (bitwise: a speculative verify step's rows are decode steps'); longer
    // ones (prefill chunks) go to attend_kernel. Over quantized pools only
    // one-token steps do (decode_kernel_q takes one query).
    const bool decode = !legacy && (is_quant<S> ? p.T == 1 : p.T <= kMaxDecodeQueries);
    bool mma = false;  // decode_mma_kernel(_q): groups of kMmaHeads query heads
    if constexpr (is_16bit<S>) mma = decode && decode_on_mma(ws, p);
    if constexpr (is_quant<S>) mma = decode && (p.head_dim == 64 || p.head_dim == 128) && decode_on_mma(ws, p);
    int bucket = mma ? kMmaHeads : group_bucket(std::min(G, decode ? decode_heads(ws, p.rule) : 8));
    AttnArgs<S> a = make_args<S>(p);
    a.one_token_splits = 0;
    // A several-query step under the fast kernel carries more heads a block
    // than a one-token step (Tuning::verify_heads; automatic: 4, or the
    // one-token step's if more), with the one-token step's split count.
    const int one_bucket = bucket;
    if constexpr (!is_quant<S>) {
      if (decode && !mma && p.T > 1 && !decode_staged<S>(ws, p.head_dim)) {
        const int vh = ws.tuning().verify_heads;
        bucket = vh > 0 ? group_bucket(std::min(G, vh)) : std::max(bucket, group_bucket(std::min(G, kAutoVerifyHeads)));
      }
    }
    a.zgroups = (G + bucket - 1) / bucket;
    int splits = 1;
    if (p.T == 1 || decode) {
      if (p.n_q_heads > ws.max_q_heads() || p.head_dim > ws.max_head_dim())
        fail_op("attention", "workspace too small for " + std::to_string(p.n_q_heads) + " heads of dim " +
                                 std::to_string(p.head_dim));
      // The step's rows are written first when it has several queries (query
      // t reads rows pos .. pos + t - 1 from the pool), and under the legacy
      // kernel over quantized pools (write_kv_kernel_q quantizes them);
      // otherwise the kernel writes the new row itself.
      a.fused_write = p.T == 1 && !(is_quant<S> && legacy);
      if (!a.fused_write) launch_write(a, stream);
      a.min_chunk = decode_min_chunk(ws, p.head_dim, mma);
      // No more splits than the longest visible span can fill: the grid is
      // fixed when a step is recorded, and blocks past the span only exit.
      const int32_t span = p.rule.window > 0 ? p.rule.window : p.rule.pool;
      splits = static_cast<int>(std::min<int64_t>(ws.fitting_splits(p.n_q_heads, p.head_dim),
                                                  (int64_t(span) + a.min_chunk - 1) / a.min_chunk));
      a.ws_splits = splits;  // row stride of the partials (a launch may use fewer splits)
      if constexpr (!is_quant<S>) {
        if (bucket != one_bucket) {
          switch (one_bucket) {
            case 1: a.one_token_splits = fast_decode_splits<S, 1>(a, splits); break;
            case 2: a.one_token_splits = fast_decode_splits<S, 2>(a, splits); break;
            case 4: a.one_token_splits = fast_decode_splits<S, 4>(a, splits); break;
            default: a.one_token_splits = fast_decode_splits<S, 8>(a, splits); break;
          }
        }
      }
      a.part_o = ws.partial_out();
      a.part_ml = ws.partial_ml();
      a.counters = ws.counters();
    } else {
      launch_write(a, stream);
      a.fused_write = false;
      a.min_chunk = 1;
    }
    // Prefill chunks over 16-bit pools at head dim 64/128/256 on the tensor
    // cores when the tuning asks (the rows are written above).
    if constexpr (is_16bit<S>) {
      if (p.T > kMaxDecodeQueries && ws.tuning().prefill_attn == Tuning::PrefillAttn::flash &&
          flash_head_dim(p.head_dim)) {
        launch_flash(a, stream);
        return;
      }
    }
    if constexpr (is_16bit<S>) {
      if (mma) {
        launch_decode_mma(a, splits, ws, stream);
        return;
      }
    }
    if constexpr (is_quant<S>) {
      if (mma && launch_decode_mma_q(a, splits, ws, stream)) return;
    }
    if (decode) {
      switch (bucket) {
        case 1: launch_decode_any<S, 1>(a, splits, ws, stream); break;
        case 2: launch_decode_any<S, 2>(a, splits, ws, stream); break;
        case 4: launch_decode_any<S, 4>(a, splits, ws, stream); break;
        default: launch_decode_any<S, 8>(a, splits, ws, stream); break;
      }
      return;
    }
    switch (bucket) {
      case 1: launch_attend_any<S, 1>(a, splits, stream); break;
      case 2: launch_attend_any<S, 2>(a, splits, stream); break;
      case 4: launch_attend_any<S, 4>(a, splits, stream); break;
      default: launch_attend_any<S, 8>(a, splits, stream); break;
    }
  });
}

}  // namespace kvgraph::cuda
