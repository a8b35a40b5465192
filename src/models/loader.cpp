// Model::load: config.json + safetensors -> device tensors, named and
// shape-checked as transformers names them.
#include <algorithm>
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

  // One checkpoint tensor as f32 values on the host (shape-checked).
  std::vector<float> host(const std::string& name, const std::vector<int64_t>& shape) {
    WeightView w = store.get(name, shape);
    if (w.dtype != DType::F32 && w.dtype != DType::BF16 && w.dtype != DType::F16)
      fail("weights", "tensor \"{}\": dtype {} is not a float type", name, dtype_name(w.dtype));
    std::vector<float> v = to_f32(w);
    done_bytes += w.nbytes;
    if (progress) progress(done_bytes, total_bytes);
    return v;
  }
  Tensor put(const std::vector<float>& v, std::vector<int64_t> shape, bool matrix) {
    Tensor t = upload(v, std::move(shape), matrix ? matrix_dtype : DType::F32, device);
    *weight_bytes += t.nbytes();
    return t;
  }
  Tensor get(const std::string& name, std::vector<int64_t> shape, bool matrix) {
    return put(host(name, shape), shape, matrix);
  }
  // Tensors stacked along their first dimension into one (fused projections).
  // Biases are stored like their matrices (the CUDA GEMV reads both alike).
  Tensor stacked(const std::vector<std::string>& names, const std::vector<int64_t>& rows, int64_t cols) {
    std::vector<float> all;
    int64_t total = 0;
    for (size_t i = 0; i < names.size(); ++i) {
      std::vector<int64_t> shape = cols ? std::vector<int64_t>{rows[i], cols} : std::vector<int64_t>{rows[i]};
      std::vector<float> v = host(names[i], shape);
      all.insert(all.end(), v.begin(), v.end());
      total += rows[i];
    }
    return put(all, cols ? std::vector<int64_t>{total, cols} : std::vector<int64_t>{total}, true);
  }
  // Two [F, cols] (or [F]) tensors a, b as one [2F, cols] with rows a_0, b_0, a_1, b_1, ...
  Tensor interleaved(const std::string& a, const std::string& b, int64_t F, int64_t cols) {
    const std::vector<int64_t> shape = cols ? std::vector<int64_t>{F, cols} : std::vector<int64_t>{F};
    const std::vector<float> va = host(a, shape), vb = host(b, shape);
    const int64_t c = cols ? cols : 1;
    std::vector<float> all(size_t(2 * F * c));
    for (int64_t r = 0; r < F; ++r) {
      std::copy_n(va.begin() + r * c, c, all.begin() + 2 * r * c);
      std::copy_n(vb.begin() + r * c, c, all.begin() + (2 * r + 1) * c);
    }
    return put(all, cols ? std::vector<int64_t>{2 * F, cols} : std::vector<int64_t>{2 * F}, true);
  }
};

// Where the decoder's tensors live. Text-only checkpoints name them
// "model.*". Gemma 3 multimodal checkpoints (Gemma3ForConditionalGeneration,
// config with "text_config") keep the text decoder beside a vision tower: the
// published ones as "language_model.model.*" (lm_head, when present, as
// "language_model.lm_head.weight"), those saved by newer transformers as
// "model.language_model.*". Only the decoder is loaded.
struct Names {
  std::string decoder = "model.";
  std::string lm_head = "lm_head.weight";
};

Names checkpoint_names(const WeightStore& store, const ModelConfig& c) {
  if (!c.nested_text_config) return {};
  if (store.has("language_model.model.embed_tokens.weight"))
    return {"language_model.model.", "language_model.lm_head.weight"};
  if (store.has("model.language_model.embed_tokens.weight")) return {"model.language_model.", "lm_head.weight"};
  return {};  // the usual missing-tensor error names "model.embed_tokens.weight"
}

}  // namespace

