#include "kvgraph/cache/sequence_cache.h"
#include "kvgraph/ops.h"

#include <cmath>
#include <cstring>
#include <random>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "kvgraph/error.h"

using namespace kvgraph;
using ::testing::HasSubstr;

namespace {

// Independent reference: every row ever written kept in f32, attention over
// positions (qpos - window, qpos] (or [0, qpos] without a window).
struct History {
  int Hkv, D;
  std::vector<float> k, v;  // [pos][Hkv][D]
  void append(const std::vector<float>& kt, const std::vector<float>& vt) {
    k.insert(k.end(), kt.begin(), kt.end());
    v.insert(v.end(), vt.begin(), vt.end());
  }
  std::vector<float> attend(const float* q, int qpos, int Hq, int window, float scale, float softcap) const {
    std::vector<float> out(static_cast<size_t>(Hq) * D, 0.f);
    int lo = window > 0 ? std::max(0, qpos - window + 1) : 0;
    for (int h = 0; h < Hq; ++h) {
      int hk = h / (Hq / Hkv);
      std::vector<double> s;
      double mx = -1e300;
      for (int j = lo; j <= qpos; ++j) {
        double d = 0;
        for (int e = 0; e < D; ++e) d += double(q[h * D + e]) * k[(size_t(j) * Hkv + hk) * D + e];
        d *= scale;
        if (softcap > 0) d = softcap * std::tanh(d / softcap);
        s.push_back(d);
        mx = std::max(mx, d);
      }
      double sum = 0;
      for (double& x : s) sum += (x = std::exp(x - mx));
      for (int j = lo; j <= qpos; ++j)
        for (int e = 0; e < D; ++e)
          out[h * D + e] += float(s[j - lo] / sum * v[(size_t(j) * Hkv + hk) * D + e]);
    }
    return out;
  }
};

std::vector<float> random_vec(std::mt19937& rng, size_t n, float amp = 1.f) {
  std::uniform_real_distribution<float> d(-amp, amp);
  std::vector<float> x(n);
  for (float& f : x) f = d(rng);
  return x;
}

struct Scale {
  float scale = 1.0f, softcap = 0.0f;
};

// Runs one eager CPU step through the cache on every layer.
struct Stepper {
  SequenceCache& cache;
  Stream stream{Device::CPU};
  Tensor pos = Tensor::zeros({1}, DType::I32, Device::CPU);
  void step(int layer_count, int T, const std::vector<std::vector<float>>& q,
            const std::vector<std::vector<float>>& k, const std::vector<std::vector<float>>& v,
            std::vector<std::vector<float>>& out, Scale prm) {
    *pos.data<int32_t>() = cache.length();
    const CacheStep step = cache.begin_step(stream, pos, T);
    for (int l = 0; l < layer_count; ++l) {
      const LayerSpec& s = cache.config().layers[l];
      Tensor tq = Tensor::from_host(q[l].data(), {T, s.n_heads, s.head_dim}, DType::F32, Device::CPU);
      Tensor tk = Tensor::from_host(k[l].data(), {T, s.n_kv_heads, s.head_dim}, DType::F32, Device::CPU);
      Tensor tv = Tensor::from_host(v[l].data(), {T, s.n_kv_heads, s.head_dim}, DType::F32, Device::CPU);
      Tensor to = Tensor::empty({T, s.n_heads, s.head_dim}, DType::F32, Device::CPU);
      ops::update_and_attend(stream, {.cache = &cache, .step = step, .layer = l, .q = &tq, .k = &tk, .v = &tv,
                                      .out = &to, .scale = prm.scale, .softcap = prm.softcap});
      out[l].assign(to.data<float>(), to.data<float>() + to.numel());
    }
    cache.commit(step);
  }
};

}  // namespace

