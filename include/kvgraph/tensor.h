#pragma once
// A minimal tensor: a typed, shaped view into a reference-counted buffer that
// lives on one device. Buffers never move, so a recorded step can hold raw
// pointers into them for its whole life.
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "kvgraph/dtype.h"

namespace kvgraph {

enum class Device : uint8_t { CPU, CUDA };
std::string_view device_name(Device d);
Device parse_device(std::string_view name);  // "cpu" | "cuda"; throws otherwise
bool cuda_available();                       // built with CUDA and a device is present

// Raw memory on one device, freed on destruction (RAII): the one owner of
// device memory in kvgraph (the CUDA kernel layer's DeviceBuffer is this on
// Device::CUDA). Movable, not copyable; contents are undefined until written.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Device device, size_t bytes);
  ~Buffer();
  Buffer(Buffer&& o) noexcept;
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  Device device() const { return device_; }
  size_t bytes() const { return bytes_; }
  void* data() const { return data_; }
  template <typename T>
  T* as() const { return static_cast<T*>(data_); }

  // Synchronous host <-> buffer copies of `bytes` at byte `offset` (checked
  // against the size), and a synchronous fill with zeros.
  void upload(const void* src, size_t bytes, size_t offset = 0);
  void download(void* dst, size_t bytes, size_t offset = 0) const;
  void zero();

 private:
  void release() noexcept;
  Device device_ = Device::CPU;
  size_t bytes_ = 0;
  void* data_ = nullptr;
};

class Tensor {
 public:
  Tensor() = default;
  static Tensor empty(std::vector<int64_t> shape, DType dtype, Device device);
  static Tensor zeros(std::vector<int64_t> shape, DType dtype, Device device);
  // Copies host data of the given dtype into a new tensor on `device`.
  static Tensor from_host(const void* src, std::vector<int64_t> shape, DType dtype, Device device);

  bool defined() const { return buf_ != nullptr; }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_.at(i < 0 ? shape_.size() + i : i); }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t numel() const;
  size_t nbytes() const { return numel() * dtype_size(dtype_); }

  void* raw() const { return static_cast<std::byte*>(buf_->data()) + offset_; }
  template <typename T>
  T* data() const { return static_cast<T*>(raw()); }

  // A view of rows [begin, begin + count) along dim 0, same buffer.
  Tensor slice_rows(int64_t begin, int64_t count) const;
  // Same buffer, another shape with the same number of elements.
  Tensor reshape(std::vector<int64_t> shape) const;

  // Host copies (synchronous); work for either device.
  void copy_to_host(void* dst) const;
  void copy_from_host(const void* src);
  std::vector<float> to_f32_vector() const;  // widens any dtype (widen_to_f32)
  std::string shape_str() const;

 private:
  std::shared_ptr<Buffer> buf_;
  size_t offset_ = 0;
  std::vector<int64_t> shape_;
  DType dtype_ = DType::F32;
  Device device_ = Device::CPU;
};

}  // namespace kvgraph
