#include "server/server.h"

#include <algorithm>
#include <ctime>

#include <fmt/format.h>
#include <httplib.h>

#include "kvgraph/error.h"
#include "server/api_error.h"
#include "server/request.h"

namespace kvgraph::server {

namespace {

constexpr const char* kJson = "application/json";

const char* const kRoutes[] = {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics",
                               "/tokenize",            "/detokenize",     "/apply-template"};

// The metrics label of a path: the endpoint, or "other" (bounded label set).
std::string route_label(const std::string& path) {
  for (const char* r : kRoutes)
    if (path == r) return r;
  return "other";
}

void set_error(httplib::Response& res, int status, const std::string& message, const std::string& type,
               const std::string& code) {
  res.status = status;
  res.set_content(error_body(message, type, code), kJson);
}

// Compares without an early exit, so the time taken does not reveal how much
// of a guessed key was right.
bool same_key(const std::string& given, const std::string& key) {
  if (given.size() != key.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < key.size(); ++i) diff |= static_cast<unsigned char>(given[i] ^ key[i]);
  return diff == 0;
}

std::string dump(const ojson& j) { return j.dump(-1, ' ', false, ojson::error_handler_t::replace); }

}  // namespace

struct Server::Engine {
  explicit Engine(ServedModel m) : model(std::move(m)) {}
  ServedModel model;
  int32_t ctx = 0;
  std::unique_ptr<TurnLock> turns;  // CUDA (or take_turns): slots step one at a time
  std::unique_ptr<SlotPool> pool;   // after turns: its sessions may take a turn to reset
  int64_t created = 0;
};

// Registers a running completion's cancel flag, so stop() can end it.
class ActiveCompletion {
 public:
  // `stopping` is read under `mu`: a completion that starts while the
  // server stops is cancelled at once.
  ActiveCompletion(std::mutex& mu, std::set<std::atomic<bool>*>& active, const bool& stopping,
                   std::atomic<bool>* flag)
      : mu_(mu), active_(active), flag_(flag) {
    std::lock_guard lk(mu_);
    if (stopping) flag->store(true);
    active_.insert(flag);
  }
  ~ActiveCompletion() {
    std::lock_guard lk(mu_);
    active_.erase(flag_);
  }

