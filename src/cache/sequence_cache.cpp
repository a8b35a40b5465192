#include "kvgraph/cache/sequence_cache.h"

#include <algorithm>
#include <climits>

#include "kvgraph/error.h"
#include "ops/cpu/attention.h"
#ifdef KVGRAPH_HAVE_CUDA
#include "ops/cuda/ops_cuda.h"
#endif

namespace kvgraph {

namespace {

void validate(const CacheConfig& c) {
  if (c.layers.empty()) fail("sequence_cache", "config has no layers");
  if (c.storage != DType::F32 && c.storage != DType::BF16 && c.storage != DType::F16)
    fail("sequence_cache", "storage dtype {} is not supported (f32, bf16, f16)", dtype_name(c.storage));
  int32_t min_flat = INT32_MAX;
  for (const LayerSpec& l : c.layers)
    if (!l.policy.is_ring()) min_flat = std::min(min_flat, l.policy.capacity());
  for (size_t i = 0; i < c.layers.size(); ++i) {
    const LayerSpec& l = c.layers[i];
    if (l.n_heads <= 0) fail("sequence_cache", "layer {}: n_heads must be positive, got {}", i, l.n_heads);
    if (l.n_kv_heads <= 0)
      fail("sequence_cache", "layer {}: n_kv_heads must be positive, got {}", i, l.n_kv_heads);
    if (l.n_heads % l.n_kv_heads != 0)
      fail("sequence_cache", "layer {}: n_heads {} is not a multiple of n_kv_heads {}", i, l.n_heads,
           l.n_kv_heads);
    if (l.head_dim <= 0) fail("sequence_cache", "layer {}: head_dim must be positive, got {}", i, l.head_dim);
    if (l.policy.is_ring()) {
      if (l.policy.window() <= 0)
        fail("sequence_cache", "layer {}: window must be positive, got {}", i, l.policy.window());
      if (l.policy.max_write() <= 0)
        fail("sequence_cache", "layer {}: max_write must be positive, got {}", i, l.policy.max_write());
      // A sequence never outgrows the smallest flat layer, so a window at
      // least that long never slides: use a flat policy instead.
      if (min_flat != INT32_MAX && l.policy.window() >= min_flat)
        fail("sequence_cache", "layer {}: window {} is not smaller than the flat capacity {}; use Flat",
             i, l.policy.window(), min_flat);
    } else if (l.policy.capacity() <= 0) {
      fail("sequence_cache", "layer {}: capacity must be positive, got {}", i, l.policy.capacity());
    }
  }
}

}  // namespace

SequenceCache::SequenceCache(CacheConfig config) : config_(std::move(config)) {
  validate(config_);
  for (const LayerSpec& l : config_.layers) {
    auto it = std::find(policies_.begin(), policies_.end(), l.policy);
    policy_of_layer_.push_back(static_cast<int>(it - policies_.begin()));
    if (it == policies_.end()) policies_.push_back(l.policy);
    std::vector<int64_t> shape{l.n_kv_heads, l.policy.pool(), l.head_dim};
    k_.push_back(Tensor::zeros(shape, config_.storage, config_.device));
    v_.push_back(Tensor::zeros(shape, config_.storage, config_.device));
  }
  plans_.resize(policies_.size());
}

int32_t SequenceCache::capacity() const {
  int32_t c = INT32_MAX;
  for (const CachePolicy& p : policies_) c = std::min(c, p.capacity());
  return c;
}

int32_t SequenceCache::max_write() const {
  int32_t m = INT32_MAX;
  for (const CachePolicy& p : policies_) m = std::min(m, p.max_write());
  return m;
}

size_t SequenceCache::bytes() const {
  size_t b = 0;
  for (int l = 0; l < n_layers(); ++l) b += k_[l].nbytes() + v_[l].nbytes();
  return b;
}

size_t SequenceCache::bytes_per_token(int layer) const {
  const LayerSpec& l = config_.layers.at(layer);
  return 2 * static_cast<size_t>(l.n_kv_heads) * l.head_dim * dtype_size(config_.storage);
}

void SequenceCache::check_step(int32_t position, int32_t T) const {
  for (const CachePolicy& p : policies_) (void)plan(p, position, T);  // throws on misfit
}

void SequenceCache::begin_step(Stream& stream, const Tensor& pos, int32_t T) {
  if (pos.dtype() != DType::I32 || pos.numel() < 1 || pos.device() != config_.device)
    fail("sequence_cache", "begin_step: pos must be an i32 tensor on {}", device_name(config_.device));
  step_pos_ = pos.data<int32_t>();
  step_T_ = T;
  if (config_.device != Device::CPU) return;  // kernels derive slots from pos themselves
  // One plan per distinct policy, computed when the op runs.
  stream.submit([this, p = step_pos_, T] {
    for (size_t i = 0; i < policies_.size(); ++i) plans_[i] = plan(policies_[i], *p, T);
  });
}

void SequenceCache::update_and_attend(Stream& stream, int layer, const Tensor& q, const Tensor& k,
                                      const Tensor& v, Tensor& out, AttendParams params) {
  if (layer < 0 || layer >= n_layers())
    fail("update_and_attend", "layer {} out of range (cache has {} layers)", layer, n_layers());
  if (!step_pos_) fail("update_and_attend", "layer {}: called before begin_step", layer);
  const LayerSpec& l = config_.layers[layer];
  const int32_t T = step_T_;
  auto expect = [&](const Tensor& t, const char* name, int heads) {
    if (t.dtype() != DType::F32 || t.numel() != static_cast<int64_t>(T) * heads * l.head_dim)
      fail("update_and_attend", "layer {}: {} must be f32 [{}, {}, {}], got {} {}", layer, name, T, heads,
           l.head_dim, dtype_name(t.dtype()), t.shape_str());
  };
  expect(q, "q", l.n_heads);
  expect(k, "k", l.n_kv_heads);
  expect(v, "v", l.n_kv_heads);
  expect(out, "out", l.n_heads);
  const int64_t qs = int64_t(l.n_heads) * l.head_dim, ks = int64_t(l.n_kv_heads) * l.head_dim;
  attend(stream, layer, {q.data<float>(), qs}, {k.data<float>(), ks}, {v.data<float>(), ks}, out, params);
}

void SequenceCache::update_and_attend(Stream& stream, int layer, const Tensor& qkv, Tensor& out,
                                      AttendParams params) {
  if (layer < 0 || layer >= n_layers())
    fail("update_and_attend", "layer {} out of range (cache has {} layers)", layer, n_layers());
  if (!step_pos_) fail("update_and_attend", "layer {}: called before begin_step", layer);
  const LayerSpec& l = config_.layers[layer];
  const int32_t T = step_T_;
  const int64_t qs = int64_t(l.n_heads) * l.head_dim, ks = int64_t(l.n_kv_heads) * l.head_dim;
  const int64_t row = qs + 2 * ks;
  if (qkv.dtype() != DType::F32 || qkv.numel() != T * row)
    fail("update_and_attend", "layer {}: qkv must be f32 [{}, {}], got {} {}", layer, T, row,
         dtype_name(qkv.dtype()), qkv.shape_str());
  if (out.dtype() != DType::F32 || out.numel() != T * qs)
    fail("update_and_attend", "layer {}: out must be f32 [{}, {}], got {} {}", layer, T, qs,
         dtype_name(out.dtype()), out.shape_str());
  const float* p = qkv.data<float>();
  attend(stream, layer, {p, row}, {p + qs, row}, {p + qs + ks, row}, out, params);
}

void SequenceCache::attend(Stream& stream, int layer, Rows q, Rows k, Rows v, Tensor& out, AttendParams params) {
  const LayerSpec& l = config_.layers[layer];
  auto vec = [&](const Tensor* t, int64_t n, const char* name) -> const float* {
    if (!t) return nullptr;
    if (t->dtype() != DType::F32 || t->numel() != n || t->device() != config_.device)
      fail("update_and_attend", "layer {}: {} must be f32 [{}] on {}, got {} {}", layer, name, n,
           device_name(config_.device), dtype_name(t->dtype()), t->shape_str());
    return t->data<float>();
  };
  const float* q_norm = vec(params.q_norm, l.head_dim, "q_norm");
  const float* k_norm = vec(params.k_norm, l.head_dim, "k_norm");
  const float* inv_freq = vec(params.rope_inv_freq, l.head_dim / 2, "rope_inv_freq");
  if (config_.device == Device::CPU) {
    cpu::AttentionArgs a{&plans_[policy_of_layer_[layer]], l.policy.rule(), config_.storage,
                         k_[layer].raw(), v_[layer].raw(), q.p, k.p, v.p, out.data<float>(),
                         l.n_heads, l.n_kv_heads, l.head_dim, params.scale, params.softcap,
                         q.stride, k.stride, v.stride, q_norm, k_norm, params.norm_eps,
                         params.norm_plus_one, inv_freq};
    stream.submit([a] { cpu::update_and_attend(a); });
    return;
  }
#ifdef KVGRAPH_HAVE_CUDA
  cuda_ops::CacheAttendArgs a{step_pos_, step_T_, l.policy.rule(), config_.storage, k_[layer].raw(),
                              v_[layer].raw(), q.p, k.p, v.p, q.stride, k.stride, v.stride, out.data<float>(),
                              l.n_heads, l.n_kv_heads, l.head_dim, params.scale, params.softcap,
                              l.policy.is_ring() ? l.policy.pool() : l.policy.capacity(),
                              q_norm, k_norm, params.norm_eps, params.norm_plus_one, inv_freq};
  cuda_ops::update_and_attend(stream, a);
#else
  fail("update_and_attend", "has no implementation for device {}", device_name(config_.device));
#endif
}

void SequenceCache::commit(int32_t T) {
  check_step(length_, T);
  length_ += T;
  written_ = std::max(written_, length_);
}

void SequenceCache::trim(int32_t n) {
  if (n < 0 || n > length_) fail("sequence_cache", "trim({}): must be within [0, {}]", n, length_);
  for (int i = 0; i < n_layers(); ++i) {
    const CachePolicy& p = config_.layers[i].policy;
    if (!p.is_ring()) continue;
    // The next query (position n) needs positions > n - window; they must
    // still be resident, i.e. not older than the oldest surviving row.
    int32_t need = first_visible(p.rule(), n);
    int32_t oldest = oldest_resident(p.rule(), written_);
    if (need < oldest)
      fail("sequence_cache", "trim({}): layer {} ({}) has evicted position {} that position {} needs; "
           "a ring layer can trim back at most max_write={} tokens once it has wrapped",
           n, i, p.describe(), need, n, p.max_write());
  }
  length_ = n;
}

void SequenceCache::reset() {
  length_ = 0;
  written_ = 0;
}

}  // namespace kvgraph
