#include "kvgraph/stream.h"

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

int32_t Stream::read_i32(const Tensor& t) {
  if (t.dtype() != DType::I32 || t.numel() < 1) fail("stream", "read_i32 needs a non-empty i32 tensor");
  if (t.device() != device_) fail("stream", "read_i32: tensor is on another device");
  if (device_ == Device::CPU) return *t.data<int32_t>();
#ifdef KVGRAPH_HAVE_CUDA
  if (!pinned_) KV_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&pinned_), sizeof(int32_t)));
  cudaStream_t s = static_cast<cudaStream_t>(cuda_stream_);
  KV_CUDA_CHECK(cudaMemcpyAsync(pinned_, t.raw(), sizeof(int32_t), cudaMemcpyDeviceToHost, s));
  KV_CUDA_CHECK(cudaStreamSynchronize(s));
  return *pinned_;
#else
  fail("stream", "read_i32 on CUDA in a build without CUDA");
#endif
}

void Stream::synchronize() {
#ifdef KVGRAPH_HAVE_CUDA
  if (device_ == Device::CUDA) KV_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(cuda_stream_)));
#endif
}

}  // namespace kvgraph
