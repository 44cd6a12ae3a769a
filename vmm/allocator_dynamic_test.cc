// Dynamic requests with a home: a plan's slots for the requests of dynamic
// windows (RuntimePlan's DynamicWindow::requests). The n-th request of a
// window in an iteration is served at its slot when it fits, by the dynamic
// space otherwise; real memory (host backend), every allocation stamped and
// checked at its free.
#include <gtest/gtest.h>

#include <vector>

#include "vmm/allocator.h"
#include "vmm/allocator_testing.h"
#include "vmm/host_driver.h"
#include "vmm/lending_policy.h"

namespace loom::vmm {
namespace {

constexpr uint64_t kG = 64 << 10;

std::unique_ptr<HostDriver> Host() {
  return test_support::HostForTest(kG, 512 * kG);
}

std::unique_ptr<Allocator> Make(Driver& driver) {
  AllocatorOptions options;
  options.arena_va_bytes = 1024 * kG;
  return std::move(Allocator::Create(driver, options)).value();
}

// One planned request A (4 granules, the whole period), and a window
// "moe@forward" whose first two requests have slots: 2 granules at
// granule 4, 1 granule at granule 6 (the region's end). A slot holds the
// largest size recorded at its position (an expert's follows its routing).
RuntimePlan MoePlan() {
  RuntimePlan plan;
  plan.period = 20;
  plan.region_bytes = 7 * kG;
  plan.iteration = {{4 * kG, 0, 0, 20}};
  DynamicWindow window;
  window.module = "moe@forward";
  window.start = 2;
  window.end = 10;
  window.steady.requests = {{2 * kG, 4 * kG, 2, 8}, {kG, 6 * kG, 3, 9}};
  plan.windows = {window};
  return plan;
}

struct Stamped {
  DevicePtr ptr;
  uint64_t size;
  uint8_t stamp;
};

StatusOr<Stamped> Take(Allocator& a, Driver& d, uint64_t size, uint8_t stamp) {
  StatusOr<DevicePtr> p = a.Allocate(size, 0);
  if (!p.ok()) return p.status();
  LOOM_RETURN_IF_ERROR(d.Memset(*p, stamp, size));
  return Stamped{*p, size, stamp};
}

void Check(Allocator& a, Driver& d, const Stamped& s) {
  ASSERT_NO_FATAL_FAILURE(test_support::ExpectStamp(d, s.ptr, s.size, s.stamp));
  ASSERT_TRUE(a.Free(s.ptr).ok());
}

TEST(AllocatorDynamicTest, AWindowsRequestsAreServedAtTheirSlotsWhenTheyFit) {
  auto d = Host();
  auto a = Make(*d);
  ASSERT_TRUE(a->LoadPlan(MoePlan()).ok());
  for (uint64_t it = 0; it < 3; ++it) {
    a->IterationBegin(it);
    a->Phase("forward");
    StatusOr<Stamped> big = Take(*a, *d, 4 * kG, 1);
    ASSERT_TRUE(big.ok()) << big.status().ToString();
    a->ModuleEnter("moe", /*dynamic=*/true);
    // Smaller than its slot (the largest recorded): at the slot.
    StatusOr<Stamped> e0 = Take(*a, *d, 2 * kG - 4096, 2);
    ASSERT_TRUE(e0.ok());
    EXPECT_EQ(e0->ptr, big->ptr + 4 * kG);
    // Larger than its slot, nothing idle after it: elsewhere.
    StatusOr<Stamped> e1 = Take(*a, *d, kG + 4096, 3);
    ASSERT_TRUE(e1.ok());
    EXPECT_FALSE(e1->ptr >= big->ptr && e1->ptr < big->ptr + 7 * kG);
    // A third request: the window has no slot for it.
    StatusOr<Stamped> e2 = Take(*a, *d, kG / 2, 4);
    ASSERT_TRUE(e2.ok());
    a->ModuleExit("moe");
    a->CheckInvariants();
    for (const StatusOr<Stamped>* s : {&e2, &e1, &e0, &big}) Check(*a, *d, **s);
    a->IterationEnd(it);
    // Every iteration counts its window's requests from the first again.
    const AllocatorStats stats = a->stats();
    EXPECT_EQ(stats.dynamic_requests, 3 * (it + 1));
    EXPECT_EQ(stats.dynamic_hits, it + 1);
    EXPECT_EQ(stats.plan_hits, it + 1);
  }
}

TEST(AllocatorDynamicTest, ASlotStillTakenIsNeverHandedOutTwice) {
  auto d = Host();
  auto a = Make(*d);
  ASSERT_TRUE(a->LoadPlan(MoePlan()).ok());
  a->IterationBegin(0);
  a->Phase("forward");
  StatusOr<Stamped> big = Take(*a, *d, 4 * kG, 1);
  ASSERT_TRUE(big.ok());
  a->ModuleEnter("moe", true);
  StatusOr<Stamped> e0 = Take(*a, *d, 2 * kG, 2);
  ASSERT_TRUE(e0.ok());
  a->ModuleExit("moe");
  a->IterationEnd(0);
  // The next iteration's first request of the window finds its slot still
  // live (it outlived the iteration): served elsewhere, data intact.
  a->IterationBegin(1);
  a->Phase("forward");
  a->ModuleEnter("moe", true);
  StatusOr<Stamped> again = Take(*a, *d, 2 * kG, 3);
  ASSERT_TRUE(again.ok());
  EXPECT_NE(again->ptr, e0->ptr);
  a->ModuleExit("moe");
  a->CheckInvariants();
  Check(*a, *d, *e0);
  Check(*a, *d, *again);
  Check(*a, *d, *big);
  a->IterationEnd(1);
  EXPECT_EQ(a->stats().dynamic_hits, 1u);
}

// A window whose module runs twice per iteration (a pipeline's two
// micro-batches): each call starts at its own first slot, so a call that
// made fewer requests (an expert without tokens) shifts no later call.
TEST(AllocatorDynamicTest, EveryCallOfTheModuleStartsAtItsOwnSlots) {
  auto d = Host();
  auto a = Make(*d);
  RuntimePlan plan = MoePlan();
  // Call 1: slots 0 and 1 (granules 4-5, 6); call 2: slot 2 (granule 7).
  plan.region_bytes = 8 * kG;
  plan.windows[0].steady.requests.push_back({kG, 7 * kG, 10, 12});
  plan.windows[0].steady.calls = {1, 1, 2};
  ASSERT_TRUE(a->LoadPlan(plan).ok());
  a->IterationBegin(0);
  a->Phase("forward");
  StatusOr<Stamped> big = Take(*a, *d, 4 * kG, 1);
  ASSERT_TRUE(big.ok());
  // Call 1 makes one request of the two planned.
  a->ModuleEnter("moe", true);
  StatusOr<Stamped> first = Take(*a, *d, 2 * kG, 2);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->ptr, big->ptr + 4 * kG);
  a->ModuleExit("moe");
  // Call 2's request meets its own slot, not call 1's second one.
  a->ModuleEnter("moe", true);
  StatusOr<Stamped> second = Take(*a, *d, kG, 3);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->ptr, big->ptr + 7 * kG);
  // A third call the plan never saw takes no slot.
  a->ModuleExit("moe");
  a->ModuleEnter("moe", true);
  StatusOr<Stamped> third = Take(*a, *d, kG, 4);
  ASSERT_TRUE(third.ok());
  EXPECT_FALSE(third->ptr >= big->ptr && third->ptr < big->ptr + 8 * kG);
  a->ModuleExit("moe");
  a->CheckInvariants();
  for (const StatusOr<Stamped>* s : {&third, &second, &first, &big})
    Check(*a, *d, **s);
  a->IterationEnd(0);
  EXPECT_EQ(a->stats().dynamic_hits, 2u);
}

