// kvgraph_server_load: a bounded load run against a running `kvgraph serve`
// (bench/server_load.sh starts the server, measures its memory and compares
// with `kvgraph bench`).
//
//   kvgraph_server_load --port P --requests 500 --concurrency 8 --max-tokens 64
//       mixed load: chat and text completions, streamed and not (alternating),
//       each generating exactly --max-tokens tokens (ignore_eos); prints
//       failed requests, time to first token (streamed), latency, decode
//       tokens/s per streamed request and the aggregate rate.
//   kvgraph_server_load --port P --health
//       waits until GET /health answers 200.
//   kvgraph_server_load --port P --single --requests 5 --prompt-tokens 512 --max-tokens 256
//       one streamed text completion at a time on a prompt of random token
//       ids, as `kvgraph bench --prompt 512 --new-tokens 256` runs it: the
//       decode rate a client sees over HTTP.
//
// A request fails when it does not answer 200, a stream lacks [DONE], or the
// reply does not hold exactly --max-tokens tokens.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <httplib.h>
#include <nlohmann/json.hpp>

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

struct Options {
  std::string host = "127.0.0.1";
  int port = 8080;
  int requests = 500;
  int concurrency = 8;
  int max_tokens = 64;
  int prompt_tokens = 512;  // --single
  bool single = false;
  bool health = false;  // only wait until GET /health answers 200 (at most 10 minutes)
  std::string api_key;
};

struct Sample {
  bool ok = false;
  bool stream = false;
  std::string error;
  double latency_s = 0;  // request sent -> response complete
  double ttft_s = -1;    // request sent -> the first token's event (streams)
  double decode_tok_s = -1;  // tokens after the first / time from the first to the last token's event (streams)
  double decode_s = 0;       // that time
  double server_decode_tok_s = -1;  // the server's own timings.predicted_per_second (streams)
  int tokens = 0;
};

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

const char* const kPrompts[] = {
    "Once upon a time, in a village by the sea,",
    "The best advice I ever received was",
    "A wise man once said that the secret of happiness",
    "Never trust a computer you cannot throw out of a window, because",
    "It was a dark and stormy night; the rain fell in torrents, except",
    "Here is a short poem about the morning:",
    "The committee met for the third time and decided",
    "If you want to go fast, go alone; if you want to go far,",
};