// Ring attention over any sequence of steps equals full-history attention
// restricted to the window, for every query.
RC_GTEST_PROP(SequenceCacheProperty, RingEqualsWindowedFullHistory, ()) {
  const int window = *rc::gen::inRange(1, 24);
  const int max_write = *rc::gen::inRange(1, 9);
  const int Hkv = *rc::gen::inRange(1, 4);
  const int group = *rc::gen::inRange(1, 4);
  const int D = *rc::gen::element(1, 4, 8, 16, 32);
  const float softcap = *rc::gen::element(0.f, 5.f);
  const int Hq = Hkv * group;
  const int pool = window + max_write - 1;
  const uint32_t seed = *rc::gen::arbitrary<uint32_t>();
  std::mt19937 rng(seed);

  SequenceCache cache(CacheConfig{{LayerSpec{Ring{window, max_write}, Hq, Hkv, D}}, DType::F32, Device::CPU});
  Stepper st{cache};
  History hist{Hkv, D, {}, {}};
  const float scale = 1.0f / std::sqrt(float(D));
  // At least five wraps of the pool.
  while (cache.length() < 5 * pool + 3) {
    const int T = *rc::gen::inRange(1, max_write + 1);
    std::vector<std::vector<float>> q{random_vec(rng, size_t(T) * Hq * D, 2.f)};
    std::vector<std::vector<float>> k{random_vec(rng, size_t(T) * Hkv * D, 2.f)};
    std::vector<std::vector<float>> v{random_vec(rng, size_t(T) * Hkv * D)};
    std::vector<std::vector<float>> out(1);
    const int pos0 = cache.length();
    hist.append(k[0], v[0]);
    st.step(1, T, q, k, v, out, Scale{scale, softcap});
    for (int t = 0; t < T; ++t) {
      std::vector<float> ref = hist.attend(q[0].data() + size_t(t) * Hq * D, pos0 + t, Hq, window, scale, softcap);
      for (int i = 0; i < Hq * D; ++i)
        RC_ASSERT(std::abs(out[0][size_t(t) * Hq * D + i] - ref[i]) <= 1e-5f);
    }
  }
}

TEST(SequenceCache, MixedFlatAndRingLayersBehaveIndependently) {
  // Layer 0 flat, layer 1 ring(window 4), layer 2 flat: the same inputs into
  // every layer must give full attention on flat layers and windowed on ring.
  const int Hq = 2, Hkv = 1, D = 8, window = 4, max_write = 3;
  SequenceCache cache(CacheConfig{{LayerSpec{Flat{64}, Hq, Hkv, D}, LayerSpec{Ring{window, max_write}, Hq, Hkv, D},
                                   LayerSpec{Flat{64}, Hq, Hkv, D}},
                                  DType::F32, Device::CPU});
  Stepper st{cache};
  History hist{Hkv, D, {}, {}};
  std::mt19937 rng(7);
  int sizes[] = {3, 1, 2, 3, 1, 1, 3, 2, 1, 3, 3};
  for (int T : sizes) {
    auto q = random_vec(rng, size_t(T) * Hq * D, 2.f), k = random_vec(rng, size_t(T) * Hkv * D, 2.f),
         v = random_vec(rng, size_t(T) * Hkv * D);
    std::vector<std::vector<float>> out(3);
    int pos0 = cache.length();
    hist.append(k, v);
    st.step(3, T, {q, q, q}, {k, k, k}, {v, v, v}, out, Scale{0.35f, 0.f});
    for (int t = 0; t < T; ++t) {
      auto full = hist.attend(q.data() + t * Hq * D, pos0 + t, Hq, 0, 0.35f, 0.f);
      auto band = hist.attend(q.data() + t * Hq * D, pos0 + t, Hq, window, 0.35f, 0.f);
      for (int i = 0; i < Hq * D; ++i) {
        EXPECT_NEAR(out[0][t * Hq * D + i], full[i], 1e-5);
        EXPECT_NEAR(out[1][t * Hq * D + i], band[i], 1e-5);
        EXPECT_NEAR(out[2][t * Hq * D + i], full[i], 1e-5);
      }
    }
  }
  EXPECT_EQ(cache.length(), 23);
}

TEST(SequenceCache, Bf16AndF16StorageStayCloseToF32) {
  for (DType dt : {DType::BF16, DType::F16}) {
    const int Hq = 4, Hkv = 2, D = 16;
    SequenceCache cache(CacheConfig{{LayerSpec{Ring{6, 2}, Hq, Hkv, D}}, dt, Device::CPU});
    Stepper st{cache};
    History hist{Hkv, D, {}, {}};
    std::mt19937 rng(3);
    for (int s = 0; s < 20; ++s) {
      int T = 1 + s % 2;
      auto q = random_vec(rng, size_t(T) * Hq * D), k = random_vec(rng, size_t(T) * Hkv * D),
           v = random_vec(rng, size_t(T) * Hkv * D);
      std::vector<std::vector<float>> out(1);
      int pos0 = cache.length();
      hist.append(k, v);
      st.step(1, T, {q}, {k}, {v}, out, Scale{0.25f, 0.f});
      for (int t = 0; t < T; ++t) {
        auto ref = hist.attend(q.data() + t * Hq * D, pos0 + t, Hq, 6, 0.25f, 0.f);
        for (int i = 0; i < Hq * D; ++i) EXPECT_NEAR(out[0][t * Hq * D + i], ref[i], 1e-2) << dtype_name(dt);
      }
    }
  }
}

