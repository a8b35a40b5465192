#include "kvgraph/session.h"

#include <algorithm>
#include <cmath>
#include <chrono>
#include <climits>
#include <deque>
#include <optional>

#include "kvgraph/error.h"
#include "kvgraph/speculative.h"

namespace kvgraph {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::eos: return "eos";
    case FinishReason::stop: return "stop";
    case FinishReason::max_tokens: return "max_tokens";
    case FinishReason::length: return "length";
    case FinishReason::cancelled: return "cancelled";
  }
  return "?";
}

int32_t request_capacity(const ModelConfig& config, int64_t prompt_tokens, int64_t max_tokens) {
  int64_t n = std::max<int64_t>(prompt_tokens, 0) + std::max<int64_t>(max_tokens, 0);
  if (config.max_position_embeddings > 0) n = std::min<int64_t>(n, config.max_position_embeddings);
  return static_cast<int32_t>(std::clamp<int64_t>(n, 1, INT32_MAX));
}

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
  ops::validate(sampling_);  // before the settings reach a step; NaN never compares equal, so lands here
  sampling_config_.copy_from_host(&sampling_);
  uploaded_ = sampling_;
}

void Session::set_banned_tokens(const std::vector<int32_t>& ids) {
  if (ids.size() > 64) fail("session", "at most 64 banned tokens, got {}", ids.size());
  if (ids == banned_ids_) return;  // keep the recording: generate() sets the same list every call
  banned_ids_ = ids;
  std::vector<int32_t> buf(64, -1);
  std::copy(ids.begin(), ids.end(), buf.begin());
  banned_.copy_from_host(buf.data());
  n_banned_ = static_cast<int>(ids.size());
  // n_banned is baked into a recorded step: record again with the new count.
  stream_.discard_recording();
}

void Session::prefill(std::span<const int32_t> ids, const ChunkFn& on_chunk) {
  if (ids.empty()) fail("session", "prefill with no tokens");
  verify_T_ = 0;
  const int32_t V = model_->config().vocab_size;
  for (int32_t id : ids)
    if (id < 0 || id >= V) fail("session", "token id {} out of range [0, {})", id, V);
  // Validate the whole prompt against the cache before writing anything.
  cache_.reserve(static_cast<int64_t>(ids.size()));
  // Transactional: a chunk that fails leaves the session as it was. Rows past
  // the kept length are harmless in flat layers; a ring overwrites rows the
  // rollback needs once the prefill writes more than it can roll back, so
  // its pools are copied first (window + max_write - 1 rows a layer).
  const int32_t L = cache_.length();
  const int64_t end = static_cast<int64_t>(L) + static_cast<int64_t>(ids.size());
  const bool snapshot = !cache_.can_trim(L, std::max<int64_t>(cache_.written(), end));
  if (snapshot) cache_.snapshot_rings(stream_, ring_snapshot_);
  const std::optional<int32_t> was_pending = pending();
  try {
    have_pending_ = false;
    run_prefill(ids, on_chunk);
  } catch (...) {
    stream_.synchronize();
    cache_.note_written(static_cast<int32_t>(std::min<int64_t>(end, INT32_MAX)));
    if (snapshot)
      cache_.restore_rings(stream_, ring_snapshot_);
    else
      cache_.trim(L);
    tokens_.resize(L);
    set_step_state(L, was_pending);
    have_logits_ = false;  // the logits buffer holds a later chunk's rows
    throw;
  }
}

// The chunk loop of prefill (ids already validated): appends to the cache,
// the token history and the seen mask.
void Session::run_prefill(std::span<const int32_t> ids, const ChunkFn& on_chunk) {
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
    fault("prefill:after_chunk");
    cache_.commit(step);
    tokens_.insert(tokens_.end(), chunk.begin(), chunk.end());
    if (on_chunk) {
      Tensor l = ws_.logits.slice_rows(0, opt_.all_logits ? T : 1);
      std::vector<float> rows = l.to_f32_vector();
      const int64_t V = model_->config().vocab_size;
      for (size_t i = 0; i < rows.size(); ++i)
        if (!std::isfinite(rows[i])) fail_non_finite(position + (opt_.all_logits ? int64_t(i / V) : T - 1));
      on_chunk(position, T, rows);
    }
    done += T;
  }
  have_logits_ = true;
}

// The sample op writes -1 when the logits were not finite: a broken model
// stops here, with the token the host reads anyway.
int32_t Session::read_token() {
  const int32_t t = stream_.read_i32(ids_);
  if (t < 0) fail_non_finite(cache_.length());
  return t;
}

