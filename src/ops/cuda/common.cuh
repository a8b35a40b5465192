#pragma once
// Device helpers shared by the kernels: storage types and conversions, warp
// reductions, programmatic-dependent-launch controls, a launch helper and the
// typed dispatch. Only included by .cu files.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <utility>

#include "kvgraph/dtype.h"
#include "ops/cuda/kernels.h"

namespace kvgraph::cuda {

// Throws kvgraph::Error("[cuda] <op>: <msg>").
[[noreturn]] void fail_op(const char* op, const std::string& msg);

namespace detail {

// Storage tags: 16-bit types are carried as raw bits so host and device agree
// bit for bit with dtype.h.
struct bf16 { uint16_t bits; };
struct f16 { uint16_t bits; };

template <typename T> __device__ __forceinline__ float to_f32(T v);
template <> __device__ __forceinline__ float to_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_f32<bf16>(bf16 v) { return __uint_as_float(uint32_t(v.bits) << 16); }
template <> __device__ __forceinline__ float to_f32<f16>(f16 v) {
  return __half2float(__ushort_as_half(v.bits));
}

template <typename T> __device__ __forceinline__ T from_f32(float f);
template <> __device__ __forceinline__ float from_f32<float>(float f) { return f; }
// Round to nearest even, exactly as kvgraph::f32_to_bf16 on the host.
template <> __device__ __forceinline__ bf16 from_f32<bf16>(float f) { return bf16{kvgraph::f32_to_bf16(f)}; }
template <> __device__ __forceinline__ f16 from_f32<f16>(float f) {
  return f16{__half_as_ushort(__float2half_rn(f))};
}

// 8 consecutive elements of T (16 bytes for 16-bit types, 32 for f32).
template <typename T> struct Pack8;
template <> struct Pack8<bf16> { uint4 r; };
template <> struct Pack8<f16> { uint4 r; };
template <> struct Pack8<float> { uint4 r[2]; };

template <typename T> __device__ __forceinline__ Pack8<T> load8(const T* p);
template <> __device__ __forceinline__ Pack8<bf16> load8<bf16>(const bf16* p) {
  return {*reinterpret_cast<const uint4*>(p)};
}
template <> __device__ __forceinline__ Pack8<f16> load8<f16>(const f16* p) {
  return {*reinterpret_cast<const uint4*>(p)};
}
template <> __device__ __forceinline__ Pack8<float> load8<float>(const float* p) {
  const uint4* q = reinterpret_cast<const uint4*>(p);
  return {{q[0], q[1]}};
}

__device__ __forceinline__ uint32_t word(const uint4& r, int i) {
  return i == 0 ? r.x : i == 1 ? r.y : i == 2 ? r.z : r.w;
}
// Unpacks a Pack8 into 8 floats (i is compile-time after unrolling).
__device__ __forceinline__ void unpack8(const Pack8<bf16>& p, float* f) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t u = word(p.r, i);
    f[2 * i] = __uint_as_float(u << 16);
    f[2 * i + 1] = __uint_as_float(u & 0xffff0000u);
  }
}
__device__ __forceinline__ void unpack8(const Pack8<f16>& p, float* f) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t u = word(p.r, i);
    __half2 h;
    memcpy(&h, &u, 4);
    const float2 v = __half22float2(h);
    f[2 * i] = v.x;
    f[2 * i + 1] = v.y;
  }
}
__device__ __forceinline__ void unpack8(const Pack8<float>& p, float* f) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[i] = __uint_as_float(word(p.r[0], i));
    f[4 + i] = __uint_as_float(word(p.r[1], i));
  }
}

// v as a float for 0 <= v < 2^23 without I2F (a quarter-rate instruction):
// as_float(0x4B000000 | v) is 2^23 + v exactly, so one FADD gives v. v may
// sit anywhere below bit 23 (v << s converts to v * 2^s).
__device__ __forceinline__ float small_uint_to_f32(uint32_t v) { return __uint_as_float(v | 0x4B000000u) - 8388608.f; }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Block-wide sum in a fixed order (deterministic). `red` holds 32 floats.
// Every thread gets the result. blockDim.x must be a multiple of 32.
__device__ __forceinline__ float block_sum(float v, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // red may still be read by a previous call
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float t = lane < nw ? red[lane] : 0.f;
  return warp_sum(t);
}

// Programmatic dependent launch. Both are no-ops when the kernel was launched
// without the attribute.
__device__ __forceinline__ void griddep_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void griddep_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

// f32 -> orderable u32: a < b  <=>  key(a) < key(b) (for non-NaN values).
__device__ __forceinline__ uint32_t order_key(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float key_value(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

}  // namespace detail

// Launches `kernel` with programmatic stream serialization when the Launch
// asks for it and the stream is an explicit one (the legacy default stream
// gets plain launches). Empty grids are skipped.
// launch_clustered: the same, the grid in thread-block clusters of `cluster`
// blocks (which must divide the grid).
template <typename... KArgs, typename... Args>
void launch_clustered(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, Launch stream, dim3 cluster,
                      Args&&... args) {
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream.stream;
  cudaLaunchAttribute attr[2];
  unsigned n = 0;
  if (stream.pdl && stream.stream != nullptr) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster.x * cluster.y * cluster.z > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = cluster.x;
    attr[n].val.clusterDim.y = cluster.y;
    attr[n++].val.clusterDim.z = cluster.z;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  KVGRAPH_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}
template <typename... KArgs, typename... Args>
void launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, Launch stream, Args&&... args) {
  launch_clustered(kernel, grid, block, smem, stream, dim3(1, 1, 1), std::forward<Args>(args)...);
}

// Typed dispatch: f(tag) with tag a float / detail::bf16 / detail::f16 value.
template <typename F>
void dispatch_weight(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::F32: f(float{}); return;
    case DType::BF16: f(detail::bf16{}); return;
    default: fail_op(op, std::string("weights must be f32 or bf16, got ") + std::string(dtype_name(t)));
  }
}
template <typename F>
void dispatch_storage(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::F32: f(float{}); return;
    case DType::BF16: f(detail::bf16{}); return;
    case DType::F16: f(detail::f16{}); return;
    default: fail_op(op, std::string("storage must be f32, bf16 or f16, got ") + std::string(dtype_name(t)));
  }
}

inline unsigned ceil_div(int64_t a, int64_t b) { return static_cast<unsigned>((a + b - 1) / b); }

}  // namespace kvgraph::cuda
