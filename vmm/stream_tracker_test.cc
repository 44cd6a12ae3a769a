// StreamTracker: frees are released to other streams only once the work
// queued before them has completed; one stream pays no event.
#include "vmm/stream_tracker.h"

#include <gtest/gtest.h>

#include "vmm/fake_driver.h"

namespace loom::vmm {
namespace {

constexpr Stream kA = 0;
constexpr Stream kB = 0x5eed00000001;

class StreamTrackerTest : public ::testing::Test {
 protected:
  StreamTrackerTest() { driver_.set_events_complete_immediately(false); }
  FakeDriver driver_;
};

TEST_F(StreamTrackerTest, OneStreamRecordsNoEventsAndNoFences) {
  StreamTracker t(driver_, 0);
  EXPECT_TRUE(t.Use(kA).empty());
  for (int i = 0; i < 100; ++i) {
    const FreeTag tag = t.Released(kA);
    EXPECT_EQ(tag.epoch, 0u);  // nothing to fence per page
    EXPECT_TRUE(t.Ready(tag, kA));
  }
  EXPECT_FALSE(t.multi_stream());
  EXPECT_EQ(driver_.calls(DriverOp::kRecordEvent), 0u);
  // But unmapping must wait: those frees' kernels may still be queued.
  EXPECT_TRUE(t.NeedsWaitForUnmap());
  ASSERT_TRUE(t.WaitForAll(WaitSite::kEmptyCache).ok());
  EXPECT_FALSE(t.NeedsWaitForUnmap());
}

TEST_F(StreamTrackerTest, OtherStreamWaitsForTheEventOfTheFree) {
  StreamTracker t(driver_, 0);
  t.Use(kA);
  t.Released(kA);  // single-stream: no event, no fence
  // The second stream closes A's open epoch with a checkpoint, and returns
  // its tag: the allocator fences every page with it.
  std::vector<FreeTag> closing = t.Use(kB);
  ASSERT_EQ(closing.size(), 1u);
  const FreeTag before = closing[0];
  EXPECT_EQ(before.stream, kA);
  EXPECT_TRUE(t.multi_stream());
  EXPECT_FALSE(t.NeedsWaitForUnmap());  // fences describe it now
  EXPECT_EQ(driver_.calls(DriverOp::kRecordEvent), 1u);
  const FreeTag after = t.Released(kA);  // recorded at the free
  EXPECT_EQ(driver_.calls(DriverOp::kRecordEvent), 2u);
  t.NewCall();
  EXPECT_FALSE(t.Ready(before, kB));
  EXPECT_FALSE(t.Ready(after, kB));
  EXPECT_TRUE(t.Ready(after, kA));
  driver_.CompleteEvents();
  t.NewCall();
  EXPECT_TRUE(t.Ready(before, kB));
  EXPECT_TRUE(t.Ready(after, kB));
  EXPECT_TRUE(t.Complete(after));
}

TEST_F(StreamTrackerTest, QueriesOncePerCallWhileNotDone) {
  StreamTracker t(driver_, 0);
  t.Use(kA);
  t.Use(kB);
  const FreeTag tag = t.Released(kA);
  t.NewCall();
  const uint64_t queries = driver_.calls(DriverOp::kQueryEvent);
  for (int i = 0; i < 10; ++i) EXPECT_FALSE(t.Ready(tag, kB));
  EXPECT_EQ(driver_.calls(DriverOp::kQueryEvent), queries + 1);
  t.NewCall();
  EXPECT_FALSE(t.Ready(tag, kB));
  EXPECT_EQ(driver_.calls(DriverOp::kQueryEvent), queries + 2);
}

TEST_F(StreamTrackerTest, WaitForAllSynchronisesOnlyWhenSomethingIsPending) {
  StreamTracker t(driver_, 0);
  t.Use(kA);
  t.Use(kB);
  EXPECT_TRUE(t.WaitForAll(WaitSite::kEmptyCache).ok());
  EXPECT_EQ(t.device_syncs(), 0u);  // nothing freed yet
  driver_.InjectFailure(DriverOp::kRecordEvent, 1, InternalError("no event"));
  const FreeTag tag = t.Released(kA);  // no event covers it
  EXPECT_FALSE(t.Complete(tag));
  EXPECT_TRUE(t.WaitForAll(WaitSite::kEmptyCache).ok());
  EXPECT_EQ(t.device_syncs(), 1u);
  EXPECT_TRUE(t.Complete(tag));
  EXPECT_TRUE(t.WaitForAll(WaitSite::kEmptyCache).ok());
  EXPECT_EQ(t.device_syncs(), 1u);  // nothing new since
  // A later free is a new epoch: not covered by the earlier wait.
  const FreeTag later = t.Released(kA);
  t.NewCall();
  EXPECT_FALSE(t.Complete(later));
}

TEST_F(StreamTrackerTest, BoundedCheckpointsStillCoverEveryFree) {
  StreamTracker t(driver_, 0);
  t.Use(kA);
  t.Use(kB);
  std::vector<FreeTag> tags;
  for (int i = 0; i < 50; ++i) tags.push_back(t.Released(kA));
  t.NewCall();
  for (const FreeTag& tag : tags) EXPECT_FALSE(t.Ready(tag, kB));
  driver_.CompleteEvents();
  t.NewCall();
  for (const FreeTag& tag : tags) EXPECT_TRUE(t.Ready(tag, kB));
}

TEST_F(StreamTrackerTest, FailedEventRecordKeepsTheFreeUnreleased) {
  StreamTracker t(driver_, 0);
  t.Use(kA);
  t.Use(kB);
  driver_.InjectFailure(DriverOp::kRecordEvent, 1,
                        InternalError("injected record failure"));
  const FreeTag tag = t.Released(kA);
  driver_.CompleteEvents();
  t.NewCall();
  EXPECT_FALSE(t.Ready(tag, kB));  // no event covers it: never assumed done
  ASSERT_TRUE(t.WaitForAll(WaitSite::kEmptyCache)
                  .ok());  // the device-wide wait releases it
  EXPECT_TRUE(t.Ready(tag, kB));
}

TEST_F(StreamTrackerTest, WaitsAreCountedByTheirSite) {
  StreamTracker t(driver_, 0);
  t.Use(kA);
  t.Released(kA);
  t.Use(kB);       // closes A's epoch: a second-stream checkpoint
  t.Released(kA);  // a free's checkpoint
  t.Released(kB);  // another
  driver_.CompleteEvents();
  t.NewCall();
  ASSERT_TRUE(t.WaitForAll(WaitSite::kPlanInstall).ok());
  const WaitCounters& w = t.waits();
  EXPECT_EQ(w.Get(WaitSite::kSecondStream, WaitKind::kEventRecord), 1u);
  EXPECT_EQ(w.Get(WaitSite::kFree, WaitKind::kEventRecord), 2u);
  EXPECT_EQ(w.Get(WaitSite::kPlanInstall, WaitKind::kEventRecord), 0u);
  // Events cover every free and have completed: no synchronisation.
  EXPECT_EQ(w.Total(WaitKind::kDeviceSync), 0u);
  EXPECT_EQ(t.events_recorded(), driver_.calls(DriverOp::kRecordEvent));
  // A free no event covers: the next wait synchronises the device, counted
  // at the site that waited.
  driver_.InjectFailure(DriverOp::kRecordEvent, 1, InternalError("no event"));
  t.Released(kB);
  ASSERT_TRUE(t.WaitForAll(WaitSite::kReclaim).ok());
  EXPECT_EQ(w.Get(WaitSite::kReclaim, WaitKind::kDeviceSync), 1u);
  EXPECT_EQ(t.device_syncs(), 1u);
  EXPECT_EQ(t.device_syncs(), driver_.calls(DriverOp::kSynchronizeDevice));
  EXPECT_EQ(WaitSiteName(WaitSite::kReclaim), "reclaim");
  EXPECT_EQ(WaitKindName(WaitKind::kDeviceSync), "device_syncs");
}

}  // namespace
}  // namespace loom::vmm
