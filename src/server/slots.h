#pragma once
// The server's slots: --parallel sessions, each with its own cache, and the
// admission rule in front of them.
//
// A request takes the free slot whose cached tokens share the longest
// reusable prefix with its prompt (whole max_write chunks, as
// Session::prefill_reusing keeps them; ties: the least recently used, so hot
// caches survive); prefill_reusing then prefills only the rest. When no slot is free
// the request waits, first come first served, at most `max_wait`, behind at
// most `max_waiting` others; past either bound it is refused with 503
// (unavailable_error, code "server_busy"), so an overloaded server answers
// quickly instead of holding connections without end.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "kvgraph/session.h"

namespace kvgraph::server {

// Slots that take turns, one step at a time, first come first served (a
// ticket lock). For CUDA: each slot's session has its own stream, but the
// CUDA runtime is not safe to drive from several threads the way kvgraph
// does (a slot recording its decode graph while another uploads step state
// through the legacy stream breaks the capture), so on a GPU a request holds
// the turn for its prefill and for each decode step, and gives it up while
// it writes each token to its client. The GPU runs one step at a time, as it
// would anyway for batch-1 decode; slots still keep their own caches.
class TurnLock {
 public:
  void lock();
  void unlock();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t next_ = 0, serving_ = 0;
};

class SlotPool {
 public:
  struct Limits {
    int max_waiting = 64;  // requests that may wait for a slot (0: none wait)
    std::chrono::milliseconds max_wait{60'000};
  };
  // `turns` (CUDA): taken to reset a poisoned slot's session.
  SlotPool(std::vector<std::unique_ptr<Session>> sessions, Limits limits, TurnLock* turns = nullptr);

  // A slot held by one request; released (and the next waiter woken) when
  // the lease is destroyed. A lease marked `poisoned` (its request failed
  // inside the session) resets the session on release, so nothing of a
  // failed request is reused.
  class Lease {
   public:
    Lease(SlotPool* pool, int slot) : pool_(pool), slot_(slot) {}
    ~Lease();
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    Session& session() const;
    int slot() const { return slot_; }
    void poison() { poisoned_ = true; }

   private:
    SlotPool* pool_;
    int slot_;
    bool poisoned_ = false;
  };

  // Waits for a slot as the header says; throws ApiError 503 when refused
  // or when the pool is shutting down.
  std::unique_ptr<Lease> acquire(std::span<const int32_t> prompt);

  // Wakes every waiter with 503 and refuses new requests (server shutdown).
  void shutdown();

  int size() const { return static_cast<int>(slots_.size()); }
  int busy() const;
  int waiting() const;

 private:
  struct Slot {
    std::unique_ptr<Session> session;
    bool busy = false;
    uint64_t last_used = 0;
  };
  void release(int slot, bool poisoned);

  Limits limits_;
  TurnLock* turns_;
  std::vector<Slot> slots_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<uint64_t> queue_;  // tickets of waiting requests, oldest first
  uint64_t next_ticket_ = 0;
  uint64_t clock_ = 0;          // use counter for least-recently-used ties
  int n_busy_ = 0;
  bool stopping_ = false;
};

// The length of the common prefix of a and b.
size_t common_prefix(std::span<const int32_t> a, std::span<const int32_t> b);

}  // namespace kvgraph::server
