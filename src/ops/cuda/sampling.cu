// Token selection: argmax and sampling, plus the logit masks they use.
//
// One kernel for both. Every block scans a slice of the logits for the
// maximum (value, lowest index), packed into a u64 and combined with
// atomicMax; the last block to finish reads the winner. Greedy stops there.
// Sampling continues in that last block. Tokens are ranked by decreasing
// logit, ties by increasing id (the CPU backend's order); top-k, top-p and the
// draw each find "the token where the running weight of the ranked tokens
// reaches a target" by a radix selection over order-preserving u32 keys (4
// passes of 8 bits) plus a scan by id among equal keys. Probability masses
// are summed in 32.32 fixed point, so every sum is exact and the result is
// deterministic; the draw uses the CPU backend's counter-based RNG.
#include <string>

#include "ops/cuda/common.cuh"

namespace kvgraph::cuda {
namespace {

constexpr int kSelThreads = 1024;
constexpr int kPerThread = 8;  // logits per thread in the max pass: sizes the grid

struct SelectArgs {
  const float* logits;
  int V;
  const SamplingConfig* config;  // null: greedy
  uint8_t* seen;                 // null: no penalty, nothing marked
  const int32_t* pos;            // RNG counter (sampling only)
  int32_t* token;
  unsigned long long* slot;
  unsigned* counter;
};

// The logits as sampling sees them: repetition penalty applied (HF rule).
struct Logits {
  const float* logits;
  const uint8_t* seen;
  float penalty;
  __device__ __forceinline__ float operator()(int i) const {
    float l = logits[i];
    if (seen != nullptr && penalty != 1.0f && seen[i]) l = l > 0.f ? l / penalty : l * penalty;
    return l;
  }
};

__device__ __forceinline__ unsigned long long pack_max(float v, int i) {
  return (static_cast<unsigned long long>(detail::order_key(v)) << 32) | (0xffffffffu - static_cast<uint32_t>(i));
}

__device__ __forceinline__ unsigned long long warp_max_u64(unsigned long long v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const unsigned long long w = __shfl_xor_sync(0xffffffffu, v, o);
    v = w > v ? w : v;
  }
  return v;
}

__device__ __forceinline__ unsigned long long warp_sum_u64(unsigned long long v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

struct TailShared {
  unsigned long long hist[256];
  unsigned long long red[32];
  uint32_t prefix;
  unsigned long long above;
  int found;
};

// Sum over the block (every thread gets it).
__device__ unsigned long long block_sum_u64(unsigned long long v, TailShared& sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum_u64(v);
  __syncthreads();
  if (lane == 0) sh.red[warp] = v;
  __syncthreads();
  return warp_sum_u64(lane < (kSelThreads >> 5) ? sh.red[lane] : 0ull);
}

// Exclusive prefix sum over the block in thread order; `total` gets the sum.
__device__ unsigned long long block_exclusive_scan_u64(unsigned long long v, unsigned long long& total,
                                                       TailShared& sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  unsigned long long incl = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned long long n = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += n;
  }
  __syncthreads();
  if (lane == 31) sh.red[warp] = incl;
  __syncthreads();
  unsigned long long before = 0, all = 0;
  for (int w = 0; w < (kSelThreads >> 5); ++w) {
    if (w < warp) before += sh.red[w];
    all += sh.red[w];
  }
  total = all;
  return before + incl - v;
}

// Probability mass of logit l in 32.32 fixed point (the maximum weighs 2^32).
struct Mass {
  float mx, temperature;
  __device__ __forceinline__ unsigned long long operator()(float l) const {
    const float w = expf((l - mx) / temperature);
    return __float2ull_rd(w * 4294967296.0f);
  }
};

// Tokens are ranked by a unique 64-bit composite: (order key of the logit,
// then the complement of the id), i.e. by decreasing logit, ties by
// increasing id, exactly the CPU backend's sort order. A set of top tokens is
// "composite >= C" for a threshold C.
__device__ __forceinline__ unsigned long long composite(float l, int i) { return pack_max(l, i); }

// Among tokens with composite >= c_min, the 32-bit key tau such that the
// weight (1 per token, or its mass) of tokens with key > tau is below
// `target` and with key >= tau reaches it. *above gets the weight with key > tau.
template <bool kMass>
__device__ uint32_t radix_select(const Logits& lg, int V, const Mass& mass, unsigned long long c_min,
                                 unsigned long long target, unsigned long long* above_out, TailShared& sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  uint32_t prefix = 0, mask = 0;
  unsigned long long above = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += kSelThreads) sh.hist[b] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < V; i += kSelThreads) {
      const float l = lg(i);
      const uint32_t key = detail::order_key(l);
      if ((key & mask) != prefix || composite(l, i) < c_min) continue;
      atomicAdd(&sh.hist[(key >> shift) & 255u], kMass ? mass(l) : 1ull);
    }
    __syncthreads();
    if (warp == 0) {  // lane l owns bins 255-8l down to 248-8l
      unsigned long long local = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) local += sh.hist[255 - 8 * lane - j];
      unsigned long long incl = local;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const unsigned long long n = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += n;
      }
      const unsigned ballot = __ballot_sync(0xffffffffu, above + incl >= target);
      const int first = ballot ? __ffs(ballot) - 1 : 31;
      if (lane == first) {
        unsigned long long cum = above + incl - local;
        int d = 0;
        for (int j = 0; j < 8; ++j) {
          const int bin = 255 - 8 * lane - j;
          d = bin;
          if (j == 7 || cum + sh.hist[bin] >= target) break;
          cum += sh.hist[bin];
        }
        sh.prefix = prefix | (static_cast<uint32_t>(d) << shift);
        sh.above = cum;
      }
    }
    __syncthreads();
    prefix = sh.prefix;
    above = sh.above;
    mask |= 255u << shift;
    __syncthreads();
  }
  *above_out = above;
  return prefix;
}

