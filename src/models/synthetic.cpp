// Synthetic checkpoints: the published configs of a few models with random
// weights made on the device, for benchmarks without files. The tensors are
// the family schema's (family.h), as the loader reads them.
#include <cmath>
#include <map>

#include "kvgraph/error.h"
#include "kvgraph/model.h"
#include "kvgraph/ops.h"
#include "models/family.h"

namespace kvgraph {

namespace {

// config.json values as published by each model's authors.
const std::map<std::string, const char*>& synthetic_configs() {
  static const std::map<std::string, const char*> m = {
      {"qwen2.5-0.5b", R"({"model_type":"qwen2","vocab_size":151936,"hidden_size":896,"intermediate_size":4864,
        "num_hidden_layers":24,"num_attention_heads":14,"num_key_value_heads":2,"max_position_embeddings":32768,
        "rms_norm_eps":1e-6,"rope_theta":1000000.0,"tie_word_embeddings":true,"use_sliding_window":false,
        "torch_dtype":"bfloat16","eos_token_id":151643,"bos_token_id":151643})"},
      {"llama3.2-1b", R"({"model_type":"llama","vocab_size":128256,"hidden_size":2048,"intermediate_size":8192,
        "num_hidden_layers":16,"num_attention_heads":32,"num_key_value_heads":8,"head_dim":64,
        "max_position_embeddings":131072,"rms_norm_eps":1e-5,"rope_theta":500000.0,"tie_word_embeddings":true,
        "rope_scaling":{"factor":32.0,"high_freq_factor":4.0,"low_freq_factor":1.0,
        "original_max_position_embeddings":8192,"rope_type":"llama3"},"torch_dtype":"bfloat16",
        "bos_token_id":128000,"eos_token_id":128001})"},
      {"llama3.1-8b", R"({"model_type":"llama","vocab_size":128256,"hidden_size":4096,"intermediate_size":14336,
        "num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":8,"max_position_embeddings":131072,
        "rms_norm_eps":1e-5,"rope_theta":500000.0,"tie_word_embeddings":false,
        "rope_scaling":{"factor":8.0,"high_freq_factor":4.0,"low_freq_factor":1.0,
        "original_max_position_embeddings":8192,"rope_type":"llama3"},"torch_dtype":"bfloat16",
        "bos_token_id":128000,"eos_token_id":128001})"},
      {"mistral-7b", R"({"model_type":"mistral","vocab_size":32000,"hidden_size":4096,"intermediate_size":14336,
        "num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":8,"max_position_embeddings":32768,
        "rms_norm_eps":1e-5,"rope_theta":10000.0,"sliding_window":4096,"tie_word_embeddings":false,
        "torch_dtype":"bfloat16","bos_token_id":1,"eos_token_id":2})"},
      {"gemma3-1b", R"({"model_type":"gemma3_text","vocab_size":262144,"hidden_size":1152,"intermediate_size":6912,
        "num_hidden_layers":26,"num_attention_heads":4,"num_key_value_heads":1,"head_dim":256,
        "max_position_embeddings":32768,"rms_norm_eps":1e-6,"rope_theta":1000000.0,"rope_local_base_freq":10000.0,
        "sliding_window":512,"sliding_window_pattern":6,"query_pre_attn_scalar":256,"tie_word_embeddings":true,
        "torch_dtype":"bfloat16","bos_token_id":2,"eos_token_id":[1,106]})"},
  };
  return m;
}

// The config of synthetic model `name`; throws [model] naming the known ones.
ModelConfig synthetic_config(const std::string& name) {
  auto it = synthetic_configs().find(name);
  if (it == synthetic_configs().end()) {
    std::string names;
    for (const auto& [n, json] : synthetic_configs()) names += (names.empty() ? "" : ", ") + n;
    fail("model", "unknown synthetic model \"{}\" (known: {})", name, names);
  }
  return parse_model_config(it->second);
}

DType synthetic_matrix_dtype(Device device) { return device == Device::CUDA ? DType::BF16 : DType::F32; }

// The format a synthetic tensor is made in: quantized for a matrix whose
// input dim the group divides (as quantize-on-load leaves the others float).
QuantFormat synthetic_format(const TensorPlan& plan, QuantFormat quantize) {
  if (!quantize.quantized() || plan.role != Role::matrix) return {};
  const std::vector<int64_t> shape = plan.shape();
  return shape.size() == 2 && shape[1] % quantize.group == 0 ? quantize : QuantFormat{};
}

}  // namespace