TEST(AllocatorDynamicTest, ADynamicModulesRequestGetsSmallerNewChunks) {
  // A request of 16 MiB, inside a module marked dynamic and outside one,
  // each in a fresh allocator without a plan: a new chunk holds at most
  // 8 MiB for the first (LendingPolicy::kMaxNewDynamicChunkBytes), 16 MiB
  // for the second; each maps its chunks in one set-access.
  constexpr uint64_t kBytes = uint64_t{16} << 20;
  static_assert(LendingPolicy::kMaxNewDynamicChunkBytes == kBytes / 2);
  static_assert(LendingPolicy::kMaxNewChunkBytes == kBytes);
  for (bool dynamic : {true, false}) {
    auto d = Host();
    auto a = Make(*d);
    if (dynamic) a->ModuleEnter("moe.experts@forward", /*dynamic=*/true);
    StatusOr<DevicePtr> p = a->Allocate(kBytes, 0);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    ASSERT_NO_FATAL_FAILURE(test_support::Stamp(*d, *p, kBytes, 0x5A));
    const AllocatorStats s = a->stats();
    EXPECT_EQ(s.driver_calls[static_cast<size_t>(DriverOp::kCreate)],
              dynamic ? 2u : 1u);
    EXPECT_EQ(s.driver_calls[static_cast<size_t>(DriverOp::kMap)],
              dynamic ? 2u : 1u);
    EXPECT_EQ(s.driver_calls[static_cast<size_t>(DriverOp::kSetAccess)], 1u);
    EXPECT_EQ(s.reserved_bytes.current, kBytes);
    ASSERT_NO_FATAL_FAILURE(test_support::ExpectStamp(*d, *p, kBytes, 0x5A));
    ASSERT_TRUE(a->Free(*p).ok());
    if (dynamic) a->ModuleExit("moe.experts@forward");
    a->CheckInvariants();
  }
}

}  // namespace
}  // namespace loom::vmm
