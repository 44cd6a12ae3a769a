#include "vmm/plan_schedule.h"

#include <gtest/gtest.h>

namespace loom::vmm {
namespace {

// A 4 KiB region, period 100: A [0, 1024) during [0, 50), B [1024, 2048)
// during [40, 90), C [2048, 3072) during [80, 120) (wraps to [0, 20)),
// P [3072, 3584) persistent.
RuntimePlan Plan() {
  RuntimePlan plan;
  plan.region_bytes = 4096;
  plan.period = 100;
  plan.iteration = {{1000, 0, 0, 50}, {1024, 1024, 40, 90},
                    {1000, 2048, 80, 120}};
  plan.prologue = {{512, 3072, 0, 100}, {1000, 0, 0, 50}};  // a duplicate
  return plan;
}

TEST(PlanScheduleTest, MergesDuplicates) {
  EXPECT_EQ(PlanSchedule(Plan(), 1024).occupants(), 4u);
}

TEST(PlanScheduleTest, IdleBytesDependOnTheTimeWindow) {
  const PlanSchedule s(Plan(), 1024);
  // [50, 80): only B and P are busy: A's bytes and C's are idle; the
  // smallest gap first, then the larger one ([2048, 3072) and [3584, 4096)
  // are separate gaps; [0, 1024) too).
  std::vector<uint64_t> at = s.IdleRanges(1024, 50, 80, 8);
  ASSERT_FALSE(at.empty());
  EXPECT_EQ(at[0], 0u);  // [0, 1024)
  EXPECT_NE(std::find(at.begin(), at.end(), 2048u), at.end());
  // Something longer than 1 KiB fits only in the two-KiB... none: A and C
  // are 1 KiB gaps separated by B; the end [3584, 4096) is 512 B.
  EXPECT_TRUE(s.IdleRanges(1536, 50, 80, 8).empty());
  // [0, 10): C wraps around into it, A is busy: only [1024, 2048) (B idle)
  // and the 512 B tail.
  at = s.IdleRanges(1024, 0, 10, 8);
  ASSERT_EQ(at.size(), 1u);
  EXPECT_EQ(at[0], 1024u);
  // A window across the boundary: [95, 105) meets C (80..120) and A (0..50).
  at = s.IdleRanges(1024, 95, 105, 8);
  ASSERT_EQ(at.size(), 1u);
  EXPECT_EQ(at[0], 1024u);
}

TEST(PlanScheduleTest, UnknownOrLongLifetimesGetOnlyNeverUsedBytes) {
  const PlanSchedule s(Plan(), 1024);
  EXPECT_EQ(s.IdleRanges(512, 10, -1, 8), std::vector<uint64_t>{3584});
  EXPECT_EQ(s.IdleRanges(512, 10, 110, 8), std::vector<uint64_t>{3584});
  EXPECT_TRUE(s.IdleRanges(1024, 10, -1, 8).empty());
}

TEST(PlanScheduleTest, OffsetsAreAlignedAndInsideTheirGap) {
  const PlanSchedule s(Plan(), 1024);
  for (uint64_t size : {1u, 511u, 513u, 1000u}) {
    for (uint64_t at : s.IdleRanges(size, 50, 80, 8)) {
      EXPECT_EQ(at % 512, 0u);
      EXPECT_LE(at + size, 4096u);
    }
  }
  // Both ends of a gap are offered: [0, 1024) for 512 B: 0 and 512.
  std::vector<uint64_t> at = s.IdleRanges(512, 50, 80, 1);
  EXPECT_EQ(at, (std::vector<uint64_t>{3584}));  // the smallest gap only
  at = s.IdleRanges(512, 50, 80, 2);
  EXPECT_NE(std::find(at.begin(), at.end(), 512u), at.end());
}

// Per granule (64 KiB): a 4-granule plan, period 100: A [0, kG + 512)
// during [10, 30), B [2 kG, 3 kG) during [60, 120) (wraps), P [3 kG, 4 kG)
// persistent.
constexpr uint64_t kG = 64 << 10;

RuntimePlan GranulePlan() {
  RuntimePlan plan;
  plan.region_bytes = 4 * kG;
  plan.period = 100;
  plan.iteration = {{kG + 512, 0, 10, 30}, {kG, 2 * kG, 60, 120}};
  plan.prologue = {{kG, 3 * kG, 0, 100}};
  return plan;
}

TEST(PlanScheduleTest, TimeToNextUseFollowsThePlanCyclically) {
  const PlanSchedule s(GranulePlan(), kG);
  // Granule 0: A starts at 10.
  EXPECT_EQ(s.TimeToNextUse(0, 5), 5);
  EXPECT_EQ(s.TimeToNextUse(0, 50), 60);   // next iteration's 10
  EXPECT_EQ(s.TimeToNextUse(0, 150), 60);  // times wrap the period
  // Granule 2: B starts at 60.
  EXPECT_EQ(s.TimeToNextUse(2, 10), 50);
  // Granule 3: persistent.
  EXPECT_EQ(s.TimeToNextUse(3, 10), 0);
  // In the set-up: the first planned start of the first iteration.
  EXPECT_EQ(s.TimeToNextUse(0, 0, /*in_setup=*/true), 10);
  EXPECT_EQ(s.TimeToNextUse(3, 0, /*in_setup=*/true), 0);
}

TEST(PlanScheduleTest, NeverUsedGranulesAreNeverNeeded) {
  RuntimePlan plan = GranulePlan();
  plan.region_bytes = 5 * kG;  // granule 4: no planned request
  const PlanSchedule s(plan, kG);
  EXPECT_EQ(s.TimeToNextUse(4, 10), PlanSchedule::kNever);
  EXPECT_EQ(s.TimeToNextUse(4, 0, true), PlanSchedule::kNever);
  // Past the plan's region (another variant's, in a larger region).
  EXPECT_EQ(s.TimeToNextUse(7, 10), PlanSchedule::kNever);
}

TEST(PlanScheduleTest, WithoutAPeriodAPlannedGranuleIsAlwaysNeeded) {
  RuntimePlan plan = GranulePlan();
  plan.period = 0;
  plan.region_bytes = 5 * kG;
  const PlanSchedule s(plan, kG);
  // Not cyclic: nothing says when a used granule is free again.
  EXPECT_EQ(s.TimeToNextUse(0, 50), 0);
  EXPECT_EQ(s.TimeToNextUse(2, 0), 0);
  EXPECT_EQ(s.TimeToNextUse(4, 10), PlanSchedule::kNever);
  EXPECT_EQ(s.TimeToNextUse(2, 0, /*in_setup=*/true), 60);
}

}  // namespace
}  // namespace loom::vmm

namespace loom::vmm {
namespace {

TEST(PlanScheduleTest, RangeIdleSeesEveryOccupantOfTheBytesInTheWindow) {
  const PlanSchedule s(Plan(), 1024);
  // A [0, 1024) busy in [0, 50); B [1024, 2048) in [40, 90).
  EXPECT_TRUE(s.RangeIdle(1024, 512, 0, 40));   // before B starts
  EXPECT_FALSE(s.RangeIdle(1024, 512, 0, 41));  // meets B
  EXPECT_FALSE(s.RangeIdle(512, 1024, 10, 20));  // A's tail
  EXPECT_TRUE(s.RangeIdle(512, 1024, 95, 99));   // A and B both idle then...
  // ...but not C, which wraps to [0, 20) over [2048, 3072).
  EXPECT_FALSE(s.RangeIdle(2048, 10, 95, 105));
  // P is persistent; past the region nothing is idle.
  EXPECT_FALSE(s.RangeIdle(3072, 10, 0, 1));
  EXPECT_TRUE(s.RangeIdle(3584, 512, 0, 99));
  EXPECT_FALSE(s.RangeIdle(3584, 1024, 0, 99));
}

}  // namespace
}  // namespace loom::vmm
