// Prefill on affine-quantized weights (MLX's layout, 4 or 8 bits, groups of
// 32, 64 or 128) on the tensor cores: out[T, N] = x[T, K] w[N, K]^T for
// kMaxGemvTokens < T <= kQGemmMaxTokens, with the dequantisation fused into
// the weight stream instead of a bf16 copy of every slab of rows.
//
// A block of 8 warps owns 128 weight rows (16 a warp: the M side of mma.sync
// m16n8k16) and 64 or 128 tokens (8 or 16 n-tiles of 8) over a slice of K.
// Per stage of 64 values of k, cp.async brings the packed weights of the
// stage (128 rows x 32 or 64 bytes) and the bf16 x tile (the tokens x 64)
// into shared memory,
// kStages stages in flight. Each thread dequantises the A fragments it owns
// straight from the packed words, to the bf16 of fmaf(scale, q, bias) (the
// values the slab path gives cuBLAS), and ldmatrix reads the B fragments.
// Scales and biases come from global memory one stage ahead.
//
// Grids too small for the GPU split K over blockIdx.z: each split writes its
// f32 partial tile and a second kernel adds the splits in order, then applies
// the epilogue; otherwise the block applies it. No atomics: the results depend
// only on the shapes.
#include "ops/cuda/qgemm.h"

#include <algorithm>
#include <mutex>

#include "kvgraph/dtype.h"
#include "ops/cuda/async_copy.cuh"
#include "ops/cuda/common.cuh"
#include "ops/cuda/epilogue.cuh"
#include "ops/cuda/mma.cuh"
#include "ops/cuda/runtime.h"

