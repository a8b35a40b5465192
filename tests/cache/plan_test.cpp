#include "kvgraph/cache/plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "kvgraph/error.h"

using namespace kvgraph;
using ::testing::HasSubstr;

TEST(CachePlan, FlatWritesAtPositionAndReadsFromZero) {
  StepPlan p = plan(Flat{64}, /*position=*/10, /*T=*/4);
  ASSERT_EQ(p.n_write, 1);
  EXPECT_EQ(p.write[0], (SlotRun{10, 4, 10}));
  ASSERT_EQ(p.n_read, 1);
  EXPECT_EQ(p.read[0], (SlotRun{0, 14, 0}));
  EXPECT_EQ(p.mask, MaskKind::Causal);
}

TEST(CachePlan, FlatSingleTokenNeedsNoMask) {
  StepPlan p = plan(Flat{64}, /*position=*/5, /*T=*/1);
  EXPECT_EQ(p.mask, MaskKind::None);
  EXPECT_EQ(p.read[0], (SlotRun{0, 6, 0}));
}

TEST(CachePlan, FlatOverflowThrowsWithNumbers) {
  EXPECT_NO_THROW(plan(Flat{16}, 12, 4));
  try {
    plan(Flat{16}, 13, 4);
    FAIL() << "expected overflow";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("overflow capacity 16"));
    EXPECT_THAT(e.what(), HasSubstr("position 13"));
  }
}

TEST(CachePlan, RingPoolIsWindowPlusMaxWriteMinusOne) {
  CachePolicy r = Ring{/*window=*/8, /*max_write=*/4};
  EXPECT_EQ(r.pool(), 11);
  EXPECT_TRUE(r.is_ring());
  EXPECT_EQ(r.capacity(), INT32_MAX);
}

TEST(CachePlan, RingWithoutWrapReadsTheBand) {
  StepPlan p = plan(Ring{8, 4}, /*position=*/3, /*T=*/2);
  ASSERT_EQ(p.n_write, 1);
  EXPECT_EQ(p.write[0], (SlotRun{3, 2, 3}));
  EXPECT_EQ(p.read_begin, 0);
  ASSERT_EQ(p.n_read, 1);
  EXPECT_EQ(p.read[0], (SlotRun{0, 5, 0}));
  EXPECT_EQ(p.mask, MaskKind::CausalBand);
}

TEST(CachePlanRing, WrapSplitsWriteIntoTwoRuns) {
  // pool 11: positions 20..23 live in slots 9, 10, 0, 1.
  StepPlan p = plan(Ring{8, 4}, /*position=*/20, /*T=*/4);
  ASSERT_EQ(p.n_write, 2);
  EXPECT_EQ(p.write[0], (SlotRun{9, 2, 20}));
  EXPECT_EQ(p.write[1], (SlotRun{0, 2, 22}));
  // Reads: logical [13, 24) -> slots 2..10 then 0..1, oldest first.
  EXPECT_EQ(p.read_begin, 13);
  ASSERT_EQ(p.n_read, 2);
  EXPECT_EQ(p.read[0], (SlotRun{2, 9, 13}));
  EXPECT_EQ(p.read[1], (SlotRun{0, 2, 22}));
}

TEST(CachePlanRing, StepOfExactlyMaxWriteAtWrapBoundary) {
  // pool 11, position 11: slots 0..3, no split; reads [4, 15) = slots 4..10, 0..3.
  StepPlan p = plan(Ring{8, 4}, /*position=*/11, /*T=*/4);
  ASSERT_EQ(p.n_write, 1);
  EXPECT_EQ(p.write[0], (SlotRun{0, 4, 11}));
  ASSERT_EQ(p.n_read, 2);
  EXPECT_EQ(p.read[0], (SlotRun{4, 7, 4}));
  EXPECT_EQ(p.read[1], (SlotRun{0, 4, 11}));
  // Ending exactly at the boundary: positions 7..10 -> slots 7..10, one run.
  StepPlan q = plan(Ring{8, 4}, /*position=*/7, /*T=*/4);
  ASSERT_EQ(q.n_write, 1);
  EXPECT_EQ(q.write[0], (SlotRun{7, 4, 7}));
}

TEST(CachePlanRing, ReadsNeverExceedThePool) {
  CachePolicy r = Ring{5, 3};
  for (int pos = 0; pos < 200; ++pos)
    for (int T = 1; T <= 3; ++T) {
      StepPlan p = plan(r, pos, T);
      int total = 0;
      for (int i = 0; i < p.n_read; ++i) total += p.read[i].len;
      EXPECT_LE(total, r.pool());
      EXPECT_EQ(total, pos + T - p.read_begin);
    }
}

TEST(CachePlanRing, StepAboveMaxWriteIsRejected) {
  EXPECT_THROW(plan(Ring{8, 4}, 0, 5), Error);
  EXPECT_THROW(plan(Flat{8}, 0, 0), Error);
}

TEST(CachePlanSlots, SlotArithmeticMatchesPlan) {
  SlotRule r = CachePolicy(Ring{8, 4}).rule();
  EXPECT_EQ(slot_of(r, 0), 0);
  EXPECT_EQ(slot_of(r, 11), 0);
  EXPECT_EQ(slot_of(r, 25), 3);
  EXPECT_EQ(first_visible(r, 3), 0);
  EXPECT_EQ(first_visible(r, 20), 13);
  EXPECT_EQ(oldest_resident(r, 30), 19);
  SlotRule f = CachePolicy(Flat{64}).rule();
  EXPECT_EQ(slot_of(f, 40), 40);
  EXPECT_EQ(first_visible(f, 40), 0);
}
