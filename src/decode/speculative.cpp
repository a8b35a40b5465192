// Speculative decoding: proposers and the acceptance rules (see
// include/kvgraph/speculative.h for what is guaranteed).
#include "kvgraph/speculative.h"

#include <algorithm>
#include <cmath>

#include "kvgraph/error.h"
#include "kvgraph/scalar.h"

namespace kvgraph {

namespace {

// Independent counter-RNG streams derived from the sampling seed: the
// acceptance test, the draw after a rejection (or after K acceptances), and
// the draft model's own sampling.
constexpr uint64_t kAcceptStream = 0x243F6A8885A308D3ull;
constexpr uint64_t kResidualStream = 0x13198A2E03707344ull;
constexpr uint64_t kDraftStream = 0xA4093822299F31D0ull;

// The sequence so far: the cached tokens and the pending one.
std::vector<int32_t> context_of(const Session& s) {
  std::vector<int32_t> c = s.tokens();
  if (auto p = s.pending()) c.push_back(*p);
  return c;
}

// Probabilities over [0, V) of the session's sampler on `logits` [V], with
// the repetition-penalty mask `seen` (u8 [V]); throws on a non-finite logit.
std::vector<float> distribution(const float* logits, int V, const ops::SamplingParams& p,
                                const std::vector<int32_t>& banned, const std::vector<uint8_t>& seen,
                                int64_t position) {
  const ops::SampleCandidates c =
      ops::sampling_candidates(logits, V, p, banned.data(), static_cast<int>(banned.size()), seen.data());
  if (!c.finite)
    fail("model", "non-finite logits at position {} (a NaN or infinite value in the weights or activations); "
         "the session must be reset", position);
  std::vector<float> d(V, 0.0f);
  for (size_t i = 0; i < c.ids.size(); ++i) d[c.ids[i]] = c.weights[i] / c.sum;
  return d;
}

// A draw from the (unnormalised, non-negative) weights w with u in [0, 1):
// the first id, in id order, whose running weight passes u * total. -1 when
// the total is 0.
int32_t draw(const std::vector<float>& w, float u) {
  double total = 0;
  for (float x : w) total += x;
  if (!(total > 0)) return -1;
  const double target = double(u) * total;
  double c = 0;
  int32_t last = -1;
  for (size_t i = 0; i < w.size(); ++i) {
    if (w[i] <= 0) continue;
    c += w[i];
    last = static_cast<int32_t>(i);
    if (target < c) return last;
  }
  return last;
}

std::vector<uint8_t> seen_mask(std::span<const int32_t> context, int V) {
  std::vector<uint8_t> m(V, 0);
  for (int32_t t : context)
    if (t >= 0 && t < V) m[t] = 1;
  return m;
}

}  // namespace

// ---------------------------------------------------------------- prompt lookup

PromptLookup::PromptLookup(int max_ngram) : max_ngram_(max_ngram) {
  if (max_ngram < 1) fail("speculative", "prompt lookup n-gram size must be at least 1, got {}", max_ngram);
}

std::vector<int32_t> PromptLookup::lookup(std::span<const int32_t> seq, int max_ngram, int k) {
  const int64_t len = static_cast<int64_t>(seq.size());
  if (k < 1) return {};
  for (int64_t n = std::min<int64_t>(max_ngram, len - 1); n >= 1; --n) {
    const auto tail = seq.subspan(len - n);
    // Earliest occurrence first; the tail itself (start len - n) has nothing after it.
    for (int64_t start = 0; start + n < len; ++start) {
      if (!std::equal(tail.begin(), tail.end(), seq.begin() + start)) continue;
      const int64_t from = start + n, to = std::min<int64_t>(from + k, len);
      return std::vector<int32_t>(seq.begin() + from, seq.begin() + to);
    }
  }
  return {};
}

Proposer::Proposal PromptLookup::propose(const Session& target, int k) {
  Proposal p;
  p.tokens = lookup(context_of(target), max_ngram_, k);
  return p;
}

// ---------------------------------------------------------------- draft model

DraftModel::DraftModel(std::shared_ptr<const Model> model, SessionOptions options)
    : model_(std::move(model)), options_(options) {
  if (!model_) fail("speculative", "no draft model");
  options_.all_logits = false;
}

Session& DraftModel::session() {
  if (!draft_) draft_ = std::make_unique<Session>(model_, options_);
  return *draft_;
}

// Makes the draft hold context[0, n - 1) in its cache with context[n - 1]
// pending: keeps the common prefix (a rollback, or a re-prefill where a ring
// cannot roll back), prefills what is missing.
void DraftModel::sync(std::span<const int32_t> context) {
  Session& d = session();
  const size_t n = context.size();
  const auto& have = d.tokens();
  size_t common = 0;
  while (common < have.size() && common + 1 < n && have[common] == context[common]) ++common;
  if (common < have.size()) d.trim(static_cast<int32_t>(common));
  const size_t at = static_cast<size_t>(d.position());
  if (at + 1 < n) {
    if (at + 2 == n && d.pending() == context[at])
      d.decode();  // the one missing token is the pending one: a recorded step
    else
      d.prefill(context.subspan(at, n - 1 - at));
  }
  if (d.pending() != context[n - 1]) d.set_pending(context[n - 1]);
}

Proposer::Proposal DraftModel::propose(const Session& target, int k) {
  const int32_t V = target.model().config().vocab_size;
  if (model_->config().vocab_size != V)
    fail("speculative", "the draft model's vocabulary has {} ids, the target's {}: a draft must share the "
         "target's tokenizer and vocabulary", model_->config().vocab_size, V);
  Proposal p;
  const std::vector<int32_t> context = context_of(target);
  if (context.empty() || k < 1) return p;
  Session& d = session();
  k = std::min<int64_t>(k, int64_t(d.capacity()) - int64_t(context.size()) + 1);  // room for k decode steps
  if (k < 1) return p;
  sync(context);
  ops::SamplingParams sp = target.sampling();
  sp.seed ^= kDraftStream;
  d.sampling() = sp;
  d.set_banned_tokens(target.banned_tokens());
  const bool sampled = sp.temperature > 0.0f;
  std::vector<uint8_t> seen;
  if (sampled) seen = seen_mask(context, V);
  for (int i = 0; i < k; ++i) {
    const int32_t t = d.decode();
    p.tokens.push_back(t);
    if (sampled) {
      const std::vector<float> logits = d.last_logits();
      p.q.push_back(distribution(logits.data(), V, sp, target.banned_tokens(), seen, d.position()));
      seen[t] = 1;
    }
  }
  return p;
}

// ---------------------------------------------------------------- the step

std::vector<int32_t> speculative_step(Session& target, Proposer& proposer, int k, SpeculativeStats& stats) {
  const int64_t room = int64_t(target.capacity()) - target.position();  // tokens that still fit
  k = static_cast<int>(std::min<int64_t>({int64_t(k), room - 1, int64_t(Session::kMaxVerifyTokens - 1),
                                          int64_t(target.options().max_write) - 1}));
  Proposer::Proposal prop;
  if (k >= 1) prop = proposer.propose(target, k);
  if (prop.tokens.size() > size_t(std::max(k, 0))) prop.tokens.resize(std::max(k, 0));
  const int32_t V = target.model().config().vocab_size;
  // Ids the target cannot take end the proposal (a draft with a larger vocabulary).
  for (size_t i = 0; i < prop.tokens.size(); ++i)
    if (prop.tokens[i] < 0 || prop.tokens[i] >= V) {
      prop.tokens.resize(i);
      break;
    }
  if (prop.tokens.empty()) {
    ++stats.plain_steps;
    return {target.decode()};  // throws CacheFull when nothing fits
  }
  const int K = static_cast<int>(prop.tokens.size());
  const ops::SamplingParams sp = target.sampling();
  const bool sampled = sp.temperature > 0.0f;
  const bool point_mass = prop.q.empty();
  if (sampled && !point_mass && static_cast<int>(prop.q.size()) < K)
    fail("speculative", "the proposer gave {} tokens but {} distributions", K, prop.q.size());
  const int32_t L = target.position();  // the pending token's position
  std::vector<int32_t> context = context_of(target);
  const std::vector<int32_t> y = target.verify(prop.tokens);
  ++stats.steps;
  stats.proposed += K;

  int n = 0;  // proposals kept
  int32_t next = -1;
  if (!sampled) {
    // Greedy: keep while the target's arg-max is the proposal; its arg-max
    // after the last kept one is the next token.
    while (n < K && y[n] == prop.tokens[n]) ++n;
    next = y[n];
  } else {
    const std::vector<float> rows = target.verify_logits();  // [>= K + 1, V]
    std::vector<uint8_t> seen = seen_mask(context, V);
    for (; n <= K; ++n) {
      const int64_t position = int64_t(L) + n + 1;  // of the token being decided
      const std::vector<float> p =
          distribution(rows.data() + size_t(n) * V, V, sp, target.banned_tokens(), seen, position);
      if (n == K) {  // every proposal kept: one more token from p
        next = draw(p, uniform01(sp.seed ^ kResidualStream, static_cast<uint32_t>(position)));
        break;
      }
      const int32_t x = prop.tokens[n];
      const float px = p[x], qx = point_mass ? 1.0f : prop.q[n][x];
      const float u = uniform01(sp.seed ^ kAcceptStream, static_cast<uint32_t>(position));
      if (qx > 0.0f && u * qx < px) {  // u < p(x) / q(x): keep x
        seen[x] = 1;
        continue;
      }
      // Rejected: draw from max(0, p - q) (p without x for a point mass).
      std::vector<float> r = p;
      if (point_mass) {
        r[x] = 0.0f;
      } else {
        for (int32_t i = 0; i < V; ++i) r[i] = std::max(0.0f, p[i] - prop.q[n][i]);
      }
      next = draw(r, uniform01(sp.seed ^ kResidualStream, static_cast<uint32_t>(position)));
      if (next < 0) next = x;  // p <= q everywhere: only rounding rejected x
      break;
    }
  }
  target.accept(n, next);
  stats.accepted += n;
  std::vector<int32_t> out(prop.tokens.begin(), prop.tokens.begin() + n);
  out.push_back(next);
  return out;
}

}  // namespace kvgraph
