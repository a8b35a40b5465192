#pragma once
// A decoding session: owns the sequence cache, the step state and the
// recorded decode step of one sequence.
//
//   Session s(model, {.capacity = 4096});
//   s.prefill(prompt_ids);             // eager, chunked by max_write
//   int32_t t = s.sample();            // first new token from the prompt's logits
//   while (...) t = s.decode();        // feeds t, replays the recorded step
//
// or, with end-of-sequence and stop-string handling done for you:
//
//   auto r = s.generate(prompt_ids, &tokenizer, {.max_tokens = 64, .stop = {"\n\n"}},
//                       [](int32_t id, std::string_view text) { fputs(...); });
//
// Compiled (default): the T=1 step (forward, advance position, sample) is
// recorded once and replayed for every token; the position and the token id
// live in device memory and are advanced inside the step. Eager runs the same
// ops unrecorded, and gives bitwise-identical logits and tokens.
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvgraph/cache/sequence_cache.h"
#include "kvgraph/model.h"
#include "kvgraph/ops.h"
#include "kvgraph/tokenizer.h"

namespace kvgraph {

class Proposer;  // kvgraph/speculative.h

struct SessionOptions {
  int32_t capacity = 4096;   // longest sequence (prompt + generated tokens)
  int32_t max_write = 64;    // prefill chunk = largest step; ring pools hold window + max_write - 1
  KvStorage kv_storage = DType::F32;  // K and V formats (kv_format.h): f32, bf16, f16, int8, int4, fp8
  bool eager = false;        // decode without recording (debugging, parity)
  bool all_logits = false;   // keep logits of every prefill position (scoring)
  Tuning tuning;             // kernel launch choices (CUDA); results agree up to rounding
};

// What one generate() call may do.
struct GenerateOptions {
  int32_t max_tokens = 64;        // most new tokens (>= 1)
  // End once the text contains one of these (needs a tokenizer). The stop
  // string and anything after it are not part of the text, streamed or
  // returned; `tokens` ends with the token that completed it.
  std::vector<std::string> stop;
  bool ignore_eos = false;        // ban the end tokens from sampling instead of ending on them
  std::vector<int32_t> extra_eos; // more end tokens, e.g. a chat format's end-of-turn token
  bool skip_special_tokens = true;  // in the text
  // Polled after each token (e.g. set by a SIGINT handler): once true, generation
  // ends with FinishReason::cancelled. Null: never cancelled.
  const std::atomic<bool>* cancel = nullptr;
  // The prompt is the whole sequence: keep the longest common prefix with
  // what the session holds and prefill only the rest (Session::prefill_reusing).
  // Off: the prompt is appended after whatever the cache holds.
  bool reuse_prefix = false;
  // Speculative decoding (kvgraph/speculative.h): each step takes up to
  // draft_tokens proposals from `proposer` and verifies them in one step of
  // the model. Greedy output (temperature 0) is token for token that of
  // plain decoding; sampled output has the same distribution (on CUDA with
  // int8/int4 weights only under Tuning::quantized_int8_x = false, as
  // `kvgraph generate` sets for speculative runs: verify steps take x in
  // f32; else generate() throws). Null: plain.
  Proposer* proposer = nullptr;
  int draft_tokens = 4;  // K, 1 <= K < min(max_write, kMaxVerifyTokens)
};

// What speculative decoding did in one generate() call.
struct SpeculativeStats {
  int64_t steps = 0;        // verify steps
  int64_t proposed = 0;     // proposals verified
  int64_t accepted = 0;     // proposals kept
  int64_t plain_steps = 0;  // decode steps taken without proposals (none found, or no room)
  double acceptance() const { return proposed ? double(accepted) / double(proposed) : 0.0; }
};

// Why generate() returned.
enum class FinishReason {
  eos,         // sampled an end token (not part of `tokens`)
  stop,        // the text reached a stop string
  max_tokens,  // generated max_tokens tokens
  length,      // the cache is full: one more token would not fit
  cancelled,   // GenerateOptions::cancel became true
};
const char* finish_reason_name(FinishReason r);  // "eos", "stop", "max_tokens", "length", "cancelled"

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated ids: no end token; on `stop`, up to the one completing the stop string
  std::string text;             // their text, cut before a stop string; empty without a tokenizer
  FinishReason finish = FinishReason::max_tokens;
  // The last sampled token, which is not in the cache yet (the end token on
  // `eos`): prefill it first to continue the same sequence.
  int32_t last = -1;
  double prefill_seconds = 0;   // prefill and the first sample
  double decode_seconds = 0;    // everything after
  int32_t reused = 0;           // prompt tokens kept from the session (reuse_prefix)
  SpeculativeStats speculative; // with GenerateOptions::proposer
};

