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
      cudaGraph_t g;
      CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
      if (mode == 0) {
        copy_kernel<<<sms * 8, kThreads, 0, st>>>(w, total_units, outs);
      } else if (mode <= 2) {
        for (const Phase& p : ph) {
          cudaLaunchConfig_t cfg{};
          cfg.gridDim = dim3(unsigned(p.units));
          cfg.blockDim = dim3(kThreads);
          cfg.stream = st;
          cudaLaunchAttribute at[1];
          at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
          at[0].val.programmaticStreamSerializationAllowed = 1;
          cfg.attrs = at;
          cfg.numAttrs = mode == 2 ? 1 : 0;
          if (mode == 2)
            CHECK(cudaLaunchKernelEx(&cfg, phase_kernel<true>, p));
          else
            CHECK(cudaLaunchKernelEx(&cfg, phase_kernel<false>, p));
        }
      } else {
        CHECK(cudaMemsetAsync(count, 0, sizeof(unsigned), st));
        cudaLaunchConfig_t cfg{};
        cfg.gridDim = dim3(unsigned(sms * blocks_per_sm));
        cfg.blockDim = dim3(kThreads);
        cfg.stream = st;
        cudaLaunchAttribute at[1];
        at[0].id = cudaLaunchAttributeCooperative;
        at[0].val.cooperative = 1;
        cfg.attrs = at;
        cfg.numAttrs = 1;
        CHECK(cudaLaunchKernelEx(&cfg, persistent_kernel, (const Phase*)dph, int(ph.size()), count, mode == 4));
      }
      CHECK(cudaStreamEndCapture(st, &g));
      cudaGraphExec_t ge;
      CHECK(cudaGraphInstantiate(&ge, g, 0));
      CHECK(cudaGraphDestroy(g));
      return ge;
    };
    auto time = [&](cudaGraphExec_t ge) {
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
    };
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
  return 0;
}
