// The backend-ops suite, in the spirit of llama.cpp's test-backend-ops: every
// op of include/kvgraph/ops.h runs through Stream(CPU) and Stream(CUDA) on the
// same random inputs, and the two results are compared by normalised error.
// The CPU backend is the reference: a CUDA result that drifts from it fails
// here, whichever kernel or launch shape produced it. Each case builds its
// inputs from a seed inside `op`, so both devices see the same values.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kvgraph/cache/sequence_cache.h"
#include "kvgraph/ops.h"
#include "kvgraph/quant.h"
#include "kvgraph/stream.h"

using namespace kvgraph;

namespace {

int g_cases = 0;  // op/shape cases compared, reported per test

#define SKIP_WITHOUT_GPU() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device"

std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// max |got - want| / max |want|; NaN anywhere is an infinite error.
double norm_err(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return INFINITY;
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i]) || std::isnan(want[i])) return INFINITY;
    num = std::max(num, std::abs(double(got[i]) - want[i]));
    den = std::max(den, std::abs(double(want[i])));
  }
  return den > 0 ? num / den : num;
}

// A tensor of `dtype` on `d` holding `v` (rounded to bf16/f16 as needed).
Tensor make(const std::vector<float>& v, std::vector<int64_t> shape, Device d, DType dtype = DType::F32) {
  if (dtype == DType::F32) return Tensor::from_host(v.data(), std::move(shape), DType::F32, d);
  std::vector<uint16_t> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = dtype == DType::BF16 ? f32_to_bf16(v[i]) : f32_to_f16(v[i]);
  return Tensor::from_host(h.data(), std::move(shape), dtype, d);
}

using OpFn = std::function<std::vector<float>(Stream&, Device)>;

// Runs `op` on both backends and compares (CPU = reference).
void compare(const std::string& name, double tol, const OpFn& op) {
  Stream cs(Device::CPU), gs(Device::CUDA);
  const std::vector<float> want = op(cs, Device::CPU);
  const std::vector<float> got = op(gs, Device::CUDA);
  gs.synchronize();
  ++g_cases;
  const double e = norm_err(got, want);
  EXPECT_LE(e, tol) << name << " (" << want.size() << " values)";
}

void report(const char* suite, int before) { std::printf("[backend-ops] %s: %d cases\n", suite, g_cases - before); }

TEST(BackendOps, Embedding) {
  SKIP_WITHOUT_GPU();
  const int before = g_cases;
  // D = 2112: rows of several blocks (256 values a block), the last partial.
  for (int D : {96, 2112})
    for (DType dt : {DType::F32, DType::BF16})
      for (int T : {1, 7}) {
        compare("embedding " + std::string(dtype_name(dt)) + " D=" + std::to_string(D) + " T=" + std::to_string(T),
                1e-6, [&](Stream& s, Device d) {
                  const int V = 300;
                  Tensor table = make(randn(size_t(V) * D, 1), {V, D}, d, dt);
                  std::vector<int32_t> id(T);
                  for (int t = 0; t < T; ++t) id[t] = (t * 37 + 5) % V;
                  Tensor ids = Tensor::from_host(id.data(), {T}, DType::I32, d);
                  Tensor out = Tensor::zeros({T, D}, DType::F32, d);
                  ops::embedding(s, table, ids, out, 1.7f);
                  return out.to_f32_vector();
                });
      }
  // Quantized tables (affine groups of 64, 4 and 8 bits).
  for (int D : {128, 2112})
    for (int bits : {4, 8})
      for (int T : {1, 7}) {
        compare("embedding int" + std::to_string(bits) + " D=" + std::to_string(D) + " T=" + std::to_string(T), 1e-6,
                [&](Stream& s, Device d) {
                  const int V = 300, group = 64;
                  const std::vector<float> w = randn(size_t(V) * D, 2);
                  std::vector<uint32_t> words(size_t(V) * D * bits / 32);
                  std::vector<float> sc(size_t(V) * D / group), bi(sc.size());
                  affine_quantize(w.data(), V, D, bits, group, words.data(), sc.data(), bi.data());
                  Weight table;
                  table.w = Tensor::from_host(words.data(), {V, D * bits / 32}, DType::U32, d);
                  table.scales = make(sc, {V, D / group}, d);
                  table.biases = make(bi, {V, D / group}, d);
                  table.format = {.bits = bits, .group = group};
                  std::vector<int32_t> id(T);
                  for (int t = 0; t < T; ++t) id[t] = (t * 37 + 5) % V;
                  Tensor ids = Tensor::from_host(id.data(), {T}, DType::I32, d);
                  Tensor out = Tensor::zeros({T, D}, DType::F32, d);
                  ops::embedding(s, table, ids, out, 1.7f);
                  return out.to_f32_vector();
                });
      }
  report("embedding", before);
}

