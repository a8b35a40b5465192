#pragma once
// A kvgraph server started in-process on a free loopback port with the
// default model, and an HTTP client for it (cpp-httplib), for the server tests.
#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "kvgraph/error.h"
#include "kvgraph/model.h"
#include "kvgraph/session.h"
#include "kvgraph/tokenizer.h"
#include "server/completion.h"
#include "server/server.h"

namespace kvgraph::testing {

using ojson = nlohmann::ordered_json;

inline std::filesystem::path default_model_path() {
  return std::filesystem::path(KVGRAPH_SOURCE_DIR) / "models" / "default";
}

// The default model, loaded once per test process (weights never change).
inline std::shared_ptr<const Model> default_model() {
  static std::shared_ptr<const Model> m = Model::load(default_model_path(), Device::CPU);
  return m;
}

inline server::ServedModel load_default() {
  auto m = default_model();
  return server::ServedModel::make(m, check_vocab(Tokenizer::from_file(default_model_path() / "tokenizer.json"), m->config()),
                                   "default");
}

struct Reply {
  int status = -1;
  ojson json;        // the body parsed (null when it is not JSON)
  std::string body;
  httplib::Headers headers;
};

inline Reply to_reply(const httplib::Result& r) {
  Reply out;
  if (!r) return out;
  out.status = r->status;
  out.body = r->body;
  out.headers = r->headers;
  out.json = ojson::parse(r->body, nullptr, false);
  if (out.json.is_discarded()) out.json = ojson();
  return out;
}

// The `data:` payloads of an SSE body, in order (comments skipped).
inline std::vector<std::string> sse_data(const std::string& body) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) end = body.size();
    const std::string event = body.substr(pos, end - pos);
    if (event.rfind("data: ", 0) == 0) out.push_back(event.substr(6));
    pos = end + 2;
  }
  return out;
}

class TestServer {
 public:
  explicit TestServer(server::ServerOptions o = {}, server::LoadFn load = load_default, bool wait = true) {
    o.host = "127.0.0.1";
    o.port = 0;
    srv_ = std::make_unique<server::Server>(std::move(o), std::move(load));
    port_ = srv_->start();
    if (wait) srv_->wait_loaded();
  }

  server::Server& server() { return *srv_; }
  int port() const { return port_; }

  std::unique_ptr<httplib::Client> client(const std::string& api_key = "") const {
    auto c = std::make_unique<httplib::Client>("127.0.0.1", port_);
    c->set_read_timeout(60, 0);
    if (!api_key.empty()) c->set_bearer_token_auth(api_key.c_str());
    return c;
  }

  Reply post(const std::string& path, const ojson& body, const std::string& api_key = "") const {
    return to_reply(client(api_key)->Post(path.c_str(), body.dump(), "application/json"));
  }
  Reply post_raw(const std::string& path, const std::string& body) const {
    return to_reply(client()->Post(path.c_str(), body, "application/json"));
  }
  Reply get(const std::string& path, const std::string& api_key = "") const {
    return to_reply(client(api_key)->Get(path.c_str()));
  }

  // A streamed POST read to the end, or until `on_data` (given each data
  // payload as it arrives) returns false, which closes the connection.
  Reply stream(const std::string& path, const ojson& body,
               const std::function<bool(const std::string&)>& on_data = {}) const {
    httplib::Request req;
    req.method = "POST";
    req.path = path;
    req.body = body.dump();
    req.set_header("Content-Type", "application/json");
    std::string all, pending;
    bool stopped = false;
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      all.append(data, n);
      if (!on_data) return true;
      pending.append(data, n);
      size_t end;
      while ((end = pending.find("\n\n")) != std::string::npos) {
        const std::string event = pending.substr(0, end);
        pending.erase(0, end + 2);
        if (event.rfind("data: ", 0) == 0 && !on_data(event.substr(6))) {
          stopped = true;
          return false;
        }
      }
      return true;
    };
    auto c = client();
    auto r = c->send(req);
    Reply out;
    out.body = all;
    if (r) {
      out.status = r->status;
      out.headers = r->headers;
    } else if (stopped) {
      out.status = 0;  // we hung up
    }
    return out;
  }

  // A Prometheus sample's value ("kvgraph_slots_busy"); -1 when absent.
  double metric(const std::string& name) const {
    const std::string text = get("/metrics").body;
    size_t pos = 0;
    while ((pos = text.find(name, pos)) != std::string::npos) {
      if ((pos == 0 || text[pos - 1] == '\n') && text.size() > pos + name.size() && text[pos + name.size()] == ' ')
        return std::stod(text.substr(pos + name.size() + 1));
      pos += name.size();
    }
    return -1;
  }

  // Polls until `pred` or `timeout`; true when pred held.
  template <typename Pred>
  static bool eventually(Pred pred, std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    const auto end = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < end) {
      if (pred()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return pred();
  }

 private:
  std::unique_ptr<server::Server> srv_;
  int port_ = 0;
};

// What Session::generate gives for these prompt ids on a fresh session of
// `ctx` tokens: the reference the server's answers are checked against.
struct Direct {
  std::string text;
  std::vector<int32_t> tokens;
  FinishReason finish;
};
inline Direct direct_generate(const std::vector<int32_t>& prompt, const ops::SamplingParams& sp, GenerateOptions go,
                              int32_t ctx = 1024) {
  auto m = load_default();
  Session s(m.model, {.capacity = ctx});
  s.sampling() = sp;
  auto r = s.generate(prompt, &m.tokenizer, go);
  return {r.text, r.tokens, r.finish};
}

inline ops::SamplingParams greedy() { return {}; }

}  // namespace kvgraph::testing
