#include "kvgraph/session.h"

#include <algorithm>

#include "kvgraph/error.h"

namespace kvgraph {

Session::Session(std::shared_ptr<const Model> model, SessionOptions options)
    : model_(std::move(model)),
      opt_(options),
      stream_(model_->device(), options.tuning),
      cache_(model_->cache_config(options.capacity, std::min(options.max_write, options.capacity), options.kv_storage)) {
  opt_.max_write = std::min(opt_.max_write, cache_.max_write());
  ws_ = model_->make_workspace(opt_.max_write, opt_.all_logits);
  const Device d = model_->device();
  ids_ = Tensor::zeros({opt_.max_write}, DType::I32, d);
  pos_ = Tensor::zeros({1}, DType::I32, d);
  banned_ = Tensor::zeros({64}, DType::I32, d);
  seen_ = Tensor::zeros({model_->config().vocab_size}, DType::U8, d);
  sampling_config_ = Tensor::zeros({int64_t(sizeof(ops::SamplingParams))}, DType::U8, d);
}

// The settings live in a device buffer that the sample op reads when it
// runs; a change is one small copy, never a new recording.
void Session::upload_sampling() {
  const auto& a = sampling_;
  const auto& b = uploaded_;
  if (a.temperature == b.temperature && a.top_k == b.top_k && a.top_p == b.top_p &&
      a.repetition_penalty == b.repetition_penalty && a.seed == b.seed)
    return;
  sampling_config_.copy_from_host(&sampling_);
  uploaded_ = sampling_;
}

void Session::set_banned_tokens(const std::vector<int32_t>& ids) {
  if (ids.size() > 64) fail("session", "at most 64 banned tokens, got {}", ids.size());
  std::vector<int32_t> buf(64, -1);
  std::copy(ids.begin(), ids.end(), buf.begin());
  banned_.copy_from_host(buf.data());
  n_banned_ = static_cast<int>(ids.size());
  // n_banned is baked into a recorded step: record again with the new count.
  stream_.discard_recording();
}

void Session::prefill(std::span<const int32_t> ids, const ChunkFn& on_chunk) {
  if (ids.empty()) fail("session", "prefill with no tokens");
  const int32_t V = model_->config().vocab_size;
  for (int32_t id : ids)
    if (id < 0 || id >= V) fail("session", "token id {} out of range [0, {})", id, V);
  // Validate the whole prompt against the cache before writing anything.
  cache_.reserve(static_cast<int64_t>(ids.size()));
  have_pending_ = false;
  size_t done = 0;
  while (done < ids.size()) {
    const int32_t T = static_cast<int32_t>(std::min<size_t>(opt_.max_write, ids.size() - done));
    const int32_t position = cache_.length();
    // Host -> step state; the ops read them when they run.
    std::vector<int32_t> chunk(ids.begin() + done, ids.begin() + done + T);
    ids_.slice_rows(0, T).copy_from_host(chunk.data());
    pos_.copy_from_host(&position);
    Tensor chunk_ids = ids_.slice_rows(0, T);
    const CacheStep step = model_->forward(stream_, cache_, ws_, ids_, pos_, T, opt_.all_logits);
    ops::mark_seen(stream_, chunk_ids, seen_);
    ops::advance(stream_, pos_, T);
    stream_.synchronize();
    cache_.commit(step);
    if (on_chunk) {
      Tensor l = ws_.logits.slice_rows(0, opt_.all_logits ? T : 1);
      on_chunk(position, T, l.to_f32_vector());
    }
    done += T;
  }
  have_logits_ = true;
}

int32_t Session::read_token() { return stream_.read_i32(ids_); }

int32_t Session::sample() {
  if (!have_logits_) fail("session", "sample() before prefill");
  if (opt_.all_logits) fail("session", "sample() is not available in an all_logits (scoring) session");
  Tensor row = ws_.logits.slice_rows(0, 1);
  Tensor tok = ids_.slice_rows(0, 1);
  upload_sampling();
  ops::sample(stream_, row, sampling_config_, banned_, n_banned_, seen_, pos_, tok);
  stream_.synchronize();
  have_pending_ = true;
  return read_token();
}

// The T=1 step: forward the pending token at pos, advance pos, sample the
// next token into ids[0]. Everything per-token is read from ids_/pos_.
CacheStep Session::submit_decode_step() {
  Tensor tok = ids_.slice_rows(0, 1);
  Tensor row = ws_.logits.slice_rows(0, 1);
  const CacheStep step = model_->forward(stream_, cache_, ws_, tok, pos_, 1, false);
  ops::advance(stream_, pos_, 1);
  ops::sample(stream_, row, sampling_config_, banned_, n_banned_, seen_, pos_, tok);
  return step;
}

void Session::record_decode_step() {
  stream_.begin_record();
  try {
    decode_step_ = submit_decode_step();
  } catch (...) {
    stream_.discard_recording();
    throw;
  }
  stream_.end_record();
}

int32_t Session::decode() {
  if (!have_pending_) fail("session", "decode() needs a pending token: call prefill() and sample() first");
  // The host mirror of the position guards the cache before anything runs.
  cache_.reserve(1);
  upload_sampling();
  CacheStep step;
  if (opt_.eager) {
    step = submit_decode_step();
  } else {
    if (!stream_.has_recording()) record_decode_step();
    stream_.replay();
    step = decode_step_;
  }
  const int32_t token = read_token();  // waits for the step
  cache_.commit(step);
  return token;
}

std::vector<int32_t> Session::decode_many(int n) {
  if (n < 1) fail("session", "decode_many needs n >= 1, got {}", n);
  if (!have_pending_) fail("session", "decode() needs a pending token: call prefill() and sample() first");
  cache_.reserve(n);
  if (opt_.eager) {
    std::vector<int32_t> out;
    for (int i = 0; i < n; ++i) out.push_back(decode());
    return out;
  }
  upload_sampling();
  if (!stream_.has_recording()) record_decode_step();
  stream_.reserve_reads(n);
  for (int i = 0; i < n; ++i) {
    stream_.replay();
    stream_.queue_read_i32(ids_, i);
  }
  std::vector<int32_t> tokens = stream_.collect_i32(n);
  for (int i = 0; i < n; ++i) cache_.commit(decode_step_);
  return tokens;
}

std::vector<float> Session::last_logits() const {
  return ws_.logits.slice_rows(0, 1).to_f32_vector();
}

void Session::reset() {
  cache_.reset();
  int32_t zero = 0;
  pos_.copy_from_host(&zero);
  std::vector<uint8_t> z(seen_.numel(), 0);
  seen_.copy_from_host(z.data());
  have_logits_ = have_pending_ = false;
}

void Session::trim(int32_t n) {
  cache_.trim(n);
  pos_.copy_from_host(&n);
  have_logits_ = have_pending_ = false;
}

}  // namespace kvgraph