namespace {
std::vector<std::byte> snapshot(const SequenceCache& c) {
  std::vector<std::byte> b;
  for (int l = 0; l < c.n_layers(); ++l)
    for (const Tensor* t : {&c.k_pool(l), &c.v_pool(l)}) {
      size_t o = b.size();
      b.resize(o + t->nbytes());
      std::memcpy(b.data() + o, t->raw(), t->nbytes());
    }
  return b;
}
}  // namespace

TEST(SequenceCache, FlatOverflowRaisesBeforeAnyWriteAndLeavesCacheUnchanged) {
  const int Hq = 2, Hkv = 2, D = 4;
  SequenceCache cache(CacheConfig{{LayerSpec{Ring{4, 4}, Hq, Hkv, D}, LayerSpec{Flat{8}, Hq, Hkv, D}},
                                  DType::F32, Device::CPU});
  Stepper st{cache};
  std::mt19937 rng(1);
  auto mk = [&](int T, int H) { return random_vec(rng, size_t(T) * H * D); };
  std::vector<std::vector<float>> out(2);
  st.step(2, 4, {mk(4, Hq), mk(4, Hq)}, {mk(4, Hkv), mk(4, Hkv)}, {mk(4, Hkv), mk(4, Hkv)}, out, {0.5f, 0.f});
  st.step(2, 3, {mk(3, Hq), mk(3, Hq)}, {mk(3, Hkv), mk(3, Hkv)}, {mk(3, Hkv), mk(3, Hkv)}, out, {0.5f, 0.f});
  ASSERT_EQ(cache.length(), 7);
  const auto before = snapshot(cache);
  // Host-side check.
  try {
    cache.reserve(2);
    FAIL() << "expected overflow";
  } catch (const CacheFull& e) {
    EXPECT_THAT(e.what(), HasSubstr("cache is full: 7 of 8 positions used, 2 more tokens do not fit"));
  }
  EXPECT_NO_THROW(cache.reserve(1));
  // The op itself: the plan runs first in the step and throws before layer 0
  // (a ring layer that could have written) touches its pool.
  try {
    st.step(2, 2, {mk(2, Hq), mk(2, Hq)}, {mk(2, Hkv), mk(2, Hkv)}, {mk(2, Hkv), mk(2, Hkv)}, out, {0.5f, 0.f});
    FAIL() << "expected overflow";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("flat(capacity=8)"));
  }
  EXPECT_EQ(cache.length(), 7);
  EXPECT_EQ(snapshot(cache), before);
}

TEST(SequenceCache, BadConfigsNameLayerAndField) {
  auto expect_error = [](CacheConfig c, const std::string& what) {
    try {
      SequenceCache cache(std::move(c));
      ADD_FAILURE() << "expected error containing: " << what;
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr(what));
    }
  };
  expect_error(CacheConfig{{}, DType::F32, Device::CPU}, "no layers");
  expect_error(CacheConfig{{LayerSpec{Flat{0}, 2, 2, 4}}, DType::F32, Device::CPU}, "layer 0: capacity must be positive");
  expect_error(CacheConfig{{LayerSpec{Flat{8}, 2, 2, 4}, LayerSpec{Ring{0, 1}, 2, 2, 4}}, DType::F32, Device::CPU},
               "layer 1: window must be positive");
  expect_error(CacheConfig{{LayerSpec{Ring{4, 0}, 2, 2, 4}}, DType::F32, Device::CPU}, "layer 0: max_write must be positive");
  expect_error(CacheConfig{{LayerSpec{Flat{8}, 6, 4, 4}}, DType::F32, Device::CPU},
               "layer 0: n_heads 6 is not a multiple of n_kv_heads 4");
  expect_error(CacheConfig{{LayerSpec{Flat{8}, 2, 2, 0}}, DType::F32, Device::CPU}, "layer 0: head_dim must be positive");
  expect_error(CacheConfig{{LayerSpec{Flat{8}, -1, 2, 4}}, DType::F32, Device::CPU}, "layer 0: n_heads must be positive");
  expect_error(CacheConfig{{LayerSpec{Flat{8}, 2, 2, 4}, LayerSpec{Ring{16, 2}, 2, 2, 4}}, DType::F32, Device::CPU},
               "layer 1: window 16 is not smaller than the flat capacity 8");
  expect_error(CacheConfig{{LayerSpec{Flat{8}, 2, 2, 4}}, DType::I32, Device::CPU}, "storage dtype i32");
}

