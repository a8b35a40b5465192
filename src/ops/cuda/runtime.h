#pragma once
// CUDA resources behind RAII (device buffers, streams, events, graphs) and the
// one checking macro. Plain C++: usable from .cpp files compiled by g++.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kvgraph/tensor.h"

namespace kvgraph::cuda {

// Throws kvgraph::Error("[cuda] <call> failed: <name> (<description>) at file:line").
[[noreturn]] void fail_status(cudaError_t status, const char* call, const char* file, int line);
inline void check(cudaError_t status, const char* call, const char* file, int line) {
  if (status != cudaSuccess) fail_status(status, call, file, line);
}
// Wraps a CUDA runtime call; a failure throws kvgraph::Error naming the call.
#define KVGRAPH_CUDA_CHECK(call) ::kvgraph::cuda::check((call), #call, __FILE__, __LINE__)

// Number of CUDA devices; 0 when there is no device or no driver (never throws).
int device_count();
// Streaming multiprocessors of the current device.
int sm_count();

// Device memory of the kernel layer: kvgraph::Buffer on Device::CUDA (one
// RAII owner of device memory for the whole library). Contents are undefined
// until written; upload/download/zero are synchronous.
class DeviceBuffer : public Buffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : Buffer(Device::CUDA, bytes) {}
};

// A stream that is ordered after the legacy default stream (cudaStreamDefault).
class CudaStream {
 public:
  CudaStream();
  ~CudaStream();
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  cudaStream_t get() const { return stream_; }
  void synchronize() const;

 private:
  cudaStream_t stream_ = nullptr;
};

class CudaEvent {
 public:
  CudaEvent();
  ~CudaEvent();
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  cudaEvent_t get() const { return event_; }
  void record(cudaStream_t stream);
  void synchronize() const;
  // Milliseconds between two recorded (and completed) events.
  static float elapsed_ms(const CudaEvent& start, const CudaEvent& stop);

 private:
  cudaEvent_t event_ = nullptr;
};

// One captured CUDA graph: begin_capture(stream) -> enqueue work on that
// stream -> end_capture() (instantiates) -> launch() any number of times.
// Capture is thread-local, so other threads may keep using CUDA meanwhile.
class CudaGraph {
 public:
  CudaGraph() = default;
  ~CudaGraph();
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  // A capture holds the process-wide capture lock (CaptureExclusion) from
  // begin_capture until end_capture or abort_capture, on the same thread.
  void begin_capture(cudaStream_t stream);
  void end_capture();  // throws if the capture failed (e.g. an illegal call was made)
  // Ends a capture that failed half-way (an op threw while recording): the
  // stream leaves capture mode, the partial graph is dropped, errors ignored.
  void abort_capture() noexcept;
  bool capturing() const { return capturing_ != nullptr; }
  void launch(cudaStream_t stream) const;
  bool ready() const { return exec_ != nullptr; }
  size_t node_count() const;  // nodes of the captured graph (kernels, memcpys, ...)
  void reset();

 private:
  cudaStream_t capturing_ = nullptr;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

// Calls that use the legacy default stream or synchronize the whole device
// (synchronous cudaMemcpy / cudaMemset, cudaDeviceSynchronize, cudaFree,
// cudaFreeHost, stream and cuBLAS setup) must not run while another thread
// captures a graph: the legacy stream waits on every blocking stream, the
// capturing one included, which invalidates that capture and fails the call
// ("operation not permitted when stream is capturing"). Such calls hold a
// CaptureExclusion; a capture holds the same lock for its whole length
// (captures are short: one step's launches). On the capturing thread itself
// these calls are illegal anyway: CaptureExclusion then throws rather than
// deadlock (`quiet`: it neither throws nor locks, for noexcept frees).
class CaptureExclusion {
 public:
  explicit CaptureExclusion(const char* what, bool quiet = false);
  ~CaptureExclusion();
  CaptureExclusion(const CaptureExclusion&) = delete;
  CaptureExclusion& operator=(const CaptureExclusion&) = delete;

 private:
  bool locked_ = false;
};

// Bandwidth probes of the current device, in GB/s (1e9 bytes per second).
// Copy: a device-to-device cudaMemcpy of `bytes`, counting bytes read plus
// bytes written (2 x bytes per copy), median of `iters` timed copies.
double measure_copy_bandwidth_gbs(size_t bytes = size_t{1} << 30, int iters = 20);
// Read: a streaming read-only kernel over `bytes` (16-byte loads, no L1
// allocation), counting bytes read; median of `iters` runs. This is the
// ceiling a batch-1 GEMV can reach.
double measure_read_bandwidth_gbs(size_t bytes = size_t{1} << 30, int iters = 20);

}  // namespace kvgraph::cuda