void Session::fail_non_finite(int64_t position) const {
  fail("model", "non-finite logits at position {} (a NaN or infinite value in the weights or activations); "
       "the session must be reset",
       position);
}

int32_t Session::sample() {
  if (!have_logits_) fail("session", "sample() before prefill");
  if (opt_.all_logits) fail("session", "sample() is not available in an all_logits (scoring) session");
  Tensor row = ws_.logits.slice_rows(0, 1);
  Tensor tok = ids_.slice_rows(0, 1);
  upload_sampling();
  ops::sample(stream_, row, sampling_config_, banned_, n_banned_, seen_, pos_, tok);
  stream_.synchronize();
  have_pending_ = false;
  pending_ = read_token();  // throws on non-finite logits (nothing was marked seen)
  have_pending_ = true;
  return pending_;
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
    fault("decode:while_recording");
  } catch (...) {
    stream_.discard_recording();
    throw;
  }
  stream_.end_record();
}

int32_t Session::decode() {
  if (!have_pending_) fail("session", "decode() needs a pending token: call prefill() and sample() first");
  verify_T_ = 0;
  // The host mirror of the position guards the cache before anything runs.
  cache_.reserve(1);
  upload_sampling();
  const int32_t L = cache_.length();
  const int32_t fed = pending_;
  CacheStep step;
  int32_t token = -1;
  try {
    if (opt_.eager) {
      step = submit_decode_step();
    } else {
      if (!stream_.has_recording()) record_decode_step();
      stream_.replay();
      step = decode_step_;
    }
    token = read_token();  // waits for the step
    fault("decode:after_step");
  } catch (...) {
    // Transactional: the step may have written its row and advanced the step
    // state on the device; put the state back (the row is past the length).
    stream_.synchronize();
    cache_.note_written(L + 1);
    set_step_state(L, fed);
    have_logits_ = false;
    throw;
  }
  cache_.commit(step);
  tokens_.push_back(fed);
  pending_ = token;
  return token;
}

std::vector<int32_t> Session::decode_many(int n) {
  if (n < 1) fail("session", "decode_many needs n >= 1, got {}", n);
  if (!have_pending_) fail("session", "decode() needs a pending token: call prefill() and sample() first");
  verify_T_ = 0;
  cache_.reserve(n);
  if (opt_.eager) {
    std::vector<int32_t> out;
    for (int i = 0; i < n; ++i) out.push_back(decode());
    return out;
  }
  upload_sampling();
  const int32_t L = cache_.length();
  const int32_t fed = pending_;
  // n steps in a row may overwrite ring rows a rollback to L needs (as a
  // long prefill does): copy the ring pools first then.
  const bool snapshot = !cache_.can_trim(L, std::max(cache_.written(), L + n));
  if (snapshot) cache_.snapshot_rings(stream_, ring_snapshot_);
  std::vector<int32_t> tokens;
  try {
    if (!stream_.has_recording()) record_decode_step();
    stream_.reserve_reads(n);
    for (int i = 0; i < n; ++i) {
      stream_.replay();
      stream_.queue_read_i32(ids_, i);
    }
    tokens = stream_.collect_i32(n);
    for (int i = 0; i < n; ++i)
      if (tokens[i] < 0) fail_non_finite(int64_t(L) + i);
    fault("decode:after_step");
  } catch (...) {
    stream_.synchronize();
    if (snapshot)
      cache_.restore_rings(stream_, ring_snapshot_);
    else
      cache_.note_written(L + n);
    set_step_state(L, fed);
    have_logits_ = false;
    throw;
  }
  for (int i = 0; i < n; ++i) cache_.commit(decode_step_);
  tokens_.push_back(fed);
  tokens_.insert(tokens_.end(), tokens.begin(), tokens.end() - 1);
  pending_ = tokens.back();
  return tokens;
}

// ---- Speculative decoding: the verify step

