#pragma once
// A decoder's hyper-parameters, read from a Hugging Face config.json.
// One struct for every supported family; the per-family switches below say
// how the one decoder implementation (src/models/decoder.cpp) behaves.
#include <filesystem>
#include <string>
#include <vector>

#include "kvgraph/dtype.h"
#include "kvgraph/scalar.h"
#include "kvgraph/weight.h"

namespace kvgraph {

enum class Family { Llama, Qwen2, Mistral, Gemma2, Gemma3, Qwen3 };

std::string_view family_name(Family f);

// RoPE of one kind of layer, as transformers computes it.
struct RopeConfig {
  float theta = 10000.0f;
  std::string type = "default";  // "default", "linear", "llama3"
  float factor = 1.0f;           // linear / llama3
  float low_freq_factor = 1.0f;  // llama3
  float high_freq_factor = 4.0f; // llama3
  int original_max_position_embeddings = 8192;  // llama3
};

// Inverse frequencies [head_dim / 2] for RoPE (rotate-half / NeoX layout),
// with the scaling of `rope` applied exactly as transformers does.
std::vector<float> rope_inv_freq(const RopeConfig& rope, int head_dim);

// Largest sizes config.json may ask for: well above every published model
// (Llama 3.1 405B: 126 layers, 128 heads, hidden 16384, ffn 53248; Gemma 3:
// head_dim 256, vocab 262208), small enough that every size derived from them
// fits in 64 bits and every row a kernel indexes in 32, and checked before any
// work so that a typo fails at once.
inline constexpr int kMaxLayers = 1024;
inline constexpr int kMaxHeads = 1024;           // query and key/value heads
inline constexpr int kMaxHeadDim = 1024;
inline constexpr int kMaxHiddenSize = 1 << 17;   // 131072
inline constexpr int kMaxIntermediateSize = 1 << 20;
inline constexpr int kMaxVocabSize = 1 << 24;    // 16.8M

// FP8 (e4m3) matrices in the checkpoint, "X.weight" F8_E4M3 [N, K] with a
// float scale, dequantized at load (w = fp8 * scale):
//   block:   transformers "quant_method": "fp8" ("weight_block_size": [bn, bk]);
//            scale "X.weight_scale_inv" [ceil(N / bn), ceil(K / bk)]
//   channel: compressed-tensors "float-quantized", strategy "channel";
//            scale "X.weight_scale" [N, 1]
//   tensor:  compressed-tensors, strategy "tensor"; scale "X.weight_scale" [1] (or [])
struct Fp8Format {
  enum class Scale : uint8_t { none, block, channel, tensor };
  Scale scale = Scale::none;
  int block_n = 0, block_k = 0;  // block only

  bool quantized() const { return scale != Scale::none; }
  const char* scale_suffix() const { return scale == Scale::block ? "weight_scale_inv" : "weight_scale"; }
  bool operator==(const Fp8Format&) const = default;
};

// "fp8 e4m3 block 128x128", "fp8 e4m3 per-channel", "fp8 e4m3 per-tensor" ("" for none).
std::string fp8_format_name(const Fp8Format& f);

struct ModelConfig {
  Family family = Family::Llama;
  std::string model_type;  // as in config.json, e.g. "gemma3_text"
  std::string source;      // where it was read: the config.json path, or "config.json" for parsed text

  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;  // explicit in config or hidden_size / num_heads
  int max_position_embeddings = 0;
  float rms_norm_eps = 1e-6f;

  bool tie_word_embeddings = false;
  bool attention_bias = false;  // bias on q/k/v (Qwen2: always true; Llama: config)
  bool attention_out_bias = false;  // bias on o_proj (Llama attention_bias covers o too)
  bool mlp_bias = false;
  bool qk_norm = false;          // Gemma 3, Qwen3: RMSNorm over head_dim on q and k
  Activation activation = Activation::SiLU;

  RopeConfig rope;        // global (full-attention) layers
  RopeConfig rope_local;  // sliding layers (Gemma 3 uses another base); = rope otherwise

  // Per layer: 0 = full attention, otherwise the sliding window W (a query at
  // position i sees keys j with i - W < j <= i). Size num_layers.
  std::vector<int> layer_window;
  int sliding_window = 0;  // the configured window W (0: none); which layers use it is layer_window

  // Gemma family.
  float query_pre_attn_scalar = 0.0f;  // 0: scale = head_dim^-0.5
  float attn_logit_softcap = 0.0f;     // 0: none
  float final_logit_softcap = 0.0f;    // 0: none
  bool norm_weight_plus_one = false;   // RMSNorm multiplies by (1 + w)
  bool sandwich_norms = false;         // post-attention and pre/post-feedforward norms
  float embed_scale = 1.0f;            // Gemma: sqrt(hidden_size), rounded through the weight dtype

  std::vector<int> eos_token_ids;  // may be empty
  int bos_token_id = -1;
  DType weight_dtype = DType::F32;  // "torch_dtype" / "dtype" of the checkpoint
  // model_type "gemma3" (multimodal wrapper): the decoder's values came from
  // "text_config", and its tensors carry a language-model prefix.
  bool nested_text_config = false;
  // MLX affine quantization of the checkpoint's matrices: "quantization"
  // {"group_size": G, "bits": B[, "mode": "affine"]} (or the same under
  // "quantization_config", which mlx-lm also writes). bits 0: not quantized.
  QuantFormat quantization;
  // FP8 matrices: "quantization_config" with "quant_method" "fp8" or
  // "compressed-tensors" (float, 8 bits). Dequantized at load.
  Fp8Format fp8;

  float attention_scale() const;  // softmax scale applied to q.k
};

// Parses `dir/config.json`. Throws kvgraph::Error("[config] ...") naming the
// field on missing/invalid values (sizes outside the limits above included)
// and on an unknown model_type.
ModelConfig load_model_config(const std::filesystem::path& dir);
ModelConfig parse_model_config(const std::string& json_text);

}  // namespace kvgraph
