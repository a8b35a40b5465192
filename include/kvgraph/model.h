#pragma once
// One decoder for every supported family (Llama, Qwen2, Mistral, Gemma 2/3,
// Qwen3); the per-family switches live in ModelConfig. Weights are loaded
// from a Hugging Face checkpoint onto one device and never change.
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kvgraph/cache/sequence_cache.h"
#include "kvgraph/model_config.h"
#include "kvgraph/stream.h"
#include "kvgraph/tensor.h"
#include "kvgraph/weight.h"

namespace kvgraph {

// Projections are stored fused, so a decode step runs one GEMV where the
// checkpoint has several: q, k and v stacked into one matrix, and gate and up
// interleaved row by row (gate_0, up_0, gate_1, ...) for the gated epilogue.
// Matrices are Weights: plain, or affine-quantized along their input dim (the
// stacking and interleaving are by rows, so they apply to words, scales and
// biases alike).
struct LayerWeights {
  Weight qkv_proj;                               // [(Hq + 2 Hkv) * hd, D]: q rows, k rows, v rows
  Tensor qkv_bias;                               // [(Hq + 2 Hkv) * hd] or undefined
  Weight o_proj;                                 // [D, Hq*hd]
  Tensor o_bias;                                 // [D] or undefined
  Tensor q_norm, k_norm;                         // f32 [hd] (qk_norm families)
  Tensor input_norm, post_attention_norm;        // f32 [D]
  Tensor pre_feedforward_norm, post_feedforward_norm;  // f32 [D] (Gemma sandwich norms)
  Weight gate_up_proj;                           // [2F, D] interleaved
  Tensor gate_up_bias;                           // [2F] or undefined
  Weight down_proj;                              // [D, F]
  Tensor down_bias;                              // [D] or undefined
};

// Activation buffers for steps of up to `max_T` tokens, allocated once so a
// recorded step can point into them forever.
struct Workspace {
  int max_T = 0;
  int logit_rows = 0;            // rows of `logits` (1, or max_T to score every position)
  Tensor x, o;                   // f32 [max_T, D]: residual stream, block output (Gemma)
  Tensor qkv;                    // f32 [max_T, (Hq + 2 Hkv) * hd]
  Tensor attn;                   // f32 [max_T, Hq*hd]
  Tensor act;                    // f32 [max_T, F]: act(gate) * up
  Tensor logits;                 // f32 [logit_rows, V]
};

using ProgressFn = std::function<void(size_t done_bytes, size_t total_bytes)>;

// What Model::load (or Model::synthetic) would build, worked out from
// config.json and the safetensors headers alone: the checkpoint's tensor list,
// shapes and dtypes are checked as load checks them, but no weight is read and
// nothing is allocated (`kvgraph inspect`).
struct ModelInfo {
  ModelConfig config;
  std::filesystem::path dir;  // empty for a synthetic model
  Device device = Device::CPU;
  DType matrix_dtype = DType::F32;  // as Model::matrix_dtype()
  size_t weight_bytes = 0;          // as Model::weight_bytes()
  size_t checkpoint_bytes = 0;      // checkpoint bytes those weights are read from (0: synthetic)
  QuantFormat quantization;         // as Model::quantization()
  bool quantized_checkpoint = false;  // stored quantized (else quantized on load, or not at all)
  Fp8Format fp8;                      // as Model::fp8_checkpoint()
  // Every Model tensor as it will sit on the device, in schema order.
  struct Tensor {
    std::string name;            // its checkpoint tensor ("a + b" when parts are fused)
    std::vector<int64_t> shape;  // of the Model tensor
    std::string format;          // "f32", "bf16", "int4/g64"
    size_t bytes = 0;            // on the device (quantized: codes, scales and biases)
    std::string stored;          // as in the checkpoint: "bf16", "int4/g64", "fp8 e4m3 block 128x128"
    size_t stored_bytes = 0;     // in the checkpoint (with scales and biases)
  };
  std::vector<Tensor> tensors;
};

// Ring{window, max_write} for sliding layers, Flat{capacity} for the rest; a
// window that reaches the capacity becomes flat (same semantics).
CacheConfig cache_config(const ModelConfig& c, Device device, int32_t capacity, int32_t max_write, KvStorage storage);

// `kvgraph quantize`: the float checkpoint in `dir` written to `out` in MLX's
// layout (kvgraph/quant.h), quantized to `format` exactly as Model::load(dir,
// ..., quantize = format) quantizes on load (the same matrices, the same
// codes; scales and biases in bf16 for a bf16 tensor, else f32), so loading
// `out` builds the same model. Every other tensor is copied as stored, and
// every other file of `dir` (tokenizer, generation config, chat template);
// config.json gains "quantization" and "quantization_config". `out` must not
// exist or be an empty directory; it is written under `out`.partial and
// renamed when complete, so a failure leaves nothing behind. Throws
// [quantize] for an already quantized checkpoint or an unsupported format.
struct QuantizeSummary {
  int quantized = 0;      // matrices written quantized
  int copied = 0;         // tensors copied as stored
  size_t bytes_in = 0;    // safetensors bytes read
  size_t bytes_out = 0;   // safetensors bytes written
};
QuantizeSummary quantize_checkpoint(const std::filesystem::path& dir, const std::filesystem::path& out,
                                    QuantFormat format, const ProgressFn& progress = {});

class Model {
 public:
  // How the CPU stores a bf16 checkpoint's matrices. f32: widened once at
  // load (fastest products, twice the memory). bf16: as stored, widened a
  // panel at a time inside each product (exact; half the memory, slower when
  // the model fits in cache). automatic: bf16 once the f32 copy would pass
  // 1 GiB. Checkpoints stored in f16 or f32 are always f32 on the CPU.
  enum class CpuWeights { automatic, f32, bf16 };
  // Loads config.json and the safetensors weights. Matrices: on CUDA in bf16
  // for bf16/f16 checkpoints, f32 otherwise; on the CPU as `cpu_weights` says.
  // A checkpoint in MLX's affine layout (config.json "quantization") keeps
  // its quantized matrices as stored (scales and biases in the matrix
  // dtype). `quantize` (bits 4|8, group 32|64|128) quantizes every matrix of
  // a float checkpoint on load (embedding and lm_head included) with MLX's
  // rule (kvgraph/quant.h), except one whose input dim is not a multiple of
  // the group, which stays float as mlx-lm leaves it; asking a quantized
  // checkpoint for another format throws [weights].
  // Throws [model] when `dir` is not a directory, [config] for a config.json
  // it cannot use, [weights] / [safetensors] for a checkpoint that does not
  // match the config (every tensor's presence, shape and dtype is checked
  // before the first weight is read).
  static std::shared_ptr<Model> load(const std::filesystem::path& dir, Device device,
                                     const ProgressFn& progress = {},
                                     CpuWeights cpu_weights = CpuWeights::automatic, QuantFormat quantize = {});
  // What load would build, with the same checks, without reading a weight.
  static ModelInfo describe(const std::filesystem::path& dir, Device device,
                            CpuWeights cpu_weights = CpuWeights::automatic, QuantFormat quantize = {});
  // Random bf16 weights at the real shape of a published model (no files):
  // qwen2.5-0.5b, llama3.2-1b, llama3.1-8b, mistral-7b, gemma3-1b. With
  // `quantize`, every matrix whose input dim the group divides is made
  // quantized instead (random codes, small random scales and biases): the
  // bytes a quantized checkpoint of that shape would stream, for benchmarks.
  static std::shared_ptr<Model> synthetic(const std::string& name, Device device, uint64_t seed = 1,
                                          QuantFormat quantize = {});
  static std::vector<std::string> synthetic_names();
  // What synthetic would build, without making a weight.
  static ModelInfo describe_synthetic(const std::string& name, Device device, QuantFormat quantize = {});

