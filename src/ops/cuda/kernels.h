#pragma once
// CUDA kernels of the op set, as a raw-pointer layer. Plain C++ (callable from
// .cpp files compiled by g++); the only CUDA type is cudaStream_t.
//
// Conventions
//   - Activations are f32 on the device; weights are f32 or bf16 (`DType`);
//     KV storage is f32, bf16 or f16, or quantized (int8 / int4 affine
//     groups, fp8; kvgraph/cache/kv_format.h), K and V each.
//   - Every per-token value (the position) is read from device memory when
//     the kernel runs (`const int32_t* pos`: i32 [1], absolute position of the
//     step's first token), so a step captured into a CUDA graph once replays
//     correctly at any position. Launch shapes depend only on shapes and
//     capacities, never on the position; blocks past the active length exit.
//   - Every kernel waits for its predecessor (griddepcontrol.wait) before it
//     reads activations or step state and before it writes anything, so
//     programmatic dependent launch (PDL) is always safe; GEMVs issue their
//     first weight loads before that wait.
//   - Bad arguments throw kvgraph::Error("[cuda] <op>: ...").
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kvgraph/cache/slots.h"
#include "kvgraph/dtype.h"
#include "kvgraph/op_types.h"
#include "kvgraph/tuning.h"
#include "ops/attend_call.h"
#include "ops/cuda/runtime.h"