// T tokens (ids[0] the pending one, ids[1..T) the proposals) in one step,
// then, row by row, what a decode step does after its forward: advance the
// position and sample, with the repetition-penalty mask of the tokens before
// that row (seen_ and proposals 1..i, in a working copy). Every op computes
// a token's row as a one-token step does (kvgraph::cpu::rows_product; on
// CUDA the multi-token GEMV and decode attention), so row i is bitwise the
// logits of a decode step feeding ids[i] at position pos + i.
CacheStep Session::submit_verify_step(int T) {
  ops::copy(stream_, seen_, seen_saved_);
  const CacheStep step = model_->forward(stream_, cache_, vws_, ids_, pos_, T, /*all_logits=*/true);
  for (int i = 0; i < T; ++i) {
    ops::advance(stream_, pos_, 1);
    ops::copy(stream_, seen_, vseen_);
    if (i > 0) ops::mark_seen(stream_, ids_.slice_rows(1, i), vseen_);
    Tensor row = vws_.logits.slice_rows(i, 1);
    Tensor tok = vout_.slice_rows(i, 1);
    ops::sample(stream_, row, sampling_config_, banned_, n_banned_, vseen_, pos_, tok);
  }
  return step;
}

std::vector<int32_t> Session::verify(std::span<const int32_t> proposals) {
  if (!have_pending_) fail("session", "verify() needs a pending token: call prefill() and sample() first");
  if (opt_.all_logits) fail("session", "verify() is not available in an all_logits (scoring) session");
  const int K = static_cast<int>(proposals.size()), T = K + 1;
  if (K < 1) fail("session", "verify() needs at least one proposal");
  const int max_T = std::min(kMaxVerifyTokens, opt_.max_write);
  if (T > max_T)
    fail("session", "verify of {} proposals: at most {} (a step of at most {} tokens: kMaxVerifyTokens {}, max_write {})",
         K, max_T - 1, max_T, kMaxVerifyTokens, opt_.max_write);
  const int32_t V = model_->config().vocab_size;
  for (int32_t id : proposals)
    if (id < 0 || id >= V) fail("session", "proposed token id {} out of range [0, {})", id, V);
  cache_.reserve(T);  // CacheFull before anything is written
  upload_sampling();
  if (vws_.max_T == 0) {
    const Device d = model_->device();
    vws_ = model_->make_workspace(kMaxVerifyTokens, /*all_logits=*/true);
    vout_ = Tensor::zeros({kMaxVerifyTokens}, DType::I32, d);
    vseen_ = Tensor::zeros({V}, DType::U8, d);
    seen_saved_ = Tensor::zeros({V}, DType::U8, d);
  }
  verify_T_ = 0;
  const int32_t L = cache_.length();
  const int32_t fed = pending_;
  std::vector<int32_t> out;
  CacheStep step;
  try {
    ids_.slice_rows(1, K).copy_from_host(proposals.data());
    if (opt_.eager) {
      step = submit_verify_step(T);
    } else {
      if (!stream_.has_recording(T)) {
        stream_.begin_record(T);
        try {
          verify_steps_[T] = submit_verify_step(T);
          fault("verify:while_recording");
        } catch (...) {
          stream_.discard_recording();
          throw;
        }
        stream_.end_record();
      }
      stream_.replay(T);
      step = verify_steps_[T];
    }
    stream_.reserve_reads(T);
    for (int i = 0; i < T; ++i) stream_.queue_read_i32(vout_.slice_rows(i, 1), i);
    out = stream_.collect_i32(T);
    for (int i = 0; i < T; ++i)
      if (out[i] < 0) fail_non_finite(int64_t(L) + i);
    fault("verify:after_step");
  } catch (...) {
    // Transactional, as decode(): T <= max_write rows past the length are
    // within what every ring can roll back.
    stream_.synchronize();
    cache_.note_written(L + T);
    set_step_state(L, fed);
    have_logits_ = false;
    throw;
  }
  cache_.commit(step);
  tokens_.push_back(fed);
  tokens_.insert(tokens_.end(), proposals.begin(), proposals.end());
  // What T decode steps would leave: the last sampled token pending (and
  // seen, with the proposals), its logits the last ones.
  pending_ = out[K];
  Tensor first = ids_.slice_rows(0, 1), last_row = ws_.logits.slice_rows(0, 1);
  ops::copy(stream_, vout_.slice_rows(K, 1), first);
  ops::mark_seen(stream_, ids_.slice_rows(0, T), seen_);
  ops::copy(stream_, vws_.logits.slice_rows(K, 1), last_row);
  stream_.synchronize();
  have_pending_ = have_logits_ = true;
  verify_T_ = T;
  verify_base_ = L;
  return out;
}

std::vector<float> Session::verify_logits() const {
  if (vws_.max_T == 0) fail("session", "verify_logits() before any verify()");
  return vws_.logits.to_f32_vector();
}

