#pragma once
// Every supported model family declared once, as data: the config.json
// model_type strings that select it, transformers' defaults for absent keys,
// the switches that say how the one decoder is wired for it, and the
// checkpoint tensors with their shapes and when they are present. The config
// parser (model_config.cpp), the loader and the synthetic checkpoints all read
// these declarations and nothing else about families.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "kvgraph/model.h"
#include "kvgraph/model_config.h"

namespace kvgraph {

// Values of the transformers (v5) config classes, used for keys that
// config.json leaves out.
struct FamilyDefaults {
  int vocab_size, hidden_size, intermediate_size, num_layers, num_heads;
  std::optional<int> num_kv_heads = {};  // nullopt: = num_heads
  std::optional<int> head_dim = {};      // nullopt: hidden_size / num_heads
  int max_position_embeddings;
  bool tie_word_embeddings;
  std::optional<int> bos = {}, eos = {};
  std::optional<int> sliding_window = {};
  std::optional<double> attn_softcap = {}, final_softcap = {};  // read only by families with logit_softcaps
  double rope_theta;                                  // "rope_theta" (full-attention layers)
};

// A boolean the family fixes, or reads from a config.json key (false when absent).
struct Switch {
  enum class Kind { off, on, key };
  Kind kind = Kind::off;
  std::string_view key;
};
inline constexpr Switch kOff{};
inline constexpr Switch kOn{Switch::Kind::on, {}};
constexpr Switch from_key(std::string_view key) { return {Switch::Kind::key, key}; }

// Which layers slide once config.json sets a window, as each modeling file decides.
struct SlidingRule {
  enum class Layers {
    none,         // windows are ignored (Llama)
    all,          // every layer; "layer_types" ignored (Mistral)
    layer_types,  // "layer_types" when given (and always validated), else `fallback`
  };
  enum class Fallback {
    none,
    from_layer,      // layers i >= n slide (Qwen2/3 "max_window_layers")
    every_nth_full,  // every n-th layer is full, the others slide (Gemma); n > 0
  };
  Layers layers = Layers::none;
  std::string_view gate_key = {};  // non-empty: no window unless this key is true ("use_sliding_window")
  Fallback fallback = Fallback::none;
  std::string_view n_key = {};  // config.json key of n; empty: n is fixed
  int n = 0;                    // n, or its default
};

struct FamilySchema {
  Family family;
  std::string_view name;                      // family_name()
  std::vector<std::string_view> model_types;  // config.json "model_type" values of a text-only config
  // model_type of a multimodal wrapper whose decoder config sits under
  // "text_config" and whose decoder tensors carry a language-model prefix.
  std::string_view multimodal_model_type = {};
  FamilyDefaults defaults;

