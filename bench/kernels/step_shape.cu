// What a decode step's kernel boundaries cost, measured without the model:
// a "step" is L layers of phases that each stream their own bytes (a layer's
// GEMVs and its attention: distinct memory, more than L2 in all) and read one
// value the previous phase wrote (the dependency a real step has). Three
// shapes of the same work, each recorded in a CUDA graph and replayed:
//   kernels      one kernel a phase, 16 KB a block (the FMA GEMV's unit), no PDL;
//   kernels+pdl  the same with programmatic dependent launch: loads issued
//                before griddepcontrol.wait, as kvgraph's kernels do;
//   persistent   one cooperative kernel for the whole step, the phases
//                separated by a grid barrier (a counter and a spin), each
//                block's first unit of the next phase loaded before it waits.
// Against "copy": one kernel streaming the same bytes with no phases. If the
// persistent shape is not clearly faster than kernels+pdl here, a persistent
// decode step (docs/design.md, "per-kernel cost") would not pay.
// Part 2 (session 24): the GEMVs as int4 GEMVs in that kernel shape (a block
// of 4-16 rows x the whole K, every load issued before the PDL wait, ~40-100
// registers, no shared-memory ring): MLX affine codes (groups of 64, bf16
// scale and bias) against an int8 x of 32-value vectors (dp4a), x quantized
// once a GEMV by a one-block kernel before it (or not at all: the bound).
// If these steps run near the copy, a production quantized GEMV of this shape
// is worth building (today's streamed one: llama3.1-8b int4 2.23 ms,
// llama3.2-1b 0.60 on an H100, lm_head and embedding included).
// Measured (H100, session 25, bench/results/h100-2026-12-08-step-shape2.txt):
// x ready 1.454 / 0.266 ms, with the one-block prep 2.105 / 0.444: making x
// is the cost. Added then, not yet run: the prep over the whole grid (the
// shape of linear.cu's xprep_kernel behind --tune qgemv=blocks) and no prep
// at all, each GEMV quantizing its own output for the next (what folding
// x's quantization into the producers would give).
//   nvcc -O3 -std=c++17 -arch=sm_90 bench/kernels/step_shape.cu -o build/step_shape && build/step_shape
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#define CHECK(x)                                                                                   \
  do {                                                                                             \
    cudaError_t e_ = (x);                                                                          \
    if (e_ != cudaSuccess) {                                                                       \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));    \
      std::exit(1);                                                                                \
    }                                                                                              \
  } while (0)

constexpr int kThreads = 128, kLoads = 8;                  // 8 x 16 B a thread in flight
constexpr size_t kUnit = size_t(kThreads) * kLoads * 16;   // 16 KB a block unit

struct Phase {
  const uint4* w;   // its bytes
  size_t units;     // of kUnit
  float* out;       // one float a unit
  const float* in;  // the previous phase's out (or null)
  size_t in_n;
};

__device__ __forceinline__ uint4 ldg_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

struct Regs {
  uint4 v[kLoads];
  __device__ void load(const uint4* w, size_t unit) {
    const uint4* p = w + unit * (kUnit / 16) + threadIdx.x;
#pragma unroll
    for (int i = 0; i < kLoads; ++i) v[i] = ldg_stream(p + i * kThreads);
  }
  __device__ float sum(float x) const {
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < kLoads; ++i)
      s += __uint_as_float(v[i].x & 0x3fffffffu) + __uint_as_float(v[i].y & 0x3fffffffu) +
           __uint_as_float(v[i].z & 0x3fffffffu) + __uint_as_float(v[i].w & 0x3fffffffu);
    return s * x;
  }
};

__device__ float block_sum(float s) {
  __shared__ float part[kThreads / 32];
  for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  __syncthreads();
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = s;
  __syncthreads();
  float t = 0.f;
  for (int i = 0; i < kThreads / 32; ++i) t += part[i];
  return t;
}

__device__ float input_of(const Phase& ph, size_t unit) {
  return ph.in ? 1.f + 1e-30f * ph.in[unit % ph.in_n] : 1.f;
}

