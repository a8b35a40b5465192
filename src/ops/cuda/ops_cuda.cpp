#include "ops/cuda/ops_cuda.h"

#include <cuda_runtime_api.h>

#include <map>
#include <memory>
#include <mutex>

#include "kvgraph/error.h"
#include "ops/cuda/kernels.h"
#include "ops/cuda/runtime.h"

namespace kvgraph::cuda {
void fill_uniform(void* p, DType dt, int64_t n, uint64_t seed, float scale, cudaStream_t stream);
}

namespace kvgraph::cuda_ops {

static_assert(sizeof(ops::SamplingParams) == sizeof(cuda::SamplingConfig));
static_assert(offsetof(ops::SamplingParams, seed) == offsetof(cuda::SamplingConfig, seed));

namespace {

// Scratch owned per stream; a recorded graph points into it, so it lives as
// long as the stream.
struct Scratch {
  cuda::GemmContext gemm;
  cuda::AttentionWorkspace attn{/*max_q_heads=*/128, /*max_head_dim=*/256, /*max_splits=*/64, /*min_chunk=*/0};
  cuda::SelectWorkspace select;
};

std::mutex g_mu;
std::map<void*, std::unique_ptr<Scratch>>& registry() {
  static std::map<void*, std::unique_ptr<Scratch>> r;
  return r;
}

Scratch& scratch(Stream& s) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto& p = registry()[s.cuda_stream()];
  if (!p) p = std::make_unique<Scratch>();
  return *p;
}

cudaStream_t cs(Stream& s) { return static_cast<cudaStream_t>(s.cuda_stream()); }

}  // namespace

void release(void* cuda_stream) {
  std::lock_guard<std::mutex> lock(g_mu);
  registry().erase(cuda_stream);
}

void embedding(Stream& s, const Tensor& table, const Tensor& ids, Tensor& out, float scale) {
  cuda::embedding(table.raw(), table.dtype(), table.dim(0), ids.data<int32_t>(), static_cast<int>(ids.numel()),
                  static_cast<int>(table.dim(1)), scale, out.data<float>(), cs(s));
}

void rms_norm(Stream& s, const Tensor& x, const Tensor& w, Tensor& out, float eps, bool plus_one) {
  const int D = static_cast<int>(w.numel());
  cuda::rms_norm(x.data<float>(), w.raw(), w.dtype(), out.data<float>(), x.numel() / D, D, eps, plus_one, cs(s));
}

void linear(Stream& s, const Tensor& x, const Tensor& w, Tensor& out, const ops::LinearOptions& o) {
  cuda::LinearParams p;
  p.x = x.data<float>();
  p.w = w.raw();
  p.w_dtype = w.dtype();
  if (o.bias) {
    if (o.bias->dtype() != w.dtype())
      fail("linear", "bias dtype {} differs from weight dtype {}", dtype_name(o.bias->dtype()), dtype_name(w.dtype()));
    p.bias = o.bias->raw();
  }
  if (o.norm) {
    p.norm = o.norm->data<float>();
    p.norm_eps = o.norm_eps;
    p.norm_plus_one = o.norm_plus_one;
  }
  if (o.gated) p.gate = o.act == Activation::SiLU ? cuda::Gate::silu : cuda::Gate::gelu_tanh;
  if (o.residual) p.residual = o.residual->data<float>();
  p.out = out.data<float>();
  p.N = static_cast<int>(w.dim(0));
  p.K = static_cast<int>(w.dim(1));
  p.T = static_cast<int>(x.numel() / p.K);
  Scratch& sc = scratch(s);
  if (p.T > 1) sc.gemm.reserve(p.T, std::max(p.N, p.K));
  cuda::linear(p, p.T > 1 ? &sc.gemm : nullptr, cs(s));
}

void rms_norm_add(Stream& s, const Tensor& x, const Tensor& w, Tensor& out, float eps, bool plus_one) {
  const int D = static_cast<int>(w.numel());
  cuda::RmsNormParams p;
  p.x = x.data<float>();
  p.out = out.data<float>();
  p.weight = w.raw();
  p.weight_dtype = w.dtype();
  p.tokens = x.numel() / D;
  p.dim = D;
  p.eps = eps;
  p.plus_one = plus_one;
  p.accumulate = true;
  cuda::rms_norm(p, cs(s));
}