// Called after each generated token with its id and the text that became
// final with it: often "" (bytes of a split character, or text that may be
// the start of a stop string, are held back). Held text is delivered once
// more at the end with id -1. The pieces concatenate to GenerateResult::text.
using TokenFn = std::function<void(int32_t id, std::string_view text)>;

// The cache capacity a request needs: prompt + max_tokens positions, capped
// at the model's max_position_embeddings (when the config states one) and
// at INT32_MAX. Counted in 64 bits, so huge requests cannot wrap.
int32_t request_capacity(const ModelConfig& config, int64_t prompt_tokens, int64_t max_tokens);

class Session {
 public:
  // The most tokens one verify step feeds (the pending token and up to
  // kMaxVerifyTokens - 1 proposals).
  static constexpr int kMaxVerifyTokens = 8;

  Session(std::shared_ptr<const Model> model, SessionOptions options);

  // Appends ids to the sequence (eager, chunked by max_write). With
  // `on_chunk`, it is called after each chunk with the chunk's first
  // position, its length and its logits f32 [n, V] (all_logits sessions).
  using ChunkFn = std::function<void(int32_t position, int32_t n, const std::vector<float>& logits)>;
  void prefill(std::span<const int32_t> ids, const ChunkFn& on_chunk = {});

  // Samples the next token from the last logits (after prefill) and makes it
  // the token the next decode() feeds.
  int32_t sample();
  // Feeds the pending token at the current position and returns the next
  // one. Throws, before anything is written, when the cache is full.
  int32_t decode();
  // n decode steps queued back to back: the host does not wait between them
  // (each token is copied out as its step finishes), so the GPU never idles
  // on the host round trip. Returns the n tokens. For callers that need no
  // token before the next step is queued (benchmarks, fixed-length runs);
  // it does not stop at EOS. Checks that all n fit before anything runs.
  std::vector<int32_t> decode_many(int n);

  // Prefills `prompt` (after whatever the cache holds), then samples with
  // sampling() until an end token, a stop string, max_tokens or a full cache
  // (see FinishReason). The end tokens are the model config's, the
  // tokenizer's eos and options.extra_eos; with ignore_eos they are banned
  // (set_banned_tokens) and never sampled. `tokenizer` may be null: ids only,
  // no text, and no stop strings. A full cache is a finish, not an error.
  GenerateResult generate(std::span<const int32_t> prompt, const Tokenizer* tokenizer,
                          const GenerateOptions& options, const TokenFn& on_token = {});

  void reset();

  // For benchmarks of decode at long context: takes `ids` as the sequence
  // held without running the model (an empty session only). Positions
  // [0, ids.size()) keep whatever rows the pools hold (zeros in a fresh
  // session) and the last id is the pending token, so decode() reads as many
  // K/V bytes as after a real prefill, at none of its cost (minutes at 128K
  // tokens); the tokens it produces mean nothing.
  void assume_filled(std::span<const int32_t> ids);

  // ---- Lifecycle: rollback, fork, save/restore, prefix reuse ----

  // The ids in the cache, positions [0, position()).
  const std::vector<int32_t>& tokens() const { return tokens_; }
  // The token the next decode() feeds (sampled, not yet in the cache).
  std::optional<int32_t> pending() const;
  // Makes `id` the token the next decode() feeds, e.g. the corrected token
  // after a speculative step; the repetition-penalty mask follows.
  void set_pending(int32_t id);

