#pragma once
// The seam between the device-independent core (Tensor, Stream) and the
// backends' runtimes. Tensor and Stream call only what is declared here;
// the CPU side lives in src/ops/cpu/, the CUDA side in src/ops/cuda/, and a
// build without CUDA links src/ops/no_cuda/ instead, whose functions say so
// in one error line. No file outside src/ops/ asks which backends exist.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "kvgraph/tensor.h"
#include "kvgraph/tuning.h"

namespace kvgraph {

// What a Stream does on its device. One per Stream; it also owns whatever
// the backend's ops keep per stream (CUDA: cuBLAS, split-KV and selection
// scratch that a recorded graph points into, so it lives as long as the
// stream).
class StreamBackend {
 public:
  virtual ~StreamBackend() = default;
  // A host closure: runs now, or is appended to the recording (CPU only).
  virtual void submit(std::function<void()> fn, bool recording) = 0;
  // Recordings live in slots (small integers >= 0); a slot may be empty.
  virtual void begin_record(int slot) = 0;
  virtual void end_record() = 0;
  virtual void replay(int slot) = 0;
  virtual bool has_recording(int slot) const = 0;
  virtual void discard_recording(int slot) = 0;      // -1: every slot
  virtual size_t recorded_ops(int slot) const = 0;  // CPU tape length; CUDA: graph nodes
  virtual void synchronize() = 0;
  // Token reads: queue a copy of src[0] into host slot `slot` (ordered after
  // the work queued so far); slots() is valid after synchronize().
  virtual void reserve_reads(int n) = 0;
  virtual void queue_read_i32(const int32_t* src, int slot) = 0;
  virtual const int32_t* slots() const = 0;
  virtual void set_tuning(const Tuning& t) = 0;
};

std::unique_ptr<StreamBackend> make_cpu_stream_backend();

// CUDA memory, copies and streams. In a build without CUDA, device_count()
// is 0 and everything else throws "[device] ... built without CUDA".
namespace cuda_device {
bool compiled();     // this build has the CUDA backend
int device_count();  // 0 when there is no device or no driver (never throws)
void* alloc(size_t bytes);
void free(void* p) noexcept;
// Synchronous copy in any direction; finished on the device before it
// returns (kernels launched with programmatic dependent launch do not wait
// for the legacy stream's pageable copies).
void copy(void* dst, const void* src, size_t bytes);
void zero(void* p, size_t bytes);  // synchronous
std::unique_ptr<StreamBackend> make_stream_backend(const Tuning& t);
double copy_bandwidth_gbs();  // (bytes read + written) / time of a large device copy
}  // namespace cuda_device

}  // namespace kvgraph
