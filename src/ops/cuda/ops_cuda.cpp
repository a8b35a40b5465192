#include "ops/cuda/ops_cuda.h"

#include <cuda_runtime_api.h>

#include "kvgraph/error.h"
#include "ops/cuda/context.h"

namespace kvgraph::cuda_ops {

namespace {

cuda::Launch cs(Stream& s) { return cuda::context(s).launch(); }

}  // namespace

void embedding(Stream& s, const Tensor& table, const Tensor& ids, Tensor& out, float scale) {
  cuda::embedding(table.raw(), table.dtype(), table.dim(0), ids.data<int32_t>(), static_cast<int>(ids.numel()),
                  static_cast<int>(table.dim(1)), scale, out.data<float>(), cs(s));
}

void rms_norm(Stream& s, const Tensor& x, const Tensor& w, Tensor& out, float eps, bool plus_one) {
  const int D = static_cast<int>(w.numel());
  cuda::rms_norm(x.data<float>(), w.raw(), w.dtype(), out.data<float>(), x.numel() / D, D, eps, plus_one, cs(s));
}

void embedding_affine(Stream& s, const Weight& table, const Tensor& ids, Tensor& out, float scale) {
  cuda::embedding_affine({.words = table.w.data<uint32_t>(),
                          .scales = table.scales.raw(),
                          .biases = table.biases.raw(),
                          .scale_dtype = table.scales.dtype(),
                          .bits = table.format.bits,
                          .group = table.format.group},
                         table.rows(), ids.data<int32_t>(), static_cast<int>(ids.numel()),
                         static_cast<int>(table.cols()), scale, out.data<float>(), cs(s));
}

void linear(Stream& s, const Tensor& x, const Weight& w, Tensor& out, const ops::LinearOptions& o) {
  cuda::LinearParams p;
  p.x = x.data<float>();
  p.w = w.w.raw();
  p.w_dtype = w.float_dtype();  // quantized: the scales' type (kernels.h)
  if (w.quantized()) {
    p.qbits = w.format.bits;
    p.group = w.format.group;
    p.scales = w.scales.raw();
    p.biases = w.biases.raw();
  }
  if (o.bias) {
    if (o.bias->dtype() != w.float_dtype())
      fail("linear", "bias dtype {} differs from weight dtype {}", dtype_name(o.bias->dtype()),
           dtype_name(w.float_dtype()));
    p.bias = o.bias->raw();
  }
  if (o.norm) {
    p.norm = o.norm->data<float>();
    p.norm_eps = o.norm_eps;
    p.norm_plus_one = o.norm_plus_one;
  }
  p.gated = o.gated;
  p.act = o.act;
  if (o.residual) p.residual = o.residual->data<float>();
  p.out = out.data<float>();
  p.N = static_cast<int>(w.rows());
  p.K = static_cast<int>(w.cols());
  p.T = static_cast<int>(x.numel() / p.K);
  cuda::CudaContext& ctx = cuda::context(s);
  p.shape = ctx.tuning().gemv;
  p.int8_x = ctx.tuning().quantized_int8_x;
  p.qstream = ctx.tuning().quantized_stream;
  p.qblocks = ctx.tuning().quantized_blocks;
  if (p.qblocks) p.xprep = ctx.gemm().xprep_scratch();
  p.qring_chunk = ctx.tuning().qring_chunk;
  p.qring_stages = ctx.tuning().qring_stages;
  p.qring_blocks = ctx.tuning().qring_blocks;
  p.multi = ctx.tuning().multi;
  if (ctx.tuning().qmma_tokens >= 0) p.qmma_tokens = ctx.tuning().qmma_tokens;
  if (p.T > cuda::kMaxGemvTokens) ctx.gemm().reserve(p.T, std::max(p.N, p.K));
  cuda::linear(p, p.T > 1 ? &ctx.gemm() : nullptr, ctx.launch());
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
                act, cs(s));
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
  cuda::sample(p, cuda::context(s).select(), cs(s));
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

void update_and_attend(Stream& s, const ops::AttendCall& a) {
  cuda::CudaContext& ctx = cuda::context(s);
  cuda::update_and_attend(a, ctx.attention(), ctx.launch());
}

}  // namespace kvgraph::cuda_ops