TEST(BackendOps, NormsAndElementwise) {
  SKIP_WITHOUT_GPU();
  const int before = g_cases;
  for (bool plus_one : {false, true})
    for (int D : {64, 896, 1152}) {
      const std::string tag = " D=" + std::to_string(D) + (plus_one ? " (1+w)" : "");
      compare("rms_norm" + tag, 1e-5, [&](Stream& s, Device d) {
        Tensor x = make(randn(size_t(3) * D, 2, 3.f), {3, D}, d);
        Tensor w = make(randn(D, 3, 0.5f), {D}, d);
        Tensor out = Tensor::zeros({3, D}, DType::F32, d);
        ops::rms_norm(s, x, w, out, 1e-6f, plus_one);
        return out.to_f32_vector();
      });
      compare("rms_norm_add" + tag, 1e-5, [&](Stream& s, Device d) {
        Tensor x = make(randn(size_t(2) * D, 4), {2, D}, d);
        Tensor w = make(randn(D, 5, 0.5f), {D}, d);
        Tensor out = make(randn(size_t(2) * D, 6), {2, D}, d);
        ops::rms_norm_add(s, x, w, out, 1e-6f, plus_one);
        return out.to_f32_vector();
      });
    }
  for (Activation act : {Activation::SiLU, Activation::GeluTanh})
    compare(act == Activation::SiLU ? "act_mul silu" : "act_mul gelu_tanh", 1e-5, [&](Stream& s, Device d) {
      Tensor g = make(randn(4 * 500, 7, 3.f), {4, 500}, d), u = make(randn(4 * 500, 8), {4, 500}, d);
      Tensor out = Tensor::zeros({4, 500}, DType::F32, d);
      ops::act_mul(s, g, u, out, act);
      return out.to_f32_vector();
    });
  compare("add", 0, [&](Stream& s, Device d) {
    Tensor a = make(randn(1000, 9), {1000}, d), b = make(randn(1000, 10), {1000}, d);
    Tensor out = Tensor::zeros({1000}, DType::F32, d);
    ops::add(s, a, b, out);
    ops::add(s, out, a, out);  // aliasing
    return out.to_f32_vector();
  });
  compare("softcap", 1e-6, [&](Stream& s, Device d) {
    Tensor x = make(randn(4096, 11, 40.f), {4096}, d);
    ops::softcap(s, x, 30.f);
    return x.to_f32_vector();
  });
  for (int hd : {64, 128, 256})
    compare("rope hd=" + std::to_string(hd), 1e-5, [&](Stream& s, Device d) {
      const int T = 5, H = 3;
      Tensor x = make(randn(size_t(T) * H * hd, 12), {T, H, hd}, d);
      std::vector<float> f(hd / 2);
      for (int i = 0; i < hd / 2; ++i) f[i] = std::pow(10000.f, -2.f * i / hd);
      Tensor freq = make(f, {hd / 2}, d);
      const int32_t p0 = 1234;
      Tensor pos = Tensor::from_host(&p0, {1}, DType::I32, d);
      ops::rope(s, x, pos, freq);
      return x.to_f32_vector();
    });
  compare("copy + advance", 0, [&](Stream& s, Device d) {
    Tensor a = make(randn(77, 13), {77}, d), b = Tensor::zeros({77}, DType::F32, d);
    ops::copy(s, a, b);
    const int32_t p0 = 41;
    Tensor pos = Tensor::from_host(&p0, {1}, DType::I32, d);
    ops::advance(s, pos, 3);
    std::vector<float> out = b.to_f32_vector();
    out.push_back(float(pos.to_f32_vector()[0]));
    return out;
  });
  for (DType dt : {DType::F32, DType::BF16})
    compare("fill_random " + std::string(dtype_name(dt)), 0, [&](Stream& s, Device d) {
      Tensor t = Tensor::zeros({3000}, dt, d);
      ops::fill_random(s, t, 0x1234567ull, 0.05f);
      return t.to_f32_vector();
    });
  report("norms and elementwise", before);
}