 private:
  std::mutex& mu_;
  std::set<std::atomic<bool>*>& active_;
  std::atomic<bool>* flag_;
};

Server::Server(ServerOptions options, LoadFn load) : opt_(std::move(options)), load_(std::move(load)) {
  if (opt_.parallel < 1) fail("server", "--parallel {}: expected at least 1 slot", opt_.parallel);
  if (opt_.ctx < 0) fail("server", "--ctx {}: expected a number of tokens >= 0 (0: the model's)", opt_.ctx);
  if (opt_.queue.max_waiting < 0) fail("server", "--queue {}: expected a count >= 0", opt_.queue.max_waiting);
  http_ = std::make_unique<httplib::Server>();
}

Server::~Server() { stop(); }

std::string Server::load_error() const {
  std::lock_guard lk(mu_);
  if (!load_error_) return "";
  try {
    std::rethrow_exception(load_error_);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown error";
  }
}

std::shared_ptr<Server::Engine> Server::engine() const {
  std::lock_guard lk(mu_);
  return engine_;
}

std::shared_ptr<Server::Engine> Server::ready_engine() const {
  auto e = engine();
  if (e) return e;
  if (state_ == State::failed)
    throw ApiError(503, "unavailable_error", "model_failed", "the model failed to load: " + load_error());
  throw ApiError(503, "unavailable_error", "loading_model", "the model is loading: retry shortly");
}

int32_t Server::ctx() const {
  auto e = engine();
  return e ? e->ctx : 0;
}

int Server::slots_busy() const {
  auto e = engine();
  return e ? e->pool->busy() : 0;
}

void Server::load_model() {
  try {
    auto e = std::make_shared<Engine>(load_());
    const ModelConfig& c = e->model.model->config();
    e->ctx = opt_.ctx > 0 ? opt_.ctx : std::min(4096, c.max_position_embeddings > 0 ? c.max_position_embeddings : 4096);
    std::vector<std::unique_ptr<Session>> sessions;
    SessionOptions so = opt_.session;
    so.capacity = e->ctx;
    for (int i = 0; i < opt_.parallel; ++i) sessions.push_back(std::make_unique<Session>(e->model.model, so));
    if (opt_.take_turns || e->model.model->device() == Device::CUDA) e->turns = std::make_unique<TurnLock>();
    e->pool = std::make_unique<SlotPool>(std::move(sessions), opt_.queue, e->turns.get());
    e->created = static_cast<int64_t>(std::time(nullptr));
    std::lock_guard lk(mu_);
    if (stopping_) e->pool->shutdown();
    engine_ = std::move(e);
    state_ = State::ready;
  } catch (...) {
    std::lock_guard lk(mu_);
    load_error_ = std::current_exception();
    state_ = State::failed;
  }
  loaded_cv_.notify_all();
}

void Server::wait_loaded() {
  std::unique_lock lk(mu_);
  loaded_cv_.wait(lk, [&] { return state_ != State::loading; });
  if (load_error_) std::rethrow_exception(load_error_);
}

int Server::start() {
  routes();
  // Workers: every slot, every request allowed to wait, and a few for
  // /health and /metrics while all of those are busy.
  const size_t workers = static_cast<size_t>(opt_.parallel + opt_.queue.max_waiting + 4);
  http_->new_task_queue = [workers] { return new httplib::ThreadPool(workers); };
  http_->set_payload_max_length(opt_.max_body_bytes);
  http_->set_keep_alive_max_count(1000);
  // An idle keep-alive connection holds a worker until this timeout, and
  // stop() waits for the workers: 2 s bounds the shutdown (clients read the
  // "Keep-Alive: timeout=2" header and reconnect).
  http_->set_keep_alive_timeout(2);
  http_->set_write_timeout(30, 0);  // a client that reads nothing for 30 s is gone
  // A stream is many small writes: with Nagle's algorithm a token's event
  // waits for the ACK of the previous one, which the client may delay up to
  // 40 ms (on the H200 a 1B-shaped model's first ~40 ms of tokens reached
  // the client in one burst, and a fast model's whole stream at its end).
  http_->set_tcp_nodelay(true);
  port_ = opt_.port == 0 ? http_->bind_to_any_port(opt_.host) : (http_->bind_to_port(opt_.host, opt_.port) ? opt_.port : -1);
  if (port_ <= 0)
    fail("server", "cannot listen on {}:{} (address in use, or not an address of this machine)", opt_.host,
         opt_.port);
  listen_thread_ = std::thread([this] {
    http_->listen_after_bind();
    listening_done_ = true;
  });
  load_thread_ = std::thread([this] { load_model(); });
  return port_;
}

void Server::stop() {
  std::shared_ptr<Engine> e;
  {
    std::lock_guard lk(mu_);
    if (stopping_ && !listen_thread_.joinable() && !load_thread_.joinable()) return;
    stopping_ = true;
    for (auto* flag : active_) flag->store(true);
    e = engine_;
  }
  if (e) e->pool->shutdown();
  // httplib's stop() does nothing before listen_after_bind has started:
  // wait for it to run (or to have failed) first.
  while (listen_thread_.joinable() && !http_->is_running() && !listening_done_)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (http_) http_->stop();
  if (listen_thread_.joinable()) listen_thread_.join();
  if (load_thread_.joinable()) load_thread_.join();
}

void Server::routes() {
  httplib::Server& h = *http_;
  // Every handler: API key, then the work; ApiError -> its status and body,
  // anything else -> 500. Counted per endpoint and status.
  auto wrap = [this](std::string route, bool open, auto fn) {
    return [this, route, open, fn](const httplib::Request& req, httplib::Response& res) {
      try {
        if (!open && !opt_.api_key.empty()) {
          const std::string auth = req.get_header_value("Authorization");
          const std::string bearer = "Bearer ";
          if (auth.rfind(bearer, 0) != 0 || !same_key(auth.substr(bearer.size()), opt_.api_key))
            throw ApiError(401, "authentication_error", "invalid_api_key",
                           auth.empty() ? "no API key: send \"Authorization: Bearer KEY\"" : "invalid API key");
        }
        fn(req, res);
      } catch (const ApiError& e) {
        set_error(res, e.status(), e.what(), e.type(), e.code());
        if (e.status() == 503) res.set_header("Retry-After", "1");
      } catch (const std::exception& e) {
        set_error(res, 500, e.what(), "server_error", "internal_error");
      }
      metrics_.request(route, res.status == -1 ? 200 : res.status);  // httplib sets 200 after the handler
    };
  };

  // Runs a completion: waits for a slot, then answers at once or streams.
  auto complete = [this](const httplib::Request& req, httplib::Response& res, bool chat) {
    const auto received = std::chrono::steady_clock::now();
    auto eng = ready_engine();
    const ojson body = parse_body(req.body);
    CompletionRequest r = chat ? parse_chat_request(body) : parse_completion_request(body);
    auto job = std::make_shared<Job>(prepare_job(eng->model, std::move(r), eng->ctx));
    job->received = received;
    auto lease = eng->pool->acquire(job->prompt);
    if (!job->req.stream) {
      std::atomic<bool> cancel{false};
      Outcome o;
      {
        ActiveCompletion active(mu_, active_, stopping_, &cancel);
        try {
          o = run_job(eng->model, *job, lease->session(), {}, cancel, eng->turns.get());
        } catch (const ApiError&) {
          throw;  // shutdown: the session is consistent
        } catch (...) {
          lease->poison();
          throw;
        }
      }
      metrics_.completion(o.stats);
      res.set_content(o.body, kJson);
      return;
    }
    // Streams run inside httplib's content provider, after the headers went
    // out; the provider owns the lease, so the slot is freed however the
    // response ends (a client that left before the first byte included).
    struct Stream {
      std::shared_ptr<Engine> eng;
      std::shared_ptr<Job> job;
      std::unique_ptr<SlotPool::Lease> lease;
      std::atomic<bool> cancel{false};
    };
    auto st = std::make_shared<Stream>();
    st->eng = eng;
    st->job = job;
    st->lease = std::move(lease);
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    res.set_chunked_content_provider("text/event-stream", [this, st](size_t, httplib::DataSink& sink) {
      WriteFn write = [&sink](std::string_view b) { return sink.write(b.data(), b.size()); };
      auto active = std::make_unique<ActiveCompletion>(mu_, active_, stopping_, &st->cancel);
      try {
        Outcome o = run_job(st->eng->model, *st->job, st->lease->session(), write, st->cancel, st->eng->turns.get());
        metrics_.completion(o.stats);
      } catch (const std::exception& e) {
        if (!dynamic_cast<const ApiError*>(&e)) st->lease->poison();
        write(sse_error(e.what(), "server_error", "internal_error") + "data: [DONE]\n\n");
      }
      active.reset();
      st->lease.reset();  // the slot is free before the client sees the end
      sink.done();
      return true;
    });
  };

  h.Post("/v1/chat/completions",
         wrap("/v1/chat/completions", false, [complete](const auto& req, auto& res) { complete(req, res, true); }));
  h.Post("/v1/completions",
         wrap("/v1/completions", false, [complete](const auto& req, auto& res) { complete(req, res, false); }));
  // The same without the /v1 prefix, as llama-server and vLLM accept.
  h.Post("/chat/completions",
         wrap("/v1/chat/completions", false, [complete](const auto& req, auto& res) { complete(req, res, true); }));
  h.Post("/completions",
         wrap("/v1/completions", false, [complete](const auto& req, auto& res) { complete(req, res, false); }));

  h.Get("/v1/models", wrap("/v1/models", false, [this](const httplib::Request&, httplib::Response& res) {
          auto e = ready_engine();
          ojson m = {{"id", e->model.id},
                     {"object", "model"},
                     {"created", e->created},
                     {"owned_by", "kvgraph"},
                     {"meta",
                      {{"ctx", e->ctx},
                       {"parallel", e->pool->size()},
                       {"vocab_size", e->model.model->config().vocab_size},
                       {"device", device_name(e->model.model->device())}}}};
          res.set_content(dump({{"object", "list"}, {"data", ojson::array({m})}}), kJson);
        }));

  h.Get("/health", wrap("/health", true, [this](const httplib::Request&, httplib::Response& res) {
          ready_engine();  // 503 while loading (or after a failed load)
          res.set_content(R"({"status":"ok"})", kJson);
        }));

  h.Get("/metrics", wrap("/metrics", false, [this](const httplib::Request&, httplib::Response& res) {
          Metrics::Gauges g;
          if (auto e = engine()) {
            g = {e->pool->size(), e->pool->busy(), e->pool->waiting(), true};
          }
          res.set_content(metrics_.prometheus(g), "text/plain; version=0.0.4");
        }));

  h.Post("/tokenize", wrap("/tokenize", false, [this](const httplib::Request& req, httplib::Response& res) {
           auto e = ready_engine();
           const ojson body = parse_body(req.body);
           auto content = get_string(body, "content");
           if (!content) bad_request("missing_field", "\"content\" is required");
           const bool special = get_bool(body, "add_special").value_or(false);
           const bool pieces = get_bool(body, "with_pieces").value_or(false);
           const std::vector<int32_t> ids = e->model.tokenizer.encode(*content, special);
           ojson tokens = ojson::array();
           for (int32_t id : ids) {
             if (pieces)
               tokens.push_back({{"id", id}, {"piece", e->model.tokenizer.decode(std::span(&id, 1), false)}});
             else
               tokens.push_back(id);
           }
           res.set_content(dump({{"tokens", tokens}}), kJson);
         }));

  h.Post("/detokenize", wrap("/detokenize", false, [this](const httplib::Request& req, httplib::Response& res) {
           auto e = ready_engine();
           const std::vector<int32_t> ids = get_ids(parse_body(req.body), "tokens");
           const int32_t V = e->model.model->config().vocab_size;
           for (int32_t id : ids)
             if (id >= V) bad_request("invalid_value", "\"tokens\": {} is outside the vocabulary (size {})", id, V);
           res.set_content(dump({{"content", e->model.tokenizer.decode(ids, false)}}), kJson);
         }));

  h.Post("/apply-template", wrap("/apply-template", false, [this](const httplib::Request& req, httplib::Response& res) {
           auto e = ready_engine();
           const ojson body = parse_body(req.body);
           const ojson messages = parse_messages(body);
           const ojson tools = parse_tools(body);
           const bool gen = get_bool(body, "add_generation_prompt").value_or(true);
           res.set_content(dump({{"prompt", render_chat(e->model, messages, tools, gen)}}), kJson);
         }));

  // Browser front-ends: any origin may call (as llama-server allows); the
  // preflight needs no API key.
  h.set_default_headers({{"Access-Control-Allow-Origin", "*"}});
  h.Options(R"(/.*)", [](const httplib::Request&, httplib::Response& res) {
    res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
    res.set_header("Access-Control-Allow-Headers", "Authorization, Content-Type");
    res.status = 204;
  });

  // Statuses httplib sets itself (404 no route, 413 body too large, 400 a
  // malformed request line) get the same error body as ours.
  h.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    std::string type = "invalid_request_error", code = "bad_request",
                message = fmt::format("{} {}: the request could not be read", req.method, req.path);
    if (res.status == 404) {
      type = "not_found_error";
      code = "not_found";
      message = fmt::format("no endpoint {} {}", req.method, req.path);
    } else if (res.status == 413) {
      code = "body_too_large";
      message = fmt::format("the body is larger than the limit of {} bytes", opt_.max_body_bytes);
    }
    set_error(res, res.status, message, type, code);
    metrics_.request(route_label(req.path), res.status);
  });
  h.set_exception_handler([this](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    set_error(res, 500, what, "server_error", "internal_error");
    metrics_.request(route_label(req.path), 500);
  });
}

}  // namespace kvgraph::server
