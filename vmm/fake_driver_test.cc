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

TEST(FakeDriverTest, InjectedFailureHitsTheNthCallOnly) {
  FakeDriver d(SmallDevice());
  d.InjectFailure(DriverOp::kCreate, 2, OutOfMemoryError("injected"));
  PhysicalHandle first = *d.Create(0, kG);
  StatusOr<PhysicalHandle> second = d.Create(0, kG);
  EXPECT_EQ(second.status().ToString(), "OUT_OF_MEMORY: injected");
  PhysicalHandle third = *d.Create(0, kG);
  EXPECT_EQ(d.contract_counts().handles, 2u);
  EXPECT_TRUE(d.Release(first).ok());
  EXPECT_TRUE(d.Release(third).ok());
}

TEST(FakeDriverTest, FailedMapLeavesNothingBehind) {
  FakeDriver d(SmallDevice());
  DevicePtr va = *d.Reserve(kG);
  PhysicalHandle h = *d.Create(0, kG);
  d.InjectFailure(DriverOp::kMap, 1, InternalError("map broke"));
  EXPECT_EQ(d.Map(va, kG, h).code(), StatusCode::kInternal);
  EXPECT_EQ(d.contract_counts().mappings, 0u);
  // Nothing is mapped, so the handle and the reservation can go.
  EXPECT_TRUE(d.Release(h).ok());
  EXPECT_TRUE(d.Unreserve(va, kG).ok());
  EXPECT_EQ(d.contract_counts().handles, 0u);
}

TEST(FakeDriverTest, FailAlwaysUntilCleared) {
  FakeDriver d(SmallDevice());
  d.FailAlways(DriverOp::kReserve, UnavailableError("gone"));
  EXPECT_FALSE(d.Reserve(kG).ok());
  EXPECT_FALSE(d.Reserve(kG).ok());
  d.ClearFailures();
  DevicePtr va = *d.Reserve(kG);
  EXPECT_TRUE(d.Unreserve(va, kG).ok());
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
