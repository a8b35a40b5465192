// Speculative decoding on the GPU: what the CPU suite proves
// (tests/decode/speculative_test.cpp) must hold for the CUDA kernels too.
//   - The multi-token GEMV (T <= kMaxGemvTokens, every launch shape, f32,
//     bf16 and quantized weights, each prologue and epilogue): row t of a
//     T-token product is bitwise the one-token product of that row.
//   - A recorded verify step's rows are bitwise decode steps' logits (the
//     multi-query decode attention included: long contexts with split KV,
//     rings wrapped, f32 and bf16 KV), every family.
//   - Greedy speculative generate() == plain generate() on CUDA (prompt
//     lookup, self draft, another model as draft; K 4 and 7; compiled and
//     eager), and on the trained default model with its text.
//   - Sampled: the first token follows plain sampling's distribution.
// Skips without a device.
#include <cmath>
#include <cstring>
#include <map>
#include <random>

#include <gtest/gtest.h>

#include "kvgraph/error.h"
#include "kvgraph/model.h"
#include "kvgraph/ops.h"
#include "kvgraph/quant.h"
#include "kvgraph/session.h"
#include "kvgraph/speculative.h"
#include "kvgraph/tokenizer.h"
#include "support/fixtures.h"
#include "support/model_cache.h"

using namespace kvgraph;
using namespace kvgraph::testing;

namespace {

bool same_bits(const std::vector<float>& a, const float* b, size_t n) {
  return a.size() >= n && std::memcmp(a.data(), b, n * sizeof(float)) == 0;
}

std::vector<float> random_vector(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = u(g);
  return v;
}

Tensor gpu(const std::vector<float>& v, std::vector<int64_t> shape) {
  return Tensor::from_host(v.data(), std::move(shape), DType::F32, Device::CUDA);
}

std::shared_ptr<const Model> fixture(const std::string& family) { return shared_fixture(family, Device::CUDA); }

std::vector<int32_t> prompt_for(const std::string& family) {
  std::vector<int32_t> p = load_reference(family).greedy_prompt;
  const std::vector<int32_t> again = p;
  p.insert(p.end(), again.begin(), again.end());
  return p;
}

class CudaSpeculative : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  }
};

class CudaMultiToken : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  }
};

}  // namespace