namespace kvgraph::cuda {

// Where a kernel of this layer is launched: the stream, and whether with
// programmatic dependent launch (Tuning::programmatic_launch; the legacy
// default stream always gets plain launches). Converts both ways with
// cudaStream_t, so a bare stream means "PDL on".
struct Launch {
  cudaStream_t stream = nullptr;
  bool pdl = true;
  Launch(cudaStream_t s = nullptr, bool programmatic = true) : stream(s), pdl(programmatic) {}
  operator cudaStream_t() const { return stream; }
};

// ---------------------------------------------------------------- embedding

// out f32 [T, D] = table[ids[t]] * scale. table: table_dtype (f32|bf16) [vocab, D];
// ids: i32 [T] on the device. An id outside [0, vocab) yields a zero row.
void embedding(const void* table, DType table_dtype, int64_t vocab, const int32_t* ids, int T, int D,
               float scale, float* out, Launch stream);

// The same from an affine-quantized table (LinearParams' layout: words u32
// [vocab, D * bits / 32], scales and biases scale_dtype (f32|bf16)
// [vocab, D / group]); each value fmaf(s, q, b) * scale, as the CPU computes it.
struct AffineTable {
  const uint32_t* words = nullptr;
  const void* scales = nullptr;
  const void* biases = nullptr;
  DType scale_dtype = DType::BF16;
  int bits = 0, group = 0;
};
void embedding_affine(const AffineTable& table, int64_t vocab, const int32_t* ids, int T, int D, float scale,
                      float* out, Launch stream);

// ---------------------------------------------------------------- rms_norm

// Rows of `dim` f32 values addressed as (token t, head h): x + t*x_stride + h*dim.
// Hidden-state norms use heads = 1; per-head q/k norms use heads = n_heads.
struct RmsNormParams {
  const float* x = nullptr;   // f32 rows as above
  float* out = nullptr;       // f32, same addressing with out_stride; may alias x
  const void* weight = nullptr;  // weight_dtype [dim]
  DType weight_dtype = DType::F32;
  int64_t tokens = 1;
  int heads = 1;
  int dim = 0;
  int64_t x_stride = 0;    // elements between tokens; 0: heads * dim
  int64_t out_stride = 0;  // elements between tokens; 0: heads * dim
  float eps = 1e-6f;
  bool plus_one = false;   // Gemma: multiply by (1 + w)
  bool accumulate = false; // out += the normalised row (out must not alias x)
};
void rms_norm(const RmsNormParams& p, Launch stream);

// out f32 [rows, D] = x / rms(x) * w (or * (1 + w)). out may alias x.
void rms_norm(const float* x, const void* w, DType w_dtype, float* out, int64_t rows, int D, float eps,
              bool plus_one, Launch stream);

// residual f32 [rows, D] += delta f32 [rows, D]; out f32 [rows, D] = rms_norm(residual).
// out may alias delta (not residual).
void add_rms_norm(float* residual, const float* delta, const void* w, DType w_dtype, float* out, int64_t rows,
                  int D, float eps, bool plus_one, Launch stream);

// ---------------------------------------------------------------- rope

// In place, rotate-half (NeoX / Hugging Face) RoPE. Head h of token t lives at
// x + t*row_stride + h*head_dim; token t is at position pos[0] + t.
// angle = f32(pos) * inv_freq[i]; cos/sin in f32 (precise cosf/sinf), times
// attention_scaling (1 for default/linear/llama3 RoPE).
struct RopeParams {
  float* x = nullptr;             // f32, see above
  const int32_t* pos = nullptr;   // i32 [1] device
  const float* inv_freq = nullptr;  // f32 [head_dim / 2] device
  int T = 1;
  int n_heads = 0;     // heads rotated per token (e.g. n_q + n_kv in a fused qkv row)
  int head_dim = 0;
  int64_t row_stride = 0;  // elements between tokens; 0: n_heads * head_dim
  float attention_scaling = 1.0f;
};
void rope(const RopeParams& p, Launch stream);
// x f32 [T, H, head_dim] in place.
void rope(float* x, const int32_t* pos, const float* inv_freq, int T, int H, int head_dim, Launch stream);

// ---------------------------------------------------------------- elementwise

// out f32 [T, F] = act(gate) * up, with gate at gate + t*gate_stride and up at
// up + t*up_stride (strides in elements; 0: F).
void act_mul(const float* gate, const float* up, float* out, int T, int F, Activation act, Launch stream,
             int64_t gate_stride = 0, int64_t up_stride = 0);
// Fused layout: gate_up f32 [T, 2F] (gate | up) -> out f32 [T, F].
void act_mul_fused(const float* gate_up, float* out, int T, int F, Activation act, Launch stream);

void add(const float* a, const float* b, float* out, int64_t n, Launch stream);  // out may alias a or b
void softcap(float* x, int64_t n, float cap, Launch stream);  // x = cap * tanh(x / cap)
void scale(float* x, int64_t n, float s, Launch stream);      // x *= s

// Uniform values in [-scale, scale] (f32 or bf16; uniform01 of the element
// index): synthetic benchmark weights, equal to the CPU backend's.
void fill_uniform(void* p, DType dt, int64_t n, uint64_t seed, float scale, Launch stream);

// pos[0] += n on the device: the last action of a step.
void advance_position(int32_t* pos, int n, Launch stream);

// ---------------------------------------------------------------- linear

// out = x @ w^T (+ bias) (+ residual), or with a gated epilogue
// out[t, i] = act(row 2i) * row 2i+1 where w's rows interleave gate and up
// (gate_0, up_0, gate_1, up_1, ...), so one GEMV does gate+up+act_mul.

// Launch shape of the T == 1 GEMV (see Tuning::Gemv). warp4: a warp per four
// rows, so each x value loaded serves four rows.
using GemvShape = Tuning::Gemv;

// Steps of up to this many tokens go through the GEMV (each weight vector
// read once for all of them), every token's row summed exactly as a
// one-token GEMV sums it: bitwise the same values (a speculative verify
// step's rows are decode steps'). Larger steps go to cuBLAS.
constexpr int kMaxGemvTokens = 8;

struct LinearParams {
  const float* x = nullptr;      // f32 [T, K]
  const void* w = nullptr;       // w_dtype [N, K] row-major
  DType w_dtype = DType::BF16;   // f32 | bf16
  const void* bias = nullptr;    // w_dtype [N], or null
  const float* residual = nullptr;  // f32 [T, N] added in the epilogue, or null; may alias out
  float* out = nullptr;          // f32 [T, N] ([T, N/2] with a gate)
  int T = 1, N = 0, K = 0;
  bool gated = false;            // N even; no residual
  Activation act = Activation::SiLU;  // of the gate
  GemvShape shape = GemvShape::automatic;  // T == 1 launch shape (Tuning::gemv)
  Tuning::Multi multi = Tuning::Multi::automatic;  // 2..kMaxGemvTokens tokens (Tuning::multi)
  // RMSNorm prologue (when norm != null): every token's x row is normalised
  // before the product, x_k * rsqrt(mean_k(x^2) + norm_eps) * g_k with
  // g_k = norm[k] (or 1 + norm[k] when norm_plus_one). x itself is not
  // modified. T == 1 folds it into the GEMV (each group re-reduces x from L2,
  // alongside the dot products); T > 1 normalises into scratch first.
  const float* norm = nullptr;   // f32 [K]
  float norm_eps = 1e-6f;
  bool norm_plus_one = false;
  // Affine-quantized weights (qbits 4 or 8; 0: plain w_dtype weights), MLX's
  // "affine" layout: w is uint32 [N, K * qbits / 32], element k of a row in
  // bits (k % (32 / qbits)) * qbits of word k / (32 / qbits) (low bits first),
  // and w[n][k] = scales[n][k / group] * q + biases[n][k / group] with scales
  // and biases in w_dtype [N, K / group] (bias, if any, also w_dtype).
  // group: 32, 64 or 128; K % group == 0.
  int qbits = 0;
  int group = 0;
  const void* scales = nullptr;
  const void* biases = nullptr;
  // T == 1 on quantized weights (Tuning::quantized_int8_x; several tokens
  // take the f32-x kernel, so they are not bitwise a T == 1 step): each block
  // quantizes x (after the norm prologue) to int8 per vector of the weights
  // (absmax / 127) in shared memory and takes integer dot products (DP4A);
  // results within int8 rounding of x (about 1e-3 relative), not bitwise
  // equal to the f32-x kernel.
  bool int8_x = false;
  // With int8_x: the streamed kernel (Tuning::quantized_stream) where it fits.
  bool qstream = true;
  // With int8_x: the small-block register kernel (Tuning::quantized_blocks;
  // qgemv_blocks_kernel in linear.cu) where it fits, before qstream. It
  // needs xprep: device scratch of kQxScratchBytes for the prepared x
  // (GemmContext::xprep_scratch()); without it, the other kernels run.
  bool qblocks = false;
  void* xprep = nullptr;
  // Its ring (Tuning::qring_*): chunk 0 is automatic (kAutoQRing in linear.cu).
  int qring_chunk = 0, qring_stages = 0, qring_blocks = 0;
  // kMaxGemvTokens < T <= qmma_tokens on quantized weights: the fused
  // tensor-core kernel (qgemm.h) where the shape fits (qmma_tokens at most
  // kQGemmMaxTokens); longer steps, other shapes and qmma_tokens = 0
  // dequantise slabs of rows to bf16 for cuBLAS. The default is the longest
  // step measured faster than the slabs (H100, 2026-12-07, int4 g64 prefill,
  // bench/qgemm_call.sh: llama3.1-8b 3.24x / 1.98x / 1.54x / 1.02x the slabs
  // at 64 / 128 / 256 / 512 tokens, llama3.2-1b 2.45x / 1.73x / 1.26x /
  // 0.91x). Tuning::qmma_tokens (--tune qmma=N) overrides it.
  int qmma_tokens = 256;
};

// The prepared int8 x of the small-block quantized GEMV (LinearParams::xprep):
// K bytes of codes and 16 bytes a vector, K up to 32768.
constexpr size_t kQxScratchBytes = size_t{64} << 10;

// Owns a cuBLAS handle, its workspace and the scratch buffers of the T > 1 path.
// Not needed (may be null) for T <= kMaxGemvTokens, which never touches
// cuBLAS and never allocates, so it can be captured into a graph.
class GemmContext {
 public:
  GemmContext();
  ~GemmContext();
  GemmContext(const GemmContext&) = delete;
  GemmContext& operator=(const GemmContext&) = delete;
  // Pre-allocates scratch for up to `max_tokens` x max(K, N) elements.
  void reserve(int64_t max_tokens, int64_t max_dim);
  // kQxScratchBytes of device memory for LinearParams::xprep (allocated
  // with the context: usable during graph capture).
  void* xprep_scratch() const;
  struct Impl;
  Impl* impl() const { return impl_; }