namespace kvgraph::cuda {
namespace {

constexpr int kWarps = 8, kThreads = kWarps * 32;
constexpr int kRows = kWarps * 16;  // weight rows a block
// Tokens a block: 64 (8 n-tiles) up to kWideFrom tokens, else 128: each
// weight is dequantised once per token tile, so wider tiles halve that work
// on long steps (the kernel is ALU-bound), where the grid has blocks enough.
constexpr int kWideFrom = 129;
constexpr int kKS = 64;             // values of k a stage
constexpr int kStages = 4;
constexpr int kLdx = kKS + 8;    // x tile row stride (bf16): 144 bytes, ldmatrix without bank conflicts
constexpr int kLdo = kRows + 4;  // f32 output tile row stride
constexpr int kMaxSplits = 16;

template <int kBits, int kTok>
struct QGemmShape {
  static constexpr int kRowBytes = kKS * kBits / 8;  // a row's packed stage: 32 or 64 bytes
  static constexpr int kLdw = kRowBytes + 16;        // its stride: rows g = 0..7 on distinct banks
  static constexpr int kWBytes = kRows * kLdw;
  static constexpr int kXBytes = kTok * kLdx * 2;
  static constexpr int kStageBytes = kWBytes + kXBytes;  // a multiple of 16
  static constexpr size_t kSmem = std::max<size_t>(size_t(kStages) * kStageBytes, size_t(kTok) * kLdo * 4);
};

template <typename S>
struct QGemmArgs {
  const uint32_t* w;  // [N, K * bits / 32]
  const S* scales;    // [N, K / group]
  const S* biases;
  int group;
  const uint16_t* x;      // bf16 [T, K]
  const S* bias;          // [N] or null
  const float* residual;  // [T, N] or null; may alias out
  float* out;             // [T, N] ([T, N / 2] gated)
  float* partials;        // [splits, T, N] when splits > 1
  int T, N, K, splits;
  bool gated;
  Activation act;
};

// Values k and k + 1 (k even) of a packed row in shared memory, dequantised
// and rounded to bf16 as the slab path does, k in the low half.
template <int kBits>
__device__ __forceinline__ uint32_t dequant_pair(const uint32_t* row, int k, float s, float b) {
  constexpr int kPer = 32 / kBits;
  constexpr uint32_t kMask = (1u << kBits) - 1;
  const uint32_t w = row[k / kPer];
  const int sh = (k % kPer) * kBits;
  // No I2F and one cvt.rn.bf16x2 a pair: the ALU, not the tensor cores,
  // bounded the kernel (~100 TFLOP/s, H100). Round to nearest even, as
  // f32_to_bf16 (the slab path) does for finite values.
  const float q0 = detail::small_uint_to_f32((w >> sh) & kMask);
  const float q1 = detail::small_uint_to_f32((w >> (sh + kBits)) & kMask);
  const __nv_bfloat162 h = __floats2bfloat162_rn(fmaf(s, q0, b), fmaf(s, q1, b));
  uint32_t u;
  memcpy(&u, &h, 4);
  return u;
}

// A thread's scales and biases for one stage, as stored: its two rows (g and
// g + 8 of its warp) by the stage's two halves of 32 values.
template <typename S>
struct StageScales {
  S s[2][2], b[2][2];
};

template <typename S, int kBits, int kTok>
__global__ void __launch_bounds__(kThreads, 2) qgemm_kernel(QGemmArgs<S> a) {
  using Sh = QGemmShape<kBits, kTok>;
  extern __shared__ __align__(16) unsigned char qg_smem[];
  detail::griddep_launch_dependents();
  detail::griddep_wait();

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
  const int tok0 = blockIdx.x * kTok, row0 = blockIdx.y * kRows;
  const int stages = a.K / kKS / a.splits;  // of this block's slice of K
  const int s0 = blockIdx.z * stages;
  const size_t row_bytes = size_t(a.K) * kBits / 8;
  const auto* wbytes = reinterpret_cast<const unsigned char*>(a.w);

  // Stage s of the slice into slot: weights (rows past N zero-filled), then x
  // (tokens past T zero-filled).
  auto load_stage = [&](int s, int slot) {
    unsigned char* base = qg_smem + slot * Sh::kStageBytes;
    const int k0 = (s0 + s) * kKS;
    constexpr int kRowChunks = Sh::kRowBytes / 16;
#pragma unroll
    for (int i = tid; i < kRows * kRowChunks; i += kThreads) {
      const int r = i / kRowChunks, part = i % kRowChunks;
      const bool ok = row0 + r < a.N;
      const unsigned char* src = wbytes + size_t(ok ? row0 + r : 0) * row_bytes + size_t(k0) * kBits / 8 + part * 16;
      cp_async16(smem_addr(base + r * Sh::kLdw + part * 16), src, ok);
    }
    unsigned char* xs = base + Sh::kWBytes;
    constexpr int kTokChunks = kKS / 8;
#pragma unroll
    for (int i = tid; i < kTok * kTokChunks; i += kThreads) {
      const int t = i / kTokChunks, part = i % kTokChunks;
      const bool ok = tok0 + t < a.T;
      const uint16_t* src = a.x + size_t(ok ? tok0 + t : 0) * a.K + k0 + part * 8;
      cp_async16(smem_addr(xs + (t * kLdx + part * 8) * 2), src, ok);
    }
  };

  const int ng = a.K / a.group;
  const int ra = min(row0 + warp * 16 + g, a.N - 1), rb = min(row0 + warp * 16 + g + 8, a.N - 1);
  auto load_scales = [&](int s, StageScales<S>& o) {
    const int k0 = (s0 + s) * kKS;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int gi = (k0 + 32 * h) / a.group;
      o.s[0][h] = a.scales[size_t(ra) * ng + gi];
      o.b[0][h] = a.biases[size_t(ra) * ng + gi];
      o.s[1][h] = a.scales[size_t(rb) * ng + gi];
      o.b[1][h] = a.biases[size_t(rb) * ng + gi];
    }
  };