// linear with every fused option: norm prologue, bias, gate (silu/gelu) or
// residual; T = 1 (the GEMV) and T > 1 (cuBLAS, which rounds x to bf16 for
// bf16 weights: hence the looser bound there).
TEST(BackendOps, Linear) {
  SKIP_WITHOUT_GPU();
  const int before = g_cases;
  enum class Epi { none, bias, residual, silu, gelu };
  const int shapes[][2] = {{46, 896}, {130, 2048}, {10, 30}};
  for (DType dt : {DType::F32, DType::BF16})
    for (int T : {1, 5})
      for (const auto& sh : shapes)
        for (bool norm : {false, true})
          for (Epi epi : {Epi::none, Epi::bias, Epi::residual, Epi::silu, Epi::gelu}) {
            const int N = sh[0], K = sh[1];
            const std::string name = "linear " + std::string(dtype_name(dt)) + " T=" + std::to_string(T) + " " +
                                     std::to_string(N) + "x" + std::to_string(K) + (norm ? " norm" : "") +
                                     " epi=" + std::to_string(int(epi));
            const double tol = T > 1 && dt == DType::BF16 ? 1.5e-2 : 1e-4;
            compare(name, tol, [&](Stream& s, Device d) {
              Tensor x = make(randn(size_t(T) * K, 14 + K), {T, K}, d);
              Tensor w = make(randn(size_t(N) * K, 15 + N, 1.f / std::sqrt(float(K))), {N, K}, d, dt);
              Tensor b = make(randn(N, 16), {N}, d, dt);
              Tensor g = make(randn(K, 17, 0.3f), {K}, d);
              const bool gated = epi == Epi::silu || epi == Epi::gelu;
              Tensor res = make(randn(size_t(T) * N, 18), {T, N}, d);
              Tensor out = Tensor::zeros({T, gated ? N / 2 : N}, DType::F32, d);
              ops::LinearOptions o;
              o.bias = epi == Epi::bias || gated ? &b : nullptr;
              o.norm = norm ? &g : nullptr;
              o.norm_plus_one = norm && K % 2 == 0;
              o.gated = gated;
              o.act = epi == Epi::gelu ? Activation::GeluTanh : Activation::SiLU;
              o.residual = epi == Epi::residual ? &res : nullptr;
              ops::linear(s, x, w, out, o);
              return out.to_f32_vector();
            });
          }
  report("linear", before);
}

