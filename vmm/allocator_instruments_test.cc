// The allocator's instruments (issue 21): what it did that can make the GPU
// or the host wait, by call site, and how its physical memory is laid out
// (handles and mappings by handle size), on real memory (host backend).
#include <gtest/gtest.h>

#include <vector>

#include "vmm/allocator.h"
#include "vmm/host_driver.h"
#include "vmm/stack_plan_testing.h"

namespace loom::vmm {
namespace {

constexpr uint64_t kG = 64 << 10;
constexpr Stream kOther = 0x5eed00000001;

std::unique_ptr<HostDriver> Host() {
  HostDriverOptions options;
  options.granularity = kG;
  options.capacity_per_device = 512 * kG;
  return std::move(HostDriver::Open(options)).value();
}

std::unique_ptr<Allocator> Make(Driver& driver,
                                uint32_t max_chunk_pages = 512) {
  AllocatorOptions options;
  options.arena_va_bytes = 1024 * kG;
  options.max_chunk_pages = max_chunk_pages;
  return std::move(Allocator::Create(driver, options)).value();
}

// A stack of `n` buffers of `unit` bytes, all live during [i, 2n - i).
RuntimePlan StackPlan(uint64_t unit, int n) {
  return test_plans::StackPlan(unit, n, kG);
}

// One iteration: the planned stack on stream 0 and, beside it, `extra`
// unplanned buffers on `extra_stream` (a side stream's work).
void RunIteration(Allocator& a, uint64_t number, int extra = 0,
                  Stream extra_stream = 0) {
  a.IterationBegin(number);
  std::vector<DevicePtr> live;
  for (int i = 0; i < 12; ++i) {
    StatusOr<DevicePtr> p = a.Allocate(3 * kG, 0);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    live.push_back(*p);
  }
  std::vector<DevicePtr> side;
  for (int i = 0; i < extra; ++i) {
    StatusOr<DevicePtr> p = a.Allocate(kG + 100, extra_stream);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    side.push_back(*p);
  }
  for (DevicePtr p : side) ASSERT_TRUE(a.Free(p).ok());
  for (auto it = live.rbegin(); it != live.rend(); ++it) {
    ASSERT_TRUE(a.Free(*it).ok());
  }
  a.IterationEnd(number);
}

uint64_t Syncs(const Driver& d) {
  return d.calls(DriverOp::kSynchronizeDevice) +
         d.calls(DriverOp::kSynchronizeStream) +
         d.calls(DriverOp::kSynchronizeEvent) +
         d.calls(DriverOp::kStreamWaitEvent);
}

TEST(AllocatorInstrumentsTest, SteadyIterationsWaitForNothing) {
  auto d = Host();
  auto a = Make(*d);
  ASSERT_TRUE(a->LoadPlan(StackPlan(3 * kG, 12)).ok());
  uint64_t n = 0;
  for (int i = 0; i < 2; ++i) RunIteration(*a, n++);  // warm-up
  const AllocatorStats before = a->stats();
  const uint64_t syncs = Syncs(*d);
  const uint64_t events = d->calls(DriverOp::kRecordEvent);
  for (int i = 0; i < 5; ++i) RunIteration(*a, n++);
  const AllocatorStats after = a->stats();
  EXPECT_EQ(after.plan_hits - before.plan_hits, 5u * 12);
  // One stream: no event, no synchronisation of any kind, at any site.
  EXPECT_EQ(Syncs(*d), syncs);
  EXPECT_EQ(d->calls(DriverOp::kRecordEvent), events);
  EXPECT_EQ(after.waits.counts, before.waits.counts);
}

TEST(AllocatorInstrumentsTest, ASideStreamRecordsEventsButNeverSynchronises) {
  auto d = Host();
  auto a = Make(*d);
  ASSERT_TRUE(a->LoadPlan(StackPlan(3 * kG, 12)).ok());
  uint64_t n = 0;
  for (int i = 0; i < 2; ++i) RunIteration(*a, n++, 4, kOther);
  const AllocatorStats before = a->stats();
  const uint64_t syncs = Syncs(*d);
  for (int i = 0; i < 5; ++i) RunIteration(*a, n++, 4, kOther);
  const AllocatorStats after = a->stats();
  EXPECT_EQ(Syncs(*d), syncs) << "a synchronisation in steady state";
  EXPECT_EQ(after.waits.Total(WaitKind::kDeviceSync),
            before.waits.Total(WaitKind::kDeviceSync));
  EXPECT_EQ(after.waits.Total(WaitKind::kStreamSync),
            before.waits.Total(WaitKind::kStreamSync));
  // Several streams: each free closes its stream's epoch with an event,
  // counted at the free (16 frees per iteration), and nowhere else.
  EXPECT_EQ(after.waits.Get(WaitSite::kFree, WaitKind::kEventRecord) -
                before.waits.Get(WaitSite::kFree, WaitKind::kEventRecord),
            5u * 16);
  EXPECT_EQ(after.waits.Total(WaitKind::kEventRecord) -
                before.waits.Total(WaitKind::kEventRecord),
            5u * 16);
  EXPECT_EQ(after.waits.Total(WaitKind::kEventRecord),
            d->calls(DriverOp::kRecordEvent));
}

TEST(AllocatorInstrumentsTest, EmptyCacheWaitsAreCountedAtEmptyCache) {
  auto d = Host();
  auto a = Make(*d);
  StatusOr<DevicePtr> p = a->Allocate(5 * kG, 0);
  ASSERT_TRUE(p.ok());
  ASSERT_TRUE(a->Free(*p).ok());
  ASSERT_TRUE(a->EmptyCache().ok());
  const AllocatorStats s = a->stats();
  EXPECT_EQ(s.waits.Get(WaitSite::kEmptyCache, WaitKind::kDeviceSync), 1u);
  EXPECT_EQ(s.waits.Total(WaitKind::kDeviceSync), 1u);
  EXPECT_EQ(d->calls(DriverOp::kSynchronizeDevice), 1u);
  const std::string json = s.ToJson();
  EXPECT_NE(json.find("\"loom.waits.empty_cache.device_syncs\":1"),
            std::string::npos)
      << json;
  EXPECT_NE(json.find("\"loom.waits.free.events\":0"), std::string::npos);
}

TEST(AllocatorInstrumentsTest, LayoutCountsHandlesAndMappingsBySize) {
  for (uint32_t max_chunk_pages : {512u, 1u}) {
    SCOPED_TRACE(max_chunk_pages);
    auto d = Host();
    auto a = Make(*d, max_chunk_pages);
    StatusOr<DevicePtr> p = a->Allocate(5 * kG, 0);  // 5 granules
    ASSERT_TRUE(p.ok());
    StatusOr<DevicePtr> q = a->Allocate(kG, 0);  // 1 more
    ASSERT_TRUE(q.ok());
    const MappingLayout layout = a->stats().layout;
    EXPECT_EQ(layout.handle_bytes, 6 * kG);
    EXPECT_EQ(layout.mapped_bytes, 6 * kG);
    const std::string json = a->stats().ToJson();
    if (max_chunk_pages == 1) {
      // One granule per handle: six handles, six mappings, all of 64 KiB.
      EXPECT_EQ(layout.handles, 6u);
      EXPECT_EQ(layout.mappings, 6u);
      ASSERT_EQ(layout.by_handle_size.size(), 1u);
      EXPECT_EQ(layout.by_handle_size.at(kG).handles, 6u);
      EXPECT_NE(json.find("\"loom.layout.handle_size.64KiB.handles\":6"),
                std::string::npos)
          << json;
    } else {
      // One handle per request stretch: 5 granules (bucket 512 KiB) and 1.
      EXPECT_EQ(layout.handles, 2u);
      EXPECT_EQ(layout.mappings, 2u);
      EXPECT_EQ(layout.by_handle_size.at(8 * kG).handles, 1u);
      EXPECT_EQ(layout.by_handle_size.at(8 * kG).bytes, 5 * kG);
      EXPECT_EQ(layout.by_handle_size.at(kG).handles, 1u);
      EXPECT_NE(json.find("\"loom.layout.handle_size.512KiB.bytes\":327680"),
                std::string::npos)
          << json;
    }
    ASSERT_TRUE(a->Free(*p).ok());
    ASSERT_TRUE(a->Free(*q).ok());
  }
}

TEST(AllocatorInstrumentsTest, TheLargestHandleIsChecked) {
  auto d = Host();
  AllocatorOptions options;
  options.max_chunk_pages = 0;
  EXPECT_EQ(Allocator::Create(*d, options).status().code(),
            StatusCode::kInvalidArgument);
  options.max_chunk_pages = 513;
  EXPECT_EQ(Allocator::Create(*d, options).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(AllocatorInstrumentsTest, SizeNamesAreExact) {
  EXPECT_EQ(SizeName(2 << 20), "2MiB");
  EXPECT_EQ(SizeName(uint64_t{1} << 30), "1GiB");
  EXPECT_EQ(SizeName(3 << 10), "3KiB");
  EXPECT_EQ(SizeName(1000), "1000B");
  EXPECT_EQ(SizeName(0), "0B");
}

}  // namespace
}  // namespace loom::vmm
