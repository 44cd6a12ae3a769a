#include "vmm/fake_driver.h"

#include <gtest/gtest.h>

namespace loom::vmm {
namespace {

constexpr uint64_t kG = 64 << 10;

FakeDriverOptions SmallDevice() {
  FakeDriverOptions options;
  options.granularity = kG;
  options.capacity_per_device = 4 * kG;
  return options;
}

TEST(FakeDriverTest, CapacityIsEnforcedAndReleasedBytesCanBeReused) {
  FakeDriver d(SmallDevice());
  PhysicalHandle a = *d.Create(0, 3 * kG);
  StatusOr<PhysicalHandle> b = d.Create(0, 2 * kG);
  EXPECT_EQ(b.status().code(), StatusCode::kOutOfMemory);
  EXPECT_EQ(d.Properties(0)->free_bytes, kG);
  ASSERT_TRUE(d.Release(a).ok());
  b = d.Create(0, 4 * kG);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(d.physical_bytes(), 4 * kG);
  ASSERT_TRUE(d.Release(*b).ok());
  EXPECT_EQ(d.calls(DriverOp::kCreate), 3u);  // the failed one counts too
}

TEST(FakeDriverTest, PendingEventsCompleteOnDemand) {
  FakeDriver d(SmallDevice());
  d.set_events_complete_immediately(false);
  Stream s = *d.CreateStream(0);
  Event e = *d.CreateEvent(0);
  ASSERT_TRUE(d.RecordEvent(e, s).ok());
  EXPECT_FALSE(*d.QueryEvent(e));
  EXPECT_EQ(d.pending_events(), 1u);
  ASSERT_TRUE(d.SynchronizeStream(s).ok());
  EXPECT_TRUE(*d.QueryEvent(e));
  ASSERT_TRUE(d.RecordEvent(e, s).ok());
  EXPECT_FALSE(*d.QueryEvent(e));
  d.CompleteEvents();
  EXPECT_TRUE(*d.QueryEvent(e));
  ASSERT_TRUE(d.DestroyEvent(e).ok());
  ASSERT_TRUE(d.DestroyStream(s).ok());
}

TEST(FakeDriverTest, AddressesAreDistinctAndAligned) {
  FakeDriver d(SmallDevice());
  DevicePtr a = *d.Reserve(kG, 16 * kG);
  DevicePtr b = *d.Reserve(kG);
  EXPECT_EQ(a % (16 * kG), 0u);
  EXPECT_GE(b, a + kG);
  EXPECT_TRUE(d.Unreserve(a, kG).ok());
  EXPECT_TRUE(d.Unreserve(b, kG).ok());
}

}  // namespace
}  // namespace loom::vmm