// Greedy picks must agree exactly; seeded sampling draws from the same
// counter-based generator, so all but rare near-ties at the cut agree.
TEST(BackendOps, Sampling) {
  SKIP_WITHOUT_GPU();
  const int before = g_cases;
  struct Setting {
    const char* name;
    ops::SamplingParams p;
    double min_agree;
  };
  const Setting settings[] = {
      {"greedy", {}, 1.0},
      {"greedy + penalty", {0.f, 0, 1.f, 1.3f, 0}, 1.0},
      {"t=0.8 top-k 40 top-p 0.9", {0.8f, 40, 0.9f, 1.f, 7}, 0.97},
      {"t=1.2 top-p 0.95 + penalty", {1.2f, 0, 0.95f, 1.1f, 11}, 0.97},
  };
  for (const Setting& st : settings) {
    std::vector<std::vector<float>> picks(2);
    for (Device d : {Device::CPU, Device::CUDA}) {
      Stream s(d);
      const int V = 5000;
      Tensor logits = make(randn(V, 19, 2.f), {V}, d);
      Tensor cfg = Tensor::from_host(&st.p, {int64_t(sizeof st.p)}, DType::U8, d);
      const int32_t ban[2] = {3, 4000};
      Tensor banned = Tensor::from_host(ban, {2}, DType::I32, d);
      Tensor seen = Tensor::zeros({V}, DType::U8, d);
      std::vector<int32_t> hist{5, 77, 900};
      Tensor hist_t = Tensor::from_host(hist.data(), {3}, DType::I32, d);
      const std::vector<uint8_t> none(V, 0);
      const int32_t p0 = 100;
      Tensor pos = Tensor::from_host(&p0, {1}, DType::I32, d), tok = Tensor::zeros({1}, DType::I32, d);
      for (int i = 0; i < 200; ++i) {
        // The same history before every draw (sample marks its pick as seen):
        // one differing pick must not make every later penalty differ.
        seen.copy_from_host(none.data());
        ops::mark_seen(s, hist_t, seen);
        Tensor l = make(randn(V, 19 + i, 2.f), {V}, d);  // sample masks banned ids in place: fresh logits each draw
        ops::sample(s, l, cfg, banned, 2, seen, pos, tok);
        ops::advance(s, pos, 1);
        picks[d == Device::CUDA].push_back(float(s.read_i32(tok)));
      }
    }
    int same = 0;
    for (size_t i = 0; i < picks[0].size(); ++i) same += picks[0][i] == picks[1][i];
    ++g_cases;
    EXPECT_GE(double(same) / picks[0].size(), st.min_agree) << st.name;
    for (float t : picks[1]) EXPECT_TRUE(t != 3 && t != 4000) << st.name << ": a banned id was drawn";
  }
  // A NaN or +inf logit: no token (-1) on both backends, nothing marked seen.
  for (float bad : {NAN, INFINITY})
    for (float temperature : {0.f, 0.8f})
      compare("sample non-finite", 0, [&](Stream& s, Device d) {
        std::vector<float> l = randn(1000, 20, 2.f);
        l[517] = bad;
        Tensor logits = make(l, {1000}, d);
        ops::SamplingParams p{.temperature = temperature, .seed = 3};
        Tensor cfg = Tensor::from_host(&p, {int64_t(sizeof p)}, DType::U8, d);
        Tensor banned = Tensor::zeros({1}, DType::I32, d), seen = Tensor::zeros({1000}, DType::U8, d);
        Tensor pos = Tensor::zeros({1}, DType::I32, d), tok = Tensor::zeros({1}, DType::I32, d);
        ops::sample(s, logits, cfg, banned, 0, seen, pos, tok);
        std::vector<float> out = seen.to_f32_vector();
        out.push_back(float(s.read_i32(tok)));
        EXPECT_EQ(out.back(), -1.f) << device_name(d);
        return out;
      });
  report("sampling", before);
}

// update_and_attend over flat and ring layers (wrapped many times), every
// storage dtype, GQA ratios 1..7, head dims 64/128/256, packed and separate
// q/k/v, with and without the q/k-norm + RoPE prologue and a softcap; steps
// of T > 1 (prefill chunks) then T = 1 (decode). Outputs of every step are
// compared.
struct AttendCase {
  int Hq, Hkv, hd;
  KvStorage storage;
  bool ring;
  bool packed, prologue;
  float softcap;
  Tuning tuning{};  // the CUDA stream's
};

std::string describe(const AttendCase& c) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "attend %s %s Hq=%d Hkv=%d hd=%d%s%s%s", c.ring ? "ring" : "flat",
                kv_storage_name(c.storage).c_str(), c.Hq, c.Hkv, c.hd, c.packed ? " packed" : "",
                c.prologue ? " prologue" : "", c.softcap > 0 ? " softcap" : "");
  return buf;
}

