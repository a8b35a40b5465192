// kvgraph bench: prefill tok/s and batch-1 decode ms/token against the
// bandwidth floor (weight bytes + KV bytes read per token) / copy bandwidth
// measured in the same run.
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <optional>
#include <random>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/common.h"
#include "kvgraph/error.h"
#include "kvgraph/ops.h"

namespace kvgraph::cli {

namespace {

struct BenchFlags {
  ModelFlags m;
  std::vector<std::string> models;
  int prompt = 512;
  int new_tokens = 256;
  int verify_tokens = 0;  // T of a speculative verify step to time beside decode (0: none)
  bool json = false;
  bool no_prefill = false;  // decode after --prompt positions taken as filled (Session::assume_filled)
};

// KV bytes a decode step at context length L reads, over all layers: the
// rows as stored (quantized codes with their scales and biases).
double kv_bytes_read(const SequenceCache& c, int32_t L) {
  double b = 0;
  for (int l = 0; l < c.n_layers(); ++l) {
    const CachePolicy& p = c.policy(l);
    const int32_t rows = p.is_ring() ? std::min(L, p.window()) : L;
    b += double(c.bytes_per_token(l)) * rows;
  }
  return b;
}

// The host's last-level cache in bytes (0: unknown).
int64_t last_level_cache_bytes() {
  for (int name : {_SC_LEVEL4_CACHE_SIZE, _SC_LEVEL3_CACHE_SIZE, _SC_LEVEL2_CACHE_SIZE}) {
    const long v = sysconf(name);
    if (v > 0) return v;
  }
  return 0;
}

nlohmann::json bench_one(const BenchFlags& f, const std::string& name, double bw_gbs) {
  ModelFlags mf = f.m;
  mf.model = name;
  double load_s = 0;
  auto model = load_model(mf, &load_s);
  SessionOptions so;
  so.capacity = f.prompt + f.new_tokens + 1 + f.verify_tokens;
  so.max_write = mf.prefill_chunk();
  so.eager = mf.eager;
  so.tuning = mf.tuning();
  so.kv_storage = mf.kv_storage(model->device());
  Session s(model, so);
  s.sampling().temperature = 0.0f;
  std::mt19937 rng(123);
  std::vector<int32_t> ids(f.prompt);
  for (auto& i : ids) i = static_cast<int32_t>(rng() % std::min(model->config().vocab_size, 32000));

  // Warm-up: one prefill step of the measured chunk size (its GEMM and
  // attention kernels loaded, its scratch allocated: the first 512-token step
  // on the H200 took 24.5 ms of which 14.7 ms ran kernels) and a few decode
  // steps (the recording, caches and clocks).
  const size_t warm = std::min<size_t>(ids.size(), static_cast<size_t>(mf.prefill_chunk()));
  s.prefill(std::span<const int32_t>(ids.data(), warm));
  s.sample();
  for (int i = 0; i < std::min<int>(8, f.new_tokens); ++i) s.decode();  // fits: warm + new_tokens <= capacity - 1
  s.reset();

  auto t0 = std::chrono::steady_clock::now();
  if (f.no_prefill) {
    s.assume_filled(ids);
  } else {
    s.prefill(ids);
    s.sample();
  }
  const double prefill_s = seconds_since(t0);
  std::vector<double> ms;
  std::vector<int32_t> tokens;
  double kv_read = 0;
  for (int i = 0; i < f.new_tokens; ++i) {
    kv_read += kv_bytes_read(s.cache(), s.position() + 1);
    auto t = std::chrono::steady_clock::now();
    tokens.push_back(s.decode());
    ms.push_back(seconds_since(t) * 1e3);
  }
  // The same tokens again with every step queued back to back (decode_many):
  // the difference to the per-token time is the host round trip per token.
  s.reset();
  if (f.no_prefill) {
    s.assume_filled(ids);
  } else {
    s.prefill(ids);
    s.sample();
  }
  auto tq = std::chrono::steady_clock::now();
  const std::vector<int32_t> queued = s.decode_many(f.new_tokens);
  const double queued_ms = seconds_since(tq) * 1e3 / f.new_tokens;
  if (queued != tokens) fail("bench", "{}: queued decode gave other tokens than step-by-step decode", name);
  std::vector<double> sorted = ms;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[sorted.size() / 2];
  // A speculative verify step of T tokens (Session::verify: the recorded
  // step, the proposals' upload and the T tokens read back) at the same
  // context lengths, each followed by the rollback of every proposal
  // (accept(0, ...), timed apart): the cost of checking T - 1 proposals
  // against one decode step.
  double verify_ms = 0, verify_accept_ms = 0;
  if (f.verify_tokens > 0) {
    const int K = f.verify_tokens - 1;
    s.reset();
    s.prefill(ids);
    s.sample();
    std::vector<int32_t> props(K);
    for (int w = 0; w < 3; ++w) {  // records the step
      for (auto& p : props) p = static_cast<int32_t>(rng() % model->config().vocab_size);
      const auto y = s.verify(props);
      s.accept(0, y[0]);
    }
    std::vector<double> v, va;
    for (int i = 3; i < f.new_tokens; ++i) {
      for (auto& p : props) p = static_cast<int32_t>(rng() % model->config().vocab_size);
      auto t = std::chrono::steady_clock::now();
      const auto y = s.verify(props);
      v.push_back(seconds_since(t) * 1e3);
      s.accept(0, y[0]);
      va.push_back(seconds_since(t) * 1e3);
    }
    if (v.empty()) fail("bench", "--verify-tokens needs --new-tokens of at least 4");
    std::sort(v.begin(), v.end());
    std::sort(va.begin(), va.end());
    verify_ms = v[v.size() / 2];
    verify_accept_ms = va[va.size() / 2];
  }
  const double p99 = sorted[std::min(sorted.size() - 1, size_t(sorted.size() * 0.99))];
  double mean = 0;
  for (double x : ms) mean += x;
  mean /= ms.size();
  const double bytes = double(model->weight_bytes_read_per_token()) + kv_read / f.new_tokens;
  const double floor_ms = bytes / (bw_gbs * 1e9) * 1e3;
  nlohmann::json j;
  j["model"] = name;
  j["device"] = device_name(model->device());
  j["compiled"] = !mf.eager;
  j["prompt"] = f.prompt;
  j["new_tokens"] = f.new_tokens;
  j["weights"] = model->quantization().quantized()
                     ? fmt::format("int{} g{}", model->quantization().bits, model->quantization().group)
                 : mf.quantize().fp8 || model->fp8_checkpoint().quantized()
                     ? fmt::format("fp8 as {}", dtype_name(model->matrix_dtype()))
                     : std::string(dtype_name(model->matrix_dtype()));
  j["kv_dtype"] = kv_storage_name(so.kv_storage);
  j["weight_bytes"] = model->weight_bytes();
  j["weight_bytes_read_per_token"] = model->weight_bytes_read_per_token();
  j["kv_bytes_per_token_avg"] = kv_read / f.new_tokens;
  j["copy_bandwidth_gbs"] = bw_gbs;
  j["prefill_tok_s"] = f.no_prefill ? nlohmann::json() : nlohmann::json(f.prompt / prefill_s);
  // Time to first token: the whole prompt's prefill and the first sampled
  // token read back (what a user waits before the first word).
  j["ttft_ms"] = f.no_prefill ? nlohmann::json() : nlohmann::json(prefill_s * 1e3);
  j["chunk"] = mf.prefill_chunk();
  j["context_filled_without_prefill"] = f.no_prefill;
  j["decode_ms_median"] = median;
  j["decode_ms_p99"] = p99;
  j["decode_ms_mean"] = mean;
  j["floor_ms"] = floor_ms;
  // On the CPU a model that fits in the last-level cache is not read from
  // memory: the DRAM floor says nothing about it (it would print > 100%).
  const int64_t llc = model->device() == Device::CPU ? last_level_cache_bytes() : 0;
  const bool in_cache = llc > 0 && bytes <= double(llc);
  j["floor_applies"] = !in_cache;
  if (in_cache) j["floor_note"] = fmt::format("weights and KV ({:.1f} MB) fit in the {:.0f} MB last-level cache",
                                             bytes / 1e6, llc / 1e6);
  j["fraction_of_floor"] = in_cache ? nlohmann::json() : nlohmann::json(floor_ms / median);
  j["decode_ms_queued"] = queued_ms;
  j["fraction_of_floor_queued"] = in_cache ? nlohmann::json() : nlohmann::json(floor_ms / queued_ms);
  if (f.verify_tokens > 0) {
    j["verify_tokens"] = f.verify_tokens;
    j["verify_ms_median"] = verify_ms;
    j["verify_over_decode"] = verify_ms / median;
    j["verify_with_rollback_ms_median"] = verify_accept_ms;
  }
  j["captures"] = s.captures();
  j["tuning"] = so.tuning.describe();
  j["load_s"] = load_s;
  return j;
}

void run_bench(const BenchFlags& f) {
  f.m.check();
  check_at_least("--prompt", f.prompt, 1);
  check_at_least("--new-tokens", f.new_tokens, 1);
  if (f.verify_tokens != 0) {
    const int max_t = std::min(Session::kMaxVerifyTokens, f.m.prefill_chunk());
    if (f.verify_tokens < 2 || f.verify_tokens > max_t)
      usage_fail("--verify-tokens {}: expected 0 (off) or an integer in [2, {}] (at most {} tokens a step, within --chunk {})",
                 f.verify_tokens, max_t, Session::kMaxVerifyTokens, f.m.prefill_chunk());
    check_at_least("--new-tokens", f.new_tokens, 4, " (with --verify-tokens)");
  }
  // The cache holds both and one more; its capacity is an int32.
  if (int64_t(f.prompt) + f.new_tokens + 1 + f.verify_tokens > INT32_MAX)
    usage_fail("--prompt {} --new-tokens {}: together at most {}", f.prompt, f.new_tokens, INT32_MAX - 1);
  std::vector<std::string> models = f.models;
  if (models.empty()) models.push_back(f.m.model);
  const double bw = ops::measure_copy_bandwidth_gbs(parse_device(f.m.device));
  std::vector<nlohmann::json> rows;
  if (!f.json) {
    fmt::print("tuning: {}\n", f.m.tuning().describe());
    fmt::print("{:<28} {:>7} {:>10} {:>12} {:>10} {:>10} {:>10} {:>8} {:>10} {:>9}\n", "model", "device", "prefill",
               "decode ms", "p99 ms", "floor ms", "of floor", "GB/s", "queued ms", "of floor");
  }
  const bool so_kv_default = f.m.kv_dtype.empty() && f.m.k_dtype.empty() && f.m.v_dtype.empty();
  for (const auto& name : models) {
    auto j = bench_one(f, name, bw);
    if (f.json) {
      fmt::print("{}\n", j.dump());
    } else {
      auto pct = [&](const char* key) {
        return j[key].is_null() ? std::string("n/a") : fmt::format("{:.1f}%", 100 * j[key].get<double>());
      };
      fmt::print("{:<28} {:>7} {:>6.0f} t/s {:>12.3f} {:>10.3f} {:>10.3f} {:>10} {:>8.0f} {:>10.3f} {:>9}\n",
                 (j["model"].get<std::string>().empty() ? "default" : j["model"].get<std::string>()) +
                     (j["weights"].get<std::string>().rfind("int", 0) == 0 ? " " + j["weights"].get<std::string>() : "") +
                     (so_kv_default ? "" : " kv " + j["kv_dtype"].get<std::string>()),
                 j["device"].get<std::string>(), j["prefill_tok_s"].is_null() ? 0.0 : j["prefill_tok_s"].get<double>(),
                 j["decode_ms_median"].get<double>(),
                 j["decode_ms_p99"].get<double>(), j["floor_ms"].get<double>(), pct("fraction_of_floor"), bw,
                 j["decode_ms_queued"].get<double>(), pct("fraction_of_floor_queued"));
      if (!j["ttft_ms"].is_null())
        fmt::print("  time to first token: {:.1f} ms ({} prompt tokens, steps of {})\n", j["ttft_ms"].get<double>(),
                   j["prompt"].get<int>(), j["chunk"].get<int>());
      if (j.contains("floor_note")) fmt::print("  of floor n/a: {}\n", j["floor_note"].get<std::string>());
      if (j.contains("verify_tokens"))
        fmt::print("  verify step of {} tokens: {:.3f} ms = {:.2f}x a decode step ({:.3f} ms with the rollback of "
                   "every proposal)\n", j["verify_tokens"].get<int>(), j["verify_ms_median"].get<double>(),
                   j["verify_over_decode"].get<double>(), j["verify_with_rollback_ms_median"].get<double>());
    }
    fflush(stdout);
  }
}

}  // namespace

void add_bench(CLI::App& app) {
  auto f = std::make_shared<BenchFlags>();
  CLI::App* c = app.add_subcommand("bench", "Prefill and batch-1 decode speed against the bandwidth floor");
  c->footer(
      "Examples:\n"
      "  kvgraph bench --device cuda --models synthetic:llama3.2-1b,synthetic:llama3.1-8b\n"
      "  kvgraph bench --prompt 128 --new-tokens 64            # the embedded model on the CPU\n"
      "  kvgraph bench --device cuda --models synthetic:llama3.1-8b --verify-tokens 5");
  f->m.add(*c);
  c->add_option("--models", f->models, "Comma-separated models (dirs or synthetic:NAME)")->delimiter(',');
  c->add_option("--prompt", f->prompt, "Prompt tokens")->capture_default_str();
  c->add_option("--new-tokens", f->new_tokens, "Decoded tokens")->capture_default_str();
  c->add_option("--verify-tokens", f->verify_tokens,
                "Also time a speculative verify step of T tokens (2-8; 5 = 4 proposals) against a decode step")
      ->type_name("T");
  c->add_flag("--json", f->json, "One JSON object per model");
  c->add_flag("--no-prefill", f->no_prefill,
              "Take the --prompt positions as filled (zero K/V rows) instead of prefilling them: decode speed at "
              "long context without minutes of prefill; no prefill figure");
  c->callback([f] { run_bench(*f); });
}

}  // namespace kvgraph::cli