// One phase, one unit a block.
template <bool kPdl>
__global__ void __launch_bounds__(kThreads) phase_kernel(Phase ph) {
  Regs r;
  r.load(ph.w, blockIdx.x);
  if (kPdl) {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");
  }
  const float s = block_sum(r.sum(input_of(ph, blockIdx.x)));
  if (threadIdx.x == 0) ph.out[blockIdx.x] = s;
}

// The whole step: phases [0, n), a grid barrier between two.
__device__ void grid_barrier(unsigned* count, unsigned target) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(count, 1u);
    unsigned seen;
    do {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(count));
    } while (seen < target);
  }
  __syncthreads();
}

__global__ void __launch_bounds__(kThreads) persistent_kernel(const Phase* phases, int n, unsigned* count,
                                                              bool prefetch) {
  const size_t G = gridDim.x;
  Regs r;
  bool have = false;
  for (int p = 0; p < n; ++p) {
    const Phase ph = phases[p];
    if (p > 0) {
      if (prefetch && blockIdx.x < ph.units) {
        r.load(ph.w, blockIdx.x);  // weights do not depend on the barrier
        have = true;
      }
      grid_barrier(count, unsigned(p) * unsigned(G));
    }
    for (size_t u = blockIdx.x; u < ph.units; u += G) {
      if (!have) r.load(ph.w, u);
      have = false;
      const float s = block_sum(r.sum(input_of(ph, u)));
      if (threadIdx.x == 0) ph.out[u] = s;
    }
  }
}

__global__ void __launch_bounds__(kThreads) copy_kernel(const uint4* w, size_t units, float* out) {
  for (size_t u = blockIdx.x; u < units; u += gridDim.x) {
    Regs r;
    r.load(w, u);
    const float s = r.sum(1.f);
    if (s == 12345.f) out[0] = s;  // never: keeps the loads
  }
}

// kernel<<<grid, block, 0, st>>>(args...) with one launch attribute:
// programmatic dependent launch (PDL), cooperative, or none.
enum class Attr { none, pdl, cooperative };
template <typename... P, typename... A>
void launch_ex(void (*kernel)(P...), dim3 grid, dim3 block, cudaStream_t st, Attr attr, A... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.stream = st;
  cudaLaunchAttribute at[1];
  if (attr == Attr::pdl) {
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
  } else {
    at[0].id = cudaLaunchAttributeCooperative;
    at[0].val.cooperative = 1;
  }
  cfg.attrs = at;
  cfg.numAttrs = attr == Attr::none ? 0 : 1;
  CHECK(cudaLaunchKernelEx(&cfg, kernel, P(args)...));
}

// What launches(st) enqueues, recorded as a graph and instantiated.
template <typename F>
cudaGraphExec_t record_graph(cudaStream_t st, F launches) {
  cudaGraph_t g;
  CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  launches();
  CHECK(cudaStreamEndCapture(st, &g));
  cudaGraphExec_t ge;
  CHECK(cudaGraphInstantiate(&ge, g, 0));
  CHECK(cudaGraphDestroy(g));
  return ge;
}

double time_graph(cudaGraphExec_t ge, cudaStream_t st, int reps) {
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) CHECK(cudaGraphLaunch(ge, st));
  std::vector<float> ms;
  for (int i = 0; i < reps; ++i) {
    CHECK(cudaEventRecord(a, st));
    CHECK(cudaGraphLaunch(ge, st));
    CHECK(cudaEventRecord(b, st));
    CHECK(cudaEventSynchronize(b));
    float t = 0.f;
    CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  CHECK(cudaEventDestroy(a));
  CHECK(cudaEventDestroy(b));
  return double(ms[ms.size() / 2]);
}

// ---------------------------------------------------------------- part 2: int4 GEMVs

struct X8 {
  int* q;        // [K/4]: per 8 values, the codes of x0 x2 x4 x6, then x1 x3 x5 x7 (dp4a order)
  float* scale;  // [K/32]
  float* sum;    // [K/32]: the vector's float sum (for the biases)
  float* ss;     // [1]: sum of squares (the norm's)
};

struct QPhase {
  const uint4* codes;  // [N][K/32]: 32 codes a vector, 8 a word, low nibble first
  const uint16_t* scales;  // [N][K/64] bf16
  const uint16_t* biases;
  int N, K;
  bool attn;       // a plain streaming phase (attention) of `units` instead
  Phase plain;
  float* out;      // [N]
};