// The outputs of every step; with `pools`, then the bytes of the layer's
// pools (codes and scales, K then V) after the last step, one float each.
std::vector<float> run_attend(const AttendCase& c, Stream& s, Device d, bool pools = false) {
  const int max_write = 8, window = 24, capacity = 96;
  if (d == Device::CUDA) s.set_tuning(c.tuning);
  CacheConfig cfg;
  cfg.storage = c.storage;
  cfg.device = d;
  // A flat layer beside the layer under test keeps the capacity finite.
  cfg.layers = {LayerSpec{c.ring ? CachePolicy(Ring{window, max_write}) : CachePolicy(Flat{capacity}), c.Hq, c.Hkv,
                          c.hd},
                LayerSpec{Flat{capacity}, c.Hq, c.Hkv, c.hd}};
  SequenceCache cache(cfg);
  std::vector<float> f(c.hd / 2);
  for (int i = 0; i < c.hd / 2; ++i) f[i] = std::pow(10000.f, -2.f * i / c.hd);
  Tensor freq = make(f, {c.hd / 2}, d);
  Tensor qn = make(randn(c.hd, 31, 0.2f), {c.hd}, d), kn = make(randn(c.hd, 32, 0.2f), {c.hd}, d);
  Tensor pos = Tensor::zeros({1}, DType::I32, d);
  const int W = (c.Hq + 2 * c.Hkv) * c.hd;
  std::vector<float> all;
  uint32_t seed = 100;
  const int steps[] = {8, 8, 5, 8, 1, 1, 1, 8, 7, 1, 1, 1, 1, 1, 8, 1, 1};  // 61 tokens: the ring wraps twice
  for (int T : steps) {
    const int32_t p = cache.length();
    pos.copy_from_host(&p);
    std::vector<float> row = randn(size_t(T) * W, seed++);
    std::vector<float> q, k, v;
    for (int t = 0; t < T; ++t) {
      const float* r = row.data() + size_t(t) * W;
      q.insert(q.end(), r, r + c.Hq * c.hd);
      k.insert(k.end(), r + c.Hq * c.hd, r + (c.Hq + c.Hkv) * c.hd);
      v.insert(v.end(), r + (c.Hq + c.Hkv) * c.hd, r + W);
    }
    Tensor qkv = make(row, {T, W}, d), qt = make(q, {T, c.Hq, c.hd}, d);
    Tensor kt = make(k, {T, c.Hkv, c.hd}, d), vt = make(v, {T, c.Hkv, c.hd}, d);
    Tensor out = Tensor::zeros({T, c.Hq, c.hd}, DType::F32, d);
    const CacheStep step = cache.begin_step(s, pos, T);
    ops::AttendArgs a{.cache = &cache, .step = step, .layer = 0, .out = &out, .scale = 1.f / std::sqrt(float(c.hd)),
                      .softcap = c.softcap};
    if (c.packed) {
      a.qkv = &qkv;
    } else {
      a.q = &qt;
      a.k = &kt;
      a.v = &vt;
    }
    if (c.prologue) {
      a.q_norm = &qn;
      a.k_norm = &kn;
      a.norm_plus_one = true;
      a.rope_inv_freq = &freq;
    }
    ops::update_and_attend(s, a);
    s.synchronize();
    cache.commit(step);
    const std::vector<float> o = out.to_f32_vector();
    all.insert(all.end(), o.begin(), o.end());
  }
  if (pools) {
    all.clear();
    for (const Tensor* t : {&cache.k_pool(0), &cache.k_aux(0), &cache.v_pool(0), &cache.v_aux(0)}) {
      if (!t->defined()) continue;
      std::vector<uint8_t> b(t->nbytes());
      t->copy_to_host(b.data());
      all.insert(all.end(), b.begin(), b.end());
    }
  }
  return all;
}

TEST(BackendOps, UpdateAndAttend) {
  SKIP_WITHOUT_GPU();
  const int before = g_cases;
  const int gqa[][2] = {{4, 4}, {8, 4}, {8, 2}, {14, 2}, {4, 1}};
  for (DType st : {DType::F32, DType::BF16, DType::F16})
    for (bool ring : {false, true})
      for (int hd : {64, 128, 256})
        for (const auto& g : gqa) {
          // One prologue/packed/softcap variant per shape keeps the suite short
          // while every combination of the switches appears somewhere.
          const int k = (hd / 64 + g[0] + (ring ? 1 : 0)) % 4;
          AttendCase c{g[0], g[1], hd, st, ring, k == 1 || k == 3, k >= 2, k == 3 ? 30.f : 0.f};
          // bf16/f16 K/V are rounded on write; a prologue that differs in the
          // last bit (sincosf on the device) can flip one rounding.
          const double tol = st == DType::F32 ? 2e-5 : 4e-3;
          compare(describe(c), tol, [&](Stream& s, Device d) { return run_attend(c, s, d); });
        }
  report("update_and_attend", before);
}

