#pragma once
// Value types the op set shares with its callers and both backends. They sit
// on the ground floor (tensors and scalars only), so neither the op front,
// nor a backend, nor the model needs to include another's header for them.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kvgraph/scalar.h"
#include "kvgraph/tensor.h"

namespace kvgraph::ops {

// Sampling settings; temperature 0 means greedy (argmax, lowest id on ties).
// The decode step reads them from device memory when it runs (the bytes of
// this struct, as Session uploads them), so one recording serves any
// settings: the layout is part of the CPU/CUDA contract.
struct SamplingParams {
  float temperature = 0.0f;
  int32_t top_k = 0;                // 0: off
  float top_p = 1.0f;               // 1: off
  float repetition_penalty = 1.0f;  // 1: off (HF rule: logit > 0 ? /p : *p)
  uint64_t seed = 0;
};

// An out-of-range sampling setting: the field's name as declared above, its
// value as text, and the range it must lie in.
struct SamplingIssue {
  std::string field;     // "temperature", "top_k", "top_p" or "repetition_penalty"
  std::string value;     // e.g. "nan", "1.5", "-3"
  std::string expected;  // e.g. "a number in (0, 1]"
};

// The ranges: temperature finite and >= 0 (0: greedy), top_k >= 0 (0: off),
// top_p in (0, 1] (1: off), repetition_penalty finite and > 0 (1: off). Any
// seed is valid. Returns the first setting out of range, or nullopt.
std::optional<SamplingIssue> check(const SamplingParams& p);

// Throws Error("[sampling] top_p 1.5: expected a number in (0, 1]") for the
// first setting out of range. Session calls it before settings reach a step.
void validate(const SamplingParams& p);

// The distribution sample() draws from, computed on the host with the CPU
// backend's arithmetic (the sample op itself uses it there): the logits after
// the repetition penalty (seen, may be null) and the bans, ranked by
// decreasing logit (ties by increasing id), cut to top_k then top_p, each
// weighted exp((l - max) / temperature). sample() draws the first candidate
// whose running weight passes uniform01(seed, counter) * sum. Temperature 0:
// the arg-max alone, weight 1. Speculative sampling reads p from it.
struct SampleCandidates {
  std::vector<int32_t> ids;    // in rank order
  std::vector<float> weights;  // unnormalised, in rank order
  float sum = 0.0f;            // of weights, summed in rank order
  bool finite = true;          // false: a logit was NaN or +inf (sample() gives -1)
};
SampleCandidates sampling_candidates(const float* logits, int V, const SamplingParams& p, const int32_t* banned,
                                     int n_banned, const uint8_t* seen);

// What a linear layer may fuse around its product (the decoder's fused
// kernels). In order: norm prologue, product, bias, then either the gate or
// the residual.
struct LinearOptions {
  const Tensor* bias = nullptr;  // [N], same dtype as w
  // RMSNorm prologue: each row of x is used as rms_norm(x) * norm (Gemma:
  // * (1 + norm)); x itself is not modified. f32 [K].
  const Tensor* norm = nullptr;
  float norm_eps = 1e-6f;
  bool norm_plus_one = false;
  // Gated epilogue: w's rows interleave gate and up (gate_0, up_0, gate_1,
  // ...), and out f32 [T, N/2] = act(x @ gate^T) * (x @ up^T).
  bool gated = false;
  Activation act = Activation::SiLU;
  // Residual epilogue: out = ... + residual (f32 [T, N]; may alias out).
  const Tensor* residual = nullptr;
};

}  // namespace kvgraph::ops
