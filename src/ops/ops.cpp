// Front of the op set: checks arguments once, then hands the op to the
// stream's backend (a CPU closure, or a CUDA launch).
#include "kvgraph/ops.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <cstring>
#include <vector>

#include "kvgraph/error.h"
#include "ops/attend_call.h"
#include "ops/backend.h"
#include "ops/cpu/attention.h"
#include "ops/cpu/kernels.h"
#ifdef KVGRAPH_HAVE_CUDA
#include "ops/cuda/ops_cuda.h"
#define KV_CUDA_OP(op, ...) return cuda_ops::op(__VA_ARGS__)
#else
#define KV_CUDA_OP(op, ...) fail(#op, "has no CUDA implementation in this build")
#endif

namespace kvgraph::ops {

namespace {

void need(bool ok, const char* op, const char* what) {
  if (!ok) fail(op, "{}", what);
}
void need_f32(const Tensor& t, const char* op, const char* name) {
  if (t.dtype() != DType::F32) fail(op, "{} must be f32, got {}", name, dtype_name(t.dtype()));
}
void need_cpu_weight(const Tensor& t, const char* op) {
  if (t.dtype() != DType::F32) fail(op, "CPU backend expects f32 weights, got {}", dtype_name(t.dtype()));
}

// Matrices (embedding tables, linear weights and their biases) may also be
// bf16 on the CPU: a bf16 checkpoint stays bf16 in memory.
void need_cpu_matrix(const Tensor& t, const char* op) {
  if (t.dtype() != DType::F32 && t.dtype() != DType::BF16)
    fail(op, "CPU backend expects f32 or bf16 weights, got {}", dtype_name(t.dtype()));
}

// A quantized Weight is whole and consistent: u32 words [N, K * bits / 32],
// a supported format, scales and biases of one float type, both [N, K / group],
// all on the stream's device.
void need_weight(const Weight& w, Device d, const char* op) {
  if (!w.defined()) fail(op, "weight is undefined");
  if (w.w.rank() != 2) fail(op, "weight must be a matrix, got {}", w.w.shape_str());
  if (w.device() != d) fail(op, "weight is on {}, the stream on {}", device_name(w.device()), device_name(d));
  if (!w.quantized()) return;
  const QuantFormat f = w.format;
  if (!supported(f)) fail(op, "quantized weight: {} bits in groups of {} (supported: 4 or 8 bits, groups of 32, 64 or 128)", f.bits, f.group);
  if (w.w.dtype() != DType::U32) fail(op, "quantized weight: words must be u32, got {}", dtype_name(w.w.dtype()));
  if (!w.scales.defined() || !w.biases.defined()) fail(op, "quantized weight without scales or biases");
  const DType ft = w.scales.dtype();
  if ((ft != DType::F32 && ft != DType::BF16) || w.biases.dtype() != ft)
    fail(op, "quantized weight: scales and biases must be both f32 or both bf16, got {} and {}", dtype_name(ft),
         dtype_name(w.biases.dtype()));
  const int64_t N = w.rows(), K = w.cols();
  if (K % f.group) fail(op, "quantized weight: K = {} is not a multiple of the group size {}", K, f.group);
  const std::vector<int64_t> want = {N, K / f.group};
  if (w.scales.shape() != want || w.biases.shape() != want)
    fail(op, "quantized weight [{}, {}] in groups of {}: scales and biases must be [{}, {}], got {} and {}", N, K,
         f.group, N, K / f.group, w.scales.shape_str(), w.biases.shape_str());
  if (w.scales.device() != d || w.biases.device() != d) fail(op, "quantized weight: scales and biases on another device");
}

cpu::AffineRows affine_rows(const Weight& w) {
  return {.words = w.w.data<uint32_t>(), .scales = w.scales.raw(), .biases = w.biases.raw(),
          .scales_bf16 = w.scales.dtype() == DType::BF16, .bits = w.format.bits, .group = w.format.group};
}

}  // namespace

void embedding(Stream& s, const Weight& table, const Tensor& ids, Tensor& out, float scale) {
  if (!table.quantized()) return embedding(s, table.w, ids, out, scale);
  need_weight(table, s.device(), "embedding");
  need(ids.dtype() == DType::I32, "embedding", "ids must be i32");
  need_f32(out, "embedding", "out");
  const int T = static_cast<int>(ids.numel());
  const int D = static_cast<int>(table.cols());
  need(out.numel() == int64_t(T) * D, "embedding", "out must be [T, D]");
  if (s.device() == Device::CUDA) KV_CUDA_OP(embedding_affine, s, table, ids, out, scale);
  s.submit([tab = affine_rows(table), V = table.rows(), id = ids.data<int32_t>(), T, D, scale,
            o = out.data<float>()] { cpu::embedding_affine(tab, V, id, T, D, scale, o); });
}

void embedding(Stream& s, const Tensor& table, const Tensor& ids, Tensor& out, float scale) {
  need(ids.dtype() == DType::I32, "embedding", "ids must be i32");
  need_f32(out, "embedding", "out");
  const int T = static_cast<int>(ids.numel());
  const int D = static_cast<int>(table.dim(1));
  need(out.numel() == int64_t(T) * D, "embedding", "out must be [T, D]");
  if (s.device() == Device::CUDA) KV_CUDA_OP(embedding, s, table, ids, out, scale);
  need_cpu_matrix(table, "embedding");
  if (table.dtype() == DType::BF16) {
    s.submit([tab = table.data<uint16_t>(), V = table.dim(0), id = ids.data<int32_t>(), T, D, scale,
              o = out.data<float>()] { cpu::embedding_bf16(tab, V, id, T, D, scale, o); });
    return;
  }
  s.submit([tab = table.data<float>(), V = table.dim(0), id = ids.data<int32_t>(), T, D, scale,
            o = out.data<float>()] { cpu::embedding(tab, V, id, T, D, scale, o); });
}

void rms_norm(Stream& s, const Tensor& x, const Tensor& w, Tensor& out, float eps, bool plus_one) {
  need_f32(x, "rms_norm", "x");
  const int D = static_cast<int>(w.numel());
  need(x.numel() % D == 0 && out.numel() == x.numel(), "rms_norm", "x/out must be [rows, D]");
  if (s.device() == Device::CUDA) KV_CUDA_OP(rms_norm, s, x, w, out, eps, plus_one);
  need_cpu_weight(w, "rms_norm");
  s.submit([xp = x.data<float>(), wp = w.data<float>(), o = out.data<float>(), rows = x.numel() / D, D, eps,
            plus_one] { cpu::rms_norm(xp, wp, o, rows, D, eps, plus_one); });
}

void linear(Stream& s, const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& out) {
  LinearOptions o;
  o.bias = bias;
  linear(s, x, w, out, o);
}

void linear(Stream& s, const Tensor& x, const Tensor& w, Tensor& out, const LinearOptions& o) {
  linear(s, x, Weight(w), out, o);
}

void linear(Stream& s, const Tensor& x, const Weight& weight, Tensor& out, const LinearOptions& o) {
  need_f32(x, "linear", "x");
  if (weight.quantized()) need_weight(weight, s.device(), "linear");
  const Tensor& w = weight.w;
  const int N = static_cast<int>(weight.rows()), K = static_cast<int>(weight.cols());
  need(x.numel() % K == 0, "linear", "x must be [T, K]");
  const int T = static_cast<int>(x.numel() / K);
  const int N_out = o.gated ? N / 2 : N;
  if (o.gated && (N % 2 || o.residual)) fail("linear", "a gated linear needs an even N and no residual");
  if (out.numel() != int64_t(T) * N_out)
    fail("linear", "out must be [{}, {}], got {}", T, N_out, out.shape_str());
  if (o.bias && o.bias->numel() != N) fail("linear", "bias must be [{}], got {}", N, o.bias->shape_str());
  if (o.norm) {
    need_f32(*o.norm, "linear", "norm");
    if (o.norm->numel() != K) fail("linear", "norm must be [{}], got {}", K, o.norm->shape_str());
  }
  if (o.residual) {
    need_f32(*o.residual, "linear", "residual");
    if (o.residual->numel() != out.numel()) fail("linear", "residual must be shaped like out");
  }
  if (s.device() == Device::CUDA) KV_CUDA_OP(linear, s, x, weight, out, o);
  if (!weight.quantized()) need_cpu_matrix(w, "linear");
  if (o.bias && o.bias->dtype() != weight.float_dtype())
    fail("linear", "bias dtype {} differs from the weights' {}", dtype_name(o.bias->dtype()),
         dtype_name(weight.float_dtype()));
  const bool bf16 = w.dtype() == DType::BF16;
  const std::optional<cpu::AffineRows> affine =
      weight.quantized() ? std::optional<cpu::AffineRows>(affine_rows(weight)) : std::nullopt;
  s.submit([xp = x.data<float>(), wp = w.raw(), bp = o.bias ? o.bias->raw() : nullptr, bf16, affine,
            np = o.norm ? o.norm->data<float>() : nullptr, eps = o.norm_eps, plus_one = o.norm_plus_one,
            gated = o.gated, act = o.act, rp = o.residual ? o.residual->data<float>() : nullptr,
            op = out.data<float>(), T, N, K] {
    auto product = [&](const float* in, float* y) {
      if (affine)
        cpu::linear_affine(in, *affine, bp, y, T, N, K);
      else if (bf16)
        cpu::linear_bf16(in, static_cast<const uint16_t*>(wp), static_cast<const uint16_t*>(bp), y, T, N, K);
      else
        cpu::linear(in, static_cast<const float*>(wp), static_cast<const float*>(bp), y, T, N, K);
    };
    thread_local std::vector<float> xn, y;
    const float* in = xp;
    if (np) {
      xn.resize(size_t(T) * K);
      cpu::rms_norm(xp, np, xn.data(), T, K, eps, plus_one);
      in = xn.data();
    }
    if (!gated && !rp) {
      product(in, op);
      return;
    }
    y.resize(size_t(T) * N);
    product(in, y.data());
    const int64_t n_out = gated ? int64_t(T) * (N / 2) : int64_t(T) * N;
    for (int64_t i = 0; i < n_out; ++i)
      op[i] = gated ? activate(y[2 * i], act) * y[2 * i + 1] : y[i] + rp[i];
  });
}

void rms_norm_add(Stream& s, const Tensor& x, const Tensor& w, Tensor& out, float eps, bool plus_one) {
  need_f32(x, "rms_norm_add", "x");
  need_f32(out, "rms_norm_add", "out");
  const int D = static_cast<int>(w.numel());
  need(x.numel() % D == 0 && out.numel() == x.numel(), "rms_norm_add", "x/out must be [rows, D]");
  if (s.device() == Device::CUDA) KV_CUDA_OP(rms_norm_add, s, x, w, out, eps, plus_one);
  need_cpu_weight(w, "rms_norm_add");
  s.submit([xp = x.data<float>(), wp = w.data<float>(), o = out.data<float>(), rows = x.numel() / D, D, eps,
            plus_one] {
    thread_local std::vector<float> n;
    n.resize(size_t(rows) * D);
    cpu::rms_norm(xp, wp, n.data(), rows, D, eps, plus_one);
    cpu::add(o, n.data(), o, rows * D);
  });
}

void rope(Stream& s, Tensor& x, const Tensor& pos, const Tensor& inv_freq) {
  need_f32(x, "rope", "x");
  need(x.rank() == 3 && inv_freq.numel() * 2 == x.dim(2), "rope", "x must be [T, H, head_dim]");
  if (s.device() == Device::CUDA) KV_CUDA_OP(rope, s, x, pos, inv_freq);
  s.submit([xp = x.data<float>(), p = pos.data<int32_t>(), f = inv_freq.data<float>(), T = int(x.dim(0)),
            H = int(x.dim(1)), D = int(x.dim(2))] { cpu::rope(xp, *p, f, T, H, D); });
}

void act_mul(Stream& s, const Tensor& gate, const Tensor& up, Tensor& out, Activation act) {
  need(gate.numel() == up.numel() && out.numel() == gate.numel(), "act_mul", "shapes differ");
  if (s.device() == Device::CUDA) KV_CUDA_OP(act_mul, s, gate, up, out, act);
  s.submit([g = gate.data<float>(), u = up.data<float>(), o = out.data<float>(), n = gate.numel(), act] {
    cpu::act_mul(g, u, o, n, act);
  });
}

void add(Stream& s, const Tensor& a, const Tensor& b, Tensor& out) {
  need(a.numel() == b.numel() && out.numel() == a.numel(), "add", "shapes differ");
  if (s.device() == Device::CUDA) KV_CUDA_OP(add, s, a, b, out);
  s.submit([ap = a.data<float>(), bp = b.data<float>(), o = out.data<float>(), n = a.numel()] {
    cpu::add(ap, bp, o, n);
  });
}

void softcap(Stream& s, Tensor& x, float cap) {
  if (s.device() == Device::CUDA) KV_CUDA_OP(softcap, s, x, cap);
  s.submit([xp = x.data<float>(), n = x.numel(), cap] { cpu::softcap(xp, n, cap); });
}

void sample(Stream& s, const Tensor& logits, const Tensor& config, const Tensor& banned, int n_banned,
            Tensor& seen, const Tensor& pos, Tensor& token) {
  need(token.dtype() == DType::I32, "sample", "token must be i32");
  need(config.nbytes() >= sizeof(SamplingParams), "sample", "config buffer too small");
  if (s.device() == Device::CUDA) KV_CUDA_OP(sample, s, logits, config, banned, n_banned, seen, pos, token);
  s.submit([l = logits.data<float>(), V = int(logits.numel()), params = config.data<SamplingParams>(),
            b = banned.data<int32_t>(), n_banned,
            sn = seen.data<uint8_t>(), p = pos.data<int32_t>(), tok = token.data<int32_t>()] {
    const int32_t t = cpu::sample(l, V, *params, b, n_banned, sn, *p);
    *tok = t;
    if (t >= 0) sn[t] = 1;
  });
}

void mark_seen(Stream& s, const Tensor& ids, Tensor& seen) {
  if (s.device() == Device::CUDA) KV_CUDA_OP(mark_seen, s, ids, seen);
  s.submit([id = ids.data<int32_t>(), n = ids.numel(), sn = seen.data<uint8_t>(), V = seen.numel()] {
    for (int64_t i = 0; i < n; ++i)
      if (id[i] >= 0 && id[i] < V) sn[id[i]] = 1;
  });
}

void advance(Stream& s, Tensor& pos, int n) {
  if (s.device() == Device::CUDA) KV_CUDA_OP(advance, s, pos, n);
  s.submit([p = pos.data<int32_t>(), n] { *p += n; });
}

void copy(Stream& s, const Tensor& src, Tensor& dst) {
  need(src.nbytes() <= dst.nbytes(), "copy", "destination too small");
  if (s.device() == Device::CUDA) KV_CUDA_OP(copy, s, src, dst);
  s.submit([a = src.raw(), b = dst.raw(), n = src.nbytes()] { std::memcpy(b, a, n); });
}

void fill_random(Stream& s, Tensor& t, uint64_t seed, float scale) {
  need(t.dtype() == DType::F32 || t.dtype() == DType::BF16, "fill_random", "tensor must be f32 or bf16");
  if (s.device() == Device::CUDA) KV_CUDA_OP(fill_random, s, t, seed, scale);
  s.submit([p = t.raw(), n = t.numel(), dt = t.dtype(), seed, scale] {
    for (int64_t i = 0; i < n; ++i) {
      const float v = (2.0f * uniform01(seed, static_cast<uint32_t>(i & 0x7fffffff)) - 1.0f) * scale;
      if (dt == DType::F32)
        static_cast<float*>(p)[i] = v;
      else
        static_cast<uint16_t*>(p)[i] = f32_to_bf16(v);
    }
  });
}

// The front of update_and_attend: every shape and pointer is checked here,
// once, then the call is resolved to raw pointers (ops::AttendCall) that
// either backend reads as it is.
void update_and_attend(Stream& s, const AttendArgs& a) {
  constexpr const char* op = "update_and_attend";
  if (!a.cache) fail(op, "no cache given");
  SequenceCache& cache = *a.cache;
  const int layer = a.layer;
  if (layer < 0 || layer >= cache.n_layers())
    fail(op, "layer {} out of range (cache has {} layers)", layer, cache.n_layers());
  if (!a.step.pos || a.step.T < 1) fail(op, "layer {}: no step (call cache.begin_step first)", layer);
  if (s.device() != cache.config().device)
    fail(op, "layer {}: a {} stream for a cache on {}", layer, device_name(s.device()),
         device_name(cache.config().device));
  const LayerSpec& l = cache.config().layers[layer];
  const int32_t T = a.step.T;
  const int64_t qs = int64_t(l.n_heads) * l.head_dim, ks = int64_t(l.n_kv_heads) * l.head_dim;
  auto rows = [&](const Tensor* t, const char* name, int64_t width) {
    if (!t) fail(op, "layer {}: {} is missing", layer, name);
    if (t->dtype() != DType::F32 || t->numel() != int64_t(T) * width || t->device() != s.device())
      fail(op, "layer {}: {} must be f32 [{}, {}] on {}, got {} {}", layer, name, T, width, device_name(s.device()),
           dtype_name(t->dtype()), t->shape_str());
    return t->data<float>();
  };
  auto vec = [&](const Tensor* t, int64_t n, const char* name) -> const float* {
    if (!t) return nullptr;
    if (t->dtype() != DType::F32 || t->numel() != n || t->device() != s.device())
      fail(op, "layer {}: {} must be f32 [{}] on {}, got {} {}", layer, name, n, device_name(s.device()),
           dtype_name(t->dtype()), t->shape_str());
    return t->data<float>();
  };

  AttendCall c;
  if (a.qkv) {
    if (a.q || a.k || a.v) fail(op, "layer {}: give either qkv or q, k and v, not both", layer);
    const float* p = rows(a.qkv, "qkv", qs + 2 * ks);
    c.q = p;
    c.k = p + qs;
    c.v = p + qs + ks;
    c.q_stride = c.k_stride = c.v_stride = qs + 2 * ks;
  } else {
    c.q = rows(a.q, "q", qs);
    c.k = rows(a.k, "k", ks);
    c.v = rows(a.v, "v", ks);
    c.q_stride = qs;
    c.k_stride = c.v_stride = ks;
  }
  c.out = const_cast<float*>(rows(a.out, "out", qs));
  c.k_pool = cache.k_pool(layer).raw();
  c.v_pool = cache.v_pool(layer).raw();
  c.k_aux = cache.k_aux(layer).defined() ? cache.k_aux(layer).raw() : nullptr;
  c.v_aux = cache.v_aux(layer).defined() ? cache.v_aux(layer).raw() : nullptr;
  c.k_format = cache.storage(layer).k;
  c.v_format = cache.storage(layer).v;
  c.pos = a.step.pos;
  c.plan = a.step.plans + cache.policy_index(layer);
  c.rule = l.policy.rule();
  c.T = T;
  c.n_q_heads = l.n_heads;
  c.n_kv_heads = l.n_kv_heads;
  c.head_dim = l.head_dim;
  c.scale = a.scale;
  c.softcap = a.softcap;
  c.q_norm = vec(a.q_norm, l.head_dim, "q_norm");
  c.k_norm = vec(a.k_norm, l.head_dim, "k_norm");
  c.norm_eps = a.norm_eps;
  c.norm_plus_one = a.norm_plus_one;
  c.rope_inv_freq = vec(a.rope_inv_freq, l.head_dim / 2, "rope_inv_freq");
  if (s.device() == Device::CUDA) KV_CUDA_OP(update_and_attend, s, c);
  s.submit([c] { cpu::update_and_attend(c); });
}

double measure_copy_bandwidth_gbs(Device d) {
  if (d == Device::CUDA) return cuda_device::copy_bandwidth_gbs();
  const size_t n = size_t(256) << 20;
  std::vector<char> a(n, 1), b(n, 0);
  double best = 1e30;
  for (int i = 0; i < 5; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    std::memcpy(b.data(), a.data(), n);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return 2.0 * n / best / 1e9;
}

}  // namespace kvgraph::ops
