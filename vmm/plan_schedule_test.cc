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
  EXPECT_EQ(PlanSchedule(Plan()).occupants(), 4u);
}

TEST(PlanScheduleTest, IdleBytesDependOnTheTimeWindow) {
  const PlanSchedule s(Plan());
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
  const PlanSchedule s(Plan());
  EXPECT_EQ(s.IdleRanges(512, 10, -1, 8), std::vector<uint64_t>{3584});
  EXPECT_EQ(s.IdleRanges(512, 10, 110, 8), std::vector<uint64_t>{3584});
  EXPECT_TRUE(s.IdleRanges(1024, 10, -1, 8).empty());
}

TEST(PlanScheduleTest, OffsetsAreAlignedAndInsideTheirGap) {
  const PlanSchedule s(Plan());
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

}  // namespace
}  // namespace loom::vmm
