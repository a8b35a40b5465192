#pragma once
// The server's counters, rendered as Prometheus text (GET /metrics).
#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

namespace kvgraph::server {

// What one completion did, for the counters and the response's `timings`.
struct CompletionStats {
  int64_t prompt_tokens = 0;   // the whole prompt
  int64_t cached_tokens = 0;   // kept from the slot's cache (not prefilled)
  int64_t generated = 0;       // completion tokens
  double queue_seconds = 0;    // waiting for a slot
  double prefill_seconds = 0;  // prefill of the uncached part and the first sample
  double decode_seconds = 0;   // from the first token to the end (tokens after the first)
  double ttft_seconds = -1;    // request received -> first token sampled; < 0: none
  bool cancelled = false;      // the client went away (or the server stopped)
};

class Metrics {
 public:
  // One answered HTTP request. `route` is the matched endpoint ("other"
  // for anything else, so the label set stays bounded).
  void request(const std::string& route, int status);
  void completion(const CompletionStats& s);

  struct Gauges {
    int slots_total = 0, slots_busy = 0, waiting = 0;
    bool loaded = false;
  };
  std::string prometheus(const Gauges& g) const;

  // Time-to-first-token histogram buckets (seconds).
  static constexpr std::array<double, 12> kTtftBuckets = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                                          0.5,   1.0,  2.5,   5.0,  10.0, 30.0};

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  uint64_t completions_ = 0, cancelled_ = 0;
  uint64_t prompt_tokens_ = 0, cached_tokens_ = 0, generated_ = 0, decoded_ = 0;
  double prefill_seconds_ = 0, decode_seconds_ = 0;
  std::array<uint64_t, kTtftBuckets.size()> ttft_counts_{};
  uint64_t ttft_n_ = 0;
  double ttft_sum_ = 0;
};

}  // namespace kvgraph::server
