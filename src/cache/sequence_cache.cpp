#include "kvgraph/cache/sequence_cache.h"

#include <algorithm>
#include <climits>

#include "kvgraph/error.h"
#include "kvgraph/ops.h"

namespace kvgraph {

namespace {

void validate(const CacheConfig& c) {
  if (c.layers.empty()) fail("sequence_cache", "config has no layers");
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
    const KvStorage& st = l.storage ? *l.storage : c.storage;
    for (const auto& [name, f] : {std::pair{"K", st.k}, std::pair{"V", st.v}}) {
      const std::string why = kv_format_problem(f, l.head_dim);
      if (!why.empty()) fail("sequence_cache", "layer {}: {} storage: {}", i, name, why);
    }
    if (c.device == Device::CUDA) {
      const std::string why = kv_cuda_problem(st);
      if (!why.empty()) fail("sequence_cache", "layer {}: {}", i, why);
    }
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
    const KvStorage st = l.storage ? *l.storage : config_.storage;
    storage_.push_back(st);
    // Codes [n_kv_heads, pool, head_dim] in the plain dtype, or u8 rows of
    // code_bytes; aux rows beside them for the quantized formats.
    auto codes = [&](KvFormat f) {
      const int64_t width = f.quantized() ? f.code_bytes(l.head_dim) : l.head_dim;
      return Tensor::zeros({l.n_kv_heads, l.policy.pool(), width}, f.dtype, config_.device);
    };
    auto aux = [&](KvFormat f) {
      if (!f.quantized()) return Tensor();
      return Tensor::zeros({l.n_kv_heads, l.policy.pool(), f.aux_bytes(l.head_dim)}, DType::U8, config_.device);
    };
    k_.push_back(codes(st.k));
    v_.push_back(codes(st.v));
    k_aux_.push_back(aux(st.k));
    v_aux_.push_back(aux(st.v));
  }
  plans_.resize(policies_.size());
}

std::vector<const Tensor*> SequenceCache::layer_pools(int layer) const {
  std::vector<const Tensor*> out;
  for (const Tensor* t : {&k_.at(layer), &k_aux_.at(layer), &v_.at(layer), &v_aux_.at(layer)})
    if (t->defined()) out.push_back(t);
  return out;
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
  for (int l = 0; l < n_layers(); ++l)
    for (const Tensor* t : layer_pools(l)) b += t->nbytes();
  return b;
}

size_t SequenceCache::bytes_per_token(int layer) const {
  const LayerSpec& l = config_.layers.at(layer);
  const KvStorage& st = storage_.at(layer);
  return static_cast<size_t>(l.n_kv_heads) * static_cast<size_t>(st.k.row_bytes(l.head_dim) + st.v.row_bytes(l.head_dim));
}

void SequenceCache::reserve(int64_t n) const {
  if (n < 0) fail("sequence_cache", "reserve({}): negative", n);
  const int64_t cap = capacity();
  if (length_ + n > cap)
    throw CacheFull(fmt::format("[sequence_cache] cache is full: {} of {} positions used, {} more tokens do not "
                                "fit; nothing was written",
                                length_, cap, n));
}

CacheStep SequenceCache::begin_step(Stream& stream, const Tensor& pos, int32_t T) {
  if (pos.dtype() != DType::I32 || pos.numel() < 1 || pos.device() != config_.device)
    fail("sequence_cache", "begin_step: pos must be an i32 tensor on {}", device_name(config_.device));
  if (T < 1 || T > max_write())
    fail("sequence_cache", "begin_step: a step of {} tokens is outside [1, {}] (the largest step this cache takes)",
         T, max_write());
  CacheStep step{pos.data<int32_t>(), T, plans_.data()};
  if (config_.device == Device::CPU) {
    // One plan per distinct policy, computed when the op runs (a recorded
    // step reads the position then); plan() throws before any layer writes
    // if the step would not fit.
    stream.submit([this, p = step.pos, T] {
      for (size_t i = 0; i < policies_.size(); ++i) plans_[i] = plan(policies_[i], *p, T);
    });
  }
  return step;
}

void SequenceCache::commit(const CacheStep& step) {
  reserve(step.T);
  length_ += step.T;
  written_ = std::max(written_, length_);
}

bool SequenceCache::can_trim(int32_t n, int32_t written) const {
  if (n < 0 || n > length_) return false;
  for (const LayerSpec& l : config_.layers)
    if (l.policy.is_ring() && first_visible(l.policy.rule(), n) < oldest_resident(l.policy.rule(), written))
      return false;
  return true;
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
           "a ring layer can trim back at most max_write = {} tokens from the furthest length written ({})",
           n, i, p.describe(), need, n, p.max_write(), written_);
  }
  length_ = n;
}

