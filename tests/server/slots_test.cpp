// SlotPool: which slot a request gets, and the bounded wait in front of them.
#include <future>
#include <thread>

#include <gtest/gtest.h>

#include "server/api_error.h"
#include "server/slots.h"
#include "support/test_server.h"

using namespace kvgraph;
using namespace kvgraph::server;
using namespace std::chrono_literals;

namespace {

std::unique_ptr<SlotPool> make_pool(int n, SlotPool::Limits limits = {}) {
  std::vector<std::unique_ptr<Session>> sessions;
  for (int i = 0; i < n; ++i)
    sessions.push_back(std::make_unique<Session>(kvgraph::testing::default_model(), SessionOptions{.capacity = 256, .max_write = 8}));
  return std::make_unique<SlotPool>(std::move(sessions), limits);
}

std::vector<int32_t> seq(int32_t first, int n) {
  std::vector<int32_t> v(n);
  for (int i = 0; i < n; ++i) v[i] = first + i;
  return v;
}

// The status and code of the ApiError `f` throws.
template <typename F>
std::pair<int, std::string> refusal(F f) {
  try {
    f();
  } catch (const ApiError& e) {
    return {e.status(), e.code()};
  }
  return {0, ""};
}

}  // namespace

TEST(SlotPool, TakesTheSlotWithTheLongestReusablePrefix) {
  auto pool = make_pool(3);
  const auto a = seq(10, 40), b = seq(100, 40);
  int slot_a, slot_b;
  {
    auto l = pool->acquire(a);
    slot_a = l->slot();
    l->session().prefill(a);
  }
  {
    auto l = pool->acquire(b);
    slot_b = l->slot();
    l->session().prefill(b);
  }
  EXPECT_NE(slot_a, slot_b);  // b shares nothing with a: the least recently used empty slot
  auto a2 = a;
  a2.push_back(7);
  EXPECT_EQ(pool->acquire(a2)->slot(), slot_a);
  auto b2 = b;
  b2.resize(20);
  b2.push_back(3);
  EXPECT_EQ(pool->acquire(b2)->slot(), slot_b);
}

TEST(SlotPool, APrefixShorterThanAChunkDoesNotPullARequest) {
  auto pool = make_pool(2);
  const auto a = seq(10, 40);
  int slot_a;
  {
    auto l = pool->acquire(a);
    slot_a = l->slot();
    l->session().prefill(a);
  }
  // Shares 5 tokens (less than max_write = 8): nothing prefill_reusing could
  // keep, so it takes the other, unused slot and leaves a's cache alone.
  auto c = seq(10, 5);
  c.push_back(999);
  c.push_back(998);
  EXPECT_NE(pool->acquire(c)->slot(), slot_a);
}

TEST(SlotPool, BusySlotsAreSkippedAndFreedOnRelease) {
  auto pool = make_pool(2);
  auto l1 = pool->acquire(seq(0, 4));
  auto l2 = pool->acquire(seq(0, 4));
  EXPECT_NE(l1->slot(), l2->slot());
  EXPECT_EQ(pool->busy(), 2);
  l1.reset();
  EXPECT_EQ(pool->busy(), 1);
  EXPECT_EQ(pool->acquire(seq(0, 4))->slot(), 1 - l2->slot());
}

TEST(SlotPool, NoWaitingAllowedMeans503AtOnce) {
  auto pool = make_pool(1, {.max_waiting = 0, .max_wait = 10s});
  auto held = pool->acquire(seq(0, 4));
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(refusal([&] { pool->acquire(seq(0, 4)); }), std::make_pair(503, std::string("server_busy")));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s);
}

TEST(SlotPool, AWaiterGetsTheSlotWhenItIsFreedAndTimesOutOtherwise) {
  auto pool = make_pool(1, {.max_waiting = 2, .max_wait = 200ms});
  auto held = pool->acquire(seq(0, 4));
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(refusal([&] { pool->acquire(seq(0, 4)); }).second, "server_busy");
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 200ms);
  auto waiter = std::async(std::launch::async, [&] { return pool->acquire(seq(0, 4))->slot(); });
  ASSERT_TRUE(kvgraph::testing::TestServer::eventually([&] { return pool->waiting() == 1; }));
  held.reset();
  EXPECT_EQ(waiter.get(), 0);
}

TEST(SlotPool, WaitersAreServedInArrivalOrder) {
  auto pool = make_pool(1, {.max_waiting = 8, .max_wait = 10s});
  auto held = pool->acquire(seq(0, 4));
  std::mutex mu;
  std::vector<int> order;
  std::vector<std::future<void>> waiters;
  for (int i = 0; i < 4; ++i) {
    waiters.push_back(std::async(std::launch::async, [&, i] {
      auto l = pool->acquire(seq(0, 4));
      std::lock_guard lk(mu);
      order.push_back(i);
    }));
    ASSERT_TRUE(kvgraph::testing::TestServer::eventually([&] { return pool->waiting() == i + 1; }));
  }
  held.reset();
  for (auto& w : waiters) w.get();
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3}));
}

TEST(SlotPool, ShutdownWakesWaitersWith503) {
  auto pool = make_pool(1, {.max_waiting = 4, .max_wait = 60s});
  auto held = pool->acquire(seq(0, 4));
  auto waiter = std::async(std::launch::async, [&] { return refusal([&] { pool->acquire(seq(0, 4)); }); });
  ASSERT_TRUE(kvgraph::testing::TestServer::eventually([&] { return pool->waiting() == 1; }));
  pool->shutdown();
  EXPECT_EQ(waiter.get(), std::make_pair(503, std::string("shutting_down")));
  EXPECT_EQ(refusal([&] { pool->acquire(seq(0, 4)); }).second, "shutting_down");
}

TEST(SlotPool, APoisonedLeaseResetsItsSession) {
  auto pool = make_pool(1);
  {
    auto l = pool->acquire(seq(0, 20));
    l->session().prefill(seq(0, 20));
    l->poison();
  }
  auto l = pool->acquire(seq(0, 20));
  EXPECT_TRUE(l->session().tokens().empty());
}