// Quantized K/V (issue 15): int8 / int4 groups of 32 and 64, fp8, and K int8
// with V int4, over the same flat and ring (wrapped) steps of T > 1 then
// T = 1. Without the prologue both backends quantize the same inputs: the
// pools must hold the same bytes, and the outputs differ only by the order
// of the f32 sums (CUDA factors the scales out of each chunk's products). With
// the RoPE/norm prologue a k value that differs in its last bit may round to
// the neighbouring code: one code of int4 is 1/15 of a group's range, so the
// bound there is loose.
TEST(BackendOps, UpdateAndAttendQuantized) {
  SKIP_WITHOUT_GPU();
  const int before = g_cases;
  const KvFormat i8g32{KvType::Int8, 32}, i8g64{KvType::Int8, 64}, i4g32{KvType::Int4, 32}, i4g64{KvType::Int4, 64},
      fp8{KvType::Fp8};
  const int gqa[][2] = {{4, 4}, {8, 2}, {14, 2}, {4, 1}};
  for (const KvStorage& st : {KvStorage{i8g32}, KvStorage{i8g64}, KvStorage{i4g32}, KvStorage{i4g64},
                              KvStorage{fp8}, KvStorage{i8g64, i4g32}})
    for (bool ring : {false, true})
      for (int hd : {64, 128, 256})
        for (const auto& g : gqa) {
          const int k = (hd / 64 + g[0] + (ring ? 1 : 0)) % 4;
          AttendCase c{g[0], g[1], hd, st, ring, k == 1 || k == 3, k >= 2, k == 3 ? 30.f : 0.f};
          const bool int4 = st.k.type == KvType::Int4 || st.v.type == KvType::Int4;
          const double tol = !c.prologue ? 1e-4 : int4 ? 0.1 : 2e-2;
          compare(describe(c), tol, [&](Stream& s, Device d) { return run_attend(c, s, d); });
          if (!c.prologue)
            compare(describe(c) + " pool bytes", 0.0, [&](Stream& s, Device d) { return run_attend(c, s, d, true); });
        }
  report("update_and_attend quantized", before);
}

// The same over the tensor-core decode kernel for quantized pools
// (`attn=mma`; head dims 64 and 128, one-token steps): the same bounds, the
// same pool bytes.
TEST(BackendOps, UpdateAndAttendQuantizedOnTheTensorCores) {
  SKIP_WITHOUT_GPU();
  const int before = g_cases;
  const KvFormat i8g32{KvType::Int8, 32}, i8g64{KvType::Int8, 64}, i4g32{KvType::Int4, 32}, i4g64{KvType::Int4, 64},
      fp8{KvType::Fp8};
  const int gqa[][2] = {{4, 4}, {8, 2}, {14, 2}, {4, 1}, {16, 2}};
  for (const KvStorage& st : {KvStorage{i8g32}, KvStorage{i8g64}, KvStorage{i4g32}, KvStorage{i4g64},
                              KvStorage{fp8}, KvStorage{i8g64, i4g32}, KvStorage{i8g32, i4g64}})
    for (bool ring : {false, true})
      for (int hd : {64, 128})
      for (const auto& g : gqa)
        for (int k = 0; k < 4; k += 2) {  // without, then with the prologue (packed, softcap)
          AttendCase c{g[0], g[1], hd, st, ring, k == 2, k == 2, k == 2 ? 30.f : 0.f, Tuning::parse("attn=mma")};
          const bool int4 = st.k.type == KvType::Int4 || st.v.type == KvType::Int4;
          const double tol = !c.prologue ? 1e-4 : int4 ? 0.1 : 2e-2;
          compare(describe(c) + " attn=mma", tol, [&](Stream& s, Device d) { return run_attend(c, s, d); });
          if (!c.prologue)
            compare(describe(c) + " attn=mma pool bytes", 0.0,
                    [&](Stream& s, Device d) { return run_attend(c, s, d, true); });
        }
  report("update_and_attend quantized, attn=mma", before);
}