void SequenceCache::copy_from(Stream& stream, const SequenceCache& other) {
  if (other.config_.layers.size() != config_.layers.size() || other.config_.device != config_.device)
    fail("sequence_cache", "copy_from: the caches have different configs");
  for (int l = 0; l < n_layers(); ++l) {
    if (!(other.config_.layers[l].policy == config_.layers[l].policy))
      fail("sequence_cache", "copy_from: layer {} has policy {} here and {} in the source", l,
           config_.layers[l].policy.describe(), other.config_.layers[l].policy.describe());
    if (other.storage_[l] != storage_[l])
      fail("sequence_cache", "copy_from: layer {} stores {} here and {} in the source", l,
           kv_storage_name(storage_[l]), kv_storage_name(other.storage_[l]));
  }
  const std::vector<Tensor>* from[] = {&other.k_, &other.k_aux_, &other.v_, &other.v_aux_};
  std::vector<Tensor>* to[] = {&k_, &k_aux_, &v_, &v_aux_};
  for (int l = 0; l < n_layers(); ++l)
    for (int i = 0; i < 4; ++i)
      if ((*to[i])[l].defined()) ops::copy(stream, (*from[i])[l], (*to[i])[l]);
  length_ = other.length_;
  written_ = other.written_;
}

void SequenceCache::snapshot_rings(Stream& stream, RingSnapshot& snap) const {
  std::vector<Tensor>* parts[] = {&snap.k, &snap.k_aux, &snap.v, &snap.v_aux};
  const std::vector<Tensor>* pools[] = {&k_, &k_aux_, &v_, &v_aux_};
  for (std::vector<Tensor>* p : parts) p->resize(n_layers());
  for (int l = 0; l < n_layers(); ++l) {
    if (!config_.layers[l].policy.is_ring()) continue;
    for (int i = 0; i < 4; ++i) {
      const Tensor& from = (*pools[i])[l];
      if (!from.defined()) continue;
      Tensor& to = (*parts[i])[l];
      if (!to.defined()) to = Tensor::empty(from.shape(), from.dtype(), from.device());  // allocated once, reused
      ops::copy(stream, from, to);
    }
  }
  snap.length = length_;
  snap.written = written_;
}

void SequenceCache::restore_rings(Stream& stream, const RingSnapshot& snap) {
  const std::vector<Tensor>* parts[] = {&snap.k, &snap.k_aux, &snap.v, &snap.v_aux};
  std::vector<Tensor>* pools[] = {&k_, &k_aux_, &v_, &v_aux_};
  for (int l = 0; l < n_layers(); ++l) {
    if (!config_.layers[l].policy.is_ring()) continue;
    for (int i = 0; i < 4; ++i) {
      Tensor& to = (*pools[i])[l];
      if (!to.defined()) continue;
      if (l >= static_cast<int>(parts[i]->size()) || !(*parts[i])[l].defined())
        fail("sequence_cache", "restore_rings: the snapshot has no rows for ring layer {}", l);
      ops::copy(stream, (*parts[i])[l], to);
    }
  }
  length_ = snap.length;
  written_ = snap.written;
}

namespace {

// Rows [0, rows) of each KV head of a pool [n_kv_heads, pool, head_dim], as
// contiguous views (one per head).
std::vector<Tensor> head_rows(const Tensor& pool, int32_t rows) {
  std::vector<Tensor> out;
  for (int64_t h = 0; h < pool.dim(0); ++h)
    out.push_back(pool.slice_rows(h, 1).reshape({pool.dim(1), pool.dim(2)}).slice_rows(0, rows));
  return out;
}

}  // namespace

size_t SequenceCache::layer_state_bytes(int layer) const {
  const CachePolicy& p = policy(layer);
  const int32_t rows = p.is_ring() ? p.pool() : length_;
  return static_cast<size_t>(rows) * bytes_per_token(layer);
}

void SequenceCache::export_layer(int layer, std::byte* out) const {
  const CachePolicy& p = policy(layer);
  const int32_t rows = p.is_ring() ? p.pool() : length_;
  if (rows == 0) return;
  for (const Tensor* pool : layer_pools(layer))
    for (const Tensor& t : head_rows(*pool, rows)) {
      t.copy_to_host(out);
      out += t.nbytes();
    }
}

void SequenceCache::import_layer(int layer, const std::byte* in, int32_t length, bool from_flat) {
  const CachePolicy& p = policy(layer);
  if (length < 0 || length > capacity())
    fail("sequence_cache", "import: length {} is outside [0, {}]", length, capacity());
  if (from_flat && p.is_ring()) {
    const int32_t lo = oldest_resident(p.rule(), length);
    for (const Tensor* pool : layer_pools(layer)) {
      const size_t row_bytes = static_cast<size_t>(pool->dim(2)) * dtype_size(pool->dtype());  // one head's row
      std::vector<Tensor> heads = head_rows(*pool, p.pool());
      for (Tensor& h : heads) {
        for (int32_t pos = lo; pos < length; ++pos) {
          Tensor dst = h.slice_rows(slot_of(p.rule(), pos), 1);
          dst.copy_from_host(in + static_cast<size_t>(pos) * row_bytes);
        }
        in += static_cast<size_t>(length) * row_bytes;
      }
    }
    return;
  }
  const int32_t rows = p.is_ring() ? p.pool() : length;
  if (rows == 0) return;
  for (const Tensor* pool : layer_pools(layer))
    for (Tensor t : head_rows(*pool, rows)) {
      t.copy_from_host(in);
      in += t.nbytes();
    }
}

void SequenceCache::set_extent(int32_t length, int32_t written) {
  if (length < 0 || length > capacity() || written < length)
    fail("sequence_cache", "set_extent: length {} / written {} do not fit a cache of capacity {}", length, written,
         capacity());
  length_ = length;
  written_ = written;
}

void SequenceCache::reset() {
  length_ = 0;
  written_ = 0;
}

}  // namespace kvgraph