  struct TrimResult {
    int32_t removed = 0;      // tokens dropped from the end
    int32_t reprefilled = 0;  // tokens prefilled again (0: rolled back in place)
  };
  // Keeps the first n tokens (0 <= n <= position()); the step state rolls
  // back with the cache: the position is n, the pending token is the one
  // that was at position n (or the pending one if n == position()), the
  // repetition-penalty mask is that of the kept tokens. last_logits() and
  // sample() are unavailable until the next step when n < position().
  // Flat layers roll back any number of tokens; ring layers while they hold
  // the rows a query at n needs (up to max_write tokens back from the
  // furthest length written, after any number of wraps; see
  // SequenceCache::trim). Beyond that the kept ids are prefilled again from
  // position 0: a window alone cannot be rebuilt exactly, because the rows of
  // a ring layer depend, through the layers below it, on positions the ring
  // already evicted. The result equals a session that prefilled the kept ids.
  TrimResult trim(int32_t n);
  // Whether trim(n) rolls back in place (no re-prefill).
  bool can_roll_back(int32_t n) const { return cache_.can_trim(n); }

  // An independent deep copy: cache rows, step state, sampler settings,
  // banned ids, last logits. The copy records its own decode step. Device to
  // device copies only (no host round trip).
  std::unique_ptr<Session> fork();

  // Writes the session (token ids, position, pending token, last logits, the
  // cache rows) to `path`, atomically: a temporary file in the same folder,
  // then rename. The file is versioned and checksummed and names the model
  // (a fingerprint over its config and tensor metadata) and every layer's
  // policy and K and V storage formats.
  void save(const std::filesystem::path& path);
  // Replaces this session's state by the one saved in `path`. A file of
  // another model, storage format or cache layout, of an unknown version, or
  // truncated or corrupted anywhere, is refused with one clear error
  // ("[session_file] ...") and the session is left untouched. A flat layer
  // may be restored into a session of another capacity if the tokens fit.
  void restore(const std::filesystem::path& path);
  // The model's fingerprint as written in saved files.
  uint64_t model_fingerprint() const;

  struct PrefixReuse {
    int32_t reused = 0;       // tokens kept from the session
    int32_t prefilled = 0;    // tokens of the prompt prefilled
    int32_t reprefilled = 0;  // kept tokens prefilled again (a ring could not roll back)
  };
  // Makes the session hold exactly `prompt` (with its last logits ready for
  // sample()): keeps the longest common prefix with tokens(), rounded down
  // to a multiple of max_write, and prefills the rest. Rounding keeps the
  // prefill chunks those of a prefill from 0, so the logits are bitwise
  // those of a fresh session on any deterministic backend. At least the last
  // prompt token is prefilled again (its logits are needed).
  PrefixReuse prefill_reusing(std::span<const int32_t> prompt);

  // ---- Speculative decoding (kvgraph/speculative.h drives these) ----

  // One recorded step of T = 1 + proposals.size() tokens (at most
  // kMaxVerifyTokens and max_write): feeds the pending token at position()
  // and proposals[i] at position() + 1 + i, and after each of the T tokens
  // samples the next one with sampling(), exactly as T decode() steps fed
  // those tokens would (the same logits, bit for bit: every op of a step of
  // up to kMaxVerifyTokens computes each token's row as a one-token step
  // does; the RNG counter is the position; the repetition-penalty mask is
  // that of the tokens before). Returns the T sampled tokens. Afterwards the
  // session is the one those T decode steps would leave: the proposals are
  // in the cache and the last sampled token is pending. Recorded once per T
  // (replayed like the decode step; eager sessions run it unrecorded).
  // Throws CacheFull, before anything is written, when T tokens do not fit.
  std::vector<int32_t> verify(std::span<const int32_t> proposals);
  // f32 [T, V]: the logits of every row of the last verify() (row i: what
  // sampled its token i).
  std::vector<float> verify_logits() const;
  // After verify(): keeps the first n proposals, drops the rest (a rollback
  // of T - 1 - n positions, ring layers included) and makes `next` the
  // pending token; last_logits() becomes verify row n. The state then equals
  // that of decode steps feeding the kept proposals, with `next` set by
  // set_pending(). accept(K, verify()[K]) changes nothing.
  void accept(int n, int32_t next);
  const std::vector<int32_t>& banned_tokens() const { return banned_ids_; }