 private:
  Impl* impl_ = nullptr;
};

// T <= kMaxGemvTokens: a bandwidth-bound GEMV (16-byte weight loads streamed
// past L1, f32 accumulation, 2 rows per group of threads; 8 for several
// tokens). Beyond: cuBLAS (bf16 weights:
// x rounded to bf16 in scratch, bf16 x bf16 -> f32 with f32 accumulation;
// f32 weights: f32 GEMM without TF32), then the epilogue.
void linear(const LinearParams& p, GemmContext* gemm, Launch stream);


// ---------------------------------------------------------------- attention

// The resolved update_and_attend call the op front hands to the backends.
using AttentionParams = ops::AttendCall;

// Steps of up to this many tokens attend each query as a decode step (split
// KV, the one-token grid per query): bitwise the outputs of one-token steps.
constexpr int kMaxDecodeQueries = 8;

// Split-KV scratch for decode (T <= kMaxDecodeQueries): partial outputs,
// partial (max, sum) and one merge counter per (query, kv head, query-head group). Allocate once per
// session (it serves every layer whose heads fit) and never resize while a
// graph that uses it lives. Counters start at zero and are reset by the kernel.
class AttentionWorkspace {
 public:
  // max_splits: static cap on blocks per kv head (1..128), the grid's second
  // dimension. min_chunk: fewest keys a split takes, so short contexts run
  // unsplit: a query seeing L keys uses ceil(L / max(min_chunk,
  // ceil(L / max_splits))) splits; 0 picks it from the head dim (about 8K
  // key elements per split).
  AttentionWorkspace(int max_q_heads, int max_head_dim, int max_splits, int min_chunk = 128);
  // A split count for `n_kv_heads` heads and up to `max_visible` keys per query:
  // about two blocks per SM at the longest context, capped at 64.
  static int choose_splits(int n_kv_heads, int64_t max_visible, int min_chunk = 128);