// The composite of the token at which the weight of the top tokens (composite
// >= c_min, in rank order) first reaches `target`.
template <bool kMass>
__device__ unsigned long long select_token(const Logits& lg, int V, const Mass& mass, unsigned long long c_min,
                                          unsigned long long target, TailShared& sh) {
  unsigned long long above = 0;
  const uint32_t tau = radix_select<kMass>(lg, V, mass, c_min, target, &above, sh);
  // Among the tokens whose key is tau (ranked by id), the n-th reaches the target.
  const unsigned long long each = kMass ? mass(detail::key_value(tau)) : 1ull;
  const unsigned long long need = target > above ? target - above : 1ull;
  const unsigned long long n = each ? (need + each - 1) / each : 1ull;  // 1-based
  const int per = (V + kSelThreads - 1) / kSelThreads;
  const int b = min(V, int(threadIdx.x) * per), e = min(V, b + per);
  unsigned long long ties = 0;
  for (int i = b; i < e; ++i) {
    const float l = lg(i);
    ties += detail::order_key(l) == tau && composite(l, i) >= c_min;
  }
  unsigned long long total = 0;
  const unsigned long long before = block_exclusive_scan_u64(ties, total, sh);
  if (threadIdx.x == 0) sh.found = -1;
  __syncthreads();
  const unsigned long long want = (n <= total ? n : total) - 1;  // 0-based
  if (ties > 0 && before <= want && want < before + ties) {
    unsigned long long k = before;
    for (int i = b; i < e; ++i) {
      const float l = lg(i);
      if (detail::order_key(l) != tau || composite(l, i) < c_min) continue;
      if (k == want) {
        sh.found = i;
        break;
      }
      ++k;
    }
  }
  __syncthreads();
  const int id = sh.found < 0 ? 0 : sh.found;
  __syncthreads();
  return (static_cast<unsigned long long>(tau) << 32) | (0xffffffffu - static_cast<uint32_t>(id));
}

// Total mass of the tokens with composite >= c_min.
__device__ unsigned long long kept_mass(const Logits& lg, int V, const Mass& mass, unsigned long long c_min,
                                        TailShared& sh) {
  unsigned long long s = 0;
  for (int i = threadIdx.x; i < V; i += kSelThreads) {
    const float l = lg(i);
    if (composite(l, i) >= c_min) s += mass(l);
  }
  return block_sum_u64(s, sh);
}

// The sampling tail, run by the last block only. Returns the token.
__device__ int32_t sample_tail(const Logits& lg, int V, const SamplingConfig& cfg, float mx, int32_t counter,
                               TailShared& sh) {
  const Mass mass{mx, cfg.temperature};
  unsigned long long c = 0;  // keep tokens with composite >= c
  if (cfg.top_k > 0 && cfg.top_k < V) c = select_token<false>(lg, V, mass, 0ull, cfg.top_k, sh);
  unsigned long long Z = kept_mass(lg, V, mass, c, sh);
  if (cfg.top_p < 1.0f) {
    unsigned long long target = static_cast<unsigned long long>(ceil(double(cfg.top_p) * double(Z)));
    target = target < 1 ? 1 : target > Z ? Z : target;
    c = select_token<true>(lg, V, mass, c, target, sh);
    Z = kept_mass(lg, V, mass, c, sh);
  }
  if (Z == 0) return -1;
  const float u = uniform01(cfg.seed, counter);
  unsigned long long r = static_cast<unsigned long long>(double(u) * double(Z));
  if (r >= Z) r = Z - 1;
  const unsigned long long t = select_token<true>(lg, V, mass, c, r + 1, sh);
  return static_cast<int32_t>(0xffffffffu - static_cast<uint32_t>(t & 0xffffffffu));
}

