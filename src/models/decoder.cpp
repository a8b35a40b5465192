// The decoder: one implementation, per-family switches from ModelConfig.
// Each family follows transformers' modeling_<family>.py step for step.
#include <cmath>

#include <fmt/format.h>

#include "kvgraph/error.h"
#include "kvgraph/model.h"
#include "kvgraph/ops.h"

namespace kvgraph {

CacheConfig Model::cache_config(int32_t capacity, int32_t max_write, DType storage) const {
  if (capacity < 1) fail("model", "cache capacity must be positive, got {}", capacity);
  if (max_write < 1) fail("model", "max_write must be positive, got {}", max_write);
  CacheConfig c;
  c.storage = storage;
  c.device = device_;
  for (int l = 0; l < cfg_.num_layers; ++l) {
    const int w = cfg_.layer_window[l];
    CachePolicy p = (w > 0 && w < capacity) ? CachePolicy(Ring{w, std::min(max_write, capacity)})
                                            : CachePolicy(Flat{capacity});
    c.layers.push_back(LayerSpec{p, cfg_.num_heads, cfg_.num_kv_heads, cfg_.head_dim});
  }
  return c;
}

void Model::upload_rope() {
  auto g = rope_inv_freq(cfg_.rope, cfg_.head_dim);
  auto lo = rope_inv_freq(cfg_.rope_local, cfg_.head_dim);
  inv_freq_global_ = Tensor::from_host(g.data(), {int64_t(g.size())}, DType::F32, device_);
  inv_freq_local_ = Tensor::from_host(lo.data(), {int64_t(lo.size())}, DType::F32, device_);
}

size_t Model::weight_bytes_read_per_token() const {
  if (lm_head_.raw() == embed_.raw()) return weight_bytes_;  // tied: the lm_head reads the table
  return weight_bytes_ - embed_.nbytes() + static_cast<size_t>(embed_.dim(1)) * dtype_size(embed_.dtype());
}

Workspace Model::make_workspace(int max_T, bool all_logits) const {
  const int64_t D = cfg_.hidden_size, F = cfg_.intermediate_size;
  const int64_t QD = int64_t(cfg_.num_heads) * cfg_.head_dim, KD = int64_t(cfg_.num_kv_heads) * cfg_.head_dim;
  Workspace w;
  w.max_T = max_T;
  w.logit_rows = all_logits ? max_T : 1;
  auto f32 = [&](int64_t rows, int64_t cols) { return Tensor::zeros({rows, cols}, DType::F32, device_); };
  w.x = f32(max_T, D);
  w.h = f32(max_T, D);
  w.o = f32(max_T, D);
  w.q = f32(max_T, QD);
  w.attn = f32(max_T, QD);
  w.k = f32(max_T, KD);
  w.v = f32(max_T, KD);
  w.gate = f32(max_T, F);
  w.up = f32(max_T, F);
  w.logits = f32(w.logit_rows, cfg_.vocab_size);
  return w;
}

void Model::forward(Stream& s, SequenceCache& cache, Workspace& ws, const Tensor& ids, const Tensor& pos, int T,
                    bool all_logits) const {
  if (T < 1 || T > ws.max_T) fail("model", "step of {} tokens exceeds the workspace ({} tokens)", T, ws.max_T);
  if (all_logits && ws.logit_rows < T) fail("model", "workspace keeps only {} logit rows", ws.logit_rows);
  const ModelConfig& c = cfg_;
  const int Hq = c.num_heads, Hkv = c.num_kv_heads, hd = c.head_dim;
  const float eps = c.rms_norm_eps;
  const bool plus1 = c.norm_weight_plus_one;

  Tensor x = ws.x.slice_rows(0, T), h = ws.h.slice_rows(0, T), o = ws.o.slice_rows(0, T);
  Tensor q = ws.q.slice_rows(0, T), k = ws.k.slice_rows(0, T), v = ws.v.slice_rows(0, T);
  Tensor attn = ws.attn.slice_rows(0, T), gate = ws.gate.slice_rows(0, T), up = ws.up.slice_rows(0, T);
  Tensor q3 = q.reshape({T, Hq, hd}), k3 = k.reshape({T, Hkv, hd});
  Tensor q_rows = q.reshape({int64_t(T) * Hq, hd}), k_rows = k.reshape({int64_t(T) * Hkv, hd});
  auto opt = [](const Tensor& t) { return t.defined() ? &t : nullptr; };

  ops::embedding(s, embed_, ids.slice_rows(0, T), x, c.embed_scale);
  cache.begin_step(s, pos, T);  // plans once per policy; a step that does not fit stops here
  for (int l = 0; l < c.num_layers; ++l) {
    const LayerWeights& L = layers_[l];
    const bool sliding = c.layer_window[l] > 0;
    // Attention block.
    ops::rms_norm(s, x, L.input_norm, h, eps, plus1);
    ops::linear(s, h, L.q_proj, opt(L.q_bias), q);
    ops::linear(s, h, L.k_proj, opt(L.k_bias), k);
    ops::linear(s, h, L.v_proj, opt(L.v_bias), v);
    if (c.qk_norm) {
      ops::rms_norm(s, q_rows, L.q_norm, q_rows, eps, plus1);
      ops::rms_norm(s, k_rows, L.k_norm, k_rows, eps, plus1);
    }
    const Tensor& inv_freq = sliding ? inv_freq_local_ : inv_freq_global_;
    ops::rope(s, q3, pos, inv_freq);
    ops::rope(s, k3, pos, inv_freq);
    cache.update_and_attend(s, l, q, k, v, attn, AttendParams{c.attention_scale(), c.attn_logit_softcap});
    ops::linear(s, attn, L.o_proj, opt(L.o_bias), o);
    if (c.sandwich_norms) {
      ops::rms_norm(s, o, L.post_attention_norm, o, eps, plus1);
      ops::add(s, x, o, x);
      ops::rms_norm(s, x, L.pre_feedforward_norm, h, eps, plus1);
    } else {
      ops::add(s, x, o, x);
      ops::rms_norm(s, x, L.post_attention_norm, h, eps, plus1);
    }
    // MLP block.
    ops::linear(s, h, L.gate_proj, opt(L.gate_bias), gate);
    ops::linear(s, h, L.up_proj, opt(L.up_bias), up);
    ops::act_mul(s, gate, up, gate, c.activation);
    ops::linear(s, gate, L.down_proj, opt(L.down_bias), o);
    if (c.sandwich_norms) ops::rms_norm(s, o, L.post_feedforward_norm, o, eps, plus1);
    ops::add(s, x, o, x);
  }
  // Head: every row, or only the last token's.
  Tensor rows = all_logits ? x : x.slice_rows(T - 1, 1);
  Tensor hrows = all_logits ? h : h.slice_rows(0, 1);
  Tensor logits = ws.logits.slice_rows(0, all_logits ? T : 1);
  ops::rms_norm(s, rows, final_norm_, hrows, eps, plus1);
  ops::linear(s, hrows, lm_head_, nullptr, logits);
  if (c.final_logit_softcap > 0.0f) ops::softcap(s, logits, c.final_logit_softcap);
}

}  // namespace kvgraph