void rope(Stream& s, Tensor& x, const Tensor& pos, const Tensor& inv_freq) {
  cuda::rope(x.data<float>(), pos.data<int32_t>(), inv_freq.data<float>(), static_cast<int>(x.dim(0)),
             static_cast<int>(x.dim(1)), static_cast<int>(x.dim(2)), cs(s));
}

void act_mul(Stream& s, const Tensor& gate, const Tensor& up, Tensor& out, Activation act) {
  const int T = static_cast<int>(gate.dim(0));
  const int F = static_cast<int>(gate.numel() / T);
  cuda::act_mul(gate.data<float>(), up.data<float>(), out.data<float>(), T, F,
                act == Activation::SiLU ? cuda::Act::silu : cuda::Act::gelu_tanh, cs(s));
}

void add(Stream& s, const Tensor& a, const Tensor& b, Tensor& out) {
  cuda::add(a.data<float>(), b.data<float>(), out.data<float>(), a.numel(), cs(s));
}

void softcap(Stream& s, Tensor& x, float cap) { cuda::softcap(x.data<float>(), x.numel(), cap, cs(s)); }

void sample(Stream& s, const Tensor& logits, const Tensor& config, const Tensor& banned, int n_banned, Tensor& seen,
            const Tensor& pos, Tensor& token) {
  cuda::SampleParams p;
  p.logits = logits.data<float>();
  p.V = static_cast<int>(logits.numel());
  p.config = config.data<cuda::SamplingConfig>();
  p.banned = n_banned > 0 ? banned.data<int32_t>() : nullptr;
  p.n_banned = n_banned;
  p.seen = seen.data<uint8_t>();
  p.pos = pos.data<int32_t>();
  p.token = token.data<int32_t>();
  cuda::sample(p, scratch(s).select, cs(s));
}

void mark_seen(Stream& s, const Tensor& ids, Tensor& seen) {
  cuda::mark_seen(ids.data<int32_t>(), static_cast<int>(ids.numel()), seen.data<uint8_t>(),
                  static_cast<int>(seen.numel()), cs(s));
}

void advance(Stream& s, Tensor& pos, int n) { cuda::advance_position(pos.data<int32_t>(), n, cs(s)); }

void copy(Stream& s, const Tensor& src, Tensor& dst) {
  KVGRAPH_CUDA_CHECK(cudaMemcpyAsync(dst.raw(), src.raw(), src.nbytes(), cudaMemcpyDeviceToDevice, cs(s)));
}

void fill_random(Stream& s, Tensor& t, uint64_t seed, float scale) {
  cuda::fill_uniform(t.raw(), t.dtype(), t.numel(), seed, scale, cs(s));
}

double measure_copy_bandwidth_gbs() { return cuda::measure_copy_bandwidth_gbs(); }

void update_and_attend(Stream& s, const CacheAttendArgs& a) {
  cuda::AttentionParams p;
  p.q = a.q;
  p.k = a.k;
  p.v = a.v;
  p.q_stride = a.q_stride;
  p.k_stride = a.k_stride;
  p.v_stride = a.v_stride;
  p.k_pool = a.k_pool;
  p.v_pool = a.v_pool;
  p.storage = a.storage;
  p.out = a.out;
  p.pos = a.pos;
  p.rule = a.rule;
  p.T = a.T;
  p.n_q_heads = a.n_heads;
  p.n_kv_heads = a.n_kv_heads;
  p.head_dim = a.head_dim;
  p.scale = a.scale;
  p.softcap = a.softcap;
  p.q_norm = a.q_norm;
  p.k_norm = a.k_norm;
  p.norm_eps = a.norm_eps;
  p.norm_plus_one = a.norm_plus_one;
  p.rope_inv_freq = a.rope_inv_freq;
  cuda::update_and_attend(p, scratch(s).attn, cs(s));
}

}  // namespace kvgraph::cuda_ops