__device__ __forceinline__ float bf16f(uint16_t b) { return __uint_as_float(uint32_t(b) << 16); }
__device__ __forceinline__ int dp4a_us(uint32_t a, int b, int c) {
  int d;
  asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

__device__ __forceinline__ void quantize_lane(float val, int v, int lane, X8 x);

// Rows [blockIdx.x R, + R) x the whole K; thread t: vectors t, t + blockDim, ...
// (VPT of them) of each row, all loaded before the PDL wait.
template <int R, int VPT, bool kFold = false>
__global__ void __launch_bounds__(256) qgemv_shape_kernel(QPhase p, X8 x, X8 xo, unsigned* cnt) {
  const int nvec = p.K / 32, ng = p.K / 64, n0 = blockIdx.x * R;
  uint4 w[R][VPT];
  uint16_t sc[R][VPT], bi[R][VPT];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
      const int v = threadIdx.x + j * blockDim.x;
      const size_t row = size_t(min(n0 + r, p.N - 1));
      w[r][j] = ldg_stream(p.codes + row * nvec + v);
      sc[r][j] = __ldg(p.scales + row * ng + v / 2);
      bi[r][j] = __ldg(p.biases + row * ng + v / 2);
    }
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  asm volatile("griddepcontrol.wait;" ::: "memory");
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.f;
#pragma unroll
  for (int j = 0; j < VPT; ++j) {
    const int v = threadIdx.x + j * blockDim.x;
    const int4 xa = reinterpret_cast<const int4*>(x.q)[2 * v], xb = reinterpret_cast<const int4*>(x.q)[2 * v + 1];
    const int xw[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
    const float xs = x.scale[v], xsum = x.sum[v];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const uint32_t wd[4] = {w[r][j].x, w[r][j].y, w[r][j].z, w[r][j].w};
      int isum = 0;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        isum = dp4a_us(wd[i] & 0x0F0F0F0Fu, xw[2 * i], isum);
        isum = dp4a_us((wd[i] >> 4) & 0x0F0F0F0Fu, xw[2 * i + 1], isum);
      }
      acc[r] = fmaf(bf16f(sc[r][j]) * xs, float(isum), fmaf(bf16f(bi[r][j]), xsum, acc[r]));
    }
  }
  __shared__ float red[8][R];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    float s = acc[r];
    for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) red[warp][r] = s;
  }
  __syncthreads();
  if (threadIdx.x < R && n0 + int(threadIdx.x) < p.N) {
    float t = 0.f;
    for (int i = 0; i < int(blockDim.x / 32); ++i) t += red[i][threadIdx.x];
    p.out[n0 + threadIdx.x] = t * rsqrtf(x.ss[0] / p.K + 1e-5f);
    if constexpr (kFold) __threadfence();
  }
  if constexpr (kFold) {
    // The next GEMV's x made here: the last of the 32 / R blocks that write
    // a 32-output vector (a counter a vector, reset by that block) quantizes
    // it, with one warp, as xprep_grid_kernel does.
    __shared__ unsigned ticket;
    __syncthreads();
    if (threadIdx.x == 0) ticket = atomicAdd(cnt + n0 / 32, 1u);
    __syncthreads();
    if (ticket == 32 / R - 1 && threadIdx.x < 32) {
      __threadfence();
      const int v = n0 / 32;
      const float val = __ldcg(p.out + v * 32 + lane);
      quantize_lane(val, v, lane, xo);
      if (lane == 0) cnt[v] = 0;
    }
  }
}

// Value `lane` of vector v (val) into X8 (a warp a vector): absmax / 127 per
// vector, the code stored as a byte in dp4a order, scale, sum and the
// vector's sum of squares (x.ss[1 + v]) by lane 0.
__device__ __forceinline__ void quantize_lane(float val, int v, int lane, X8 x) {
  float m = fabsf(val), sum = val, ss = val * val;
  for (int o = 16; o; o >>= 1) {
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    sum += __shfl_xor_sync(0xffffffffu, sum, o);
    ss += __shfl_xor_sync(0xffffffffu, ss, o);
  }
  const float rs = m > 0.f ? 127.f / m : 0.f;
  const int j = lane % 8;
  reinterpret_cast<int8_t*>(x.q)[v * 32 + lane - j + (j & 1) * 4 + j / 2] = int8_t(__float2int_rn(val * rs));
  if (lane == 0) {
    x.scale[v] = m / 127.f;
    x.sum[v] = sum;
    x.ss[1 + v] = ss;
  }
}