void Session::accept(int n, int32_t next) {
  if (verify_T_ == 0 || cache_.length() != verify_base_ + verify_T_)
    fail("session", "accept() must follow verify() directly");
  const int K = verify_T_ - 1;
  if (n < 0 || n > K) fail("session", "accept({}): the last verify() had {} proposals", n, K);
  const int32_t V = model_->config().vocab_size;
  if (next < 0 || next >= V) fail("session", "token id {} out of range [0, {})", next, V);
  if (n == K && next == pending_) {
    verify_T_ = 0;
    return;
  }
  const int32_t keep = verify_base_ + 1 + n;
  stream_.synchronize();
  cache_.trim(keep);  // T <= max_write: every ring still holds what position keep needs
  tokens_.resize(keep);
  pos_.copy_from_host(&keep);
  pending_ = next;
  ids_.slice_rows(0, 1).copy_from_host(&pending_);
  // seen = the tokens before the verify, the kept proposals (ids[1, n]) and next (ids[0]).
  ops::copy(stream_, seen_saved_, seen_);
  ops::mark_seen(stream_, ids_.slice_rows(0, n + 1), seen_);
  Tensor last_row = ws_.logits.slice_rows(0, 1);
  ops::copy(stream_, vws_.logits.slice_rows(n, 1), last_row);
  stream_.synchronize();
  have_pending_ = have_logits_ = true;
  verify_T_ = 0;
}

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Bytes at the end of `text` that may be the start of a stop string: they are
// held back from the stream until the next token settles it.
size_t stop_prefix_at_end(std::string_view text, const std::vector<std::string>& stops) {
  size_t held = 0;
  for (const auto& st : stops)
    for (size_t k = std::min(st.size() - 1, text.size()); k > held; --k)
      if (text.substr(text.size() - k) == std::string_view(st).substr(0, k)) {
        held = k;
        break;
      }
  return held;
}

// Where the first stop string in `text` starts, or npos. Text before
// `before` held none, so a match must end after it.
size_t find_stop(const std::string& text, size_t before, const std::vector<std::string>& stops, size_t longest_stop) {
  const size_t from = before >= longest_stop ? before - longest_stop + 1 : 0;
  size_t cut = std::string::npos;
  for (const auto& st : stops) cut = std::min(cut, text.find(st, from));
  return cut;
}

}  // namespace

