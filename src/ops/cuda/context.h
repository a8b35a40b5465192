#pragma once
// The CUDA backend of a Stream: its cudaStream_t, the recorded graph, the
// pinned words token reads land in, the tuning, and the scratch the ops
// keep per stream. A recorded graph points into that scratch, so it lives
// exactly as long as the stream. Plain C++ (g++-compiled files include it).
#include <cuda_runtime_api.h>

#include <map>
#include <optional>

#include "kvgraph/stream.h"
#include "ops/backend.h"
#include "ops/cuda/kernels.h"
#include "ops/cuda/runtime.h"

namespace kvgraph::cuda {

class CudaContext final : public StreamBackend {
 public:
  explicit CudaContext(const Tuning& t);
  ~CudaContext() override;

  void submit(std::function<void()> fn, bool recording) override;
  void begin_record(int slot) override;
  void end_record() override;
  void replay(int slot) override;
  bool has_recording(int slot) const override;
  void discard_recording(int slot) override;
  size_t recorded_ops(int slot) const override;
  void synchronize() override { stream_.synchronize(); }
  void reserve_reads(int n) override;
  void queue_read_i32(const int32_t* src, int slot) override;
  const int32_t* slots() const override { return pinned_; }
  void set_tuning(const Tuning& t) override;

  // Where this stream's kernels launch, with the tuning's PDL switch.
  Launch launch() const { return Launch(stream_.get(), tuning_.programmatic_launch); }
  const Tuning& tuning() const { return tuning_; }
  GemmContext& gemm() { return gemm_; }
  AttentionWorkspace& attention() { return attention_; }
  SelectWorkspace& select() { return select_; }

 private:
  // Declared first, so destroyed last: the destructor takes it, and the
  // members' CUDA frees run under it (see CaptureExclusion).
  std::optional<CaptureExclusion> teardown_;
  Tuning tuning_;
  CudaStream stream_;
  std::map<int, CudaGraph> graphs_;  // recordings by slot
  CudaGraph* capturing_ = nullptr;
  int32_t* pinned_ = nullptr;
  GemmContext gemm_;
  AttentionWorkspace attention_{/*max_q_heads=*/128, /*max_head_dim=*/256, /*max_splits=*/128, /*min_chunk=*/0};
  SelectWorkspace select_;
};

// The CUDA backend behind a Stream on Device::CUDA.
CudaContext& context(Stream& s);

}  // namespace kvgraph::cuda