// The same kernel over long spans: ~6K keys a head, flat and a ring that
// wrapped, so a head's keys make dozens of chunks, claimed by fewer blocks
// than there are chunks. The pools are filled with the same random codes and
// scales on both backends (a prefill this long is minutes of CPU), then come
// one-token steps; the bound is that of the short cases.
std::vector<float> run_long_quantized(const KvStorage& st, bool ring, int hd, Stream& s, Device d) {
  const int Hq = 32, Hkv = 8, L = 6000, window = 4000;
  if (d == Device::CUDA) s.set_tuning(Tuning::parse("attn=mma"));
  CacheConfig cfg;
  cfg.storage = st;
  cfg.device = d;
  cfg.layers = {LayerSpec{ring ? CachePolicy(Ring{window, 8}) : CachePolicy(Flat{L + 64}), Hq, Hkv, hd}};
  SequenceCache cache(cfg);
  std::mt19937 rng(7);
  auto fill_codes = [&](Tensor t, KvType type) {
    std::vector<uint8_t> b(t.nbytes());
    for (auto& x : b) {
      x = uint8_t(rng());
      if (type == KvType::Fp8 && (x & 0x7f) == 0x7f) x ^= 1;  // not NaN
    }
    t.copy_from_host(b.data());
  };
  auto fill_aux = [&](Tensor t, KvType type) {
    std::vector<uint32_t> w(t.nbytes() / 4);
    std::uniform_real_distribution<float> scale(0.002f, 0.03f), bias(-0.5f, 0.5f);
    for (auto& x : w) {
      if (type == KvType::Fp8) {
        const float f = scale(rng);
        std::memcpy(&x, &f, 4);
      } else {
        x = uint32_t(f32_to_f16(scale(rng))) | uint32_t(f32_to_f16(bias(rng))) << 16;
      }
    }
    t.copy_from_host(w.data());
  };
  fill_codes(cache.k_pool(0), st.k.type);
  fill_codes(cache.v_pool(0), st.v.type);
  fill_aux(cache.k_aux(0), st.k.type);
  fill_aux(cache.v_aux(0), st.v.type);
  cache.set_extent(L, L);
  Tensor pos = Tensor::zeros({1}, DType::I32, d);
  std::vector<float> all;
  uint32_t seed = 300;
  for (int step = 0; step < 4; ++step) {
    const int32_t p = cache.length();
    pos.copy_from_host(&p);
    Tensor q = make(randn(size_t(Hq) * hd, seed++), {1, Hq, hd}, d);
    Tensor k = make(randn(size_t(Hkv) * hd, seed++), {1, Hkv, hd}, d);
    Tensor v = make(randn(size_t(Hkv) * hd, seed++), {1, Hkv, hd}, d);
    Tensor out = Tensor::zeros({1, Hq, hd}, DType::F32, d);
    const CacheStep cs = cache.begin_step(s, pos, 1);
    ops::AttendArgs a{.cache = &cache, .step = cs, .layer = 0, .out = &out, .scale = 1.f / std::sqrt(float(hd))};
    a.q = &q;
    a.k = &k;
    a.v = &v;
    ops::update_and_attend(s, a);
    s.synchronize();
    cache.commit(cs);
    const std::vector<float> o = out.to_f32_vector();
    all.insert(all.end(), o.begin(), o.end());
  }
  return all;
}

TEST(BackendOps, UpdateAndAttendQuantizedOnTheTensorCoresOverLongSpans) {
  SKIP_WITHOUT_GPU();
  const int before = g_cases;
  const KvFormat i8g32{KvType::Int8, 32}, i8g64{KvType::Int8, 64}, i4g32{KvType::Int4, 32}, i4g64{KvType::Int4, 64},
      fp8{KvType::Fp8};
  for (const KvStorage& st : {KvStorage{i8g32}, KvStorage{i8g64}, KvStorage{i4g32}, KvStorage{i4g64},
                              KvStorage{fp8}, KvStorage{i8g64, i4g32}, KvStorage{i8g32, i4g64}})
    for (bool ring : {false, true})
      for (int hd : {64, 128})
        compare(std::string("long ") + (ring ? "ring " : "flat ") + kv_storage_name(st) + " hd=" + std::to_string(hd) +
                    " attn=mma",
                1e-4, [&](Stream& s, Device d) { return run_long_quantized(st, ring, hd, s, d); });
  report("update_and_attend quantized over long spans, attn=mma", before);
}

}  // namespace
