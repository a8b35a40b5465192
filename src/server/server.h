#pragma once
// kvgraph's OpenAI-compatible HTTP server (cpp-httplib).
//
//   Server srv({.port = 0, .parallel = 2}, [] { return ServedModel::make(...); });
//   int port = srv.start();   // listening now; the model loads in the background
//   srv.wait_loaded();        // rethrows a load failure
//   ...
//   srv.stop();               // cancels generations, refuses waiters, joins
//
// Endpoints: POST /v1/chat/completions, POST /v1/completions, GET /v1/models,
// GET /health (503 while loading, then 200 {"status":"ok"}), GET /metrics
// (Prometheus text), POST /tokenize, POST /detokenize, POST /apply-template.
// Every error is OpenAI-shaped: {"error": {"message", "type", "code"}} with
// 400 (bad request), 401 (API key), 404 (no such endpoint), 413 (body over
// the limit), 500 (a failure inside the model), 503 (loading, busy past the
// queue bounds of SlotPool, shutting down).
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "kvgraph/session.h"
#include "server/completion.h"
#include "server/metrics.h"
#include "server/slots.h"

namespace httplib {
class Server;
}

namespace kvgraph::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                    // 0: any free port (start() returns it)
  int parallel = 1;                   // slots: sessions with their own cache
  int32_t ctx = 0;                    // tokens a slot holds; 0: min(4096, max_position_embeddings)
  std::string api_key;                // non-empty: "Authorization: Bearer KEY" on all but /health
  size_t max_body_bytes = 8u << 20;   // larger bodies: 413
  SlotPool::Limits queue;             // waiting for a slot: how many, how long (then 503)
  SessionOptions session;             // chunk, kv storage, eager, tuning (capacity = ctx)
  bool take_turns = false;            // slots step one at a time (TurnLock); always on for CUDA models
};

using LoadFn = std::function<ServedModel()>;

class Server {
 public:
  Server(ServerOptions options, LoadFn load);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds host:port (Error "[server] cannot listen on ..." when it cannot),
  // then serves on one thread and loads the model on another. Returns the port.
  int start();
  // Blocks until the model is loaded and the slots made; rethrows the load's
  // error when it failed.
  void wait_loaded();
  enum class State { loading, ready, failed };
  State state() const { return state_.load(); }
  std::string load_error() const;
  // Ends running generations (streams get an error event), answers waiting
  // requests 503, stops listening and joins the threads. Idempotent.
  void stop();

  int port() const { return port_; }
  const ServerOptions& options() const { return opt_; }
  // Slots running a request (0 before loading).
  int slots_busy() const;
  // Tokens a slot holds (0 before loading).
  int32_t ctx() const;

 private:
  struct Engine;
  void load_model();
  void routes();
  std::shared_ptr<Engine> engine() const;  // null until loaded
  std::shared_ptr<Engine> ready_engine() const;  // 503 unless loaded

  ServerOptions opt_;
  LoadFn load_;
  std::unique_ptr<httplib::Server> http_;
  std::thread listen_thread_, load_thread_;
  std::atomic<State> state_{State::loading};
  std::atomic<bool> listening_done_{false};
  mutable std::mutex mu_;  // engine_, load_error_, active_
  std::condition_variable loaded_cv_;
  std::shared_ptr<Engine> engine_;
  std::exception_ptr load_error_;
  std::set<std::atomic<bool>*> active_;  // cancel flags of running completions
  bool stopping_ = false;
  int port_ = 0;
  Metrics metrics_;
};

}  // namespace kvgraph::server
