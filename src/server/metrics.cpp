#include "server/metrics.h"

#include <fmt/format.h>

namespace kvgraph::server {

void Metrics::request(const std::string& route, int status) {
  std::lock_guard lk(mu_);
  ++requests_[{route, status}];
}

void Metrics::completion(const CompletionStats& s) {
  std::lock_guard lk(mu_);
  ++completions_;
  if (s.cancelled) ++cancelled_;
  prompt_tokens_ += s.prompt_tokens;
  cached_tokens_ += s.cached_tokens;
  generated_ += s.generated;
  if (s.generated > 1) {
    decoded_ += s.generated - 1;  // the first token comes out of the prompt step
    decode_seconds_ += s.decode_seconds;
  }
  prefill_seconds_ += s.prefill_seconds;
  if (s.ttft_seconds >= 0) {
    ++ttft_n_;
    ttft_sum_ += s.ttft_seconds;
    for (size_t i = 0; i < kTtftBuckets.size(); ++i)
      if (s.ttft_seconds <= kTtftBuckets[i]) ++ttft_counts_[i];
  }
}

std::string Metrics::prometheus(const Gauges& g) const {
  std::lock_guard lk(mu_);
  std::string out;
  auto metric = [&](const char* name, const char* type, const char* help) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  };
  // One unlabelled sample: its HELP and TYPE lines, then the value.
  auto scalar = [&](const char* name, const char* type, const char* help, const auto& value) {
    metric(name, type, help);
    out += fmt::format("{} {}\n", name, value);
  };
  auto seconds = [](double s) { return fmt::format("{:.6f}", s); };
  metric("kvgraph_requests_total", "counter", "HTTP requests answered, by endpoint and status.");
  for (const auto& [key, n] : requests_)
    out += fmt::format("kvgraph_requests_total{{endpoint=\"{}\",status=\"{}\"}} {}\n", key.first, key.second, n);
  scalar("kvgraph_completions_total", "counter", "Completions run (chat and text).", completions_);
  scalar("kvgraph_completions_cancelled_total", "counter", "Completions ended early because the client went away.",
         cancelled_);
  scalar("kvgraph_prompt_tokens_total", "counter", "Prompt tokens of completions.", prompt_tokens_);
  scalar("kvgraph_prompt_tokens_cached_total", "counter", "Prompt tokens reused from a slot's cache.", cached_tokens_);
  scalar("kvgraph_generated_tokens_total", "counter", "Completion tokens generated.", generated_);
  scalar("kvgraph_prefill_seconds_total", "counter", "Time spent prefilling prompts (and sampling the first token).",
         seconds(prefill_seconds_));
  scalar("kvgraph_decode_seconds_total", "counter", "Time spent decoding the tokens after each first one.",
         seconds(decode_seconds_));
  scalar("kvgraph_decode_tokens_per_second", "gauge",
         "Tokens decoded after each first one, per second of decoding, over all completions so far.",
         fmt::format("{:.3f}", decode_seconds_ > 0 ? double(decoded_) / decode_seconds_ : 0.0));
  metric("kvgraph_time_to_first_token_seconds", "histogram", "From the request's arrival to its first token.");
  for (size_t i = 0; i < kTtftBuckets.size(); ++i)
    out += fmt::format("kvgraph_time_to_first_token_seconds_bucket{{le=\"{}\"}} {}\n", kTtftBuckets[i],
                       ttft_counts_[i]);
  out += fmt::format("kvgraph_time_to_first_token_seconds_bucket{{le=\"+Inf\"}} {}\n", ttft_n_);
  out += fmt::format("kvgraph_time_to_first_token_seconds_sum {}\n", seconds(ttft_sum_));
  out += fmt::format("kvgraph_time_to_first_token_seconds_count {}\n", ttft_n_);
  scalar("kvgraph_slots_total", "gauge", "Slots (sessions with their own cache).", g.slots_total);
  scalar("kvgraph_slots_busy", "gauge", "Slots running a request.", g.slots_busy);
  scalar("kvgraph_requests_waiting", "gauge", "Requests waiting for a free slot.", g.waiting);
  scalar("kvgraph_model_loaded", "gauge", "1 once the model is loaded and the server answers completions.",
         g.loaded ? 1 : 0);
  return out;
}

}  // namespace kvgraph::server