// x of K values (src, and one value of the previous phase: the dependency)
// to X8 by the whole grid, a thread a value (linear.cu's xprep_kernel).
__global__ void __launch_bounds__(256) xprep_grid_kernel(const float* src, const float* prev, int K, X8 x) {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  asm volatile("griddepcontrol.wait;" ::: "memory");
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  const float val = i < K ? src[i] + 1e-30f * prev[0] : 0.f;
  if (i - int(threadIdx.x % 32) < K) quantize_lane(val, i / 32, int(threadIdx.x % 32), x);
}

// x of K values (src, and one value of the previous phase: the dependency)
// to X8, with its sum of squares: one block of 1024 threads.
__global__ void __launch_bounds__(1024) xprep_kernel(const float* src, const float* prev, int K, X8 x) {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  asm volatile("griddepcontrol.wait;" ::: "memory");
  const float bump = 1e-30f * prev[0];
  float ss = 0.f;
  const int nvec = K / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int v = warp; v < nvec; v += blockDim.x / 32) {  // a warp a vector, a lane a value
    const float val = src[v * 32 + lane] + bump;
    ss += val * val;
    float m = fabsf(val), sum = val;
    for (int o = 16; o; o >>= 1) {
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
      sum += __shfl_xor_sync(0xffffffffu, sum, o);
    }
    const float scale = m > 0.f ? m / 127.f : 1.f;
    const int q = __float2int_rn(val / scale) & 0xff;
    // Word i of the vector (lanes i < 8 write it): bytes k = 0..3 are the
    // codes of values 8 (i / 2) + 2 k + (i & 1).
    const int i = lane % 8;
    unsigned packed = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k)
      packed |= unsigned(__shfl_sync(0xffffffffu, q, 8 * (i / 2) + 2 * k + (i & 1))) << (8 * k);
    if (lane < 8) x.q[v * 8 + lane] = int(packed);
    if (lane == 0) {
      x.scale[v] = scale;
      x.sum[v] = sum;
    }
  }
  __shared__ float part[32];
  for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if (lane == 0) part[warp] = ss;
  __syncthreads();
  if (threadIdx.x == 0) {
    float t = 0.f;
    for (int i = 0; i < int(blockDim.x / 32); ++i) t += part[i];
    x.ss[0] = t;
  }
}

struct QShape {
  const char* name;
  std::vector<std::pair<int, int>> gemvs;  // (N, K); (0, MB x 10) = a plain attention phase
  int layers;
  double ref_ms;  // kvgraph's int4 step on an H100 (lm_head and embedding included)
};

