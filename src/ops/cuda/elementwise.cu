// Small elementwise ops: activation-and-multiply, add, softcap, scale, and the
// step's position advance.
#include "ops/cuda/common.cuh"

namespace kvgraph::cuda {
namespace {

__global__ void act_mul_kernel(const float* gate, const float* up, float* out, int T, int F, int64_t gs,
                               int64_t us, Activation act) {
  detail::griddep_launch_dependents();
  detail::griddep_wait();
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= int64_t(T) * F) return;
  const int64_t t = idx / F;
  const int f = static_cast<int>(idx % F);
  out[idx] = activate(gate[t * gs + f], act) * up[t * us + f];
}

__global__ void add_kernel(const float* a, const float* b, float* out, int64_t n) {
  detail::griddep_launch_dependents();
  detail::griddep_wait();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a[i] + b[i];
}

__global__ void softcap_kernel(float* x, int64_t n, float cap) {
  detail::griddep_launch_dependents();
  detail::griddep_wait();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] = kvgraph::softcap(x[i], cap);
}

__global__ void scale_kernel(float* x, int64_t n, float s) {
  detail::griddep_launch_dependents();
  detail::griddep_wait();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= s;
}

__global__ void advance_kernel(int32_t* pos, int n) {
  detail::griddep_launch_dependents();
  detail::griddep_wait();
  pos[0] += n;
}

constexpr int kThreads = 256;

}  // namespace

void act_mul(const float* gate, const float* up, float* out, int T, int F, Activation act, Launch stream,
             int64_t gate_stride, int64_t up_stride) {
  if (T < 0 || F <= 0) fail_op("act_mul", "bad shape");
  launch(act_mul_kernel, dim3(ceil_div(int64_t(T) * F, kThreads)), dim3(kThreads), 0, stream, gate, up, out, T, F,
         gate_stride ? gate_stride : int64_t(F), up_stride ? up_stride : int64_t(F), act);
}

void act_mul_fused(const float* gate_up, float* out, int T, int F, Activation act, Launch stream) {
  act_mul(gate_up, gate_up + F, out, T, F, act, stream, 2 * int64_t(F), 2 * int64_t(F));
}

void add(const float* a, const float* b, float* out, int64_t n, Launch stream) {
  launch(add_kernel, dim3(ceil_div(n, kThreads)), dim3(kThreads), 0, stream, a, b, out, n);
}

void softcap(float* x, int64_t n, float cap, Launch stream) {
  if (!(cap > 0.f)) fail_op("softcap", "cap must be > 0");
  launch(softcap_kernel, dim3(ceil_div(n, kThreads)), dim3(kThreads), 0, stream, x, n, cap);
}

void scale(float* x, int64_t n, float s, Launch stream) {
  launch(scale_kernel, dim3(ceil_div(n, kThreads)), dim3(kThreads), 0, stream, x, n, s);
}

void advance_position(int32_t* pos, int n, Launch stream) {
  launch(advance_kernel, dim3(1), dim3(1), 0, stream, pos, n);
}

}  // namespace kvgraph::cuda
