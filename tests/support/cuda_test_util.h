#pragma once
// Helpers shared by the CUDA op tests (tests/ops/*_gpu_test.cpp): host <->
// device copies, seeded random inputs, bf16 rounding, the relative error
// measure, and a fixture base that skips when there is no CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "kvgraph/dtype.h"
#include "ops/cuda/runtime.h"

namespace kvgraph::cuda {

// Fixture base: every test skips cleanly when no CUDA device is present.
class CudaDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (device_count() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

template <typename T>
inline DeviceBuffer to_device(const std::vector<T>& v) {
  DeviceBuffer b(v.size() * sizeof(T));
  b.upload(v.data(), v.size() * sizeof(T));
  return b;
}
template <typename T>
inline std::vector<T> to_host(const DeviceBuffer& b, size_t n) {
  std::vector<T> v(n);
  b.download(v.data(), n * sizeof(T));
  return v;
}
inline std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}
inline std::vector<uint16_t> bf16_of(const std::vector<float>& v) {
  std::vector<uint16_t> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = f32_to_bf16(v[i]);
  return o;
}
inline std::vector<float> bf16_round(const std::vector<float>& v) {
  std::vector<float> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = bf16_to_f32(f32_to_bf16(v[i]));
  return o;
}
// max |got - want| / max |want|. A NaN difference is skipped by std::max here
// A NaN anywhere counts as an infinite error, so a kernel that emits NaN
// can never pass.
inline double norm_err(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = std::fabs(double(got[i]) - double(want[i]));
    num = std::isnan(d) ? INFINITY : std::max(num, d);
    den = std::max(den, std::fabs(double(want[i])));
  }
  return den > 0 ? num / den : num;
}

}  // namespace kvgraph::cuda
