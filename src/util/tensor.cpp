#include "kvgraph/tensor.h"

#include <cstdlib>
#include <cstring>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kvgraph/error.h"

#ifdef KVGRAPH_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace kvgraph {

std::string_view device_name(Device d) { return d == Device::CPU ? "cpu" : "cuda"; }

Device parse_device(std::string_view name) {
  if (name == "cpu") return Device::CPU;
  if (name == "cuda" || name == "gpu") {
    if (!cuda_available()) {
#ifdef KVGRAPH_HAVE_CUDA
      fail("device", "--device cuda: no CUDA device is visible on this machine");
#else
      fail("device", "--device cuda: this kvgraph was built without CUDA (use the `cuda` preset)");
#endif
    }
    return Device::CUDA;
  }
  fail("device", "unknown device \"{}\" (expected cpu or cuda)", name);
}

bool cuda_available() {
#ifdef KVGRAPH_HAVE_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return false;
  return n > 0;
#else
  return false;
#endif
}

Buffer::Buffer(Device device, size_t bytes) : device_(device), bytes_(bytes) {
  size_t alloc = bytes == 0 ? 64 : (bytes + 63) / 64 * 64;
  if (device == Device::CPU) {
    data_ = std::aligned_alloc(64, alloc);
    if (!data_) fail("buffer", "out of host memory allocating {} bytes", bytes);
    return;
  }
#ifdef KVGRAPH_HAVE_CUDA
  cudaError_t e = cudaMalloc(&data_, alloc);
  if (e != cudaSuccess)
    fail("buffer", "cudaMalloc of {} bytes failed: {}", bytes, cudaGetErrorString(e));
#else
  fail("buffer", "CUDA buffer requested but kvgraph was built without CUDA");
#endif
}

Buffer::~Buffer() {
  if (!data_) return;
  if (device_ == Device::CPU) {
    std::free(data_);
  } else {
#ifdef KVGRAPH_HAVE_CUDA
    cudaFree(data_);
#endif
  }
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape_) n *= d;
  return n;
}

Tensor Tensor::empty(std::vector<int64_t> shape, DType dtype, Device device) {
  Tensor t;
  t.shape_ = std::move(shape);
  for (int64_t d : t.shape_)
    if (d < 0) fail("tensor", "negative dimension in shape {}", t.shape_str());
  t.dtype_ = dtype;
  t.device_ = device;
  t.buf_ = std::make_shared<Buffer>(device, t.nbytes());
  return t;
}

Tensor Tensor::zeros(std::vector<int64_t> shape, DType dtype, Device device) {
  Tensor t = empty(std::move(shape), dtype, device);
  if (device == Device::CPU) {
    std::memset(t.raw(), 0, t.nbytes());
  } else {
#ifdef KVGRAPH_HAVE_CUDA
    cudaMemset(t.raw(), 0, t.nbytes());
    cudaDeviceSynchronize();  // see copy_from_host
#endif
  }
  return t;
}

Tensor Tensor::from_host(const void* src, std::vector<int64_t> shape, DType dtype, Device device) {
  Tensor t = empty(std::move(shape), dtype, device);
  t.copy_from_host(src);
  return t;
}

Tensor Tensor::slice_rows(int64_t begin, int64_t count) const {
  if (shape_.empty() || begin < 0 || count < 0 || begin + count > shape_[0])
    fail("tensor", "slice_rows({}, {}) out of range for shape {}", begin, count, shape_str());
  Tensor t = *this;
  t.shape_[0] = count;
  t.offset_ += static_cast<size_t>(begin) * (numel() / std::max<int64_t>(shape_[0], 1)) * dtype_size(dtype_);
  return t;
}

Tensor Tensor::reshape(std::vector<int64_t> shape) const {
  Tensor t = *this;
  t.shape_ = std::move(shape);
  if (t.numel() != numel()) fail("tensor", "cannot reshape {} to {}", shape_str(), t.shape_str());
  return t;
}

void Tensor::copy_to_host(void* dst) const {
  if (device_ == Device::CPU) {
    std::memcpy(dst, raw(), nbytes());
    return;
  }
#ifdef KVGRAPH_HAVE_CUDA
  cudaError_t e = cudaMemcpy(dst, raw(), nbytes(), cudaMemcpyDeviceToHost);
  if (e != cudaSuccess) fail("tensor", "cudaMemcpy to host failed: {}", cudaGetErrorString(e));
#endif
}

void Tensor::copy_from_host(const void* src) {
  if (device_ == Device::CPU) {
    std::memcpy(raw(), src, nbytes());
    return;
  }
#ifdef KVGRAPH_HAVE_CUDA
  cudaError_t e = cudaMemcpy(raw(), src, nbytes(), cudaMemcpyHostToDevice);
  // A pageable upload may still be in flight when cudaMemcpy returns, and
  // kernels launched with programmatic dependent launch do not wait for the
  // legacy stream: finish the copy before any kernel can read it.
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  if (e != cudaSuccess) fail("tensor", "cudaMemcpy from host failed: {}", cudaGetErrorString(e));
#endif
}

std::vector<float> Tensor::to_f32_vector() const {
  std::vector<std::byte> bytes(nbytes());
  copy_to_host(bytes.data());
  std::vector<float> out(numel());
  for (int64_t i = 0; i < numel(); ++i) {
    switch (dtype_) {
      case DType::F32: std::memcpy(&out[i], bytes.data() + 4 * i, 4); break;
      case DType::BF16: { uint16_t h; std::memcpy(&h, bytes.data() + 2 * i, 2); out[i] = bf16_to_f32(h); break; }
      case DType::F16: { uint16_t h; std::memcpy(&h, bytes.data() + 2 * i, 2); out[i] = f16_to_f32(h); break; }
      case DType::I32: { int32_t v; std::memcpy(&v, bytes.data() + 4 * i, 4); out[i] = static_cast<float>(v); break; }
      default: fail("tensor", "to_f32_vector: unsupported dtype {}", dtype_name(dtype_));
    }
  }
  return out;
}

std::string Tensor::shape_str() const { return fmt::format("[{}]", fmt::join(shape_, ", ")); }

}  // namespace kvgraph
