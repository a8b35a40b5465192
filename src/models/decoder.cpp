// The decoder: one implementation, per-family switches from ModelConfig.
// Each family follows transformers' modeling_<family>.py step for step.
#include <cmath>

#include <fmt/format.h>

#include "kvgraph/error.h"
#include "kvgraph/model.h"
#include "kvgraph/ops.h"

namespace kvgraph {

CacheConfig cache_config(const ModelConfig& cfg, Device device, int32_t capacity, int32_t max_write, KvStorage storage) {
  if (capacity < 1) fail("model", "cache capacity must be positive, got {}", capacity);
  if (max_write < 1) fail("model", "max_write must be positive, got {}", max_write);
  CacheConfig c;
  c.storage = storage;
  c.device = device;
  for (int l = 0; l < cfg.num_layers; ++l) {
    const int w = cfg.layer_window[l];
    CachePolicy p = (w > 0 && w < capacity) ? CachePolicy(Ring{w, std::min(max_write, capacity)})
                                            : CachePolicy(Flat{capacity});
    c.layers.push_back(LayerSpec{p, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim});
  }
  return c;
}

CacheConfig Model::cache_config(int32_t capacity, int32_t max_write, KvStorage storage) const {
  return kvgraph::cache_config(cfg_, device_, capacity, max_write, storage);
}

void Model::upload_rope() {
  auto g = rope_inv_freq(cfg_.rope, cfg_.head_dim);
  auto lo = rope_inv_freq(cfg_.rope_local, cfg_.head_dim);
  inv_freq_global_ = Tensor::from_host(g.data(), {int64_t(g.size())}, DType::F32, device_);
  inv_freq_local_ = Tensor::from_host(lo.data(), {int64_t(lo.size())}, DType::F32, device_);
}

size_t Model::weight_bytes_read_per_token() const {
  if (lm_head_.same_as(embed_)) return weight_bytes_;  // tied: the lm_head reads the table
  return weight_bytes_ - embed_.nbytes() + embed_.row_bytes();
}

Workspace Model::make_workspace(int max_T, bool all_logits) const {
  const int64_t D = cfg_.hidden_size, F = cfg_.intermediate_size;
  const int64_t QD = int64_t(cfg_.num_heads) * cfg_.head_dim, KD = int64_t(cfg_.num_kv_heads) * cfg_.head_dim;
  Workspace w;
  w.max_T = max_T;
  w.logit_rows = all_logits ? max_T : 1;
  auto f32 = [&](int64_t rows, int64_t cols) { return Tensor::zeros({rows, cols}, DType::F32, device_); };
  w.x = f32(max_T, D);
  w.o = f32(max_T, D);
  w.qkv = f32(max_T, QD + 2 * KD);
  w.attn = f32(max_T, QD);
  w.act = f32(max_T, F);
  w.logits = f32(w.logit_rows, cfg_.vocab_size);
  return w;
}

// One step, in fused ops (a decode layer is 5 kernels on CUDA for Llama-like
// models): [norm + QKV] -> [q/k norm + RoPE + update_and_attend] -> [O +
// residual] -> [norm + gate/up + act] -> [down + residual]. Gemma's sandwich
// norms add a norm-and-accumulate after each block instead of the residual
// epilogue. Each bracket is one op.
CacheStep Model::forward(Stream& s, SequenceCache& cache, Workspace& ws, const Tensor& ids, const Tensor& pos,
                         int T, bool all_logits) const {
  if (T < 1 || T > ws.max_T) fail("model", "step of {} tokens exceeds the workspace ({} tokens)", T, ws.max_T);
  if (all_logits && ws.logit_rows < T) fail("model", "workspace keeps only {} logit rows", ws.logit_rows);
  const ModelConfig& c = cfg_;
  const float eps = c.rms_norm_eps;
  const bool plus1 = c.norm_weight_plus_one;

  Tensor x = ws.x.slice_rows(0, T), o = ws.o.slice_rows(0, T), qkv = ws.qkv.slice_rows(0, T);
  Tensor attn = ws.attn.slice_rows(0, T), act = ws.act.slice_rows(0, T);
  auto opt = [](const Tensor& t) { return t.defined() ? &t : nullptr; };
  auto normed = [&](const Tensor& norm) {
    ops::LinearOptions lo;
    lo.norm = &norm;
    lo.norm_eps = eps;
    lo.norm_plus_one = plus1;
    return lo;
  };
  // x += in @ w^T + bias: the product's residual epilogue, or, with Gemma's
  // sandwich norms, the product into o and then x += rms_norm(o) weighted by `post`.
  auto add_to_x = [&](const Tensor& in, const Weight& w, const Tensor& bias, const Tensor& post) {
    ops::LinearOptions lo;
    lo.bias = opt(bias);
    if (c.sandwich_norms) {
      ops::linear(s, in, w, o, lo);
      ops::rms_norm_add(s, o, post, x, eps, plus1);
    } else {
      lo.residual = &x;
      ops::linear(s, in, w, x, lo);
    }
  };

  ops::embedding(s, embed_, ids.slice_rows(0, T), x, c.embed_scale);
  const CacheStep step = cache.begin_step(s, pos, T);  // plans once per policy
  for (int l = 0; l < c.num_layers; ++l) {
    const LayerWeights& L = layers_[l];
    const bool sliding = c.layer_window[l] > 0;
    // Attention block.
    ops::LinearOptions qkv_o = normed(L.input_norm);
    qkv_o.bias = opt(L.qkv_bias);
    ops::linear(s, x, L.qkv_proj, qkv, qkv_o);
    ops::update_and_attend(s, {.cache = &cache,
                               .step = step,
                               .layer = l,
                               .qkv = &qkv,
                               .out = &attn,
                               .scale = c.attention_scale(),
                               .softcap = c.attn_logit_softcap,
                               .q_norm = c.qk_norm ? &L.q_norm : nullptr,
                               .k_norm = c.qk_norm ? &L.k_norm : nullptr,
                               .norm_eps = eps,
                               .norm_plus_one = plus1,
                               .rope_inv_freq = sliding ? &inv_freq_local_ : &inv_freq_global_});
    add_to_x(attn, L.o_proj, L.o_bias, L.post_attention_norm);
    // MLP block.
    ops::LinearOptions up_o = normed(c.sandwich_norms ? L.pre_feedforward_norm : L.post_attention_norm);
    up_o.bias = opt(L.gate_up_bias);
    up_o.gated = true;
    up_o.act = c.activation;
    ops::linear(s, x, L.gate_up_proj, act, up_o);
    add_to_x(act, L.down_proj, L.down_bias, L.post_feedforward_norm);
  }
  // Head: every row, or only the last token's.
  Tensor rows = all_logits ? x : x.slice_rows(T - 1, 1);
  Tensor logits = ws.logits.slice_rows(0, all_logits ? T : 1);
  ops::linear(s, rows, lm_head_, logits, normed(final_norm_));
  if (c.final_logit_softcap > 0.0f) ops::softcap(s, logits, c.final_logit_softcap);
  return step;
}

}  // namespace kvgraph
