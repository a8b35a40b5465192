#include "kvgraph/stream.h"

#include <algorithm>

#include "kvgraph/error.h"

#ifdef KVGRAPH_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "ops/cuda/ops_cuda.h"
#define KV_CUDA_CHECK(call)                                                      \
  do {                                                                           \
    cudaError_t e_ = (call);                                                     \
    if (e_ != cudaSuccess) fail("stream", "{} failed: {}", #call, cudaGetErrorString(e_)); \
  } while (0)
#endif

namespace kvgraph {

Stream::Stream(Device device) : device_(device) {
  if (device_ == Device::CUDA) {
#ifdef KVGRAPH_HAVE_CUDA
    cudaStream_t s;
    // Blocking stream: it orders with the synchronous host copies of Tensor.
    KV_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamDefault));
    cuda_stream_ = s;
#else
    fail("stream", "CUDA stream requested but kvgraph was built without CUDA");
#endif
  }
}

Stream::~Stream() {
#ifdef KVGRAPH_HAVE_CUDA
  if (graph_exec_) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(graph_exec_));
  if (pinned_) cudaFreeHost(pinned_);
  if (cuda_stream_) {
    cudaStreamSynchronize(static_cast<cudaStream_t>(cuda_stream_));
    cuda_ops::release(cuda_stream_);
    cudaStreamDestroy(static_cast<cudaStream_t>(cuda_stream_));
  }
#endif
}

void Stream::submit(std::function<void()> fn) {
  if (recording_)
    tape_.push_back(std::move(fn));
  else
    fn();
}

void Stream::begin_record() {
  if (recording_) fail("stream", "begin_record while already recording");
  discard_recording();
  recording_ = true;
#ifdef KVGRAPH_HAVE_CUDA
  if (device_ == Device::CUDA)
    KV_CUDA_CHECK(cudaStreamBeginCapture(static_cast<cudaStream_t>(cuda_stream_),
                                         cudaStreamCaptureModeThreadLocal));
#endif
}

void Stream::end_record() {
  if (!recording_) fail("stream", "end_record without begin_record");
  recording_ = false;
  ++captures_;
#ifdef KVGRAPH_HAVE_CUDA
  if (device_ == Device::CUDA) {
    cudaGraph_t graph;
    KV_CUDA_CHECK(cudaStreamEndCapture(static_cast<cudaStream_t>(cuda_stream_), &graph));
    cudaGraphExec_t exec;
    cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    if (e != cudaSuccess) fail("stream", "cudaGraphInstantiate failed: {}", cudaGetErrorString(e));
    graph_exec_ = exec;
  }
#endif
}

bool Stream::has_recording() const {
  return device_ == Device::CPU ? !tape_.empty() : graph_exec_ != nullptr;
}

void Stream::discard_recording() {
  tape_.clear();
#ifdef KVGRAPH_HAVE_CUDA
  if (graph_exec_) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(graph_exec_));
#endif
  graph_exec_ = nullptr;
}

void Stream::replay() {
  if (!has_recording()) fail("stream", "replay without a recorded step");
  if (device_ == Device::CPU) {
    for (auto& op : tape_) op();
    return;
  }
#ifdef KVGRAPH_HAVE_CUDA
  KV_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(graph_exec_),
                                static_cast<cudaStream_t>(cuda_stream_)));
#endif
}

void Stream::reserve_reads(int n) {
  if (n <= pinned_cap_) return;
#ifdef KVGRAPH_HAVE_CUDA
  if (device_ == Device::CUDA) {
    synchronize();  // queued reads may still target the old buffer
    if (pinned_) cudaFreeHost(pinned_);
    pinned_ = nullptr;
    pinned_cap_ = 0;
    KV_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&pinned_), sizeof(int32_t) * size_t(n)));
  }
#endif
  host_reads_.resize(n);
  pinned_cap_ = n;
}

void Stream::queue_read_i32(const Tensor& t, int slot) {
  if (t.dtype() != DType::I32 || t.numel() < 1) fail("stream", "reading a token needs a non-empty i32 tensor");
  if (t.device() != device_) fail("stream", "reading a token: tensor is on another device");
  if (slot < 0) fail("stream", "negative read slot");
  if (slot >= pinned_cap_) reserve_reads(std::max(slot + 1, 2 * pinned_cap_));
  if (device_ == Device::CPU) {
    host_reads_[slot] = *t.data<int32_t>();
    return;
  }
#ifdef KVGRAPH_HAVE_CUDA
  KV_CUDA_CHECK(cudaMemcpyAsync(pinned_ + slot, t.raw(), sizeof(int32_t), cudaMemcpyDeviceToHost,
                                static_cast<cudaStream_t>(cuda_stream_)));
#endif
}

std::vector<int32_t> Stream::collect_i32(int n) {
  if (n < 0 || n > pinned_cap_) fail("stream", "collect_i32({}): only {} slots", n, pinned_cap_);
  synchronize();
  if (device_ == Device::CPU) return std::vector<int32_t>(host_reads_.begin(), host_reads_.begin() + n);
  return std::vector<int32_t>(pinned_, pinned_ + n);
}

int32_t Stream::read_i32(const Tensor& t) {
  queue_read_i32(t, 0);
  return collect_i32(1)[0];
}

void Stream::synchronize() {
#ifdef KVGRAPH_HAVE_CUDA
  if (device_ == Device::CUDA) KV_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(cuda_stream_)));
#endif
}

}  // namespace kvgraph