  // Tests only: called at named points inside a step ("decode:after_step",
  // "verify:after_step", "prefill:after_chunk": after the step's kernels
  // wrote the cache; "decode:while_recording", "verify:while_recording": in
  // the middle of recording a step); throwing there simulates a device error.
  using FaultFn = std::function<void(std::string_view point)>;
  void set_fault_injection(FaultFn fn) { fault_ = std::move(fn); }

  int32_t position() const { return cache_.length(); }
  int32_t capacity() const { return cache_.capacity(); }
  const SequenceCache& cache() const { return cache_; }
  const Model& model() const { return *model_; }
  const SessionOptions& options() const { return opt_; }
  // The settings the next sample uses; checked by ops::validate when they are
  // next used (sample, decode, generate), which throws Error if out of range.
  ops::SamplingParams& sampling() { return sampling_; }
  const ops::SamplingParams& sampling() const { return sampling_; }
  void set_banned_tokens(const std::vector<int32_t>& ids);  // e.g. EOS for --ignore-eos
  std::vector<float> last_logits() const;  // f32 [V] of the last step
  int captures() const { return stream_.captures(); }
  size_t recorded_ops() const { return stream_.recorded_ops(); }

 private:
  void record_decode_step();
  CacheStep submit_decode_step();
  CacheStep submit_verify_step(int T);
  int32_t read_token();
  [[noreturn]] void fail_non_finite(int64_t position) const;
  void run_prefill(std::span<const int32_t> ids, const ChunkFn& on_chunk);
  void upload_seen();  // seen_ = tokens_ + the pending token
  void set_step_state(int32_t position, std::optional<int32_t> pending);
  void fault(std::string_view point) const {
    if (fault_) fault_(point);
  }

  std::shared_ptr<const Model> model_;
  SessionOptions opt_;
  Stream stream_;
  SequenceCache cache_;
  Workspace ws_;
  // Step state (device): ids i32 [max_write] (row 0 = the token decode feeds),
  // pos i32 [1] (position of ids[0]).
  Tensor ids_, pos_;
  Tensor banned_;  // i32 [64]
  int n_banned_ = 0;
  std::vector<int32_t> banned_ids_;  // host copy of banned_[0, n_banned_)
  Tensor seen_;    // u8 [V]
  ops::SamplingParams sampling_;
  Tensor sampling_config_;  // u8 [sizeof(SamplingParams)]: sampling_ as the ops read it
  ops::SamplingParams uploaded_{-1.0f};  // last value copied into sampling_config_
  void upload_sampling();
  CacheStep decode_step_;  // the recorded step's cache step
  bool have_logits_ = false;
  bool have_pending_ = false;
  std::vector<int32_t> tokens_;  // host: ids at positions [0, position())
  int32_t pending_ = -1;         // host mirror of ids_[0] while have_pending_
  SequenceCache::RingSnapshot ring_snapshot_;  // prefill rollback of wrapped rings
  // Verify steps (speculative decoding), allocated by the first verify():
  Workspace vws_;           // activations for kMaxVerifyTokens tokens, every row's logits
  Tensor vout_;             // i32 [kMaxVerifyTokens]: the token sampled after each row
  Tensor vseen_;            // u8 [V]: the step's working copy of seen_ (marked row by row)
  Tensor seen_saved_;       // u8 [V]: seen_ before the last verify (accept() rolls back to it)
  CacheStep verify_steps_[kMaxVerifyTokens + 1];  // recorded steps' cache steps, by T
  int verify_T_ = 0;        // T of the last verify() while accept() may follow (0: none)
  int32_t verify_base_ = 0; // position of its first token
  mutable std::optional<uint64_t> fingerprint_;
  FaultFn fault_;
};

}  // namespace kvgraph
