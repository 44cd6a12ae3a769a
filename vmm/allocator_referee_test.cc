// The allocator with its plan referee (plan_referee.h): a plan that holds
// more than the dynamic space alone would stops serving, the decision and
// its numbers are in the stats, a re-plan is judged afresh, and nothing of
// it breaks the invariants (randomized, with real memory on the host
// backend).
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <vector>

#include "vmm/allocator.h"
#include "vmm/host_driver.h"
#include "vmm/stack_plan_testing.h"

namespace loom::vmm {
namespace {

constexpr uint64_t kG = 64 << 10;
// More granules than the referee's slack (32 MiB) holds.
constexpr int kN = 2 * PlanReferee::kSlackBytes / kG;

std::unique_ptr<HostDriver> Host() {
  HostDriverOptions options;
  options.granularity = kG;
  options.capacity_per_device = 4 * kN * kG;
  return std::move(HostDriver::Open(options)).value();
}

std::unique_ptr<Allocator> Make(Driver& driver) {
  AllocatorOptions options;
  options.arena_va_bytes = 4 * kN * kG;
  return std::move(Allocator::Create(driver, options)).value();
}

// kN buffers of one granule, all live together in the plan's iteration,
// laid out one after the other.
RuntimePlan StackPlan(uint64_t unit) {
  return test_plans::StackPlan(unit, kN, kG);
}

TEST(AllocatorRefereeTest, APlanIsNotJudgedOnItsOwnRegionWhileItFits) {
  auto d = Host();
  auto a = Make(*d);
  ASSERT_TRUE(a->LoadPlan(StackPlan(kG)).ok());
  EXPECT_EQ(a->stats().plan_verdict, "watching");
  // The run frees every buffer at once: the dynamic space would reuse one
  // granule, the plan backs a new one for every request. But the plan fits
  // (every request hits): its region is what the requests it foresees
  // need, so it is not judged on it (the region is the floor of the
  // dynamic space's expected cost).
  a->IterationBegin(0);
  for (int i = 0; i < kN; ++i) {
    StatusOr<DevicePtr> p = a->Allocate(kG, 0);
    ASSERT_TRUE(p.ok());
    ASSERT_TRUE(a->Free(*p).ok());
  }
  a->IterationEnd(0);
  AllocatorStats s = a->stats();
  EXPECT_EQ(s.plan_verdict, "watching");
  EXPECT_EQ(s.plan_losses, 0u);
  EXPECT_EQ(s.plan_hits, static_cast<uint64_t>(kN));
  EXPECT_EQ(s.referee_plan_bytes, uint64_t{kN} * kG);
  EXPECT_LE(s.referee_dynamic_bytes, 2 * kG);
  // A re-plan starts a fresh watch, seeded with the live allocations.
  StatusOr<DevicePtr> held = a->Allocate(3 * kG, 0);
  ASSERT_TRUE(held.ok());
  ASSERT_TRUE(a->AddPlanVariant(StackPlan(2 * kG)).ok());
  EXPECT_EQ(a->stats().plan_verdict, "watching");
  ASSERT_TRUE(a->Free(*held).ok());
  a->CheckInvariants();
}

TEST(AllocatorRefereeTest, APlanThatFitsIsConfirmedAndKeepsServing) {
  auto d = Host();
  auto a = Make(*d);
  ASSERT_TRUE(a->LoadPlan(StackPlan(kG)).ok());
  for (uint64_t it = 0; it < 4; ++it) {
    a->IterationBegin(it);
    std::vector<DevicePtr> live;
    for (int i = 0; i < kN; ++i) live.push_back(*a->Allocate(kG, 0));
    for (int i = kN - 1; i >= 0; --i) ASSERT_TRUE(a->Free(live[i]).ok());
    a->IterationEnd(it);
  }
  a->IterationBegin(4);
  AllocatorStats s = a->stats();
  EXPECT_EQ(s.plan_verdict, "confirmed");
  EXPECT_EQ(s.plan_losses, 0u);
  EXPECT_EQ(s.plan_hits, 4u * kN);
}

// Random requests (planned sizes and others, random frees) against the
// stack plan, seeded: the plan loses at some point or not; every
// allocation's data survives until its free and no byte is shared.
TEST(AllocatorRefereeTest, SeededRandomizedRunKeepsEveryAllocationIntact) {
  for (uint32_t seed : {1u, 2u, 3u}) {
    std::mt19937_64 rng(seed);
    auto d = Host();
    auto a = Make(*d);
    ASSERT_TRUE(a->LoadPlan(StackPlan(kG)).ok());
    std::map<DevicePtr, std::pair<uint64_t, uint8_t>> live;
    uint8_t stamp = 0;
    for (uint64_t it = 0; it < 4; ++it) {
      a->IterationBegin(it);
      for (int step = 0; step < kN; ++step) {
        if (live.empty() || rng() % 3 != 0) {
          const uint64_t size =
              rng() % 4 == 0 ? 1 + rng() % (3 * kG) : kG;  // mostly planned
          StatusOr<DevicePtr> p = a->Allocate(size, 0);
          ASSERT_TRUE(p.ok()) << p.status().ToString();
          ++stamp;
          ASSERT_TRUE(d->Memset(*p, stamp, size).ok());
          live[*p] = {size, stamp};
        } else {
          auto at = live.begin();
          std::advance(at, rng() % live.size());
          std::vector<uint8_t> back(at->second.first);
          ASSERT_TRUE(d->CopyToHost(back.data(), at->first, back.size()).ok());
          for (uint8_t b : back) ASSERT_EQ(b, at->second.second);
          ASSERT_TRUE(a->Free(at->first).ok());
          live.erase(at);
        }
        if (step % 97 == 0) a->CheckInvariants();
      }
      a->IterationEnd(it);
    }
    for (const auto& [ptr, what] : live) ASSERT_TRUE(a->Free(ptr).ok());
    a->CheckInvariants();
  }
}

}  // namespace
}  // namespace loom::vmm