TEST(SequenceCache, StepLargerThanMaxWriteIsRejected) {
  SequenceCache cache(CacheConfig{{LayerSpec{Ring{4, 2}, 1, 1, 4}}, DType::F32, Device::CPU});
  Stream s(Device::CPU);
  Tensor pos = Tensor::zeros({1}, DType::I32, Device::CPU);
  try {
    cache.begin_step(s, pos, 3);
    FAIL() << "expected error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("a step of 3 tokens is outside [1, 2]"));
  }
  EXPECT_NO_THROW(cache.begin_step(s, pos, 2));
  EXPECT_EQ(cache.max_write(), 2);
}

TEST(SequenceCacheLifecycle, TrimFlatAnywhereRingOnlyWhileResident) {
  SequenceCache cache(CacheConfig{{LayerSpec{Flat{64}, 1, 1, 2}, LayerSpec{Ring{4, 2}, 1, 1, 2}}, DType::F32, Device::CPU});
  // pool 5: after 5 tokens nothing is evicted: any trim is fine.
  auto commit = [&](int32_t T) { cache.commit(CacheStep{nullptr, T, nullptr}); };
  commit(2); commit(2); commit(1);
  EXPECT_NO_THROW(cache.trim(0));
  EXPECT_EQ(cache.length(), 0);
  for (int i = 0; i < 10; ++i) commit(2);  // length 20, oldest resident 15
  EXPECT_NO_THROW(cache.trim(19));  // back 1
  EXPECT_NO_THROW(cache.trim(18));  // back 2 in total = max_write
  try {
    cache.trim(17);
    FAIL() << "expected error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("layer 1"));
    EXPECT_THAT(e.what(), HasSubstr("max_write=2"));
  }
  EXPECT_EQ(cache.length(), 18);
  EXPECT_THROW(cache.trim(19), Error);  // beyond length
  cache.reset();
  EXPECT_EQ(cache.length(), 0);
}

TEST(SequenceCacheLifecycle, TrimThenRewriteMatchesFreshHistory) {
  // Decode 12 tokens, trim back 2 (allowed), write 2 different ones: attention
  // equals that of a history with the replacement rows.
  const int Hq = 2, Hkv = 1, D = 4, W = 4, MW = 2;
  SequenceCache cache(CacheConfig{{LayerSpec{Ring{W, MW}, Hq, Hkv, D}}, DType::F32, Device::CPU});
  Stepper st{cache};
  History hist{Hkv, D, {}, {}};
  std::mt19937 rng(11);
  std::vector<std::vector<float>> out(1);
  for (int i = 0; i < 12; ++i) {
    auto q = random_vec(rng, Hq * D), k = random_vec(rng, Hkv * D), v = random_vec(rng, Hkv * D);
    hist.append(k, v);
    st.step(1, 1, {q}, {k}, {v}, out, {0.5f, 0.f});
  }
  cache.trim(10);
  hist.k.resize(10 * Hkv * D);
  hist.v.resize(10 * Hkv * D);
  for (int i = 0; i < 2; ++i) {
    auto q = random_vec(rng, Hq * D), k = random_vec(rng, Hkv * D), v = random_vec(rng, Hkv * D);
    int p = cache.length();
    hist.append(k, v);
    st.step(1, 1, {q}, {k}, {v}, out, {0.5f, 0.f});
    auto ref = hist.attend(q.data(), p, Hq, W, 0.5f, 0.f);
    for (int j = 0; j < Hq * D; ++j) EXPECT_NEAR(out[0][j], ref[j], 1e-5);
  }
}
