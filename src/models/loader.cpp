// Model::load: config.json + safetensors -> device tensors, named and
// shape-checked as transformers names them.
#include <cmath>
#include <random>

#include <fmt/format.h>

#include "kvgraph/error.h"
#include "kvgraph/model.h"
#include "kvgraph/safetensors.h"

namespace kvgraph {

namespace {

// Converts host f32 values to a device tensor of `dtype` (f32 or bf16).
Tensor upload(const std::vector<float>& host, std::vector<int64_t> shape, DType dtype, Device device) {
  if (dtype == DType::F32) return Tensor::from_host(host.data(), std::move(shape), DType::F32, device);
  std::vector<uint16_t> h(host.size());
  for (size_t i = 0; i < host.size(); ++i) h[i] = f32_to_bf16(host[i]);
  return Tensor::from_host(h.data(), std::move(shape), DType::BF16, device);
}

struct Loader {
  const WeightStore& store;
  Device device;
  DType matrix_dtype;
  size_t total_bytes = 0;
  size_t done_bytes = 0;
  const ProgressFn& progress;
  size_t* weight_bytes;

  Tensor get(const std::string& name, std::vector<int64_t> shape, bool matrix) {
    WeightView w = store.get(name, shape);
    if (w.dtype != DType::F32 && w.dtype != DType::BF16 && w.dtype != DType::F16)
      fail("weights", "tensor \"{}\": dtype {} is not a float type", name, dtype_name(w.dtype));
    Tensor t = upload(to_f32(w), std::move(shape), matrix ? matrix_dtype : DType::F32, device);
    *weight_bytes += t.nbytes();
    done_bytes += w.nbytes;
    if (progress) progress(done_bytes, total_bytes);
    return t;
  }
  // Biases are stored like their matrices (the CUDA GEMV reads both alike).
  Tensor maybe(const std::string& name, std::vector<int64_t> shape, bool present) {
    return present ? get(name, std::move(shape), true) : Tensor{};
  }
};

}  // namespace

std::shared_ptr<Model> Model::load(const std::filesystem::path& dir, Device device, const ProgressFn& progress) {
  std::shared_ptr<Model> m(new Model());
  m->cfg_ = load_model_config(dir);
  m->device_ = device;
  m->dir_ = dir;
  const ModelConfig& c = m->cfg_;
  WeightStore store(dir);

  // CPU computes in f32; CUDA keeps 16-bit checkpoints in bf16.
  m->matrix_dtype_ = (device == Device::CUDA && c.weight_dtype != DType::F32) ? DType::BF16 : DType::F32;
  Loader ld{store, device, m->matrix_dtype_, 0, 0, progress, &m->weight_bytes_};
  for (const std::string& n : store.names()) ld.total_bytes += store.get(n).nbytes;

  const int64_t D = c.hidden_size, F = c.intermediate_size, V = c.vocab_size, hd = c.head_dim;
  const int64_t QD = int64_t(c.num_heads) * hd, KD = int64_t(c.num_kv_heads) * hd;
  m->embed_ = ld.get("model.embed_tokens.weight", {V, D}, true);
  m->final_norm_ = ld.get("model.norm.weight", {D}, false);
  if (c.tie_word_embeddings || !store.has("lm_head.weight")) {
    if (!c.tie_word_embeddings) fail("weights", "missing tensor \"lm_head.weight\" in {}", dir.string());
    m->lm_head_ = m->embed_;
  } else {
    m->lm_head_ = ld.get("lm_head.weight", {V, D}, true);
  }
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    LayerWeights L;
    L.q_proj = ld.get(p + "self_attn.q_proj.weight", {QD, D}, true);
    L.k_proj = ld.get(p + "self_attn.k_proj.weight", {KD, D}, true);
    L.v_proj = ld.get(p + "self_attn.v_proj.weight", {KD, D}, true);
    L.o_proj = ld.get(p + "self_attn.o_proj.weight", {D, QD}, true);
    L.q_bias = ld.maybe(p + "self_attn.q_proj.bias", {QD}, c.attention_bias);
    L.k_bias = ld.maybe(p + "self_attn.k_proj.bias", {KD}, c.attention_bias);
    L.v_bias = ld.maybe(p + "self_attn.v_proj.bias", {KD}, c.attention_bias);
    L.o_bias = ld.maybe(p + "self_attn.o_proj.bias", {D}, c.attention_out_bias);
    if (c.qk_norm) {
      L.q_norm = ld.get(p + "self_attn.q_norm.weight", {hd}, false);
      L.k_norm = ld.get(p + "self_attn.k_norm.weight", {hd}, false);
    }
    L.input_norm = ld.get(p + "input_layernorm.weight", {D}, false);
    L.post_attention_norm = ld.get(p + "post_attention_layernorm.weight", {D}, false);
    if (c.sandwich_norms) {
      L.pre_feedforward_norm = ld.get(p + "pre_feedforward_layernorm.weight", {D}, false);
      L.post_feedforward_norm = ld.get(p + "post_feedforward_layernorm.weight", {D}, false);
    }
    L.gate_proj = ld.get(p + "mlp.gate_proj.weight", {F, D}, true);
    L.up_proj = ld.get(p + "mlp.up_proj.weight", {F, D}, true);
    L.down_proj = ld.get(p + "mlp.down_proj.weight", {D, F}, true);
    L.gate_bias = ld.maybe(p + "mlp.gate_proj.bias", {F}, c.mlp_bias);
    L.up_bias = ld.maybe(p + "mlp.up_proj.bias", {F}, c.mlp_bias);
    L.down_bias = ld.maybe(p + "mlp.down_proj.bias", {D}, c.mlp_bias);
    m->layers_.push_back(std::move(L));
  }
  m->upload_rope();
  return m;
}

}  // namespace kvgraph