GenerateResult Session::generate(std::span<const int32_t> prompt, const Tokenizer* tokenizer,
                                 const GenerateOptions& options, const TokenFn& on_token) {
  if (options.max_tokens < 1) fail("session", "generate: max_tokens must be at least 1, got {}", options.max_tokens);
  ops::validate(sampling_);  // before the prompt is written, so a bad setting leaves the cache as it was
  std::vector<std::string> stops;
  size_t longest_stop = 0;
  for (const auto& st : options.stop)
    if (!st.empty()) {
      stops.push_back(st);
      longest_stop = std::max(longest_stop, st.size());
    }
  if (!stops.empty() && !tokenizer) fail("session", "generate: stop strings need a tokenizer");
  if (options.proposer) {
    const int max_k = std::min(kMaxVerifyTokens, opt_.max_write) - 1;
    if (options.draft_tokens < 1 || options.draft_tokens > max_k)
      fail("session", "generate: draft_tokens must be in [1, {}] (a verify step of at most {} tokens: "
           "kMaxVerifyTokens {}, max_write {}), got {}", max_k, max_k + 1, kMaxVerifyTokens, opt_.max_write,
           options.draft_tokens);
    // Verify steps take x in f32 on quantized weights; one-token steps under
    // qx=int8 do not, and greedy output would no longer be plain decoding's.
    if (model_->device() == Device::CUDA && model_->quantization().quantized() && opt_.tuning.quantized_int8_x)
      fail("session", "generate: speculative decoding over int8/int4 weights on CUDA needs "
           "Tuning::quantized_int8_x = false (--tune qx=f32): verify steps take x in f32");
  }

  std::vector<int32_t> eos(model_->config().eos_token_ids.begin(), model_->config().eos_token_ids.end());
  if (tokenizer && tokenizer->eos_id()) eos.push_back(*tokenizer->eos_id());
  eos.insert(eos.end(), options.extra_eos.begin(), options.extra_eos.end());
  std::sort(eos.begin(), eos.end());
  eos.erase(std::unique(eos.begin(), eos.end()), eos.end());
  if (options.ignore_eos) set_banned_tokens(eos);
  const bool end_on_eos = !options.ignore_eos;

  GenerateResult r;
  auto t0 = std::chrono::steady_clock::now();
  if (options.reuse_prefix)
    r.reused = prefill_reusing(prompt).reused;
  else
    prefill(prompt);
  int32_t t = sample();
  r.prefill_seconds = seconds_since(t0);
  auto t1 = std::chrono::steady_clock::now();

  std::optional<StreamDecoder> sd;
  if (tokenizer) sd.emplace(*tokenizer, options.skip_special_tokens);
  size_t emitted = 0;  // bytes of r.text already given to on_token
  // Tokens a speculative step already put in the session after t (the last
  // of them pending); handed out one at a time, so every end condition is
  // checked per token exactly as in plain decoding.
  std::deque<int32_t> ahead;
  while (true) {
    r.last = t;
    if (end_on_eos && std::binary_search(eos.begin(), eos.end(), t)) {
      r.finish = FinishReason::eos;
      break;
    }
    r.tokens.push_back(t);
    bool stopped = false;
    if (sd) {
      const size_t before = r.text.size();
      r.text += sd->step(t);
      const size_t cut = find_stop(r.text, before, stops, longest_stop);
      if (cut != std::string::npos) {
        r.text.resize(cut);
        stopped = true;
      }
    }
    if (on_token) {
      const size_t ready = stopped ? r.text.size() : r.text.size() - stop_prefix_at_end(r.text, stops);
      on_token(t, std::string_view(r.text).substr(emitted, ready - emitted));
      emitted = ready;
    }
    if (stopped) {
      r.finish = FinishReason::stop;
      break;
    }
    if (static_cast<int64_t>(r.tokens.size()) >= options.max_tokens) {
      r.finish = FinishReason::max_tokens;
      break;
    }
    if (options.cancel && options.cancel->load(std::memory_order_relaxed)) {
      r.finish = FinishReason::cancelled;
      break;
    }
    if (ahead.empty()) {
      try {
        if (options.proposer) {
          // No more proposals than tokens still wanted after this step's own one.
          const int64_t wanted = int64_t(options.max_tokens) - int64_t(r.tokens.size());
          const int k = static_cast<int>(std::min<int64_t>(options.draft_tokens, wanted - 1));
          const std::vector<int32_t> b = speculative_step(*this, *options.proposer, k, r.speculative);
          ahead.assign(b.begin(), b.end());
        } else {
          ahead.push_back(decode());
        }
      } catch (const CacheFull&) {  // raised before anything was written: the cache limit is a stop
        r.finish = FinishReason::length;
        break;
      }
    }
    t = ahead.front();
    ahead.pop_front();
  }
  // Ended inside a speculative batch: roll back to where plain decoding
  // would have stopped (t pending, nothing after it in the cache).
  if (!ahead.empty()) trim(position() - static_cast<int32_t>(ahead.size()));
  if (sd && r.finish != FinishReason::stop) {
    // Bytes the decoder still held (an unfinished character, as U+FFFD) may
    // complete a stop string too: the same rule applies to them.
    const size_t before = r.text.size();
    r.text += sd->flush();
    const size_t cut = find_stop(r.text, before, stops, longest_stop);
    if (cut != std::string::npos) {
      r.text.resize(cut);
      r.finish = FinishReason::stop;
    }
  }
  if (on_token && emitted < r.text.size()) on_token(-1, std::string_view(r.text).substr(emitted));
  r.decode_seconds = seconds_since(t1);
  return r;
}

std::vector<float> Session::last_logits() const {
  return ws_.logits.slice_rows(0, 1).to_f32_vector();
}

void Session::reset() {
  verify_T_ = 0;
  cache_.reset();
  tokens_.clear();
  int32_t zero = 0;
  pos_.copy_from_host(&zero);
  std::vector<uint8_t> z(seen_.numel(), 0);
  seen_.copy_from_host(z.data());
  have_logits_ = have_pending_ = false;
}

std::optional<int32_t> Session::pending() const {
  if (!have_pending_) return std::nullopt;
  return pending_;
}

void Session::upload_seen() {
  std::vector<uint8_t> m(seen_.numel(), 0);
  for (int32_t t : tokens_) m[t] = 1;
  if (have_pending_) m[pending_] = 1;
  seen_.copy_from_host(m.data());
}

// Host -> device step state: pos = position, ids[0] = the pending token,
// seen = the kept tokens and the pending one.
void Session::set_step_state(int32_t position, std::optional<int32_t> pending) {
  verify_T_ = 0;
  pos_.copy_from_host(&position);
  have_pending_ = pending.has_value();
  if (pending) {
    pending_ = *pending;
    ids_.slice_rows(0, 1).copy_from_host(&pending_);
  }
  upload_seen();
}