// Every GEMV launch shape (block2 for long rows, warp2, tuned warp4, the
// unaligned scalar fallback), plain f32 / bf16 and 4- and 8-bit weights,
// the several-token GEMV's variants (Tuning::multi), plain + bias, norm +
// gated, norm + residual: each row of T = 2..8 tokens
// equals the same row alone, bit for bit, and the product is right.
TEST_F(CudaMultiToken, LinearRowsAreOneTokenRows) {
  struct Shape {
    int N, K;
    const char* tune;
  };
  // (mt=...: the several-token GEMV's other row / batch variants.)
  for (const Shape sh : {Shape{520, 4096, ""}, Shape{1000, 1024, ""}, Shape{256, 512, "gemv=warp4"},
                         Shape{96, 100, ""}, Shape{520, 4096, "mt=r8u2"}, Shape{1000, 1024, "mt=r8u2"},
                         Shape{520, 4096, "mt=r8u1"}, Shape{1000, 1024, "mt=r4u4"}, Shape{520, 4096, "mt=r4u4"},
                         Shape{520, 4096, "mt=p4u2"}, Shape{518, 3000, "mt=p2u4"}, Shape{516, 4000, "mt=p8u1"},
                         Shape{520, 4096, "mt=h8u1"}, Shape{518, 3000, "mt=h4u2"}, Shape{516, 4000, "mt=h4u1"},
                         Shape{520, 4096, "mt=s8x3"}, Shape{518, 3000, "mt=s4x4"}, Shape{516, 4000, "mt=s4x6"},
                         Shape{520, 4096, "gemv=mma"}, Shape{1000, 1000, "gemv=mma8"}, Shape{518, 3000, "gemv=mma16"},
                         Shape{520, 4096, "gemv=mmax"}, Shape{1000, 1000, "gemv=mmax"}}) {
    // x in f32: the int8-x one-token kernel (qx=int8) is no several-token row.
    Stream s(Device::CUDA, Tuning::parse(std::string("qx=f32,") + sh.tune));
    const int N = sh.N, K = sh.K, T = 8;
    const auto wv = random_vector(size_t(N) * K, 3, 0.05f);
    const auto xv = random_vector(size_t(T) * K, 4);
    const auto nv = random_vector(K, 5);
    const auto rv = random_vector(size_t(T) * N, 7);
    std::vector<Weight> weights;
    weights.emplace_back(gpu(wv, {N, K}));
    std::vector<uint16_t> wb(wv.size());
    for (size_t i = 0; i < wv.size(); ++i) wb[i] = f32_to_bf16(wv[i]);
    weights.emplace_back(Tensor::from_host(wb.data(), {N, K}, DType::BF16, Device::CUDA));
    if (K % 64 == 0)
      for (int bits : {4, 8}) {
        Weight q;
        std::vector<uint32_t> words(size_t(N) * K * bits / 32);
        std::vector<float> sc(size_t(N) * K / 64), bi(sc.size());
        affine_quantize(wv.data(), N, K, bits, 64, words.data(), sc.data(), bi.data());
        q.w = Tensor::from_host(words.data(), {N, K * bits / 32}, DType::U32, Device::CUDA);
        q.scales = gpu(sc, {N, K / 64});
        q.biases = gpu(bi, {N, K / 64});
        q.format = {.bits = bits, .group = 64};
        weights.push_back(q);
      }
    Tensor x = gpu(xv, {T, K}), norm = gpu(nv, {K});
    for (const Weight& w : weights) {
      const std::vector<float> bias_v = random_vector(N, 6);
      Tensor bias = w.float_dtype() == DType::F32 ? gpu(bias_v, {N}) : Tensor();
      for (int mode = 0; mode < 3; ++mode) {
        ops::LinearOptions o;
        if (mode == 0 && bias.defined()) o.bias = &bias;
        if (mode > 0) o.norm = &norm;
        o.gated = mode == 1;
        const int N_out = o.gated ? N / 2 : N;
        for (int tt = 2; tt <= T; tt += 3) {
          Tensor xs = x.slice_rows(0, tt);
          Tensor res = gpu(rv, {T, N});
          Tensor rs = res.slice_rows(0, tt);
          if (mode == 2) o.residual = &rs;
          Tensor all = Tensor::zeros({tt, N_out}, DType::F32, Device::CUDA);
          ops::linear(s, xs, w, all, o);
          s.synchronize();
          const auto av = all.to_f32_vector();
          for (int t = 0; t < tt; ++t) {
            Tensor xt = x.slice_rows(t, 1), rt = res.slice_rows(t, 1);
            ops::LinearOptions ot = o;
            if (mode == 2) ot.residual = &rt;
            Tensor one = Tensor::zeros({1, N_out}, DType::F32, Device::CUDA);
            ops::linear(s, xt, w, one, ot);
            s.synchronize();
            ASSERT_TRUE(same_bits(one.to_f32_vector(), av.data() + size_t(t) * N_out, N_out))
                << N << "x" << K << " " << sh.tune << " " << format_name(w.format, w.float_dtype()) << " mode "
                << mode << " T " << tt << " row " << t;
          }
          if (mode == 0 && w.w.dtype() == DType::F32) {  // and it is the product
            for (int t = 0; t < tt; ++t)
              for (int n = 0; n < N; n += 37) {
                double ref = bias.defined() ? bias_v[n] : 0.0;
                for (int k = 0; k < K; ++k) ref += double(wv[size_t(n) * K + k]) * xv[size_t(t) * K + k];
                ASSERT_NEAR(av[size_t(t) * N + n], ref, 1e-4 * (1 + std::fabs(ref)));
              }
          }
        }
      }
    }
  }
}

