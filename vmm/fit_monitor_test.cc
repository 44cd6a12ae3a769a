// FitMonitor: a plan is suspended once most of a window of requests missed,
// never before kMinRecords of the iteration, and resumes each iteration.
#include "vmm/fit_monitor.h"

#include <gtest/gtest.h>

namespace loom::vmm {
namespace {

TEST(FitMonitorTest, AFittingPlanIsNeverSuspended) {
  FitMonitor m;
  for (int iteration = 0; iteration < 5; ++iteration) {
    m.IterationBegin();
    // One miss in ten stays above the threshold.
    for (int i = 0; i < 1000; ++i) EXPECT_FALSE(m.Record(i % 10 != 0));
    EXPECT_FALSE(m.suspended());
  }
  EXPECT_EQ(m.suspensions(), 0u);
  EXPECT_EQ(m.suspended_iterations(), 0u);
}

TEST(FitMonitorTest, AForeignPlanIsSuspendedAfterTheFirstRecords) {
  FitMonitor m;
  m.IterationBegin();
  for (uint32_t i = 1; i < FitMonitor::kMinRecords; ++i) {
    EXPECT_FALSE(m.Record(false)) << "judged too early, at " << i;
  }
  EXPECT_TRUE(m.Record(false));
  EXPECT_TRUE(m.suspended());
  EXPECT_FALSE(m.Record(false)) << "suspends once";
  EXPECT_EQ(m.suspensions(), 1u);
  // The next iteration gets another chance; the suspended one is counted.
  m.IterationBegin();
  EXPECT_FALSE(m.suspended());
  EXPECT_TRUE(m.last_iteration_suspended());
  EXPECT_EQ(m.suspended_iterations(), 1u);
  for (int i = 0; i < 100; ++i) m.Record(true);
  m.IterationBegin();
  EXPECT_FALSE(m.last_iteration_suspended());
  EXPECT_EQ(m.suspended_iterations(), 1u);
}

TEST(FitMonitorTest, TheWindowForgetsOldHits) {
  FitMonitor m;
  m.IterationBegin();
  for (int i = 0; i < 500; ++i) ASSERT_FALSE(m.Record(true));
  // A run of misses suspends as soon as the window's hit rate drops below
  // the threshold: 64 * (1 - 0.875) = 8 misses are tolerated.
  int misses = 0;
  while (!m.Record(false)) ++misses;
  EXPECT_EQ(misses, 8);
}

TEST(FitMonitorTest, AFewEarlyMissesDoNotSuspend) {
  FitMonitor m;
  m.IterationBegin();
  // 13 hits, then 4 misses: 76% of 17 requests, but only 4 misses.
  for (int i = 0; i < 13; ++i) ASSERT_FALSE(m.Record(true));
  for (uint32_t i = 0; i + 1 < FitMonitor::kMinMisses; ++i) {
    ASSERT_FALSE(m.Record(false));
  }
  EXPECT_FALSE(m.suspended());
  // Another shape: misses keep coming; the kMinMisses-th suspends.
  EXPECT_TRUE(m.Record(false));
}

TEST(FitMonitorTest, AShortWindowIsJudgedOnWhatItHolds) {
  FitMonitor m;
  m.IterationBegin();
  // 32 records, 5 misses: 27/32 = 0.84 < 0.875.
  for (int i = 0; i < 27; ++i) ASSERT_FALSE(m.Record(true));
  for (int i = 0; i < 4; ++i) ASSERT_FALSE(m.Record(false));
  EXPECT_TRUE(m.Record(false));
}

}  // namespace
}  // namespace loom::vmm