Sample run_one(httplib::Client& cli, const Options& o, int index, const std::vector<int32_t>& ids) {
  Sample s;
  const bool chat = !o.single && index % 4 >= 2;
  s.stream = o.single || index % 2 == 0;
  json body = {{"max_tokens", o.max_tokens}, {"ignore_eos", true}, {"stream", s.stream}};
  if (s.stream) body["stream_options"] = {{"include_usage", true}};
  if (o.single) {
    body["prompt"] = ids;
    body["temperature"] = 0;
  } else {
    const std::string p = std::string(kPrompts[index % std::size(kPrompts)]) + " (" + std::to_string(index % 5) + ")";
    body["temperature"] = 0.7;
    body["seed"] = index;
    if (chat)
      body["messages"] = {{{"role", "user"}, {"content", p}}};
    else
      body["prompt"] = p;
  }
  httplib::Request req;
  req.method = "POST";
  req.path = chat ? "/v1/chat/completions" : "/v1/completions";
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  if (!o.api_key.empty()) req.set_header("Authorization", "Bearer " + o.api_key);
  std::string all, pending;
  Clock::time_point first{}, last{};
  bool done = false;
  int usage_tokens = -1;
  const auto t0 = Clock::now();
  if (s.stream) {
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      pending.append(data, n);
      size_t end;
      while ((end = pending.find("\n\n")) != std::string::npos) {
        const std::string ev = pending.substr(0, end);
        pending.erase(0, end + 2);
        // Every generated token is one event: a chunk with its text, or an
        // SSE comment when it showed no text (half a character, a possible
        // stop string). Both time the stream; timing text chunks alone
        // overstated the rate when the first or last tokens showed nothing.
        if (ev.rfind(":", 0) == 0) {
          last = Clock::now();
          if (first == Clock::time_point{}) first = last;
          continue;
        }
        if (ev.rfind("data: ", 0) != 0) continue;
        const std::string d = ev.substr(6);
        if (d == "[DONE]") {
          done = true;
          continue;
        }
        const json c = json::parse(d, nullptr, false);
        if (c.is_discarded()) continue;
        if (c.contains("usage") && c["usage"].is_object()) usage_tokens = c["usage"]["completion_tokens"];
        if (c.contains("timings") && c["timings"].is_object())
          s.server_decode_tok_s = c["timings"].value("predicted_per_second", -1.0);
        if (!c.contains("choices") || c["choices"].empty()) continue;
        const json& ch = c["choices"][0];
        const json* text = ch.contains("delta") ? (ch["delta"].contains("content") ? &ch["delta"]["content"] : nullptr)
                                                : (ch.contains("text") ? &ch["text"] : nullptr);
        if (text && text->is_string() && !text->get<std::string>().empty()) {
          const auto now = Clock::now();
          if (first == Clock::time_point{}) first = now;
          last = now;
        }
      }
      return true;
    };
  }
  auto res = cli.send(req);
  s.latency_s = seconds(Clock::now() - t0);
  if (!res) {
    s.error = "transport: " + httplib::to_string(res.error());
    return s;
  }
  if (res->status != 200) {
    s.error = "status " + std::to_string(res->status) + ": " + res->body.substr(0, 200);
    return s;
  }
  if (s.stream) {
    if (!done) {
      s.error = "stream without [DONE]";
      return s;
    }
    s.tokens = usage_tokens;
    if (first != Clock::time_point{}) {
      s.ttft_s = seconds(first - t0);
      if (last > first && s.tokens > 1) {
        s.decode_s = seconds(last - first);
        s.decode_tok_s = (s.tokens - 1) / s.decode_s;
      }
    }
  } else {
    const json r = json::parse(res->body, nullptr, false);
    if (r.is_discarded() || !r.contains("usage")) {
      s.error = "a reply that is not a completion";
      return s;
    }
    s.tokens = r["usage"]["completion_tokens"];
  }
  if (s.tokens != o.max_tokens) {
    s.error = "completion_tokens " + std::to_string(s.tokens) + ", expected " + std::to_string(o.max_tokens);
    return s;
  }
  s.ok = true;
  return s;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5))];
}

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / v.size();
}

