#include "kvgraph/stream.h"

#include <algorithm>

#include "kvgraph/error.h"
#include "ops/backend.h"

namespace kvgraph {

Stream::Stream(Device device, Tuning tuning)
    : device_(device),
      tuning_(tuning),
      backend_(device == Device::CPU ? make_cpu_stream_backend() : cuda_device::make_stream_backend(tuning)) {}

Stream::~Stream() = default;

void Stream::set_tuning(const Tuning& t) {
  if (recording_) fail("stream", "set_tuning while recording");
  if (t == tuning_) return;
  discard_recording();
  tuning_ = t;
  backend_->set_tuning(t);
}

void Stream::submit(std::function<void()> fn) { backend_->submit(std::move(fn), recording_); }

void Stream::begin_record(int slot) {
  if (recording_) fail("stream", "begin_record while already recording");
  if (slot < 0) fail("stream", "negative recording slot {}", slot);
  backend_->discard_recording(slot);
  backend_->begin_record(slot);
  recording_ = true;
}

void Stream::end_record() {
  if (!recording_) fail("stream", "end_record without begin_record");
  recording_ = false;
  ++captures_;
  backend_->end_record();
}

bool Stream::has_recording(int slot) const { return backend_->has_recording(slot); }
// Also ends a recording an exception interrupted (the backend leaves capture
// mode), so the stream takes eager work and new recordings again.
void Stream::discard_recording() {
  recording_ = false;
  backend_->discard_recording(-1);
}
size_t Stream::recorded_ops(int slot) const { return backend_->recorded_ops(slot); }

void Stream::replay(int slot) {
  if (!has_recording(slot)) fail("stream", "replay without a recorded step (slot {})", slot);
  backend_->replay(slot);
}

void Stream::reserve_reads(int n) {
  if (n <= read_cap_) return;
  synchronize();  // queued reads may still target the old slots
  backend_->reserve_reads(n);
  read_cap_ = n;
}

void Stream::queue_read_i32(const Tensor& t, int slot) {
  if (t.dtype() != DType::I32 || t.numel() < 1) fail("stream", "reading a token needs a non-empty i32 tensor");
  if (t.device() != device_) fail("stream", "reading a token: tensor is on another device");
  if (slot < 0) fail("stream", "negative read slot");
  if (slot >= read_cap_) reserve_reads(std::max(slot + 1, 2 * read_cap_));
  backend_->queue_read_i32(t.data<int32_t>(), slot);
}

std::vector<int32_t> Stream::collect_i32(int n) {
  if (n < 0 || n > read_cap_) fail("stream", "collect_i32({}): only {} slots", n, read_cap_);
  synchronize();
  const int32_t* s = backend_->slots();
  return std::vector<int32_t>(s, s + n);
}

int32_t Stream::read_i32(const Tensor& t) {
  queue_read_i32(t, 0);
  return collect_i32(1)[0];
}

void Stream::synchronize() { backend_->synchronize(); }

}  // namespace kvgraph
