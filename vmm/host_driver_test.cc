#include "vmm/host_driver.h"

#include <gtest/gtest.h>

#include <vector>

namespace loom::vmm {
namespace {

constexpr uint64_t kG = 64 << 10;

std::unique_ptr<HostDriver> Make(uint64_t capacity = 64 * kG) {
  HostDriverOptions options;
  options.granularity = kG;
  options.capacity_per_device = capacity;
  StatusOr<std::unique_ptr<HostDriver>> d = HostDriver::Open(options);
  LOOM_CHECK(d.ok(), "{}", d.status().ToString());
  return std::move(d).value();
}

TEST(HostDriverTest, RejectsImpossibleOptions) {
  HostDriverOptions options;
  options.granularity = 1000;
  EXPECT_EQ(HostDriver::Open(options).status().code(),
            StatusCode::kInvalidArgument);
  options.granularity = kG;
  options.device_count = 0;
  EXPECT_FALSE(HostDriver::Open(options).ok());
}

TEST(HostDriverTest, ReleasePunchesTheMemoryOut) {
  auto d = Make();
  DevicePtr va = *d->Reserve(8 * kG);
  PhysicalHandle h = *d->Create(0, 8 * kG);
  ASSERT_TRUE(d->Map(va, 8 * kG, h).ok());
  ASSERT_TRUE(d->SetAccess(va, 8 * kG, 0).ok());
  uint64_t before = *d->ResidentBytes();
  ASSERT_TRUE(d->Memset(va, 0xAB, 8 * kG).ok());
  EXPECT_GE(*d->ResidentBytes(), before + 8 * kG);
  ASSERT_TRUE(d->Unmap(va, 8 * kG).ok());
  ASSERT_TRUE(d->Release(h).ok());
  EXPECT_LE(*d->ResidentBytes(), before);
  // A new handle over the same file range reads zeros: no data leaks from
  // one allocation's physical memory to the next.
  PhysicalHandle fresh = *d->Create(0, 8 * kG);
  ASSERT_TRUE(d->Map(va, 8 * kG, fresh).ok());
  ASSERT_TRUE(d->SetAccess(va, 8 * kG, 0).ok());
  std::vector<uint8_t> bytes(8 * kG, 0xFF);
  ASSERT_TRUE(d->CopyToHost(bytes.data(), va, bytes.size()).ok());
  for (uint8_t b : bytes) ASSERT_EQ(b, 0);
  ASSERT_TRUE(d->Unmap(va, 8 * kG).ok());
  ASSERT_TRUE(d->Release(fresh).ok());
  ASSERT_TRUE(d->Unreserve(va, 8 * kG).ok());
}

TEST(HostDriverTest, OutOfMemoryAtCapacityAndAfterFragmentation) {
  auto d = Make(4 * kG);
  std::vector<PhysicalHandle> handles;
  for (int i = 0; i < 4; ++i) handles.push_back(*d->Create(0, kG));
  EXPECT_EQ(d->Create(0, kG).status().code(), StatusCode::kOutOfMemory);
  // Free every other one: 2 granules free but not adjacent in the file;
  // a 2-granule handle must still be possible.
  ASSERT_TRUE(d->Release(handles[0]).ok());
  ASSERT_TRUE(d->Release(handles[2]).ok());
  StatusOr<PhysicalHandle> two = d->Create(0, 2 * kG);
  ASSERT_TRUE(two.ok()) << two.status().ToString();
  ASSERT_TRUE(d->Release(*two).ok());
  ASSERT_TRUE(d->Release(handles[1]).ok());
  ASSERT_TRUE(d->Release(handles[3]).ok());
}

TEST(HostDriverTest, UnmappedAddressesAreInaccessibleAgain) {
  auto d = Make();
  DevicePtr va = *d->Reserve(kG);
  PhysicalHandle h = *d->Create(0, kG);
  ASSERT_TRUE(d->Map(va, kG, h).ok());
  ASSERT_TRUE(d->SetAccess(va, kG, 0).ok());
  ASSERT_TRUE(d->Unmap(va, kG).ok());
  // The reservation is PROT_NONE again: touching it must fault.
  EXPECT_DEATH(*reinterpret_cast<volatile char*>(va) = 1, "");
  ASSERT_TRUE(d->Release(h).ok());
  ASSERT_TRUE(d->Unreserve(va, kG).ok());
}

TEST(HostDriverTest, SeveralDevicesHaveSeparateBudgets) {
  HostDriverOptions options;
  options.granularity = kG;
  options.device_count = 2;
  options.capacity_per_device = 2 * kG;
  auto d = std::move(HostDriver::Open(options)).value();
  PhysicalHandle a = *d->Create(0, 2 * kG);
  PhysicalHandle b = *d->Create(1, 2 * kG);
  EXPECT_FALSE(d->Create(0, kG).ok());
  EXPECT_FALSE(d->Create(2, kG).ok());
  ASSERT_TRUE(d->Release(a).ok());
  ASSERT_TRUE(d->Release(b).ok());
}

}  // namespace
}  // namespace loom::vmm
