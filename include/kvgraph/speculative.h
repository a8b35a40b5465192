#pragma once
// Speculative decoding on top of rollback: a proposer guesses the next K
// tokens, the target model checks all of them in one recorded step of
// T = K + 1 tokens (Session::verify), keeps the longest acceptable prefix and
// rolls the rest back (Session::accept; ring layers included, since
// T <= max_write).
//
//   PromptLookup lookup(/*max_ngram=*/3);
//   GenerateOptions go{.max_tokens = 256};
//   go.proposer = &lookup;
//   go.draft_tokens = 4;
//   auto r = session.generate(prompt, &tokenizer, go);   // r.speculative: proposed, accepted
//
// What is guaranteed:
//   - Greedy (temperature 0): the tokens, the finish reason and the session
//     left behind are exactly those of plain decoding. The verify step's row
//     i is bitwise the logits a decode step feeding that token computes (see
//     Session::verify), and a proposal is kept only while it equals the
//     target's arg-max. On CUDA this holds for the default kernels; with
//     --tune attn=legacy or qx=int8 the verify rows are those of other
//     kernels and agree only up to rounding.
//   - Sampled: the standard speculative sampling rule (Leviathan et al. 2023,
//     Chen et al. 2023): proposal x, drawn from q, is kept with probability
//     min(1, p(x) / q(x)); on the first rejection the token is drawn from
//     max(0, p - q) renormalised; after K acceptances one more from p. p is
//     the distribution the session's sampler draws from (repetition penalty,
//     bans, temperature, top-k, top-p, as ops::sampling_candidates computes
//     it), so each token has exactly plain sampling's distribution; the
//     tokens themselves differ from a plain run with the same seed. A
//     deterministic proposer (prompt lookup) is q = a point mass: x kept with
//     probability p(x), else drawn from p without x. The draws use the
//     counter RNG of the seed and the position (reproducible with --seed).
//     On CUDA the plain sampler sums probability masses in fixed point, the
//     rule in f32: they agree up to that rounding.
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "kvgraph/model.h"
#include "kvgraph/session.h"

namespace kvgraph {

// Guesses the tokens that follow the target session's sequence.
class Proposer {
 public:
  virtual ~Proposer() = default;
  struct Proposal {
    std::vector<int32_t> tokens;  // at most k ids
    // The distribution each token was drawn from, f32 [V] each (q, for the
    // sampled acceptance rule); empty when the tokens were chosen
    // deterministically (prompt lookup, a greedy draft).
    std::vector<std::vector<float>> q;
  };
  // Up to k tokens to follow target.tokens() and its pending token, given
  // the target's sampling settings and banned ids. May return none.
  virtual Proposal propose(const Session& target, int k) = 0;
  virtual const char* name() const = 0;
};

// Prompt lookup (transformers' prompt_lookup_num_tokens, after
// apoorvumang/prompt-lookup-decoding): the last n tokens of the sequence
// (the pending one included), for n from max_ngram down to 1, are looked for
// earlier in the sequence; the first (earliest) occurrence followed by at
// least one token proposes the k tokens after it (fewer at the end of the
// sequence). No model, no distribution: q is a point mass.
class PromptLookup final : public Proposer {
 public:
  explicit PromptLookup(int max_ngram);
  Proposal propose(const Session& target, int k) override;
  const char* name() const override { return "prompt lookup"; }
  // The rule itself, on a sequence.
  static std::vector<int32_t> lookup(std::span<const int32_t> sequence, int max_ngram, int k);

 private:
  int max_ngram_;
};

// A draft model with the target's vocabulary: its own session, kept in step
// with the target's sequence (prefix reuse and rollback), runs k decode
// steps with the target's sampling settings (seed mixed, so its draws are
// independent of the target's) and proposes what it sampled.
class DraftModel final : public Proposer {
 public:
  // `options` size the draft's session (capacity at least the target's).
  // The draft's vocabulary must be the target's: checked at the first
  // propose() (vocab_size), and the CLI also compares the tokenizers.
  DraftModel(std::shared_ptr<const Model> model, SessionOptions options);
  Proposal propose(const Session& target, int k) override;
  const char* name() const override { return "draft model"; }
  Session& session();  // the draft's session (created by the first propose())

 private:
  void sync(std::span<const int32_t> context);
  std::shared_ptr<const Model> model_;
  SessionOptions options_;
  std::unique_ptr<Session> draft_;
};

// One speculative step on `target` (prefilled, with a pending token):
// proposals from `proposer` (at most k, and no more than the cache has room
// for), one verify step, acceptance by the rule above. Returns the new
// tokens in order: the kept proposals, then the target's own token after
// them, which is left pending. With no proposal (or room for none) it is one
// plain decode(). Throws CacheFull, before anything is written, when not even
// one token fits.
std::vector<int32_t> speculative_step(Session& target, Proposer& proposer, int k, SpeculativeStats& stats);

}  // namespace kvgraph