  // n-tiles of 8 tokens that hold tokens of this block (warp-uniform).
  const int ntiles = min(kTok / 8, (a.T - tok0 + 7) / 8);
  float acc[kTok / 8][4];
#pragma unroll
  for (int i = 0; i < kTok / 8; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < stages) load_stage(s, s);
    cp_async_commit();
  }
  StageScales<S> cur;
  load_scales(0, cur);
  StageScales<S> nxt = cur;
  for (int it = 0; it < stages; ++it) {
    if (it + kStages - 1 < stages) load_stage(it + kStages - 1, (it + kStages - 1) % kStages);
    cp_async_commit();
    if (it + 1 < stages) load_scales(it + 1, nxt);
    cp_async_wait<kStages - 1>();
    __syncthreads();

    const unsigned char* base = qg_smem + (it % kStages) * Sh::kStageBytes;
    const auto* wa = reinterpret_cast<const uint32_t*>(base + (warp * 16 + g) * Sh::kLdw);
    const auto* wb = reinterpret_cast<const uint32_t*>(base + (warp * 16 + g + 8) * Sh::kLdw);
    const uint32_t xs = smem_addr(base + Sh::kWBytes);
#pragma unroll
    for (int j = 0; j < kKS / 16; ++j) {
      const int h = j / 2;
      const float sa = detail::to_f32(cur.s[0][h]), ba = detail::to_f32(cur.b[0][h]);
      const float sb = detail::to_f32(cur.s[1][h]), bb = detail::to_f32(cur.b[1][h]);
      const int klo = 16 * j + 2 * c, khi = klo + 8;
      const uint32_t A[4] = {dequant_pair<kBits>(wa, klo, sa, ba), dequant_pair<kBits>(wb, klo, sb, bb),
                             dequant_pair<kBits>(wa, khi, sa, ba), dequant_pair<kBits>(wb, khi, sb, bb)};
      // ldmatrix x4 over tokens 16i..16i+15: matrices (tokens +0..7, k +0..7),
      // (+0..7, +8..15), (+8..15, +0..7), (+8..15, +8..15): B of n-tiles 2i, 2i + 1.
      const int m = lane >> 3;
      const int trow = (m >> 1) * 8 + (lane & 7), kcol = 16 * j + (m & 1) * 8;
#pragma unroll
      for (int i = 0; i < kTok / 16; ++i) {
        if (2 * i >= ntiles) break;
        uint32_t B[4];
        ldmatrix_x4(B, xs + ((16 * i + trow) * kLdx + kcol) * 2);
        Mma<detail::bf16>::mma(acc[2 * i], A, B[0], B[1]);
        if (2 * i + 1 < ntiles) Mma<detail::bf16>::mma(acc[2 * i + 1], A, B[2], B[3]);
      }
    }
    __syncthreads();  // the slot is refilled by the next iteration
    cur = nxt;
  }
  cp_async_wait<0>();
  __syncthreads();

  // The block's tile through shared memory [token][row], then row pairs of a
  // token to consecutive threads: coalesced stores.
  float* tile = reinterpret_cast<float*>(qg_smem);
  const int r = warp * 16 + g;
#pragma unroll
  for (int i = 0; i < kTok / 8; ++i) {
    if (i >= ntiles) break;
    const int t = 8 * i + 2 * c;
    tile[t * kLdo + r] = acc[i][0];
    tile[(t + 1) * kLdo + r] = acc[i][1];
    tile[t * kLdo + r + 8] = acc[i][2];
    tile[(t + 1) * kLdo + r + 8] = acc[i][3];
  }
  __syncthreads();
  for (int i = tid; i < kTok * kRows / 2; i += kThreads) {
    const int t = i / (kRows / 2), rp = i % (kRows / 2);
    const int tok = tok0 + t, n = row0 + 2 * rp;
    if (tok >= a.T || n >= a.N) continue;
    const float v0 = tile[t * kLdo + 2 * rp], v1 = tile[t * kLdo + 2 * rp + 1];
    if (a.splits > 1) {
      float* p = a.partials + (size_t(blockIdx.z) * a.T + tok) * a.N + n;
      p[0] = v0;
      if (n + 1 < a.N) p[1] = v1;
    } else {
      gemv_epilogue(a, tok, n, v0, v1);
    }
  }
}