// A verify step's rows are bitwise decode steps' logits and tokens, for
// every family, long contexts (flat layers split over several blocks; rings
// wrapped many times), f32 and bf16 KV, greedy and sampled.
TEST_P(CudaSpeculative, VerifyRowsAreDecodeSteps) {
  auto m = fixture(GetParam());
  const int32_t V = m->config().vocab_size;
  for (DType kv : {DType::BF16, DType::F32}) {
    for (float temperature : {0.0f, 0.9f}) {
      Session a(m, {.capacity = 1200, .max_write = 8, .kv_storage = kv});
      a.sampling() = {.temperature = temperature, .repetition_penalty = 1.3f, .seed = 5};
      a.prefill(prompt_for(GetParam()));
      a.sample();
      a.decode_many(700);  // past 512 keys: min_chunk at head dim 16-32 is 256-512, so flat layers split
      std::unique_ptr<Session> b = a.fork();
      const std::vector<int32_t> props = {3, 17, 3, 250, 9, 0, 42};
      const std::vector<int32_t> y = a.verify(props);
      const std::vector<float> rows = a.verify_logits();
      for (size_t i = 0; i <= props.size(); ++i) {
        if (i > 0) b->set_pending(props[i - 1]);
        const int32_t t = b->decode();
        EXPECT_EQ(y[i], t) << GetParam() << " row " << i;
        EXPECT_TRUE(same_bits(b->last_logits(), rows.data() + i * V, V))
            << GetParam() << " " << dtype_name(kv) << " temperature " << temperature << " row " << i;
      }
      EXPECT_EQ(a.decode(), b->decode());
    }
  }
}

