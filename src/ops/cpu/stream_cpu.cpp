// The CPU stream: ops are closures over stable buffers. Eagerly they run at
// once; while recording they are appended to a tape and do NOT run, so a
// closure that froze a per-token value at record time replays it wrongly,
// exactly as a CUDA graph would: CI catches that class of bug without a GPU.
#include <map>
#include <vector>

#include "kvgraph/error.h"
#include "ops/backend.h"

namespace kvgraph {

namespace {

class CpuStream final : public StreamBackend {
 public:
  void submit(std::function<void()> fn, bool recording) override {
    if (recording)
      tapes_[slot_].push_back(std::move(fn));
    else
      fn();
  }
  void begin_record(int slot) override {
    slot_ = slot;
    tapes_[slot].clear();
  }
  void end_record() override {}
  void replay(int slot) override {
    for (auto& op : tapes_.at(slot)) op();
  }
  bool has_recording(int slot) const override {
    auto it = tapes_.find(slot);
    return it != tapes_.end() && !it->second.empty();
  }
  void discard_recording(int slot) override {
    if (slot < 0)
      tapes_.clear();
    else
      tapes_.erase(slot);
  }
  size_t recorded_ops(int slot) const override {
    auto it = tapes_.find(slot);
    return it == tapes_.end() ? 0 : it->second.size();
  }
  void synchronize() override {}
  void reserve_reads(int n) override {
    if (n > static_cast<int>(reads_.size())) reads_.resize(n);
  }
  void queue_read_i32(const int32_t* src, int slot) override { reads_.at(slot) = *src; }
  const int32_t* slots() const override { return reads_.data(); }
  void set_tuning(const Tuning&) override {}  // nothing to tune on the CPU

 private:
  std::map<int, std::vector<std::function<void()>>> tapes_;  // by slot
  int slot_ = 0;  // the slot being recorded
  std::vector<int32_t> reads_;
};

}  // namespace

std::unique_ptr<StreamBackend> make_cpu_stream_backend() { return std::make_unique<CpuStream>(); }

}  // namespace kvgraph