std::shared_ptr<Model> Model::load(const std::filesystem::path& dir, Device device, const ProgressFn& progress,
                                   CpuWeights cpu_weights) {
  std::shared_ptr<Model> m(new Model());
  m->cfg_ = load_model_config(dir);
  m->device_ = device;
  m->dir_ = dir;
  const ModelConfig& c = m->cfg_;
  WeightStore store(dir);

  const Names names = checkpoint_names(store, c);
  size_t stored_bytes = 0;  // what is loaded (no vision tower): progress counts it
  for (const std::string& n : store.names())
    if (n.rfind(names.decoder, 0) == 0 || n == names.lm_head) stored_bytes += store.get(n).nbytes;

  // Matrices: CUDA keeps 16-bit checkpoints in bf16. The CPU keeps a
  // checkpoint in bf16 only when it is stored in bf16 (lossless) and
  // cpu_weights allows it (see CpuWeights); otherwise it widens to f32.
  const std::string embed_name = names.decoder + "embed_tokens.weight";
  const bool stored_bf16 =
      c.weight_dtype == DType::BF16 && store.has(embed_name) && store.get(embed_name).dtype == DType::BF16;
  bool bf16 = c.weight_dtype != DType::F32;
  if (device == Device::CPU) {
    constexpr size_t kAutoBf16 = size_t(1) << 30;  // f32 bytes above which automatic keeps bf16
    bf16 = stored_bf16 && (cpu_weights == CpuWeights::bf16 ||
                           (cpu_weights == CpuWeights::automatic && 2 * stored_bytes > kAutoBf16));
  }
  m->matrix_dtype_ = bf16 ? DType::BF16 : DType::F32;
  Loader ld{store, device, m->matrix_dtype_, stored_bytes, 0, progress, &m->weight_bytes_};

  const int64_t D = c.hidden_size, F = c.intermediate_size, V = c.vocab_size, hd = c.head_dim;
  const int64_t QD = int64_t(c.num_heads) * hd, KD = int64_t(c.num_kv_heads) * hd;
  m->embed_ = ld.get(embed_name, {V, D}, true);
  m->final_norm_ = ld.get(names.decoder + "norm.weight", {D}, false);
  if (c.tie_word_embeddings || !store.has(names.lm_head)) {
    if (!c.tie_word_embeddings) fail("weights", "missing tensor \"{}\" in {}", names.lm_head, dir.string());
    m->lm_head_ = m->embed_;
  } else {
    m->lm_head_ = ld.get(names.lm_head, {V, D}, true);
  }
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = fmt::format("{}layers.{}.", names.decoder, l);
    LayerWeights L;
    const std::string at = p + "self_attn.";
    L.qkv_proj = ld.stacked({at + "q_proj.weight", at + "k_proj.weight", at + "v_proj.weight"}, {QD, KD, KD}, D);
    if (c.attention_bias)
      L.qkv_bias = ld.stacked({at + "q_proj.bias", at + "k_proj.bias", at + "v_proj.bias"}, {QD, KD, KD}, 0);
    L.o_proj = ld.get(at + "o_proj.weight", {D, QD}, true);
    if (c.attention_out_bias) L.o_bias = ld.get(at + "o_proj.bias", {D}, true);
    if (c.qk_norm) {
      L.q_norm = ld.get(at + "q_norm.weight", {hd}, false);
      L.k_norm = ld.get(at + "k_norm.weight", {hd}, false);
    }
    L.input_norm = ld.get(p + "input_layernorm.weight", {D}, false);
    L.post_attention_norm = ld.get(p + "post_attention_layernorm.weight", {D}, false);
    if (c.sandwich_norms) {
      L.pre_feedforward_norm = ld.get(p + "pre_feedforward_layernorm.weight", {D}, false);
      L.post_feedforward_norm = ld.get(p + "post_feedforward_layernorm.weight", {D}, false);
    }
    L.gate_up_proj = ld.interleaved(p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight", F, D);
    if (c.mlp_bias) L.gate_up_bias = ld.interleaved(p + "mlp.gate_proj.bias", p + "mlp.up_proj.bias", F, 0);
    L.down_proj = ld.get(p + "mlp.down_proj.weight", {D, F}, true);
    if (c.mlp_bias) L.down_bias = ld.get(p + "mlp.down_proj.bias", {D}, true);
    m->layers_.push_back(std::move(L));
  }
  m->upload_rope();
  return m;
}

}  // namespace kvgraph