void Session::assume_filled(std::span<const int32_t> ids) {
  if (stream_.recording()) fail("session", "assume_filled() while a step is being recorded");
  if (cache_.length() != 0) fail("session", "assume_filled() needs an empty session (reset() first)");
  if (ids.empty()) fail("session", "assume_filled() needs at least one id");
  const int32_t V = model_->config().vocab_size;
  for (int32_t id : ids)
    if (id < 0 || id >= V) fail("session", "token id {} out of range [0, {})", id, V);
  cache_.reserve(static_cast<int64_t>(ids.size()));
  stream_.synchronize();
  const int32_t n = static_cast<int32_t>(ids.size());
  cache_.set_extent(n, n);
  tokens_.assign(ids.begin(), ids.end());
  have_logits_ = false;
  set_step_state(n, ids.back());
}

void Session::set_pending(int32_t id) {
  const int32_t V = model_->config().vocab_size;
  if (id < 0 || id >= V) fail("session", "token id {} out of range [0, {})", id, V);
  stream_.synchronize();
  set_step_state(cache_.length(), id);
}

Session::TrimResult Session::trim(int32_t n) {
  const int32_t L = cache_.length();
  if (n < 0 || n > L) fail("session", "trim({}): must be within [0, {}] (the tokens held)", n, L);
  stream_.synchronize();
  TrimResult r{L - n, 0};
  const std::optional<int32_t> next = n < L ? std::optional<int32_t>(tokens_[n]) : pending();
  if (cache_.can_trim(n)) {
    cache_.trim(n);
    tokens_.resize(n);
  } else {
    // A ring evicted rows the kept tokens need: prefill them again from 0.
    std::vector<int32_t> kept(tokens_.begin(), tokens_.begin() + n);
    reset();
    try {
      run_prefill(kept, {});
    } catch (...) {
      reset();  // never a half-built cache: empty, and the error says why
      throw;
    }
    r.reprefilled = n;
  }
  if (n < L) have_logits_ = false;
  set_step_state(n, next);
  return r;
}

Session::PrefixReuse Session::prefill_reusing(std::span<const int32_t> prompt) {
  if (prompt.empty()) fail("session", "prefill with no tokens");
  const int32_t V = model_->config().vocab_size;
  for (int32_t id : prompt)
    if (id < 0 || id >= V) fail("session", "token id {} out of range [0, {})", id, V);
  if (static_cast<int64_t>(prompt.size()) > cache_.capacity())
    cache_.reserve(static_cast<int64_t>(prompt.size()) - cache_.length());  // the CacheFull message
  size_t common = 0;
  while (common < tokens_.size() && common < prompt.size() && tokens_[common] == prompt[common]) ++common;
  // At least one token to prefill (its logits), and whole chunks kept.
  int32_t keep = static_cast<int32_t>(std::min(common, prompt.size() - 1));
  keep -= keep % opt_.max_write;
  PrefixReuse r;
  if (keep > 0 && cache_.can_trim(keep)) {
    trim(keep);
    r.reused = keep;
  } else {
    reset();  // nothing to keep, or a ring evicted what the kept prefix needs
  }
  r.prefilled = static_cast<int32_t>(prompt.size()) - r.reused;
  prefill(prompt.subspan(r.reused));
  return r;
}

std::unique_ptr<Session> Session::fork() {
  if (stream_.recording()) fail("session", "fork() while a step is being recorded");
  stream_.synchronize();
  auto s = std::make_unique<Session>(model_, opt_);
  Stream& st = s->stream_;
  s->cache_.copy_from(st, cache_);
  ops::copy(st, ids_, s->ids_);
  ops::copy(st, pos_, s->pos_);
  ops::copy(st, banned_, s->banned_);
  ops::copy(st, seen_, s->seen_);
  ops::copy(st, ws_.logits, s->ws_.logits);
  st.synchronize();
  s->n_banned_ = n_banned_;
  s->banned_ids_ = banned_ids_;
  s->sampling_ = sampling_;  // uploaded by the copy's next step
  s->tokens_ = tokens_;
  s->pending_ = pending_;
  s->have_logits_ = have_logits_;
  s->have_pending_ = have_pending_;
  s->fault_ = fault_;
  return s;
}

}  // namespace kvgraph