  int max_q_heads() const { return max_q_heads_; }
  int max_head_dim() const { return max_head_dim_; }
  int max_splits() const { return max_splits_; }
  int min_chunk() const { return min_chunk_; }
  // The decode-attention fields of a Tuning: legacy kernel, heads per block,
  // and a chunk that overrides min_chunk when non-zero.
  void tune(const Tuning& t) { tuning_ = t; }
  const Tuning& tuning() const { return tuning_; }
  // Split-KV partials of a step of T queries: [T * n_q_heads, splits,
  // head_dim]. Sized for kMaxDecodeQueries queries of max_q_heads heads at
  // scratch_splits() (at most 64) splits; fitting_splits() is the most splits
  // a layer's shape may use so that any step of up to kMaxDecodeQueries
  // queries fits (layers with few heads, like gemma3's one-KV-head global
  // layers, get up to max_splits).
  float* partial_out() const { return partial_out_.as<float>(); }
  size_t partial_out_floats() const {
    return size_t(kMaxDecodeQueries) * max_q_heads_ * scratch_splits() * max_head_dim_;
  }
  int scratch_splits() const { return max_splits_ < 64 ? max_splits_ : 64; }
  int fitting_splits(int n_q_heads, int head_dim) const;
  float* partial_ml() const { return partial_ml_.as<float>(); }    // f32 [kMaxDecodeQueries * max_q_heads, scratch_splits, 2]
  unsigned* counters() const { return counters_.as<unsigned>(); }  // u32 [counter_count()]
  int counter_count() const { return kMaxDecodeQueries * max_q_heads_; }

