// The six families and their tensors. Defaults are those of the transformers
// (v5) config classes; switches follow each family's modeling file.
#include "models/family.h"

#include <fmt/format.h>

#include "kvgraph/error.h"

namespace kvgraph {

namespace {

using Layers = SlidingRule::Layers;
using Fallback = SlidingRule::Fallback;

const std::vector<FamilySchema>& families() {
  static const std::vector<FamilySchema> all = {
      {.family = Family::Llama,
       .name = "llama",
       .model_types = {"llama"},
       .defaults = {.vocab_size = 32000, .hidden_size = 4096, .intermediate_size = 11008, .num_layers = 32,
                    .num_heads = 32, .max_position_embeddings = 2048, .tie_word_embeddings = false, .bos = 1,
                    .eos = 2, .rope_theta = 10000.0},
       // attention_bias covers o_proj too.
       .qkv_bias = from_key("attention_bias"),
       .o_bias = from_key("attention_bias"),
       .mlp_bias = from_key("mlp_bias"),
       .activation_key = "hidden_act",
       .activation_default = "silu",
       .sliding = {.layers = Layers::none}},

      {.family = Family::Qwen2,
       .name = "qwen2",
       .model_types = {"qwen2"},
       .defaults = {.vocab_size = 151936, .hidden_size = 4096, .intermediate_size = 22016, .num_layers = 32,
                    .num_heads = 32, .num_kv_heads = 32, .max_position_embeddings = 32768,
                    .tie_word_embeddings = false, .sliding_window = 4096, .rope_theta = 10000.0},
       .qkv_bias = kOn,  // q/k/v always biased, o never
       .o_bias = kOff,
       .mlp_bias = kOff,
       .activation_key = "hidden_act",
       .activation_default = "silu",
       .sliding = {.layers = Layers::layer_types, .gate_key = "use_sliding_window", .fallback = Fallback::from_layer,
                   .n_key = "max_window_layers", .n = 28}},

      {.family = Family::Mistral,
       .name = "mistral",
       .model_types = {"mistral"},
       .defaults = {.vocab_size = 32000, .hidden_size = 4096, .intermediate_size = 14336, .num_layers = 32,
                    .num_heads = 32, .num_kv_heads = 8, .max_position_embeddings = 4096 * 32,
                    .tie_word_embeddings = false, .bos = 1, .eos = 2, .sliding_window = 4096,
                    .rope_theta = 10000.0},
       .qkv_bias = kOff,
       .o_bias = kOff,
       .mlp_bias = kOff,
       .activation_key = "hidden_act",
       .activation_default = "silu",
       .sliding = {.layers = Layers::all}},

      {.family = Family::Gemma2,
       .name = "gemma2",
       .model_types = {"gemma2"},
       .defaults = {.vocab_size = 256000, .hidden_size = 2304, .intermediate_size = 9216, .num_layers = 26,
                    .num_heads = 8, .num_kv_heads = 4, .head_dim = 256, .max_position_embeddings = 8192,
                    .tie_word_embeddings = true, .bos = 2, .eos = 1, .sliding_window = 4096,
                    .attn_softcap = 50.0, .final_softcap = 30.0, .rope_theta = 10000.0},
       .qkv_bias = from_key("attention_bias"),
       .o_bias = from_key("attention_bias"),
       .mlp_bias = kOff,
       .sandwich_norms = true,
       .norm_weight_plus_one = true,
       .activation_key = "hidden_activation",
       .activation_default = "gelu_pytorch_tanh",
       .sliding = {.layers = Layers::layer_types, .fallback = Fallback::every_nth_full, .n = 2},
       .refuses_bidirectional = true,
       .query_pre_attn_scalar = 256.0,
       .logit_softcaps = true,
       .embed_scale = true},

      {.family = Family::Gemma3,
       .name = "gemma3",
       .model_types = {"gemma3_text"},
       .multimodal_model_type = "gemma3",
       .defaults = {.vocab_size = 262208, .hidden_size = 2304, .intermediate_size = 9216, .num_layers = 26,
                    .num_heads = 8, .num_kv_heads = 4, .head_dim = 256, .max_position_embeddings = 131072,
                    .tie_word_embeddings = true, .bos = 2, .eos = 1, .sliding_window = 4096,
                    .rope_theta = 1000000.0},
       .qkv_bias = from_key("attention_bias"),
       .o_bias = from_key("attention_bias"),
       .mlp_bias = kOff,
       .qk_norm = true,
       .sandwich_norms = true,
       .norm_weight_plus_one = true,
       .activation_key = "hidden_activation",
       .activation_default = "gelu_pytorch_tanh",
       .sliding = {.layers = Layers::layer_types, .fallback = Fallback::every_nth_full,
                   .n_key = "sliding_window_pattern", .n = 6},
       .rope_by_layer_type = true,
       .refuses_bidirectional = true,
       .query_pre_attn_scalar = 256.0,
       .logit_softcaps = true,
       .embed_scale = true},

      {.family = Family::Qwen3,
       .name = "qwen3",
       .model_types = {"qwen3"},
       .defaults = {.vocab_size = 151936, .hidden_size = 4096, .intermediate_size = 22016, .num_layers = 32,
                    .num_heads = 32, .num_kv_heads = 32, .head_dim = 128, .max_position_embeddings = 32768,
                    .tie_word_embeddings = false, .sliding_window = 4096, .rope_theta = 10000.0},
       .qkv_bias = from_key("attention_bias"),
       .o_bias = from_key("attention_bias"),
       .mlp_bias = kOff,
       .qk_norm = true,
       .activation_key = "hidden_act",
       .activation_default = "silu",
       .sliding = {.layers = Layers::layer_types, .gate_key = "use_sliding_window", .fallback = Fallback::from_layer,
                   .n_key = "max_window_layers", .n = 28}},
  };
  return all;
}

constexpr Dim D = Dim::hidden, F = Dim::intermediate, V = Dim::vocab, Q = Dim::q, KV = Dim::kv, HD = Dim::head;

// Makes each tensor of `specs` that `c` needs into its field of `owner`.
template <class Owner>
void visit(const std::vector<SlotSpec<Owner>>& specs, const ModelConfig& c, const std::string& prefix,
           const std::string& top, Owner& owner, const std::function<Weight(const TensorPlan&)>& make) {
  for (const SlotSpec<Owner>& s : specs) {
    if (!needed(s.when, c)) continue;
    TensorPlan plan{s.role, s.fuse, {}};
    for (const TensorSpec& t : s.parts) {
      std::vector<int64_t> shape;
      for (Dim d : t.shape) shape.push_back(dim_size(d, c));
      plan.parts.push_back({(s.outside_decoder ? top : prefix) + std::string(t.name), std::move(shape)});
    }
    Weight made = make(plan);
    if (auto* to_weight = std::get_if<Weight Owner::*>(&s.dest)) {
      owner.**to_weight = std::move(made);
    } else {
      if (made.quantized()) fail("weights", "\"{}\" cannot be quantized", plan.parts.front().name);
      owner.*std::get<Tensor Owner::*>(s.dest) = std::move(made.w);
    }
  }
}

}  // namespace

const FamilySchema& family_schema(Family f) {
  for (const FamilySchema& s : families())
    if (s.family == f) return s;
  fail("config", "family {} has no schema in src/models/family.cpp", static_cast<int>(f));
}

const FamilySchema* find_family(std::string_view model_type) {
  for (const FamilySchema& s : families()) {
    if (s.multimodal_model_type == model_type && !model_type.empty()) return &s;
    for (std::string_view t : s.model_types)
      if (t == model_type) return &s;
  }
  return nullptr;
}

std::string supported_model_types() {
  std::string out;
  for (const FamilySchema& s : families())
    for (std::string_view t : s.model_types) out += (out.empty() ? "" : ", ") + std::string(t);
  return out;
}

std::string_view family_name(Family f) { return family_schema(f).name; }

int64_t dim_size(Dim d, const ModelConfig& c) {
  switch (d) {
    case Dim::hidden: return c.hidden_size;
    case Dim::intermediate: return c.intermediate_size;
    case Dim::vocab: return c.vocab_size;
    case Dim::q: return int64_t(c.num_heads) * c.head_dim;
    case Dim::kv: return int64_t(c.num_kv_heads) * c.head_dim;
    case Dim::head: return c.head_dim;
  }
  return 0;
}

bool needed(Need n, const ModelConfig& c) {
  switch (n) {
    case Need::always: return true;
    case Need::attention_bias: return c.attention_bias;
    case Need::attention_out_bias: return c.attention_out_bias;
    case Need::mlp_bias: return c.mlp_bias;
    case Need::qk_norm: return c.qk_norm;
    case Need::sandwich_norms: return c.sandwich_norms;
    case Need::untied_embeddings: return !c.tie_word_embeddings;
  }
  return true;
}

const std::vector<SlotSpec<Weights>>& model_tensors() {
  using W = Weights;
  static const std::vector<SlotSpec<W>> specs = {
      {&W::embed, Role::matrix, Need::always, Fuse::none, {{"embed_tokens.weight", {V, D}}}},
      {&W::final_norm, Role::norm, Need::always, Fuse::none, {{"norm.weight", {D}}}},
      {&W::lm_head, Role::matrix, Need::untied_embeddings, Fuse::none, {{"lm_head.weight", {V, D}}},
       /*outside_decoder=*/true},
  };
  return specs;
}

const std::vector<SlotSpec<LayerWeights>>& layer_tensors() {
  using L = LayerWeights;
  static const std::vector<SlotSpec<L>> specs = {
      {&L::qkv_proj, Role::matrix, Need::always, Fuse::stack,
       {{"self_attn.q_proj.weight", {Q, D}}, {"self_attn.k_proj.weight", {KV, D}}, {"self_attn.v_proj.weight", {KV, D}}}},
      {&L::qkv_bias, Role::bias, Need::attention_bias, Fuse::stack,
       {{"self_attn.q_proj.bias", {Q}}, {"self_attn.k_proj.bias", {KV}}, {"self_attn.v_proj.bias", {KV}}}},
      {&L::o_proj, Role::matrix, Need::always, Fuse::none, {{"self_attn.o_proj.weight", {D, Q}}}},
      {&L::o_bias, Role::bias, Need::attention_out_bias, Fuse::none, {{"self_attn.o_proj.bias", {D}}}},
      {&L::q_norm, Role::norm, Need::qk_norm, Fuse::none, {{"self_attn.q_norm.weight", {HD}}}},
      {&L::k_norm, Role::norm, Need::qk_norm, Fuse::none, {{"self_attn.k_norm.weight", {HD}}}},
      {&L::input_norm, Role::norm, Need::always, Fuse::none, {{"input_layernorm.weight", {D}}}},
      {&L::post_attention_norm, Role::norm, Need::always, Fuse::none, {{"post_attention_layernorm.weight", {D}}}},
      {&L::pre_feedforward_norm, Role::norm, Need::sandwich_norms, Fuse::none,
       {{"pre_feedforward_layernorm.weight", {D}}}},
      {&L::post_feedforward_norm, Role::norm, Need::sandwich_norms, Fuse::none,
       {{"post_feedforward_layernorm.weight", {D}}}},
      {&L::gate_up_proj, Role::matrix, Need::always, Fuse::interleave,
       {{"mlp.gate_proj.weight", {F, D}}, {"mlp.up_proj.weight", {F, D}}}},
      {&L::gate_up_bias, Role::bias, Need::mlp_bias, Fuse::interleave,
       {{"mlp.gate_proj.bias", {F}}, {"mlp.up_proj.bias", {F}}}},
      {&L::down_proj, Role::matrix, Need::always, Fuse::none, {{"mlp.down_proj.weight", {D, F}}}},
      {&L::down_bias, Role::bias, Need::mlp_bias, Fuse::none, {{"mlp.down_proj.bias", {D}}}},
  };
  return specs;
}

std::vector<int64_t> TensorPlan::shape() const {
  std::vector<int64_t> s = parts.front().shape;
  s[0] = 0;
  for (const Part& p : parts) s[0] += p.shape[0];
  return s;
}

Weights build_weights(const ModelConfig& c, const CheckpointNames& names,
                      const std::function<Weight(const TensorPlan&)>& make) {
  Weights w;
  visit(model_tensors(), c, names.decoder, names.top, w, make);
  if (c.tie_word_embeddings) w.lm_head = w.embed;
  w.layers.resize(c.num_layers);
  for (int l = 0; l < c.num_layers; ++l)
    visit(layer_tensors(), c, fmt::format("{}layers.{}.", names.decoder, l), names.top, w.layers[l], make);
  return w;
}

std::vector<TensorPlan> plan_weights(const ModelConfig& c, const CheckpointNames& names) {
  std::vector<TensorPlan> plans;
  build_weights(c, names, [&](const TensorPlan& p) {
    plans.push_back(p);
    return Weight();
  });
  return plans;
}

size_t planned_bytes(const std::vector<TensorPlan>& plans, DType matrix_dtype) {
  return planned_bytes(plans, matrix_dtype, std::vector<QuantFormat>(plans.size()));
}

size_t planned_bytes(const std::vector<TensorPlan>& plans, DType matrix_dtype, const std::vector<QuantFormat>& formats) {
  size_t bytes = 0;
  for (size_t i = 0; i < plans.size(); ++i) {
    const TensorPlan& p = plans[i];
    size_t n = 1;
    for (int64_t d : p.shape()) n *= static_cast<size_t>(d);
    const QuantFormat f = i < formats.size() ? formats[i] : QuantFormat{};
    if (f.quantized())  // words, then a scale and a bias per group
      bytes += n * f.bits / 8 + 2 * (n / f.group) * dtype_size(matrix_dtype);
    else
      bytes += n * (p.role == Role::norm ? dtype_size(DType::F32) : dtype_size(matrix_dtype));
  }
  return bytes;
}

std::vector<ModelInfo::Tensor> planned_tensors(const std::vector<TensorPlan>& plans, DType matrix_dtype,
                                               const std::vector<QuantFormat>& formats) {
  std::vector<ModelInfo::Tensor> out;
  for (size_t i = 0; i < plans.size(); ++i) {
    const TensorPlan& p = plans[i];
    const QuantFormat f = i < formats.size() ? formats[i] : QuantFormat{};
    ModelInfo::Tensor t;
    t.name = p.parts.front().name;
    if (p.parts.size() > 1) {  // fused: "prefix{a,b,c}suffix"
      size_t pre = t.name.size(), suf = t.name.size();
      for (const TensorPlan::Part& part : p.parts) {
        const std::string& n = part.name;
        size_t i = 0, j = 0;
        while (i < pre && i < n.size() && n[i] == t.name[i]) ++i;
        while (j < suf && j < n.size() && n[n.size() - 1 - j] == t.name[t.name.size() - 1 - j]) ++j;
        pre = i;
        suf = j;
      }
      std::string mid;
      for (const TensorPlan::Part& part : p.parts) {
        const std::string& n = part.name;
        const size_t s0 = std::min(pre, n.size()), len = n.size() >= pre + suf ? n.size() - pre - suf : 0;
        if (!mid.empty()) mid += ',';
        mid += n.substr(s0, len);
      }
      t.name = t.name.substr(0, pre) + "{" + mid + "}" + t.name.substr(t.name.size() - std::min(suf, t.name.size() - pre));
    }
    t.shape = p.shape();
    t.format = p.role == Role::norm ? std::string(dtype_name(DType::F32)) : format_name(f, matrix_dtype);
    t.bytes = planned_bytes({p}, matrix_dtype, {f});
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace kvgraph
