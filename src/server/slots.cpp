#include "server/slots.h"

#include <algorithm>

#include "server/api_error.h"

namespace kvgraph::server {

size_t common_prefix(std::span<const int32_t> a, std::span<const int32_t> b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

SlotPool::SlotPool(std::vector<std::unique_ptr<Session>> sessions, Limits limits, TurnLock* turns)
    : limits_(limits), turns_(turns) {
  if (sessions.empty()) fail("server", "a slot pool needs at least one session");
  for (auto& s : sessions) slots_.push_back({std::move(s), false, 0});
}

SlotPool::Lease::~Lease() { pool_->release(slot_, poisoned_); }

Session& SlotPool::Lease::session() const { return *pool_->slots_[slot_].session; }

std::unique_ptr<SlotPool::Lease> SlotPool::acquire(std::span<const int32_t> prompt) {
  std::unique_lock lk(mu_);
  if (stopping_) throw ApiError(503, "unavailable_error", "shutting_down", "the server is shutting down");
  const bool free_now = n_busy_ < size() && queue_.empty();
  if (!free_now && static_cast<int>(queue_.size()) >= limits_.max_waiting)
    throw ApiError(503, "unavailable_error", "server_busy",
                   fmt::format("all {} slots are busy and {} requests are waiting (the most allowed): retry later",
                               size(), queue_.size()));
  const uint64_t ticket = next_ticket_++;
  queue_.push_back(ticket);
  const bool got = cv_.wait_for(lk, limits_.max_wait,
                                [&] { return stopping_ || (queue_.front() == ticket && n_busy_ < size()); });
  queue_.erase(std::find(queue_.begin(), queue_.end(), ticket));
  cv_.notify_all();  // the next in line may go (or see its turn came)
  if (stopping_) throw ApiError(503, "unavailable_error", "shutting_down", "the server is shutting down");
  if (!got)
    throw ApiError(503, "unavailable_error", "server_busy",
                   fmt::format("no slot became free within {:.1f} s: retry later",
                               std::chrono::duration<double>(limits_.max_wait).count()));
  int best = -1;
  size_t best_prefix = 0;
  for (int i = 0; i < size(); ++i) {
    const Slot& s = slots_[i];
    if (s.busy) continue;
    // What prefill_reusing can keep: whole max_write chunks, short of the
    // last prompt token. A shorter common prefix (a BOS) counts as none, so
    // it does not pull a request onto a slot whose cache it cannot use.
    const size_t chunk = static_cast<size_t>(s.session->options().max_write);
    const size_t common = std::min(common_prefix(s.session->tokens(), prompt), prompt.empty() ? 0 : prompt.size() - 1);
    const size_t p = common / chunk * chunk;
    if (best < 0 || p > best_prefix || (p == best_prefix && s.last_used < slots_[best].last_used)) {
      best = i;
      best_prefix = p;
    }
  }
  slots_[best].busy = true;
  ++n_busy_;
  return std::make_unique<Lease>(this, best);
}

void SlotPool::release(int slot, bool poisoned) {
  Slot& s = slots_[slot];
  if (poisoned) {
    // The session may hold a half-written step's state: start it afresh. A
    // reset that throws too leaves the slot out of service rather than
    // reusing a cache nobody can vouch for.
    try {
      std::unique_lock<TurnLock> turn;
      if (turns_) turn = std::unique_lock<TurnLock>(*turns_);
      s.session->reset();
    } catch (...) {
      return;
    }
  }
  std::lock_guard lk(mu_);
  s.busy = false;
  s.last_used = ++clock_;
  --n_busy_;
  cv_.notify_all();
}

void TurnLock::lock() {
  std::unique_lock lk(mu_);
  const uint64_t ticket = next_++;
  cv_.wait(lk, [&] { return serving_ == ticket; });
}

void TurnLock::unlock() {
  {
    std::lock_guard lk(mu_);
    ++serving_;
  }
  cv_.notify_all();
}

void SlotPool::shutdown() {
  std::lock_guard lk(mu_);
  stopping_ = true;
  cv_.notify_all();
}

int SlotPool::busy() const {
  std::lock_guard lk(mu_);
  return n_busy_;
}

int SlotPool::waiting() const {
  std::lock_guard lk(mu_);
  return static_cast<int>(queue_.size());
}

}  // namespace kvgraph::server