int usage(const char* msg) {
  std::fprintf(stderr,
               "kvgraph: error: [server_load] %s\nusage: kvgraph_server_load --port P [--host H] [--requests N] "
               "[--concurrency C] [--max-tokens T] [--single --prompt-tokens P] [--api-key KEY] [--health]\n",
               msg);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
      return argv[++i];
    };
    try {
      if (a == "--host") o.host = next();
      else if (a == "--port") o.port = std::stoi(next());
      else if (a == "--requests") o.requests = std::stoi(next());
      else if (a == "--concurrency") o.concurrency = std::stoi(next());
      else if (a == "--max-tokens") o.max_tokens = std::stoi(next());
      else if (a == "--prompt-tokens") o.prompt_tokens = std::stoi(next());
      else if (a == "--single") o.single = true;
      else if (a == "--health") o.health = true;
      else if (a == "--api-key") o.api_key = next();
      else return usage(("unknown option " + a).c_str());
    } catch (const std::exception& e) {
      return usage(e.what());
    }
  }
  if (o.requests < 1 || o.concurrency < 1 || o.max_tokens < 1 || o.prompt_tokens < 1 || o.port <= 0)
    return usage("--requests, --concurrency, --max-tokens, --prompt-tokens and --port must be >= 1");
  if (o.single) o.concurrency = 1;
  if (o.health) {
    httplib::Client cli(o.host, o.port);
    for (int i = 0; i < 3000; ++i) {
      auto r = cli.Get("/health");
      if (r && r->status == 200) return 0;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    std::fprintf(stderr, "kvgraph: error: [server_load] %s:%d never became healthy\n", o.host.c_str(), o.port);
    return 1;
  }

  // --single: random ids below min(vocabulary, 32000), as kvgraph bench
  // draws them (the rate does not depend on them).
  std::vector<int32_t> ids(o.prompt_tokens);
  if (o.single) {
    httplib::Client cli(o.host, o.port);
    cli.set_tcp_nodelay(true);
    httplib::Headers h;
    if (!o.api_key.empty()) h.emplace("Authorization", "Bearer " + o.api_key);
    auto r = cli.Get("/v1/models", h);
    const json m = r && r->status == 200 ? json::parse(r->body, nullptr, false) : json();
    if (m.is_discarded() || !m.contains("data") || m["data"].empty()) {
      std::fprintf(stderr, "kvgraph: error: [server_load] GET /v1/models on %s:%d failed\n", o.host.c_str(), o.port);
      return 1;
    }
    const int vocab = std::min(m["data"][0]["meta"]["vocab_size"].get<int>(), 32000);
    std::mt19937 rng(123);
    for (auto& id : ids) id = static_cast<int32_t>(rng() % vocab);
  }

  std::vector<Sample> samples(o.requests);
  std::atomic<int> next{0};
  const auto t0 = Clock::now();
  std::vector<std::thread> workers;
  for (int w = 0; w < o.concurrency; ++w)
    workers.emplace_back([&] {
      httplib::Client cli(o.host, o.port);
      cli.set_tcp_nodelay(true);  // streams: each token's event as it comes
      cli.set_keep_alive(true);
      cli.set_read_timeout(600, 0);
      for (int i; (i = next++) < o.requests;) samples[i] = run_one(cli, o, i, ids);
    });
  for (auto& t : workers) t.join();
  const double wall = seconds(Clock::now() - t0);

  std::vector<double> ttft, latency, decode, server_decode;
  int failed = 0, streamed = 0;
  int64_t tokens = 0, decoded = 0;
  double decode_s = 0;
  std::string first_error;
  for (const Sample& s : samples) {
    if (!s.ok) {
      ++failed;
      if (first_error.empty()) first_error = s.error;
      continue;
    }
    tokens += s.tokens;
    latency.push_back(s.latency_s);
    if (s.stream) {
      ++streamed;
      if (s.ttft_s >= 0) ttft.push_back(s.ttft_s);
      if (s.server_decode_tok_s > 0) server_decode.push_back(s.server_decode_tok_s);
      if (s.decode_tok_s > 0) {
        decode.push_back(s.decode_tok_s);
        decoded += s.tokens - 1;
        decode_s += s.decode_s;
      }
    }
  }
  json j = {{"mode", o.single ? "single" : "load"},
            {"requests", o.requests},
            {"concurrency", o.concurrency},
            {"max_tokens", o.max_tokens},
            {"failed", failed},
            {"streamed", streamed},
            {"wall_s", wall},
            {"tokens_per_s_aggregate", tokens / wall},
            {"ttft_ms_p50", percentile(ttft, 0.5) * 1e3},
            {"ttft_ms_p99", percentile(ttft, 0.99) * 1e3},
            {"latency_ms_p50", percentile(latency, 0.5) * 1e3},
            {"latency_ms_p99", percentile(latency, 0.99) * 1e3},
            {"decode_tok_s_mean", mean(decode)},
            {"decode_tok_s_p50", percentile(decode, 0.5)},
            {"decode_tok_s_max", decode.empty() ? 0.0 : *std::max_element(decode.begin(), decode.end())},
            // The server's own figure (timings.predicted_per_second): without the client's side of the socket.
            {"server_decode_tok_s_max",
             server_decode.empty() ? 0.0 : *std::max_element(server_decode.begin(), server_decode.end())},
            // All streams' tokens after the first over all their decode time.
            {"decode_tok_s_pooled", decode_s > 0 ? decoded / decode_s : 0.0}};
  if (o.single) j["prompt_tokens"] = o.prompt_tokens;
  if (!first_error.empty()) j["first_error"] = first_error;
  std::printf("%s\n", j.dump().c_str());
  return failed ? 1 : 0;
}
