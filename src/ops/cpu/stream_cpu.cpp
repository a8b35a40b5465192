// The CPU stream: ops are closures over stable buffers. Eagerly they run at
// once; while recording they are appended to a tape and do NOT run, so a
// closure that froze a per-token value at record time replays it wrongly,
// exactly as a CUDA graph would: CI catches that class of bug without a GPU.
#include <vector>

#include "kvgraph/error.h"
#include "ops/backend.h"

namespace kvgraph {

namespace {

class CpuStream final : public StreamBackend {
 public:
  void submit(std::function<void()> fn, bool recording) override {
    if (recording)
      tape_.push_back(std::move(fn));
    else
      fn();
  }
  void begin_record() override { tape_.clear(); }
  void end_record() override {}
  void replay() override {
    for (auto& op : tape_) op();
  }
  bool has_recording() const override { return !tape_.empty(); }
  void discard_recording() override { tape_.clear(); }
  size_t recorded_ops() const override { return tape_.size(); }
  void synchronize() override {}
  void reserve_reads(int n) override {
    if (n > static_cast<int>(reads_.size())) reads_.resize(n);
  }
  void queue_read_i32(const int32_t* src, int slot) override { reads_.at(slot) = *src; }
  const int32_t* slots() const override { return reads_.data(); }
  void set_tuning(const Tuning&) override {}  // nothing to tune on the CPU

 private:
  std::vector<std::function<void()>> tape_;
  std::vector<int32_t> reads_;
};

}  // namespace

std::unique_ptr<StreamBackend> make_cpu_stream_backend() { return std::make_unique<CpuStream>(); }

}  // namespace kvgraph