void run_int4(int sms, int reps, cudaStream_t st) {
  (void)sms;
  const std::vector<QShape> shapes = {
      {"llama3.1-8b int4 g64", {{6144, 4096}, {0, 21}, {4096, 4096}, {28672, 4096}, {4096, 14336}}, 32, 2.23},
      {"llama3.2-1b int4 g64", {{3072, 2048}, {0, 10}, {2048, 2048}, {16384, 2048}, {2048, 8192}}, 16, 0.60},
  };
  for (const QShape& sh : shapes) {
    size_t code_bytes = 0, aux = 0, plain_units = 0, outs_n = 0;
    for (auto [N, K] : sh.gemvs) {
      if (N == 0) plain_units += size_t(K * 1e5 / kUnit + 0.5);
      code_bytes += size_t(N) * K / 2;
      aux += size_t(N) * (K / 64);
      outs_n += size_t(N > 0 ? N : 1);
    }
    code_bytes *= sh.layers;
    aux *= sh.layers;
    plain_units *= sh.layers;
    outs_n *= sh.layers;
    char* codes = nullptr;
    uint16_t *scales = nullptr, *biases = nullptr;
    uint4* plain = nullptr;
    float *outs = nullptr, *src = nullptr;
    X8 x{};
    const size_t slack = 4 * aux + kUnit;  // mode 0 streams a phase's scale bytes past its codes
    CHECK(cudaMalloc(&codes, code_bytes + slack));
    CHECK(cudaMemset(codes, 0x5a, code_bytes + slack));
    CHECK(cudaMalloc(&scales, aux * 2));
    CHECK(cudaMalloc(&biases, aux * 2));
    CHECK(cudaMemset(scales, 0x3c, aux * 2));
    CHECK(cudaMemset(biases, 0x3c, aux * 2));
    CHECK(cudaMalloc(&plain, plain_units * kUnit));
    CHECK(cudaMemset(plain, 0x11, plain_units * kUnit));
    CHECK(cudaMalloc(&outs, outs_n * sizeof(float)));
    CHECK(cudaMemset(outs, 0, outs_n * sizeof(float)));
    CHECK(cudaMalloc(&src, 16384 * sizeof(float)));
    CHECK(cudaMemset(src, 0x3e, 16384 * sizeof(float)));
    CHECK(cudaMalloc(&x.q, 16384));
    CHECK(cudaMalloc(&x.scale, 512 * sizeof(float)));
    CHECK(cudaMalloc(&x.sum, 512 * sizeof(float)));
    CHECK(cudaMalloc(&x.ss, 1025 * sizeof(float)));  // [0]: the norm's; [1 + v]: per vector (grid-wide prep)
    X8 xo{};  // what the producer-folded GEMVs write (mode 5): up to 1024 vectors
    unsigned* cnt = nullptr;
    CHECK(cudaMalloc(&xo.q, 32768));
    CHECK(cudaMalloc(&xo.scale, 1024 * sizeof(float)));
    CHECK(cudaMalloc(&xo.sum, 1024 * sizeof(float)));
    CHECK(cudaMalloc(&xo.ss, 1025 * sizeof(float)));
    CHECK(cudaMalloc(&cnt, 1024 * sizeof(unsigned)));
    CHECK(cudaMemset(cnt, 0, 1024 * sizeof(unsigned)));
    CHECK(cudaMemset(x.q, 0x01, 16384));
    CHECK(cudaMemset(x.scale, 0x3c, 512 * sizeof(float)));
    CHECK(cudaMemset(x.sum, 0x3c, 512 * sizeof(float)));
    CHECK(cudaMemset(x.ss, 0x3f, sizeof(float)));
    std::vector<QPhase> ph;
    size_t co = 0, ao = 0, po = 0, oo = 0;
    for (int l = 0; l < sh.layers; ++l)
      for (auto [N, K] : sh.gemvs) {
        QPhase q{};
        q.out = outs + oo;
        if (N == 0) {
          q.attn = true;
          q.plain.w = plain + po * (kUnit / 16);
          q.plain.units = size_t(K * 1e5 / kUnit + 0.5);
          q.plain.out = q.out;
          q.plain.in = ph.empty() ? nullptr : ph.back().out;
          q.plain.in_n = 1;
          po += q.plain.units;
          oo += 1;
        } else {
          q.codes = reinterpret_cast<const uint4*>(codes + co);
          q.scales = scales + ao;
          q.biases = biases + ao;
          q.N = N;
          q.K = K;
          co += size_t(N) * K / 2;
          ao += size_t(N) * (K / 64);
          oo += N;
        }
        ph.push_back(q);
      }
    const double bytes = double(code_bytes) + 4.0 * double(aux) + double(plain_units) * kUnit;
    // mode 0: copy-shaped plain kernels over the same bytes; 1: int4 GEMVs, x
    // ready; 2: a one-block prep kernel before each; 3: as 2 with twice the
    // rows a block; 4: a grid-wide prep kernel (a thread a value, as linear.cu's
    // xprep_kernel) before each; 5: no prep kernel, each GEMV quantizing its own
    // output for the next (a counter a 32-output vector, the last block of it
    // quantizes; attention's output taken as made by attention for free).
    auto launch_pdl = [&](auto kernel, dim3 grid, dim3 block, auto... args) {
      launch_ex(kernel, grid, block, st, Attr::pdl, args...);
    };
    auto record = [&](int mode) {
      return record_graph(st, [&] {
        const float* prev = outs;
        for (const QPhase& q : ph) {
          if (q.attn) {
            launch_pdl(phase_kernel<true>, dim3(unsigned(q.plain.units)), dim3(kThreads), q.plain);
          } else if (mode == 0) {
            Phase p{};
            p.w = q.codes;
            p.units = (size_t(q.N) * q.K / 2 + 4 * size_t(q.N) * (q.K / 64)) / kUnit;
            p.out = q.out;
            launch_pdl(phase_kernel<true>, dim3(unsigned(p.units)), dim3(kThreads), p);
          } else {
            if (mode == 2 || mode == 3) launch_pdl(xprep_kernel, dim3(1), dim3(1024), src, prev, q.K, x);
            if (mode == 4) launch_pdl(xprep_grid_kernel, dim3(unsigned((q.K + 255) / 256)), dim3(256), src, prev, q.K, x);
            const int nvec = q.K / 32;
            const bool two = nvec > 128;
            const int threads = two ? nvec / 2 : nvec;
            if (mode == 3) {
              if (two) launch_pdl(qgemv_shape_kernel<8, 2>, dim3(unsigned(q.N / 8)), dim3(threads), q, x, xo, cnt);
              else launch_pdl(qgemv_shape_kernel<16, 1>, dim3(unsigned(q.N / 16)), dim3(threads), q, x, xo, cnt);
            } else if (mode == 5) {
              if (two) launch_pdl(qgemv_shape_kernel<4, 2, true>, dim3(unsigned(q.N / 4)), dim3(threads), q, x, xo, cnt);
              else launch_pdl(qgemv_shape_kernel<8, 1, true>, dim3(unsigned(q.N / 8)), dim3(threads), q, x, xo, cnt);
            } else {
              if (two) launch_pdl(qgemv_shape_kernel<4, 2>, dim3(unsigned(q.N / 4)), dim3(threads), q, x, xo, cnt);
              else launch_pdl(qgemv_shape_kernel<8, 1>, dim3(unsigned(q.N / 8)), dim3(threads), q, x, xo, cnt);
            }
          }
          prev = q.out;
        }
      });
    };
    std::printf("\n%s: %d layers x %zu phases (4 int4 GEMVs, attention as a plain stream), %.0f MB a step;"
                " kvgraph today %.2f ms (H100, with lm_head)\n", sh.name, sh.layers, sh.gemvs.size(), bytes / 1e6, sh.ref_ms);
    const char* names[] = {"copy-shaped kernels+pdl", "int4 GEMVs, x ready", "int4 GEMVs + x prep kernel",
                           "int4 GEMVs (2x rows) + x prep", "int4 GEMVs + grid-wide x prep",
                           "int4 GEMVs, x made by the producer"};
    for (int mode = 0; mode < 6; ++mode) {
      cudaGraphExec_t ge = record(mode);
      const double ms = time_graph(ge, st, reps);
      CHECK(cudaGraphExecDestroy(ge));
      std::printf("  %-32s %8.3f ms  %6.0f GB/s\n", names[mode], ms, bytes / ms / 1e6);
    }
    CHECK(cudaDeviceSynchronize());
    for (void* p : {(void*)codes, (void*)scales, (void*)biases, (void*)plain, (void*)outs, (void*)src, (void*)x.q,
                    (void*)x.scale, (void*)x.sum, (void*)x.ss, (void*)xo.q, (void*)xo.scale, (void*)xo.sum,
                    (void*)xo.ss, (void*)cnt})
      CHECK(cudaFree(p));
  }
}