 private:
  int max_q_heads_, max_head_dim_, max_splits_, min_chunk_;
  Tuning tuning_;
  DeviceBuffer partial_out_, partial_ml_, counters_;
};

// One layer's cache step: writes the T new k/v rows (rounded to the storage
// dtype, or quantized with their scales) at the slots of positions
// pos..pos+T-1, then attends every query t (position pos+t) over the keys it
// may see, [first_visible(rule, p), p], read from the pool (so it sees the
// stored K/V, dequantized in registers), softmax in f32. Plain formats: K and
// V alike; quantized: one format for both, or K int8 with V int4.
//   T == 1: one kernel; split-KV flash-decoding over a grid of
//           (n_kv_heads x query-head groups, ws.max_splits()); each block reads
//           one KV head once for its whole GQA group; the last block of a head
//           merges the partials (log-sum-exp). Over quantized pools at head dim
//           64/128 on the tensor cores, blocks instead claim ~1024-key chunks
//           from a counter and the chunks' partials merge in two levels (the
//           counter array holds merge, claim and group counters). Capturable.
//   T <= kMaxDecodeQueries: a write kernel, then that grid once per query
//           (each query's output bitwise a one-token step's). Capturable.
//   T > kMaxDecodeQueries: a write kernel, then one block per (query, kv head, group);
//           under Tuning::prefill_attn == flash over bf16/f16 pools at head dim
//           64/128/256, tensor-core tiles instead (one block per 64 queries
//           and query head; q and P rounded to the storage type).
//   Tuning::DecodeAttn::legacy: every T through the last path.
// Preconditions (checked by the caller / the planner, not here): a flat pool
// has room for pos+T-1; a ring step has T <= max_write.
void update_and_attend(const AttentionParams& p, AttentionWorkspace& ws, Launch stream);

// Only the write half: k/v rows -> pool slots of positions pos..pos+T-1.
void write_kv(const AttentionParams& p, Launch stream);

// ---------------------------------------------------------------- selection

// Sampling settings are ops::SamplingParams, read from DEVICE memory when
// the kernel runs (so one recorded step serves any settings).
using SamplingConfig = ops::SamplingParams;

// Scratch of argmax / sample: a 64-bit max slot and a block counter, zeroed
// at construction and left zeroed by every kernel that uses them.
class SelectWorkspace {
 public:
  SelectWorkspace();
  unsigned long long* slot() const { return buf_.as<unsigned long long>(); }
  unsigned* counter() const { return reinterpret_cast<unsigned*>(buf_.as<unsigned long long>() + 1); }

 private:
  DeviceBuffer buf_;
};

// out_token i32 [1] = argmax of logits f32 [V] (lowest index on ties).
void argmax(const float* logits, int V, int32_t* out_token, SelectWorkspace& ws, Launch stream);

struct SampleParams {
  float* logits = nullptr;                  // f32 [V]; banned ids are set to -inf in place
  int V = 0;
  const SamplingConfig* config = nullptr;   // device
  const int32_t* banned = nullptr;          // i32 [n_banned] device, or null
  int n_banned = 0;
  uint8_t* seen = nullptr;                  // u8 [V] device or null: penalised; the chosen id is marked
  const int32_t* pos = nullptr;             // i32 [1] device: RNG counter
  int32_t* token = nullptr;                 // i32 [1] device: result
};
// Greedy when config->temperature <= 0 (lowest index among maxima). Else
// HF order: repetition penalty, temperature, top-k, top-p; then one draw
// u = uniform01(seed, pos) (the same counter-based generator as the CPU
// backend) walking the kept tokens by decreasing logit, ties by id. Masses
// are summed in 32.32 fixed point, so the result is deterministic.
void sample(const SampleParams& p, SelectWorkspace& ws, Launch stream);

// logits[ids[i]] = -inf for i < n (ids on the device; out-of-range ids ignored).
void mask_tokens(float* logits, int V, const int32_t* ids, int n, Launch stream);
// seen[ids[i]] = 1 for i < n.
void mark_seen(const int32_t* ids, int n, uint8_t* seen, int V, Launch stream);

}  // namespace kvgraph::cuda
