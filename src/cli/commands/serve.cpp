// kvgraph serve: the OpenAI-compatible HTTP server (src/server/).
#include <atomic>
#include <csignal>
#include <ctime>

#include <fmt/format.h>

#include "cli/common.h"
#include "kvgraph/error.h"
#include "server/server.h"

namespace kvgraph::cli {

namespace {

struct ServeFlags {
  ModelFlags m;
  std::string host = "127.0.0.1";
  int port = 8080;
  int parallel = 1;
  int ctx = 0;
  std::string api_key;
  int queue = 64;
  double queue_timeout = 60;
  int64_t max_body = 8 << 20;
  std::string model_id;
};

// SIGINT and SIGTERM set a flag that the main thread polls; shutdown is then
// an ordinary function call. A handler, not a blocked mask and sigwait: the
// BLAS library starts its threads before main, with nothing blocked, and a
// signal the kernel hands to one of them would otherwise kill the process.
std::atomic<int> g_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "set from a signal handler");
extern "C" void on_shutdown_signal(int sig) { g_signal.store(sig, std::memory_order_relaxed); }

class ShutdownSignals {
 public:
  ShutdownSignals() {
    struct sigaction sa {};
    sa.sa_handler = on_shutdown_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGINT, &sa, &old_int_);
    sigaction(SIGTERM, &sa, &old_term_);
  }
  ~ShutdownSignals() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
  }
  ShutdownSignals(const ShutdownSignals&) = delete;
  ShutdownSignals& operator=(const ShutdownSignals&) = delete;

  // The signal received within about `ms`, or 0.
  int wait(int ms) {
    for (int waited = 0; waited < ms && !g_signal.load(); waited += 10) {
      timespec ts{0, 10 * 1000000L};
      nanosleep(&ts, nullptr);
    }
    return g_signal.load();
  }

 private:
  struct sigaction old_int_ {}, old_term_ {};
};

void run_serve(const ServeFlags& f) {
  f.m.check();
  check_at_least("--parallel", f.parallel, 1);
  check_at_least("--ctx", f.ctx, 0, " (0: the model's, up to 4096)");
  check_at_least("--queue", f.queue, 0);
  check_at_least("--max-body", f.max_body, 1);
  if (f.port < 0 || f.port > 65535) usage_fail("--port {}: expected 0..65535 (0: any free port)", f.port);
  if (!(f.queue_timeout >= 0) || f.queue_timeout > 86400)
    usage_fail("--queue-timeout {}: expected seconds in [0, 86400]", f.queue_timeout);
  if (f.ctx > 0 && f.m.capacity > 0 && f.ctx != f.m.capacity)
    usage_fail("--ctx {} and --capacity {} disagree: give one (they are the same setting here)", f.ctx, f.m.capacity);

  server::ServerOptions o;
  o.host = f.host;
  o.port = f.port;
  o.parallel = f.parallel;
  o.ctx = f.ctx > 0 ? f.ctx : f.m.capacity;
  o.api_key = f.api_key;
  o.max_body_bytes = static_cast<size_t>(f.max_body);
  o.queue.max_waiting = f.queue;
  o.queue.max_wait = std::chrono::milliseconds(static_cast<int64_t>(f.queue_timeout * 1000));
  o.session.max_write = f.m.prefill_chunk();
  o.session.eager = f.m.eager;
  o.session.tuning = f.m.tuning();
  o.session.kv_storage = f.m.kv_storage(parse_device(f.m.device));

  ShutdownSignals signals;
  ModelFlags mf = f.m;
  mf.capacity = o.ctx;  // load_model warns when it passes the trained positions
  const std::string id_flag = f.model_id;
  server::Server srv(o, [mf, id_flag] {
    auto model = load_model(mf);
    auto tok = load_tokenizer(*model, true);
    std::string id = id_flag;
    if (id.empty()) id = mf.model.empty() ? "default" : std::filesystem::path(mf.model).lexically_normal().filename().string();
    if (id.empty()) id = std::filesystem::path(mf.model).lexically_normal().parent_path().filename().string();
    return server::ServedModel::make(model, std::move(*tok), id);
  });
  const int port = srv.start();
  fmt::print("listening on http://{}:{}\n", f.host, port);
  std::fflush(stdout);

  bool announced = false;
  while (true) {
    const int sig = signals.wait(200);
    if (sig) {
      if (!f.m.quiet) fmt::print(stderr, "[kvgraph] {}: shutting down\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
      break;
    }
    if (srv.state() == server::Server::State::failed) {
      srv.stop();
      srv.wait_loaded();  // rethrows the load error: one line, exit 1
    }
    if (!announced && srv.state() == server::Server::State::ready) {
      announced = true;
      if (!f.m.quiet)
        fmt::print(stderr, "[kvgraph] ready: {} slot{} of {} tokens{}\n", f.parallel, f.parallel == 1 ? "" : "s",
                   srv.ctx(), f.api_key.empty() ? "" : ", API key required");
    }
  }
  srv.stop();
}

}  // namespace

void add_serve(CLI::App& app) {
  auto f = std::make_shared<ServeFlags>();
  CLI::App* c = app.add_subcommand("serve", "OpenAI-compatible HTTP server (chat and text completions, streaming)");
  c->footer(
      "Endpoints: POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /health, GET /metrics,\n"
      "POST /tokenize, POST /detokenize, POST /apply-template. SIGINT or SIGTERM stops it cleanly.\n"
      "When every slot is busy a request waits (first come, first served) up to --queue-timeout seconds\n"
      "behind at most --queue others; past either it gets 503 (server_busy) with Retry-After: 1.\n"
      "Examples:\n"
      "  kvgraph serve --port 8080\n"
      "  kvgraph serve -m ~/models/Qwen2.5-0.5B-Instruct --device cuda --parallel 4 --ctx 8192 --api-key secret\n"
      "  curl http://127.0.0.1:8080/v1/chat/completions -H 'Content-Type: application/json' \\\n"
      "       -d '{\"messages\":[{\"role\":\"user\",\"content\":\"Hello\"}],\"max_tokens\":32}'");
  f->m.add(*c);
  c->add_option("--host", f->host, "Address to listen on")->capture_default_str();
  c->add_option("--port", f->port, "Port to listen on (0: any free port, printed)")->capture_default_str();
  c->add_option("--parallel", f->parallel, "Slots: requests served at once, each with its own cache")
      ->capture_default_str();
  c->add_option("--ctx", f->ctx, "Tokens each slot holds (prompt + reply); default: the model's, up to 4096");
  c->add_option("--api-key", f->api_key, "Require \"Authorization: Bearer KEY\" (all endpoints but /health)");
  c->add_option("--queue", f->queue, "Requests that may wait for a busy server (more: 503)")->capture_default_str();
  c->add_option("--queue-timeout", f->queue_timeout, "Seconds a request may wait for a slot (then 503)")
      ->capture_default_str();
  c->add_option("--max-body", f->max_body, "Largest request body in bytes (larger: 413)")->capture_default_str();
  c->add_option("--model-id", f->model_id, "Model name in /v1/models and responses (default: the directory's name)");
  c->callback([f] { run_serve(*f); });
}

}  // namespace kvgraph::cli