__global__ void __launch_bounds__(kSelThreads) select_kernel(SelectArgs a) {
  __shared__ TailShared sh;
  __shared__ unsigned long long s_best;
  __shared__ int s_last;
  detail::griddep_launch_dependents();
  detail::griddep_wait();

  SamplingConfig cfg;
  if (a.config) cfg = *a.config;
  const Logits lg{a.logits, a.seen, a.config ? cfg.repetition_penalty : 1.0f};

  unsigned long long best = 0;
  for (int i = blockIdx.x * kSelThreads + threadIdx.x; i < a.V; i += gridDim.x * kSelThreads) {
    const unsigned long long k = pack_max(lg(i), i);
    best = k > best ? k : best;
  }
  best = warp_max_u64(best);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) sh.red[warp] = best;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned long long b = 0;
    for (int w = 0; w < (kSelThreads >> 5); ++w) b = sh.red[w] > b ? sh.red[w] : b;
    atomicMax(a.slot, b);
    __threadfence();
    s_last = atomicAdd(a.counter, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!s_last) return;
  if (threadIdx.x == 0) {
    __threadfence();
    s_best = atomicMax(a.slot, 0ull);  // atomic read of the final maximum
    *a.slot = 0;                       // ready for the next call
    *a.counter = 0;
  }
  __syncthreads();
  const int32_t arg = static_cast<int32_t>(0xffffffffu - static_cast<uint32_t>(s_best & 0xffffffffu));
  const float mx = detail::key_value(static_cast<uint32_t>(s_best >> 32));

  int32_t tok = arg;
  if (cfg.temperature > 0.0f && mx > -INFINITY && mx < INFINITY) {
    const int32_t t = sample_tail(lg, a.V, cfg, mx, a.pos ? a.pos[0] : 0, sh);
    if (t >= 0) tok = t;
  }
  // NaN ranks above +inf in the max pass (the device's NaN is positive), so a
  // non-finite maximum means some logit was NaN or +inf: no token (-1).
  if (isnan(mx) || mx == INFINITY) tok = -1;
  if (threadIdx.x == 0) {
    *a.token = tok;
    if (a.seen && tok >= 0) a.seen[tok] = 1;
  }
}

__global__ void mask_kernel(float* logits, int V, const int32_t* ids, int n) {
  detail::griddep_launch_dependents();
  detail::griddep_wait();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n && ids[i] >= 0 && ids[i] < V) logits[ids[i]] = -INFINITY;
}

__global__ void mark_seen_kernel(const int32_t* ids, int n, uint8_t* seen, int V) {
  detail::griddep_launch_dependents();
  detail::griddep_wait();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n && ids[i] >= 0 && ids[i] < V) seen[ids[i]] = 1;
}

void launch_select(const SelectArgs& a, Launch stream) {
  if (a.V < 1) fail_op("sample", "empty vocabulary");
  launch(select_kernel, dim3(ceil_div(a.V, int64_t(kSelThreads) * kPerThread)), dim3(kSelThreads), 0, stream, a);
}

}  // namespace

SelectWorkspace::SelectWorkspace() : buf_(2 * sizeof(unsigned long long)) { buf_.zero(); }

void argmax(const float* logits, int V, int32_t* out_token, SelectWorkspace& ws, Launch stream) {
  launch_select(SelectArgs{logits, V, nullptr, nullptr, nullptr, out_token, ws.slot(), ws.counter()}, stream);
}

void sample(const SampleParams& p, SelectWorkspace& ws, Launch stream) {
  if (!p.logits || !p.config || !p.token) fail_op("sample", "null pointer");
  if (p.n_banned > 0) mask_tokens(p.logits, p.V, p.banned, p.n_banned, stream);
  launch_select(SelectArgs{p.logits, p.V, p.config, p.seen, p.pos, p.token, ws.slot(), ws.counter()}, stream);
}

void mask_tokens(float* logits, int V, const int32_t* ids, int n, Launch stream) {
  launch(mask_kernel, dim3(ceil_div(n, 256)), dim3(256), 0, stream, logits, V, ids, n);
}

void mark_seen(const int32_t* ids, int n, uint8_t* seen, int V, Launch stream) {
  launch(mark_seen_kernel, dim3(ceil_div(n, 256)), dim3(256), 0, stream, ids, n, seen, V);
}

}  // namespace kvgraph::cuda
