#include "kvgraph/tensor.h"

#include <cstdlib>
#include <cstring>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kvgraph/error.h"

#include "ops/backend.h"

namespace kvgraph {

std::string_view device_name(Device d) { return d == Device::CPU ? "cpu" : "cuda"; }

Device parse_device(std::string_view name) {
  if (name == "cpu") return Device::CPU;
  if (name == "cuda" || name == "gpu") {
    if (!cuda_device::compiled())
      fail("device", "--device cuda: this kvgraph was built without CUDA (use the `cuda` preset)");
    if (cuda_device::device_count() == 0) fail("device", "--device cuda: no CUDA device is visible on this machine");
    return Device::CUDA;
  }
  fail("device", "unknown device \"{}\" (expected cpu or cuda)", name);
}

bool cuda_available() { return cuda_device::device_count() > 0; }

Buffer::Buffer(Device device, size_t bytes) : device_(device), bytes_(bytes) {
  if (device == Device::CUDA) {
    data_ = cuda_device::alloc(bytes);
    return;
  }
  data_ = std::aligned_alloc(64, bytes == 0 ? 64 : (bytes + 63) / 64 * 64);
  if (!data_) fail("buffer", "out of host memory allocating {} bytes", bytes);
}

void Buffer::release() noexcept {
  if (!data_) return;
  if (device_ == Device::CPU)
    std::free(data_);
  else
    cuda_device::free(data_);
  data_ = nullptr;
}

Buffer::~Buffer() { release(); }

Buffer::Buffer(Buffer&& o) noexcept
    : device_(o.device_), bytes_(std::exchange(o.bytes_, 0)), data_(std::exchange(o.data_, nullptr)) {}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    release();
    device_ = o.device_;
    bytes_ = std::exchange(o.bytes_, 0);
    data_ = std::exchange(o.data_, nullptr);
  }
  return *this;
}

void Buffer::upload(const void* src, size_t bytes, size_t offset) {
  if (offset + bytes > bytes_) fail("buffer", "upload of {} bytes at {} past the end ({} bytes)", bytes, offset, bytes_);
  if (bytes == 0) return;
  if (device_ == Device::CPU)
    std::memcpy(static_cast<char*>(data_) + offset, src, bytes);
  else
    cuda_device::copy(static_cast<char*>(data_) + offset, src, bytes);
}

void Buffer::download(void* dst, size_t bytes, size_t offset) const {
  if (offset + bytes > bytes_) fail("buffer", "download of {} bytes at {} past the end ({} bytes)", bytes, offset, bytes_);
  if (bytes == 0) return;
  if (device_ == Device::CPU)
    std::memcpy(dst, static_cast<const char*>(data_) + offset, bytes);
  else
    cuda_device::copy(dst, static_cast<const char*>(data_) + offset, bytes);
}

void Buffer::zero() {
  if (bytes_ == 0) return;
  if (device_ == Device::CPU)
    std::memset(data_, 0, bytes_);
  else
    cuda_device::zero(data_, bytes_);
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
  t.buf_->zero();
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

void Tensor::copy_to_host(void* dst) const { buf_->download(dst, nbytes(), offset_); }

void Tensor::copy_from_host(const void* src) { buf_->upload(src, nbytes(), offset_); }

std::vector<float> Tensor::to_f32_vector() const {
  std::vector<std::byte> bytes(nbytes());
  copy_to_host(bytes.data());
  std::vector<float> out(numel());
  widen_to_f32(bytes.data(), dtype_, out.size(), out.data());
  return out;
}

std::string Tensor::shape_str() const { return fmt::format("[{}]", fmt::join(shape_, ", ")); }

}  // namespace kvgraph