  Switch qkv_bias, o_bias, mlp_bias;  // -> attention_bias, attention_out_bias, mlp_bias
  bool qk_norm = false;
  bool sandwich_norms = false;
  bool norm_weight_plus_one = false;
  std::string_view activation_key;      // "hidden_act" or "hidden_activation"
  std::string_view activation_default;  // its value when absent
  SlidingRule sliding;
  // RoPE keyed by layer type (Gemma 3): "rope_parameters" holds
  // "full_attention" / "sliding_attention" dicts, "rope_scaling" applies to
  // full attention, sliding layers default to "rope_local_base_freq" (1e4).
  bool rope_by_layer_type = false;
  bool refuses_bidirectional = false;            // "use_bidirectional_attention": true is refused
  std::optional<double> query_pre_attn_scalar = {};  // the key's default; nullopt: no key, scale hd^-0.5
  bool logit_softcaps = false;                   // reads attn/final_logit_softcapping
  bool embed_scale = false;  // embeddings * sqrt(hidden_size), rounded through the weight dtype
};

const FamilySchema& family_schema(Family f);
// The family whose model_types or multimodal_model_type is `model_type`; nullptr if none.
const FamilySchema* find_family(std::string_view model_type);
// Every family's model_types, for messages: "llama, qwen2, ...".
std::string supported_model_types();

// ------------------------------------------------------------ tensors

// A checkpoint dimension, in terms of the config.
enum class Dim {
  hidden,        // D = hidden_size
  intermediate,  // F = intermediate_size
  vocab,         // V = vocab_size
  q,             // Hq * hd
  kv,            // Hkv * hd
  head,          // hd = head_dim
};
int64_t dim_size(Dim d, const ModelConfig& c);

// When a tensor is in the checkpoint.
enum class Need { always, attention_bias, attention_out_bias, mlp_bias, qk_norm, sandwich_norms, untied_embeddings };
bool needed(Need n, const ModelConfig& c);

// How a Model tensor is stored, and what a synthetic checkpoint fills it with.
enum class Role {
  matrix,  // matrix dtype, or affine-quantized (a Weight); random, scale cols^-1/2
  bias,    // matrix dtype (the CUDA GEMV reads it like its matrix); random, scale 0.01
  norm,    // f32; ones, or zeros where the norm multiplies by (1 + w)
};

// How the checkpoint tensors of one Model tensor are laid out in it (see
// LayerWeights): stacked along rows, or interleaved row by row (a_0, b_0, a_1, ...).
enum class Fuse { none, stack, interleave };

struct TensorSpec {
  std::string_view name;   // after the prefix: "embed_tokens.weight", "self_attn.q_proj.weight"
  std::vector<Dim> shape;
};

// One Model tensor: where it goes and the checkpoint tensors it is made of.
// Matrices go to a Weight (plain or quantized), everything else to a Tensor.
template <class Owner>
struct SlotSpec {
  std::variant<Tensor Owner::*, Weight Owner::*> dest;
  Role role;
  Need when;
  Fuse fuse;
  std::vector<TensorSpec> parts;
  bool outside_decoder = false;  // named after CheckpointNames::top, not ::decoder (lm_head)
};

// A Model's tensors, as build_weights makes them.
struct Weights {
  Weight embed;       // [V, D]
  Tensor final_norm;  // f32 [D]
  Weight lm_head;     // [V, D]; the embedding itself when tied
  std::vector<LayerWeights> layers;
};

// The tensor lists, shared by every family: all six use transformers'
// names, and differ only through the config switches in `when`.
// Model-level names follow the decoder prefix ("model."), except lm_head.
const std::vector<SlotSpec<Weights>>& model_tensors();
const std::vector<SlotSpec<LayerWeights>>& layer_tensors();  // after "<decoder>layers.<i>."

// Where a checkpoint keeps the decoder: "model.*" in text-only checkpoints;
// Gemma 3 multimodal ones use "language_model.model.*" (lm_head
// "language_model.lm_head.weight") or, saved by newer transformers,
// "model.language_model.*" (lm_head "lm_head.weight").
struct CheckpointNames {
  std::string decoder = "model.";
  std::string top;  // prefix of lm_head
};

// One Model tensor to make: its checkpoint tensors by full name and shape.
struct TensorPlan {
  struct Part {
    std::string name;
    std::vector<int64_t> shape;
  };
  Role role;
  Fuse fuse;
  std::vector<Part> parts;
  std::vector<int64_t> shape() const;  // of the Model tensor: the parts' rows summed
};

// Every Model tensor `c` needs, made by `make` in schema order; a tensor
// whose Need is off stays undefined, a tied lm_head is the embedding. `make`
// returns a quantized Weight only for Role::matrix plans.
Weights build_weights(const ModelConfig& c, const CheckpointNames& names,
                      const std::function<Weight(const TensorPlan&)>& make);
// The plans build_weights hands to `make`, in the same order.
std::vector<TensorPlan> plan_weights(const ModelConfig& c, const CheckpointNames& names);
// Bytes of the Model tensors `plans` make: matrices and biases in
// `matrix_dtype`, norms in f32 (see Role).
size_t planned_bytes(const std::vector<TensorPlan>& plans, DType matrix_dtype);
// The same when matrix plan i is quantized as formats[i] says (bits 0: plain;
// scales and biases in matrix_dtype).
size_t planned_bytes(const std::vector<TensorPlan>& plans, DType matrix_dtype, const std::vector<QuantFormat>& formats);
// ModelInfo::tensors of those plans (names, shapes, formats, bytes).
std::vector<ModelInfo::Tensor> planned_tensors(const std::vector<TensorPlan>& plans, DType matrix_dtype,
                                               const std::vector<QuantFormat>& formats);

}  // namespace kvgraph