// Greedy speculative generate() == plain generate() on CUDA.
TEST_P(CudaSpeculative, GreedyOutputIsPlainOutput) {
  auto m = fixture(GetParam());
  const std::vector<int32_t> prompt = prompt_for(GetParam());
  for (bool eager : {false, true}) {
    const SessionOptions so{.capacity = 256, .max_write = 8, .eager = eager};
    GenerateOptions go;
    go.max_tokens = 120;
    go.ignore_eos = true;
    Session p(m, so);
    const GenerateResult plain = p.generate(prompt, nullptr, go);
    const std::string other = GetParam() == "llama" ? "qwen3" : "llama";
    for (int k : {4, 7}) {
      PromptLookup lookup(2);
      DraftModel self(m, so), draft(fixture(other), so);
      for (Proposer* prop : std::vector<Proposer*>{&lookup, &self, &draft}) {
        go.proposer = prop;
        go.draft_tokens = k;
        Session s(m, so);
        const GenerateResult r = s.generate(prompt, nullptr, go);
        EXPECT_EQ(r.tokens, plain.tokens) << GetParam() << " " << prop->name() << " K " << k << " eager " << eager;
        EXPECT_EQ(s.tokens(), p.tokens()) << GetParam() << " " << prop->name();
        EXPECT_EQ(s.pending(), p.pending()) << GetParam() << " " << prop->name();
        if (prop == &self) EXPECT_EQ(r.speculative.accepted, r.speculative.proposed) << GetParam();
      }
      go.proposer = nullptr;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Families, CudaSpeculative, ::testing::ValuesIn(fixture_families()),
                         [](const auto& info) { return info.param; });

// Over int4 weights a verify step's rows are decode rows only with x in f32
// (verify steps always take f32 x; one-token steps take int8 x unless
// Tuning::quantized_int8_x is off): greedy speculative output is plain
// output there, and generate() refuses the default rather than drift.
TEST_F(CudaMultiToken, QuantizedWeightsSpeculativeTakesF32X) {
  auto m = Model::load(fixtures_dir() / "llama", Device::CUDA, {}, Model::CpuWeights::automatic,
                       QuantFormat{.bits = 4, .group = 32});
  ASSERT_TRUE(m->quantization().quantized());
  const std::vector<int32_t> prompt = prompt_for("llama");
  SessionOptions so{.capacity = 256, .max_write = 8};
  GenerateOptions go;
  go.max_tokens = 80;
  go.ignore_eos = true;
  PromptLookup lookup(2);
  go.proposer = &lookup;
  {
    Session s(m, so);
    EXPECT_THROW(s.generate(prompt, nullptr, go), Error);
    EXPECT_TRUE(s.tokens().empty());
  }
  so.tuning.quantized_int8_x = false;
  go.proposer = nullptr;
  Session p(m, so);
  const GenerateResult plain = p.generate(prompt, nullptr, go);
  go.proposer = &lookup;
  Session s(m, so);
  const GenerateResult r = s.generate(prompt, nullptr, go);
  EXPECT_EQ(r.tokens, plain.tokens);
  EXPECT_GT(r.speculative.proposed, 0);
}

// The trained default model with its tokenizer: the same text, and the
// prompt lookup keeps proposals.
TEST_F(CudaMultiToken, DefaultModelLookupTextIsPlainText) {
  const auto dir = std::filesystem::path(KVGRAPH_SOURCE_DIR) / "models" / "default";
  auto m = Model::load(dir, Device::CUDA);
  const Tokenizer tok = Tokenizer::from_file(dir);
  const std::string passage =
      "You have a deep appreciation of the arts and music. Good news from afar can bring you a welcome visitor.";
  const std::vector<int32_t> prompt = tok.encode(passage + "\n%\n" + passage.substr(0, 16), true);
  GenerateOptions go;
  go.max_tokens = 100;
  Session p(m, {.capacity = 512});
  const GenerateResult plain = p.generate(prompt, &tok, go);
  PromptLookup lookup(3);
  go.proposer = &lookup;
  go.draft_tokens = 4;
  Session s(m, {.capacity = 512});
  const GenerateResult r = s.generate(prompt, &tok, go);
  EXPECT_EQ(r.tokens, plain.tokens);
  EXPECT_EQ(r.text, plain.text);
  EXPECT_EQ(finish_reason_name(r.finish), std::string(finish_reason_name(plain.finish)));
  EXPECT_GT(r.speculative.accepted, 0);
}

// Sampled with prompt lookup on CUDA: the first token's histogram over 2000
// seeds against plain sampling's distribution (computed on the host from
// the same CUDA logits). Loose: chi-square below the 0.1% point.
TEST_F(CudaMultiToken, SampledFirstTokenKeepsTheDistribution) {
  auto m = fixture("qwen2");
  ops::SamplingParams sp{.temperature = 4.0f};
  Session base(m, {.capacity = 64, .max_write = 8});
  base.sampling() = sp;
  base.prefill(prompt_for("qwen2"));
  base.sample();
  base.set_pending(3);
  auto ref = base.fork();
  ref->decode();
  const auto l = ref->last_logits();
  std::vector<uint8_t> seen(l.size(), 0);
  for (int32_t t : ref->tokens()) seen[t] = 1;
  const ops::SampleCandidates c = ops::sampling_candidates(l.data(), int(l.size()), sp, nullptr, 0, seen.data());
  std::vector<double> p(l.size(), 0.0);
  for (size_t i = 0; i < c.ids.size(); ++i) p[c.ids[i]] = c.weights[i] / c.sum;
  const int32_t top = c.ids[0];
  class Fixed final : public Proposer {
   public:
    explicit Fixed(int32_t t) : t_(t) {}
    Proposal propose(const Session&, int) override { return {{t_, 11}, {}}; }
    const char* name() const override { return "fixed"; }
    int32_t t_;
  } prop(top);
  std::map<int32_t, int> counts;
  const int n = 2000;
  for (int i = 1; i <= n; ++i) {
    auto s = base.fork();
    s->sampling().seed = uint64_t(i) * 7919;
    SpeculativeStats st;
    ++counts[speculative_step(*s, prop, 2, st)[0]];
  }
  double chi = 0, pooled_e = 0;
  int pooled_o = 0, bins = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const double e = p[i] * n;
    const int o = counts.count(int32_t(i)) ? counts[int32_t(i)] : 0;
    if (e < 5) {
      pooled_e += e;
      pooled_o += o;
      continue;
    }
    chi += (o - e) * (o - e) / e;
    ++bins;
  }
  if (pooled_e > 0) chi += (pooled_o - pooled_e) * (pooled_o - pooled_e) / std::max(pooled_e, 1e-9), ++bins;
  const int df = bins - 1;
  ASSERT_GE(df, 10);
  const double a = 2.0 / (9.0 * df), crit = df * std::pow(1 - a + 3.0902 * std::sqrt(a), 3);
  EXPECT_LT(chi, crit) << "df " << df;
}
