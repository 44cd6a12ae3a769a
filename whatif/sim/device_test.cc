#include "whatif/sim/device.h"

#include <gtest/gtest.h>

#include "whatif/sim/stats.h"

namespace loom::whatif {
namespace {

TEST(SimDeviceTest, AscendingMallocIsFirstFitAndAligned) {
  SimDevice device(100 * kMiB, AddressOrder::kAscending);
  auto a = device.Malloc(3 * kMiB);  // occupies 4 MiB of address space
  auto b = device.Malloc(2 * kMiB);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(*a % SimDevice::kAddressAlignment, 0u);
  EXPECT_EQ(*b, *a + 4 * kMiB);
  EXPECT_EQ(device.physical_used(), 5 * kMiB);
  device.Free(*a, 3 * kMiB);
  auto c = device.Malloc(kMiB);  // reuses the lowest free range
  ASSERT_TRUE(c);
  EXPECT_EQ(*c, *a);
  EXPECT_EQ(device.calls().malloc, 3u);
  EXPECT_EQ(device.calls().free, 1u);
}

TEST(SimDeviceTest, CapacityLimitsPhysicalMemory) {
  SimDevice device(10 * kMiB);
  EXPECT_TRUE(device.Malloc(6 * kMiB));
  EXPECT_FALSE(device.Malloc(6 * kMiB));  // 12 > 10
  EXPECT_TRUE(device.CreateHandle(4 * kMiB));
  EXPECT_FALSE(device.CreateHandle(kMiB));
  EXPECT_EQ(device.physical_used(), 10 * kMiB);
  device.ReleaseHandle(4 * kMiB);
  EXPECT_EQ(device.physical_free(), 4 * kMiB);
  EXPECT_EQ(device.calls().mem_create, 2u);
  EXPECT_EQ(device.calls().malloc, 2u);  // failed calls count too
}

TEST(SimDeviceTest, DescendingMallocTakesTheTopOfTheHighestFit) {
  SimDevice device(100 * kMiB);      // descending by default
  auto a = device.Malloc(3 * kMiB);  // occupies 4 MiB of address space
  auto b = device.Malloc(2 * kMiB);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(*a % SimDevice::kAddressAlignment, 0u);
  EXPECT_EQ(*b, *a - 2 * kMiB);  // just below the first
  device.Free(*a, 3 * kMiB);
  auto c = device.Malloc(kMiB);  // the top of the highest free range
  ASSERT_TRUE(c);
  EXPECT_EQ(*c, *a + 2 * kMiB);
  auto d = device.Malloc(2 * kMiB);  // fills the rest of that hole
  ASSERT_TRUE(d);
  EXPECT_EQ(*d, *a);
  auto e = device.Malloc(2 * kMiB);  // then below everything
  ASSERT_TRUE(e);
  EXPECT_EQ(*e, *b - 2 * kMiB);
  device.Free(*b, 2 * kMiB);
  device.Free(*c, kMiB);
  device.Free(*d, 2 * kMiB);
  device.Free(*e, 2 * kMiB);
  EXPECT_EQ(device.physical_used(), 0u);
}

TEST(SimDeviceTest, AddressOrderNames) {
  EXPECT_EQ(*ParseAddressOrder("descending"), AddressOrder::kDescending);
  EXPECT_EQ(*ParseAddressOrder("ascending"), AddressOrder::kAscending);
  EXPECT_EQ(AddressOrderName(AddressOrder::kAscending), "ascending");
  StatusOr<AddressOrder> bad = ParseAddressOrder("up");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'up'"), std::string::npos);
}

TEST(SimDeviceTest, ReservationsDoNotTakePhysicalMemory) {
  SimDevice device(2 * kMiB, AddressOrder::kAscending);
  auto va = device.ReserveAddress(kGiB);
  ASSERT_TRUE(va);
  EXPECT_EQ(device.physical_used(), 0u);
  auto second = device.ReserveAddress(kGiB);
  ASSERT_TRUE(second);
  EXPECT_EQ(*second, *va + kGiB);
  device.FreeAddress(*va, kGiB);
  device.FreeAddress(*second, kGiB);
  auto again = device.ReserveAddress(2 * kGiB);  // coalesced free space
  ASSERT_TRUE(again);
  EXPECT_EQ(*again, *va);
  EXPECT_EQ(device.calls().address_reserve, 3u);
  EXPECT_EQ(device.calls().address_free, 2u);
}

TEST(SimDeviceTest, UnlimitedByDefault) {
  SimDevice device;
  EXPECT_TRUE(device.unlimited());
  EXPECT_TRUE(device.Malloc(uint64_t{1} << 45));
}

TEST(StatsTest, IncreaseDecreaseFollowPyTorch) {
  StatArray array;
  array.Increase(/*small_pool=*/true, 10);
  array.Increase(/*small_pool=*/false, 5);
  array.Decrease(/*small_pool=*/true, 10);
  EXPECT_EQ(array.all().current, 5);
  EXPECT_EQ(array.all().peak, 15);
  EXPECT_EQ(array.all().allocated, 15);
  EXPECT_EQ(array.all().freed, 10);
  EXPECT_EQ(array[StatType::kSmallPool].peak, 10);
  EXPECT_EQ(array[StatType::kLargePool].current, 5);
  array.ResetPeak();
  EXPECT_EQ(array.all().peak, 5);
}

TEST(StatsTest, FlattenUsesMemoryStatsKeys) {
  MemoryStats stats;
  stats.allocated_bytes.Increase(false, 4096);
  stats.num_device_alloc = 3;
  auto flat = stats.Flatten();
  auto find = [&](const std::string& key) -> int64_t {
    for (const auto& [k, v] : flat) {
      if (k == key) return v;
    }
    ADD_FAILURE() << "missing key " << key;
    return 0;
  };
  EXPECT_EQ(find("allocated_bytes.all.current"), 4096);
  EXPECT_EQ(find("allocated_bytes.large_pool.peak"), 4096);
  EXPECT_EQ(find("allocation.all.current"), 0);  // the real key, not
                                                 // "allocated.*"
  EXPECT_EQ(find("num_device_alloc"), 3);
  EXPECT_EQ(find("max_split_size"), -1);
  EXPECT_EQ(find("oversize_segments.peak"), 0);
  // 9 arrays x 3 pools x 4 + 2 single stats x 4 + 6 scalars.
  EXPECT_EQ(flat.size(), 9u * 3 * 4 + 2 * 4 + 6);
  EXPECT_TRUE(std::is_sorted(flat.begin(), flat.end()));
}

TEST(StatsTest, DriverCallsTotalExcludesSynchronize) {
  DriverCalls calls;
  calls.mem_map = 3;
  calls.mem_create = 3;
  calls.set_access = 1;
  calls.synchronize = 7;
  EXPECT_EQ(calls.total(), 7u);
  EXPECT_EQ(calls.Named().size(), 10u);
}

}  // namespace
}  // namespace loom::whatif
