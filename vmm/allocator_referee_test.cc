// The allocator with its plan referee (plan_referee.h): a plan that holds
// more than the dynamic space alone would stops serving, the decision and
// its numbers are in the stats, a re-plan is judged afresh, and nothing of
// it breaks the invariants (randomized, with real memory on the host
// backend); the idle region (a plan that no longer serves lends its backed
// bytes in place) holds no new memory and keeps every allocation intact.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <vector>

#include "vmm/allocator.h"
#include "vmm/allocator_testing.h"
#include "vmm/fake_driver.h"
#include "vmm/host_driver.h"
#include "vmm/stack_plan_testing.h"

namespace loom::vmm {
namespace {

constexpr uint64_t kG = 64 << 10;
// More granules than the referee's slack (kSlackBytes) holds.
constexpr int kN = 2 * PlanReferee::kSlackBytes / kG;

std::unique_ptr<HostDriver> Host() {
  return test_support::HostForTest(kG, 4 * kN * kG);
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

using Stamped = test_support::StampedAllocations;

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

// The referee's figure for the dynamic space is what loom's allocator
// without a plan holds on the same run (its shadow is that allocator):
// whenever a judgement updates it, it equals the high-water mark of an
// unplanned allocator served the same requests, stitching included (the
// run goes past its second iteration marker).
TEST(AllocatorRefereeTest, TheDynamicSpaceIsWhatTheRunHoldsWithoutThePlan) {
  for (uint32_t seed : {1u, 2u, 3u, 4u}) {
    SCOPED_TRACE(seed);
    std::mt19937_64 rng(seed);
    FakeDriverOptions fake;
    fake.granularity = kG;
    fake.capacity_per_device = 64 * kN * kG;
    FakeDriver planned_driver(fake), unplanned_driver(fake);
    AllocatorOptions options;
    options.arena_va_bytes = 64 * kN * kG;
    auto planned =
        std::move(Allocator::Create(planned_driver, options)).value();
    auto unplanned =
        std::move(Allocator::Create(unplanned_driver, options)).value();
    ASSERT_TRUE(planned->LoadPlan(StackPlan(kG)).ok());
    std::vector<std::pair<DevicePtr, DevicePtr>> live;
    uint64_t judged = 0, checked = 0;
    for (uint64_t it = 0; it < 5 && planned->stats().plan_verdict == "watching";
         ++it) {
      planned->IterationBegin(it);
      unplanned->IterationBegin(it);
      for (int step = 0; step < 2 * kN; ++step) {
        if (live.empty() || rng() % 5 < 3) {
          const uint64_t size = rng() % 3 == 0 ? 1 + rng() % (4 * kG) : kG;
          auto p = planned->Allocate(size, 0);
          auto u = unplanned->Allocate(size, 0);
          ASSERT_TRUE(p.ok() && u.ok());
          live.emplace_back(*p, *u);
        } else {
          const size_t k = rng() % live.size();
          ASSERT_TRUE(planned->Free(live[k].first).ok());
          ASSERT_TRUE(unplanned->Free(live[k].second).ok());
          live[k] = live.back();
          live.pop_back();
        }
        const AllocatorStats s = planned->stats();
        if (s.plan_verdict != "watching") break;
        if (s.referee_dynamic_bytes != judged) {
          judged = s.referee_dynamic_bytes;
          ASSERT_EQ(judged, unplanned->held_high_water());
          ++checked;
        }
      }
    }
    EXPECT_GT(checked, 0u);
    for (const auto& [p, u] : live) {
      ASSERT_TRUE(planned->Free(p).ok());
      ASSERT_TRUE(unplanned->Free(u).ok());
    }
    planned->CheckInvariants();
  }
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
    Stamped live(*a, *d);
    for (uint64_t it = 0; it < 4; ++it) {
      a->IterationBegin(it);
      for (int step = 0; step < kN; ++step) {
        if (live.size() == 0 || rng() % 3 != 0) {
          const uint64_t size =
              rng() % 4 == 0 ? 1 + rng() % (3 * kG) : kG;  // mostly planned
          ASSERT_NO_FATAL_FAILURE(live.Allocate(size));
        } else {
          ASSERT_NO_FATAL_FAILURE(live.Free(rng() % live.size()));
        }
        if (step % 97 == 0) a->CheckInvariants();
      }
      a->IterationEnd(it);
    }
    ASSERT_NO_FATAL_FAILURE(live.FreeAll());
    a->CheckInvariants();
  }
}

// A plan that does not fit a run without iteration markers is suspended
// for the rest of it: the region's backed bytes that no live allocation
// occupies serve the requests that follow, with no new memory and no
// driver call, and every allocation keeps its bytes.
TEST(AllocatorRegionReuseTest,
     ASuspendedPlanWithoutMarkersServesFromItsRegion) {
  auto d = Host();
  auto a = Make(*d);
  ASSERT_TRUE(a->LoadPlan(StackPlan(kG)).ok());
  // Half the plan's buffers come and go: their granules stay backed.
  std::vector<DevicePtr> planned;
  for (int i = 0; i < kN / 2; ++i) {
    StatusOr<DevicePtr> p = a->Allocate(kG, 0);
    ASSERT_TRUE(p.ok());
    planned.push_back(*p);
  }
  ASSERT_EQ(a->stats().plan_hits, static_cast<uint64_t>(kN / 2));
  // One stays live in the middle of them: the region's idle bytes are two
  // blocks around it.
  for (int i = 0; i < kN / 2; ++i) {
    if (i != kN / 4) ASSERT_TRUE(a->Free(planned[i]).ok());
  }
  // Then requests the plan never saw: it is suspended (no marker will end
  // the suspension); they live on.
  Stamped live(*a, *d);
  for (int i = 0; i < 24; ++i) ASSERT_NO_FATAL_FAILURE(live.Allocate(kG / 3));
  ASSERT_GE(a->stats().plan_suspensions, 1u);
  const AllocatorStats before = a->stats();
  // Requests of up to a quarter of the plan: all in the region's idle
  // granules.
  for (int i = 0; i < kN / 8; ++i) {
    ASSERT_NO_FATAL_FAILURE(live.Allocate(2 * kG - 512));
  }
  a->CheckInvariants();
  const AllocatorStats after = a->stats();
  EXPECT_EQ(after.reserved_bytes.current, before.reserved_bytes.current);
  for (DriverOp op : {DriverOp::kCreate, DriverOp::kMap, DriverOp::kUnmap,
                      DriverOp::kSetAccess}) {
    EXPECT_EQ(after.driver_calls[static_cast<size_t>(op)],
              before.driver_calls[static_cast<size_t>(op)])
        << DriverOpName(op);
  }
  EXPECT_EQ(after.region_reuses - before.region_reuses,
            static_cast<uint64_t>(kN / 8));
  EXPECT_EQ(after.static_bytes.current - before.static_bytes.current,
            uint64_t{kN / 8} * (2 * kG - 512));
  ASSERT_NO_FATAL_FAILURE(live.FreeAll());
  ASSERT_TRUE(a->Free(planned[kN / 4]).ok());
  a->CheckInvariants();
}

// In a run with iteration markers the plan may serve again next iteration:
// while it is suspended, only chunks a live static allocation holds lend
// their idle bytes in place; a chunk none holds stays whole.
TEST(AllocatorRegionReuseTest, AfterAMarkerOnlyChunksAStaticAllocationHolds) {
  auto d = Host();
  auto a = Make(*d);
  // Two buffers per granule, each granule its own chunk (its buffers start
  // at different times).
  ASSERT_TRUE(a->LoadPlan(StackPlan(kG / 2)).ok());
  a->IterationBegin(0);
  std::vector<DevicePtr> planned;
  for (int i = 0; i < kN / 2; ++i) {
    StatusOr<DevicePtr> p = a->Allocate(kG / 2, 0);
    ASSERT_TRUE(p.ok());
    planned.push_back(*p);
  }
  ASSERT_EQ(a->stats().plan_hits, static_cast<uint64_t>(kN / 2));
  for (int i = 1; i < kN / 2; ++i) ASSERT_TRUE(a->Free(planned[i]).ok());
  Stamped live(*a, *d);
  for (int i = 0; i < 24; ++i) ASSERT_NO_FATAL_FAILURE(live.Allocate(kG / 3));
  ASSERT_GE(a->stats().plan_suspensions, 1u);
  ASSERT_NO_FATAL_FAILURE(live.Allocate(kG / 2));
  // Chunks that static allocations hold lent their idle bytes in place:
  // planned[0]'s, and those of the misses before the suspension (placed in
  // bytes the plan left idle for a while, `Allocator::MissUntil`).
  const uint64_t reused = a->stats().region_reuses;
  EXPECT_GE(reused, 1u);
  ASSERT_NO_FATAL_FAILURE(live.FreeAll());
  // No static allocation left: every chunk of the region stays whole, for
  // the arena to take or the plan to find free next iteration.
  ASSERT_TRUE(a->Free(planned[0]).ok());
  for (int i = 0; i < 4; ++i) ASSERT_NO_FATAL_FAILURE(live.Allocate(kG / 2));
  EXPECT_EQ(a->stats().region_reuses, reused);
  a->CheckInvariants();
  ASSERT_NO_FATAL_FAILURE(live.FreeAll());
  a->IterationEnd(0);
  a->CheckInvariants();
}

// Random requests and frees without iteration markers, the plan suspended
// and its region reused: every allocation's bytes stay its own (real
// memory) and the invariants (the idle region's index among them) hold
// after every step.
TEST(AllocatorRegionReuseTest, SeededRandomizedRunWithoutMarkersStaysIntact) {
  uint64_t reuses = 0;
  for (uint32_t seed : {1u, 2u, 3u, 4u}) {
    std::mt19937_64 rng(seed);
    auto d = Host();
    auto a = Make(*d);
    ASSERT_TRUE(a->LoadPlan(StackPlan(kG)).ok());
    Stamped live(*a, *d);
    for (int step = 0; step < 3 * kN; ++step) {
      if (live.size() == 0 || rng() % 3 != 0) {
        // Planned first, then more and more requests the plan never saw.
        const bool odd = step > kN / 2 && rng() % 2 == 0;
        ASSERT_NO_FATAL_FAILURE(live.Allocate(odd ? 1 + rng() % (3 * kG) : kG));
      } else {
        ASSERT_NO_FATAL_FAILURE(live.Free(rng() % live.size()));
      }
      a->CheckInvariants();
    }
    reuses += a->stats().region_reuses;
    ASSERT_NO_FATAL_FAILURE(live.FreeAll());
    a->CheckInvariants();
  }
  EXPECT_GT(reuses, 20u);
}

// A plan that stopped serving leaves its region's pages idle; the arena
// borrows them (an idle static chunk mapped into the arena) and, from the
// second iteration on, maps such an idle chunk at another place too
// (stitching) where a new chunk would raise the memory held above its
// peak. Random requests the plan never saw, real memory: every
// allocation's bytes stay its own and the invariants hold after every
// step, while static pages really are stitched.
TEST(AllocatorRegionReuseTest, StitchedIdleStaticPagesKeepEveryByteIntact) {
  uint64_t stitched_static = 0;
  for (uint32_t seed : {1u, 2u, 3u, 4u}) {
    std::mt19937_64 rng(seed);
    auto d = Host();
    auto a = Make(*d);
    ASSERT_TRUE(a->LoadPlan(StackPlan(kG)).ok());
    // Iteration 0 as planned: the whole region backed, then idle.
    a->IterationBegin(0);
    std::vector<DevicePtr> planned;
    for (int i = 0; i < kN; ++i) planned.push_back(*a->Allocate(kG, 0));
    ASSERT_EQ(a->stats().plan_hits, static_cast<uint64_t>(kN));
    for (DevicePtr p : planned) ASSERT_TRUE(a->Free(p).ok());
    a->IterationEnd(0);
    Stamped live(*a, *d);
    for (uint64_t it = 1; it < 6; ++it) {
      a->IterationBegin(it);
      for (int step = 0; step < 2 * kN; ++step) {
        if (live.size() < 8 || (live.size() < kN / 2 && rng() % 2 == 0)) {
          ASSERT_NO_FATAL_FAILURE(live.Allocate(1 + rng() % (6 * kG)));
        } else {
          ASSERT_NO_FATAL_FAILURE(live.Free(rng() % live.size()));
        }
        a->CheckInvariants();
      }
      a->IterationEnd(it);
    }
    stitched_static += a->stats().stitched_static_pages;
    ASSERT_NO_FATAL_FAILURE(live.FreeAll());
    a->CheckInvariants();
  }
  EXPECT_GT(stitched_static, 0u);
}

}  // namespace
}  // namespace loom::vmm
