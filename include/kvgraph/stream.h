#pragma once
// Where ops run, and how a step is recorded once and replayed.
//
// CPU: an op is a closure over stable buffers. Eagerly it runs at once; while
// recording it is appended to a tape and does NOT run; replay() runs the tape.
// The rules are those of a CUDA graph: anything a closure captured by value at
// record time is frozen, so per-token values must be read from buffers when
// the closure runs. That lets CI (no GPU) catch frozen-state bugs.
//
// CUDA: ops launch kernels on one stream; while recording the stream is
// captured into a CUDA graph, instantiated once and replayed per token.
//
// A stream keeps one recording per slot (a small integer): the session's
// decode step is slot 0, its speculative verify steps of T tokens slot T.
// Every slot follows the same rules; they share the stream's scratch, which
// is safe because replays on one stream run one after another.
//
// The stream also carries the kernel tuning (include/kvgraph/tuning.h) and,
// through its backend, the per-stream scratch the backend's ops need.
#include <functional>
#include <memory>
#include <vector>

#include "kvgraph/tensor.h"
#include "kvgraph/tuning.h"

namespace kvgraph {

class StreamBackend;  // src/ops/backend.h

class Stream {
 public:
  explicit Stream(Device device, Tuning tuning = {});
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  Device device() const { return device_; }
  const Tuning& tuning() const { return tuning_; }
  // A recorded step keeps the tuning it was recorded with: setting another
  // one discards the recording.
  void set_tuning(const Tuning& t);

  // CPU ops: run now, or append to the tape while recording.
  void submit(std::function<void()> fn);

  // Starts recording into `slot` (replacing what it held).
  void begin_record(int slot = 0);
  void end_record();  // ends recording (CUDA: instantiates the graph)
  void replay(int slot = 0);  // runs the step recorded in `slot` once
  bool recording() const { return recording_; }
  bool has_recording(int slot = 0) const;
  void discard_recording();  // every slot
  int captures() const { return captures_; }  // how many steps were ever recorded
  size_t recorded_ops(int slot = 0) const;     // CPU tape length; CUDA: graph nodes

  void synchronize();
  // The first i32 of `t` once the stream's queued work is done (CUDA: one
  // small async copy into pinned memory, then a stream sync: the per-token
  // read of a decode step, cheaper than a pageable cudaMemcpy).
  int32_t read_i32(const Tensor& t);
  // Queues a copy of t's first i32 into host slot `slot` (ordered after the
  // work queued so far; CUDA: pinned memory, no wait). collect_i32(n) waits
  // for the stream and returns slots [0, n).
  void queue_read_i32(const Tensor& t, int slot);
  std::vector<int32_t> collect_i32(int n);
  void reserve_reads(int n);  // room for n queued reads (waits for the stream when it grows)

  // The backend behind this stream (for the op backends in src/ops/).
  StreamBackend& backend() const { return *backend_; }

 private:
  Device device_;
  Tuning tuning_;
  bool recording_ = false;
  int captures_ = 0;
  int read_cap_ = 0;
  std::unique_ptr<StreamBackend> backend_;
};

}  // namespace kvgraph