std::vector<std::string> Model::synthetic_names() {
  std::vector<std::string> n;
  for (const auto& [k, v] : synthetic_configs()) n.push_back(k);
  return n;
}

// The weight formats a synthetic model can take: int8/int4 groups the
// kernels implement; not fp8, which only rounds a checkpoint's values.
static void check_synthetic_request(const std::string& name, QuantFormat quantize) {
  if (quantize.fp8)
    fail("weights", "synthetic:{}: fp8 rounds a checkpoint's weights and computes them as floats, so on random "
         "weights it measures nothing bf16 does not; use bf16", name);
  if (quantize.quantized() && !supported(quantize))
    fail("weights", "cannot quantize to {} bits in groups of {}", quantize.bits, quantize.group);
}

ModelInfo Model::describe_synthetic(const std::string& name, Device device, QuantFormat quantize) {
  check_synthetic_request(name, quantize);
  ModelInfo info;
  info.config = synthetic_config(name);
  info.device = device;
  info.matrix_dtype = synthetic_matrix_dtype(device);
  info.quantization = quantize;
  const std::vector<TensorPlan> plans = plan_weights(info.config, CheckpointNames{});
  std::vector<QuantFormat> formats(plans.size());
  for (size_t i = 0; i < plans.size(); ++i) formats[i] = synthetic_format(plans[i], quantize);
  info.weight_bytes = planned_bytes(plans, info.matrix_dtype, formats);
  info.tensors = planned_tensors(plans, info.matrix_dtype, formats);
  return info;
}

std::shared_ptr<Model> Model::synthetic(const std::string& name, Device device, uint64_t seed, QuantFormat quantize) {
  check_synthetic_request(name, quantize);
  std::shared_ptr<Model> m(new Model());
  m->cfg_ = synthetic_config(name);
  m->device_ = device;
  m->matrix_dtype_ = synthetic_matrix_dtype(device);
  m->quantization_ = quantize;
  const ModelConfig& c = m->cfg_;
  Stream s(device);
  uint64_t next = seed;
  // Each listed tensor filled instead of read: random rows need no
  // reordering, so a fused tensor is filled whole.
  const float norm_one = c.norm_weight_plus_one ? 0.0f : 1.0f;
  Weights w = build_weights(c, CheckpointNames{}, [&](const TensorPlan& plan) {
    const std::vector<int64_t> shape = plan.shape();
    Tensor t;
    if (const QuantFormat f = synthetic_format(plan, quantize); f.quantized()) {
      // Random codes (any bits are valid codes), scales and biases small
      // enough that activations stay finite.
      const int64_t N = shape[0], K = shape[1];
      std::vector<uint32_t> words(size_t(N) * (K * f.bits / 32));
      uint64_t x = next++ * 0x9E3779B97F4A7C15ull;
      for (auto& word : words) {  // splitmix64
        uint64_t z = (x += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        word = static_cast<uint32_t>(z ^ (z >> 31));
      }
      Weight q;
      q.format = f;
      q.w = Tensor::from_host(words.data(), {N, K * f.bits / 32}, DType::U32, device);
      q.scales = Tensor::empty({N, K / f.group}, m->matrix_dtype_, device);
      q.biases = Tensor::empty({N, K / f.group}, m->matrix_dtype_, device);
      const float step = 2.0f / std::sqrt(static_cast<float>(K)) / float((1 << f.bits) - 1);
      ops::fill_random(s, q.scales, next++ * 0x9E3779B97F4A7C15ull, step);
      ops::fill_random(s, q.biases, next++ * 0x9E3779B97F4A7C15ull, step);
      m->weight_bytes_ += q.nbytes();
      return q;
    }
    if (plan.role == Role::norm) {
      std::vector<float> h(size_t(shape[0]), norm_one);
      t = Tensor::from_host(h.data(), shape, DType::F32, device);
    } else {
      const float scale = plan.role == Role::matrix ? 1.0f / std::sqrt(static_cast<float>(shape.back())) : 0.01f;
      t = Tensor::empty(shape, m->matrix_dtype_, device);
      ops::fill_random(s, t, next++ * 0x9E3779B97F4A7C15ull, scale);
    }
    m->weight_bytes_ += t.nbytes();
    return Weight(t);
  });
  m->embed_ = std::move(w.embed);
  m->final_norm_ = std::move(w.final_norm);
  m->lm_head_ = std::move(w.lm_head);
  m->layers_ = std::move(w.layers);
  s.synchronize();
  m->upload_rope();
  return m;
}

}  // namespace kvgraph
