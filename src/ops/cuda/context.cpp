#include "ops/cuda/context.h"

#include <cuda_runtime_api.h>

#include <utility>

#include "kvgraph/error.h"

namespace kvgraph::cuda {

CudaContext::CudaContext(const Tuning& t) : tuning_(t) { attention_.tune(t); }

CudaContext::~CudaContext() {
  // A capture an exception left open (it holds the capture lock).
  if (CudaGraph* g = std::exchange(capturing_, nullptr)) g->abort_capture();
  // Held until the last member (stream, cuBLAS, scratch) is gone.
  teardown_.emplace("destroying a CUDA stream", true);
  // Work queued on the stream may still use the scratch and the pinned words.
  cudaStreamSynchronize(stream_.get());
  if (pinned_) cudaFreeHost(pinned_);
}

void CudaContext::submit(std::function<void()>, bool) {
  fail("stream", "a host closure was submitted to a CUDA stream (an op without a CUDA path)");
}

void CudaContext::begin_record(int slot) {
  CudaGraph& g = graphs_[slot];  // std::map: the reference stays valid as slots are added
  g.begin_capture(stream_.get());
  capturing_ = &g;
}

void CudaContext::end_record() {
  CudaGraph* g = capturing_;
  capturing_ = nullptr;
  if (!g) fail("stream", "end_record without begin_record");
  g->end_capture();
}

void CudaContext::replay(int slot) { graphs_.at(slot).launch(stream_.get()); }

bool CudaContext::has_recording(int slot) const {
  auto it = graphs_.find(slot);
  return it != graphs_.end() && it->second.ready();
}

void CudaContext::discard_recording(int slot) {
  // An op threw while recording: end the capture (the stream must leave
  // capture mode before anything else runs on it, and the lock is released).
  if (CudaGraph* g = std::exchange(capturing_, nullptr)) g->abort_capture();
  if (slot < 0) {
    for (auto& [s, g] : graphs_) g.reset();
  } else if (auto it = graphs_.find(slot); it != graphs_.end()) {
    it->second.reset();
  }
}

size_t CudaContext::recorded_ops(int slot) const {
  auto it = graphs_.find(slot);
  return it == graphs_.end() ? 0 : it->second.node_count();
}

void CudaContext::set_tuning(const Tuning& t) {
  tuning_ = t;
  attention_.tune(t);
}

void CudaContext::reserve_reads(int n) {
  CaptureExclusion x("resizing pinned read slots");
  if (pinned_) KVGRAPH_CUDA_CHECK(cudaFreeHost(pinned_));
  pinned_ = nullptr;
  KVGRAPH_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&pinned_), sizeof(int32_t) * size_t(n)));
}

void CudaContext::queue_read_i32(const int32_t* src, int slot) {
  KVGRAPH_CUDA_CHECK(cudaMemcpyAsync(pinned_ + slot, src, sizeof(int32_t), cudaMemcpyDeviceToHost, stream_.get()));
}

CudaContext& context(Stream& s) {
  if (s.device() != Device::CUDA) fail("cuda", "a CUDA op was given a {} stream", device_name(s.device()));
  return static_cast<CudaContext&>(s.backend());
}

}  // namespace kvgraph::cuda

// The seam's CUDA entry points (src/ops/backend.h).
namespace kvgraph::cuda_device {

bool compiled() { return true; }
int device_count() { return cuda::device_count(); }

void* alloc(size_t bytes) {
  cuda::CaptureExclusion x("cudaMalloc");
  void* p = nullptr;
  const size_t rounded = bytes == 0 ? 64 : (bytes + 63) / 64 * 64;
  const cudaError_t e = cudaMalloc(&p, rounded);
  if (e != cudaSuccess) {
    cudaGetLastError();
    fail("buffer", "cudaMalloc of {} bytes failed: {}", bytes, cudaGetErrorString(e));
  }
  return p;
}

void free(void* p) noexcept {
  cuda::CaptureExclusion x("cudaFree", /*quiet=*/true);
  cudaFree(p);
}

void copy(void* dst, const void* src, size_t bytes) {
  cuda::CaptureExclusion x("a synchronous copy");
  KVGRAPH_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
  // A pageable upload may still be in flight when cudaMemcpy returns, and a
  // kernel launched with programmatic dependent launch does not wait for the
  // legacy stream: finish it here.
  KVGRAPH_CUDA_CHECK(cudaDeviceSynchronize());
}

void zero(void* p, size_t bytes) {
  cuda::CaptureExclusion x("a synchronous memset");
  KVGRAPH_CUDA_CHECK(cudaMemset(p, 0, bytes));
  KVGRAPH_CUDA_CHECK(cudaDeviceSynchronize());
}

std::unique_ptr<StreamBackend> make_stream_backend(const Tuning& t) {
  cuda::CaptureExclusion x("creating a CUDA stream");
  return std::make_unique<cuda::CudaContext>(t);
}

double copy_bandwidth_gbs() { return cuda::measure_copy_bandwidth_gbs(); }

}  // namespace kvgraph::cuda_device