struct Shape {
  const char* name;
  std::vector<double> mb;  // a layer's phases
  int layers;
};

int main(int argc, char** argv) {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s, %d SMs\n", prop.name, sms);
  const int reps = argc > 1 ? std::atoi(argv[1]) : 30;
  const std::vector<Shape> shapes = {
      {"llama3.1-8b int4 g64 (qkv, attn, o, gate_up, down)", {14.2, 2.1, 9.4, 66.1, 33.0}, 32},
      {"llama3.2-1b int4 g64", {3.5, 1.0, 2.4, 16.8, 8.4}, 16},
      {"llama3.2-1b bf16", {12.6, 1.0, 8.4, 67.1, 33.6}, 16},
      {"llama3.1-8b bf16", {50.3, 2.1, 33.6, 234.9, 117.4}, 32},
  };
  cudaStream_t st;
  CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  int per_sm = 0;
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, persistent_kernel, kThreads, 0));
  std::printf("persistent: %d blocks an SM resident\n", per_sm);
  for (const Shape& sh : shapes) {
    std::vector<Phase> ph;
    size_t total_units = 0;
    for (int l = 0; l < sh.layers; ++l)
      for (double mb : sh.mb) total_units += size_t(mb * 1e6 / kUnit + 0.5);
    uint4* w = nullptr;
    float* outs = nullptr;
    unsigned* count = nullptr;
    CHECK(cudaMalloc(&w, total_units * kUnit));
    CHECK(cudaMemset(w, 0x11, total_units * kUnit));
    CHECK(cudaMalloc(&outs, total_units * sizeof(float)));
    CHECK(cudaMalloc(&count, sizeof(unsigned)));
    size_t off = 0;
    for (int l = 0; l < sh.layers; ++l)
      for (double mb : sh.mb) {
        Phase p{};
        p.w = w + off * (kUnit / 16);
        p.units = size_t(mb * 1e6 / kUnit + 0.5);
        p.out = outs + off;
        p.in = ph.empty() ? nullptr : ph.back().out;
        p.in_n = ph.empty() ? 1 : ph.back().units;
        off += p.units;
        ph.push_back(p);
      }
    Phase* dph = nullptr;
    CHECK(cudaMalloc(&dph, ph.size() * sizeof(Phase)));
    CHECK(cudaMemcpy(dph, ph.data(), ph.size() * sizeof(Phase), cudaMemcpyHostToDevice));
    const double bytes = double(total_units) * kUnit;

    auto record = [&](int mode, int blocks_per_sm) {  // 0 copy, 1 kernels, 2 kernels+pdl, 3/4 persistent (+prefetch)
      return record_graph(st, [&] {
        if (mode == 0) {
          copy_kernel<<<sms * 8, kThreads, 0, st>>>(w, total_units, outs);
        } else if (mode <= 2) {
          for (const Phase& p : ph)
            launch_ex(mode == 2 ? phase_kernel<true> : phase_kernel<false>, dim3(unsigned(p.units)), dim3(kThreads),
                      st, mode == 2 ? Attr::pdl : Attr::none, p);
        } else {
          CHECK(cudaMemsetAsync(count, 0, sizeof(unsigned), st));
          launch_ex(persistent_kernel, dim3(unsigned(sms * blocks_per_sm)), dim3(kThreads), st, Attr::cooperative,
                    (const Phase*)dph, int(ph.size()), count, mode == 4);
        }
      });
    };
    auto time = [&](cudaGraphExec_t ge) { return time_graph(ge, st, reps); };
    std::printf("\n%s: %d layers x %zu phases, %.0f MB a step\n", sh.name, sh.layers, sh.mb.size(), bytes / 1e6);
    double copy_ms = 0.;
    struct V {
      const char* name;
      int mode, bps;
    };
    const V vs[] = {{"copy (no phases)", 0, 0},       {"kernels", 1, 0},
                    {"kernels+pdl", 2, 0},            {"persistent 4/SM", 3, std::min(per_sm, 4)},
                    {"persistent 4/SM+prefetch", 4, std::min(per_sm, 4)},
                    {"persistent 8/SM+prefetch", 4, std::min(per_sm, 8)},
                    {"persistent 16/SM+prefetch", 4, std::min(per_sm, 16)}};
    for (const V& v : vs) {
      cudaGraphExec_t ge = record(v.mode, v.bps);
      const double ms = time(ge);
      CHECK(cudaGraphExecDestroy(ge));
      if (v.mode == 0) copy_ms = ms;
      const double over = (ms - copy_ms) * 1e3 / double(ph.size());
      std::printf("  %-28s %8.3f ms  %6.0f GB/s  %+6.2f us a phase over copy\n", v.name, ms, bytes / ms / 1e6,
                  v.mode == 0 ? 0. : over);
    }
    CHECK(cudaFree(dph));
    CHECK(cudaFree(count));
    CHECK(cudaFree(outs));
    CHECK(cudaFree(w));
  }
  if (argc <= 2 || std::string(argv[2]) != "plain") run_int4(sms, reps, st);
  return 0;
}