// The splits of K added in order (split 0 first), then the epilogue: one
// thread a row pair of a token.
template <typename S>
__global__ void qgemm_reduce_kernel(QGemmArgs<S> a) {
  detail::griddep_launch_dependents();
  detail::griddep_wait();
  const int pairs = (a.N + 1) / 2;
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= int64_t(a.T) * pairs) return;
  const int t = static_cast<int>(i / pairs), n = static_cast<int>(i % pairs) * 2;
  const bool ok1 = n + 1 < a.N;
  float v0 = 0.f, v1 = 0.f;
  for (int z = 0; z < a.splits; ++z) {
    const float* p = a.partials + (size_t(z) * a.T + t) * a.N + n;
    v0 += p[0];
    if (ok1) v1 += p[1];
  }
  gemv_epilogue(a, t, n, v0, v1);
}

// Splits of K: doubled while the grid is under two blocks an SM and each split
// keeps at least 4 whole stages.
int tile_tokens(int T) { return T >= kWideFrom ? 128 : 64; }

int pick_splits(const LinearParams& p) {
  const int64_t blocks = int64_t(ceil_div(p.T, tile_tokens(p.T))) * ceil_div(p.N, kRows);
  const int stages = p.K / kKS;
  int s = 1;
  while (blocks * s < 2 * sm_count() && 2 * s <= kMaxSplits && stages % (2 * s) == 0 && stages / (2 * s) >= 4) s *= 2;
  return s;
}

template <typename S, int kBits, int kTok>
void launch_qgemm_as(const QGemmArgs<S>& a, Launch stream) {
  constexpr size_t kSmem = QGemmShape<kBits, kTok>::kSmem;
  static std::once_flag once;
  std::call_once(once, [] {
    KVGRAPH_CUDA_CHECK(cudaFuncSetAttribute(qgemm_kernel<S, kBits, kTok>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmem)));
  });
  launch(qgemm_kernel<S, kBits, kTok>, dim3(ceil_div(a.T, kTok), ceil_div(a.N, kRows), a.splits), dim3(kThreads),
         kSmem, stream, a);
}

template <typename S, int kBits>
void launch_qgemm(const QGemmArgs<S>& a, Launch stream) {
  if (tile_tokens(a.T) == 128)
    launch_qgemm_as<S, kBits, 128>(a, stream);
  else
    launch_qgemm_as<S, kBits, 64>(a, stream);
}

}  // namespace

bool qgemm_fits(const LinearParams& p) {
  return (p.qbits == 4 || p.qbits == 8) && p.T > kMaxGemvTokens && p.T <= kQGemmMaxTokens && p.K % kKS == 0 &&
         p.N >= 1;
}

size_t qgemm_scratch_bytes(const LinearParams& p) {
  const int s = pick_splits(p);
  return s > 1 ? size_t(s) * size_t(p.T) * size_t(p.N) * 4 : 0;
}

void qgemm(const LinearParams& p, const uint16_t* x_bf16, float* scratch, Launch stream) {
  if (!qgemm_fits(p)) fail_op("linear", "the quantized GEMM does not take this shape");
  dispatch_weight(p.w_dtype, "linear", [&](auto tag) {
    using S = decltype(tag);
    QGemmArgs<S> a{static_cast<const uint32_t*>(p.w),
                   static_cast<const S*>(p.scales),
                   static_cast<const S*>(p.biases),
                   p.group,
                   x_bf16,
                   static_cast<const S*>(p.bias),
                   p.residual,
                   p.out,
                   scratch,
                   p.T,
                   p.N,
                   p.K,
                   pick_splits(p),
                   p.gated,
                   p.act};
    if (a.splits > 1 && !scratch) fail_op("linear", "the quantized GEMM needs scratch for its split of K");
    if (p.qbits == 4)
      launch_qgemm<S, 4>(a, stream);
    else
      launch_qgemm<S, 8>(a, stream);
    if (a.splits > 1)
      launch(qgemm_reduce_kernel<S>, dim3(ceil_div(int64_t(a.T) * ((a.N + 1) / 2), 256)), dim3(256), 0, stream, a);
  });
}

}  // namespace kvgraph::cuda