  const ModelConfig& config() const { return cfg_; }
  Device device() const { return device_; }
  DType matrix_dtype() const { return matrix_dtype_; }  // of plain matrices, and of quantized ones' scales
  // The format of the quantized matrices (bits 0: none is quantized).
  QuantFormat quantization() const { return quantization_; }
  // The checkpoint's FP8 format when its matrices were stored in fp8 and
  // dequantized at load to matrix_dtype() (none otherwise).
  Fp8Format fp8_checkpoint() const { return fp8_; }
  size_t weight_bytes() const { return weight_bytes_; }
  // Weight bytes one decode token reads: all of them, except that an untied
  // embedding table contributes a single row.
  size_t weight_bytes_read_per_token() const;
  const std::filesystem::path& dir() const { return dir_; }

  // kvgraph::cache_config of this model's config and device.
  CacheConfig cache_config(int32_t capacity, int32_t max_write, KvStorage storage) const;
  Workspace make_workspace(int max_T, bool all_logits) const;

  // Submits one step of T tokens: ids i32 [T] and pos i32 [1] are step-state
  // tensors read when the ops run. Fills ws.logits: every row (all_logits) or
  // the last token's row (row 0). Does not advance pos. Returns the cache
  // step, for cache.commit once the step has run.
  CacheStep forward(Stream& s, SequenceCache& cache, Workspace& ws, const Tensor& ids, const Tensor& pos, int T,
               bool all_logits) const;

 private:
  Model() = default;
  void upload_rope();  // inv_freq tables of cfg_ onto device_ (load and synthetic)
  ModelConfig cfg_;
  Device device_ = Device::CPU;
  DType matrix_dtype_ = DType::F32;
  QuantFormat quantization_;
  Fp8Format fp8_;
  std::filesystem::path dir_;
  size_t weight_bytes_ = 0;
  Weight embed_, lm_head_;
  Tensor final_norm_;
  Tensor inv_freq_global_, inv_freq_local_;  // f32 [hd/2]
  std::vector<LayerWeights> layers_;
};

}  // namespace kvgraph
