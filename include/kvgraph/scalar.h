#pragma once
// Scalar math that must agree between the CPU backend, the CUDA kernels and
// the tests' references: one definition each, usable from host and device
// code (KV_HD). The bf16/f16 conversions live beside DType in dtype.h.
#include <cmath>
#include <cstdint>

#include "kvgraph/dtype.h"

namespace kvgraph {

// The MLP activations the supported families use.
enum class Activation : uint8_t {
  SiLU,      // x * sigmoid(x)
  GeluTanh,  // gelu_pytorch_tanh: GELU with the tanh approximation
};

KV_HD float silu(float x) { return x / (1.0f + expf(-x)); }
KV_HD float gelu_tanh(float x) {
  constexpr float k = 0.7978845608028654f;  // sqrt(2 / pi)
  return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}
KV_HD float activate(float x, Activation act) { return act == Activation::SiLU ? silu(x) : gelu_tanh(x); }

// Gemma's logit soft-capping: cap * tanh(x / cap).
KV_HD float softcap(float x, float cap) { return cap * tanhf(x / cap); }

// Counter-based uniform draw in [0, 1) (splitmix64 of seed and counter, top
// 24 bits): the same value for the same (seed, counter) on every backend, so
// sampling and synthetic weights never depend on where they ran.
KV_HD float uniform01(uint64_t seed, uint32_t counter) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * (static_cast<uint64_t>(counter) + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * (1.0f / 16777216.0f);
}

}  // namespace kvgraph
