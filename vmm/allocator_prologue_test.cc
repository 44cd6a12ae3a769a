// The allocator's prologue: the set-up and the early iterations a plan was
// recorded with, when the run follows them and when it does not (a trial
// before a plan that never fitted serves, an early iteration of another
// shape ends the prologue), the persistent requests a suspended early
// iteration makes (optimizer state at its planned place, under the peak
// only), and persistent requests a little larger than planned (they push
// the later ones up), with real memory (host backend) where data could be
// damaged.
#include <gtest/gtest.h>

#include <vector>

#include "vmm/allocator.h"
#include "vmm/allocator_testing.h"
#include "vmm/host_driver.h"
#include "vmm/stack_plan_testing.h"

namespace loom::vmm {
namespace {

using test_support::RunStack;

constexpr uint64_t kG = 64 << 10;

std::unique_ptr<HostDriver> Host() {
  return test_support::HostForTest(kG, 512 * kG);
}

std::unique_ptr<Allocator> Make(Driver& driver) {
  AllocatorOptions options;
  options.arena_va_bytes = 1024 * kG;
  return std::move(Allocator::Create(driver, options)).value();
}

RuntimePlan StackPlan(uint64_t unit, int n) {
  return test_plans::StackPlan(unit, n, kG);
}

TEST(AllocatorPrologueTest, SetUpRequestsThePlanLeftUnplacedCountAsFitting) {
  // A set-up of 10 weights, then 400 short-lived requests the plan foresaw
  // and left to the dynamic space (a pipeline's warm-up before its first
  // iteration), then a steady stack.
  RuntimePlan plan = StackPlan(kG, 8);
  std::vector<PlannedRequest> setup;
  for (int i = 0; i < 10; ++i) {
    setup.push_back({kG, static_cast<int64_t>((8 + i) * kG), 0, 1000});
  }
  for (int i = 0; i < 400; ++i) setup.push_back({4096, kUnplanned, 0, 0});
  plan.prologue = setup;
  plan.region_bytes = 18 * kG;
  auto d = Host();
  auto a = Make(*d);
  ASSERT_TRUE(a->LoadPlan(plan).ok());
  std::vector<DevicePtr> weights;
  for (int i = 0; i < 10; ++i) weights.push_back(*a->Allocate(kG, 0));
  // Among the foreseen requests, one extra every eleventh (40 in all):
  // about 6 in any 64 requests, a fit of over 90%.
  for (int i = 0; i < 400; ++i) {
    DevicePtr p = *a->Allocate(4096, 0);
    ASSERT_TRUE(a->Free(p).ok());
    if (i % 10 == 9) {
      DevicePtr extra = *a->Allocate(5000, 0);
      ASSERT_TRUE(a->Free(extra).ok());
    }
  }
  const AllocatorStats s = a->stats();
  EXPECT_EQ(s.unplanned, 400u);
  EXPECT_EQ(s.plan_misses, 40u);
  EXPECT_EQ(s.plan_suspensions, 0u) << "the foreseen requests fit";
  EXPECT_FALSE(a->PlanSuspended());
  RunStack(*a, *d, kG, 8, 0);
  EXPECT_EQ(a->stats().plan_hits, 10u + 8u);
  for (DevicePtr p : weights) ASSERT_TRUE(a->Free(p).ok());
  a->CheckInvariants();
}

TEST(AllocatorPrologueTest,
     APlanThatNeverFittedTriesAnIterationBeforeServingIt) {
  auto d = Host();
  auto a = Make(*d);
  ASSERT_TRUE(a->LoadPlan(StackPlan(kG, 40)).ok());
  // Another shape from the start (another batch size): suspended.
  RunStack(*a, *d, 3 * kG, 40, 0);
  ASSERT_TRUE(a->PlanSuspended());
  AllocatorStats s = a->stats();
  const uint64_t misses = s.plan_misses, suspensions = s.plan_suspensions;
  EXPECT_GT(misses, 0u);
  // The next one is a trial: its first requests are served dynamically
  // while the matcher follows; they miss, so the plan takes no request.
  RunStack(*a, *d, 3 * kG, 40, 1);
  s = a->stats();
  EXPECT_EQ(s.plan_misses, misses) << "the trial's requests went to the plan";
  EXPECT_EQ(s.plan_hits, 0u);
  EXPECT_EQ(s.plan_suspensions, suspensions + 1);
  // The plan's own shape: the trial's requests hit, the rest is served
  // from the plan.
  RunStack(*a, *d, kG, 40, 2);
  s = a->stats();
  EXPECT_EQ(s.plan_hits, 40u - Allocator::kTrialRequests);
  EXPECT_EQ(s.plan_suspensions, suspensions + 1);
  // Once a whole iteration fitted, no more trials: the plan serves the
  // first requests of the next iteration and misses them.
  RunStack(*a, *d, kG, 40, 3);
  EXPECT_EQ(a->stats().plan_hits, 80u - Allocator::kTrialRequests);
  RunStack(*a, *d, 3 * kG, 40, 4);
  EXPECT_GT(a->stats().plan_misses, misses);
  a->CheckInvariants();
}

// A plan whose recording began with two early iterations of one shape
// (n buffers of 3 granules) before the steady one (n buffers of 2).
RuntimePlan TwoEarlyIterationsPlan(int n) {
  RuntimePlan plan;
  plan.period = 2 * n;
  plan.prologue_iterations = 2;
  for (int it = 0; it < 2; ++it) {
    for (int i = 0; i < n; ++i) {
      plan.prologue.push_back(
          {3 * kG, static_cast<int64_t>(3 * i * kG), i, 2 * n - i});
    }
  }
  for (int i = 0; i < n; ++i) {
    plan.iteration.push_back(
        {2 * kG, static_cast<int64_t>(2 * i * kG), i, 2 * n - i});
  }
  plan.region_bytes = 3 * n * kG;
  return plan;
}

TEST(AllocatorPrologueTest, AnEarlyIterationThatDidNotFitEndsThePrologue) {
  constexpr int kN = 24;
  auto d = Host();
  auto a = Make(*d);
  ASSERT_TRUE(a->LoadPlan(TwoEarlyIterationsPlan(kN)).ok());
  // The run's first iteration has a shape of its own: suspended. The run
  // does not follow the recorded order of shapes.
  RunStack(*a, *d, 5 * kG, 20, 0);
  ASSERT_TRUE(a->PlanSuspended());
  const AllocatorStats first = a->stats();
  // The next one has the steady shape: matched as a steady iteration (its
  // first requests a trial, the plan never having fitted), not against the
  // second early iteration's entries, which would suspend it again.
  RunStack(*a, *d, 2 * kG, kN, 1);
  const AllocatorStats second = a->stats();
  EXPECT_EQ(second.plan_hits - first.plan_hits, kN - Allocator::kTrialRequests);
  EXPECT_EQ(second.plan_misses, first.plan_misses);
  EXPECT_EQ(second.plan_suspensions, first.plan_suspensions);
  RunStack(*a, *d, 2 * kG, kN, 2);
  EXPECT_EQ(a->stats().plan_hits - second.plan_hits, static_cast<uint64_t>(kN));
  a->CheckInvariants();
}

TEST(AllocatorPrologueTest, EarlyIterationsThatFitKeepThePrologue) {
  // The same plan, and a run that follows the recorded order: both early
  // iterations meet their own entries, then the steady ones.
  constexpr int kN = 24;
  auto d = Host();
  auto a = Make(*d);
  ASSERT_TRUE(a->LoadPlan(TwoEarlyIterationsPlan(kN)).ok());
  RunStack(*a, *d, 3 * kG, kN, 0);
  RunStack(*a, *d, 3 * kG, kN, 1);
  RunStack(*a, *d, 2 * kG, kN, 2);
  const AllocatorStats s = a->stats();
  EXPECT_EQ(s.plan_hits, 3u * kN);
  EXPECT_EQ(s.plan_misses, 0u);
  EXPECT_EQ(s.plan_suspensions, 0u);
  a->CheckInvariants();
}

// Activation i of 20, 3 granules at granule 2 + 3i, live [i, 40 - i): a
// forward and backward after a weight at [0, 2 kG).
PlannedRequest Activation(int i) {
  return {3 * kG, static_cast<int64_t>((2 + 3 * i) * kG), i, 40 - i};
}

TEST(AllocatorPrologueTest,
     ASuspendedFirstStepKeepsItsOptimizerStateInTheRegion) {
  // A weight W in the set-up at [0, 2 kG); the first step (early
  // iteration 0) makes 20 activations of 3 granules and two optimizer
  // states S1, S2 of W's size at [62 kG, 66 kG), for good; the steady
  // iteration, the 20 activations.
  RuntimePlan plan;
  plan.period = 40;
  plan.prologue_iterations = 1;
  plan.prologue.push_back({2 * kG, 0, 0, 1000});
  for (int i = 0; i < 20; ++i) {
    plan.prologue.push_back(Activation(i));
    plan.iteration.push_back(Activation(i));
  }
  plan.prologue.push_back({2 * kG, static_cast<int64_t>(62 * kG), 0, 1000});
  plan.prologue.push_back({2 * kG, static_cast<int64_t>(64 * kG), 0, 1000});
  plan.region_bytes = 66 * kG;
  auto d = Host();
  auto a = Make(*d);
  ASSERT_TRUE(a->LoadPlan(plan).ok());
  const DevicePtr weight = *a->Allocate(2 * kG, 0);  // the set-up: a hit
  // The run's first step has another shape: suspended.
  a->IterationBegin(0);
  std::vector<DevicePtr> acts;
  for (int i = 0; i < 20; ++i) acts.push_back(*a->Allocate(5 * kG, 0));
  ASSERT_TRUE(a->PlanSuspended());
  // A gradient of W's size: it takes S1's place, and gives it back.
  const DevicePtr grad = *a->Allocate(2 * kG, 0);
  EXPECT_EQ(grad, weight + 62 * kG);
  ASSERT_TRUE(a->Free(grad).ok());
  // The optimizer states, for good: at their planned places.
  const DevicePtr s1 = *a->Allocate(2 * kG, 0);
  const DevicePtr s2 = *a->Allocate(2 * kG, 0);
  EXPECT_EQ(s1, weight + 62 * kG);
  EXPECT_EQ(s2, weight + 64 * kG);
  EXPECT_EQ(a->stats().persistent_placements, 3u);
  ASSERT_NO_FATAL_FAILURE(test_support::Stamp(*d, s1, 2 * kG, 0x31));
  ASSERT_NO_FATAL_FAILURE(test_support::Stamp(*d, s2, 2 * kG, 0x32));
  for (DevicePtr p : acts) ASSERT_TRUE(a->Free(p).ok());
  a->IterationEnd(0);
  // The steady iterations are served by the plan around them.
  RunStack(*a, *d, 3 * kG, 20, 1);  // a trial first (never fitted yet)
  const uint64_t hits = a->stats().plan_hits;
  RunStack(*a, *d, 3 * kG, 20, 2);
  EXPECT_EQ(a->stats().plan_hits - hits, 20u);
  ASSERT_NO_FATAL_FAILURE(test_support::ExpectStamp(*d, s1, 2 * kG, 0x31));
  ASSERT_NO_FATAL_FAILURE(test_support::ExpectStamp(*d, s2, 2 * kG, 0x32));
  for (DevicePtr p : {s1, s2, weight}) ASSERT_TRUE(a->Free(p).ok());
  a->CheckInvariants();
}

TEST(AllocatorPrologueTest,
     ALaterSuspendedIterationPlacesStateOnlyUnderThePeak) {
  // A recording with two early iterations: the first makes 20 activations
  // of 3 granules, the second 20 requests of 5 granules the plan left to
  // the dynamic space and W's two optimizer states S1, S2, at
  // [200 kG, 204 kG) (far from the activations: not backed with them).
  RuntimePlan plan;
  plan.period = 40;
  plan.prologue_iterations = 2;
  plan.prologue.push_back({2 * kG, 0, 0, 1000});
  for (int i = 0; i < 20; ++i) plan.prologue.push_back(Activation(i));
  for (int i = 0; i < 20; ++i) {
    plan.prologue.push_back({8 * kG, kUnplanned, i, 40 - i});
  }
  plan.prologue.push_back({2 * kG, static_cast<int64_t>(200 * kG), 0, 1000});
  plan.prologue.push_back({2 * kG, static_cast<int64_t>(202 * kG), 0, 1000});
  for (int i = 0; i < 20; ++i) plan.iteration.push_back(Activation(i));
  plan.region_bytes = 204 * kG;
  auto d = Host();
  auto a = Make(*d);
  ASSERT_TRUE(a->LoadPlan(plan).ok());
  const DevicePtr weight = *a->Allocate(2 * kG, 0);  // the set-up: a hit
  // The first early iteration as recorded: 20 hits.
  RunStack(*a, *d, 3 * kG, 20, 0);
  ASSERT_EQ(a->stats().plan_hits, 21u);
  // The second's requests are served by the dynamic space (new memory,
  // idle once freed); requests without a steady twin count against the
  // fit: the plan is suspended.
  a->IterationBegin(1);
  std::vector<DevicePtr> acts;
  for (int i = 0; i < 20; ++i) acts.push_back(*a->Allocate(8 * kG, 0));
  ASSERT_TRUE(a->PlanSuspended());
  for (DevicePtr p : acts) ASSERT_TRUE(a->Free(p).ok());
  ASSERT_EQ(a->stats().iterations, kStitchFromIteration);
  const uint64_t peak = a->stats().reserved_bytes.peak;
  const uint64_t backed = a->stats().static_backed_bytes;
  const auto calls = a->stats().driver_calls;
  // The states, for good: their planned places were never backed, and
  // new pages for them would raise the memory held above its peak while
  // 160 granules are idle (backing them anyway first unmaps and releases an
  // idle arena chunk). They are served from memory already held, without
  // a driver call; nothing is backed.
  const DevicePtr s1 = *a->Allocate(2 * kG, 0);
  const DevicePtr s2 = *a->Allocate(2 * kG, 0);
  EXPECT_NE(s1, weight + 200 * kG);
  EXPECT_NE(s2, weight + 202 * kG);
  EXPECT_EQ(a->stats().persistent_placements, 0u);
  EXPECT_EQ(a->stats().static_backed_bytes, backed);
  EXPECT_EQ(a->stats().reserved_bytes.peak, peak);
  EXPECT_EQ(a->stats().driver_calls, calls);
  ASSERT_NO_FATAL_FAILURE(test_support::Stamp(*d, s1, 2 * kG, 0x31));
  ASSERT_NO_FATAL_FAILURE(test_support::Stamp(*d, s2, 2 * kG, 0x32));
  a->IterationEnd(1);
  // The steady iterations are served by the plan around them, from memory
  // already held: S1 sits in idle bytes of W's chunk where an activation
  // is planned, which is served elsewhere (the safety check). The states
  // keep their bytes.
  RunStack(*a, *d, 3 * kG, 20, 2);
  const uint64_t hits = a->stats().plan_hits;
  RunStack(*a, *d, 3 * kG, 20, 3);
  EXPECT_EQ(a->stats().plan_hits - hits, 19u);
  EXPECT_EQ(a->stats().reserved_bytes.peak, peak);
  ASSERT_NO_FATAL_FAILURE(test_support::ExpectStamp(*d, s1, 2 * kG, 0x31));
  ASSERT_NO_FATAL_FAILURE(test_support::ExpectStamp(*d, s2, 2 * kG, 0x32));
  for (DevicePtr p : {s1, s2, weight}) ASSERT_TRUE(a->Free(p).ok());
  a->CheckInvariants();
}

// Persistent entries packed as the planner packs them (id order, from the
// bottom), and a steady iteration of one request T of 3 granules above
// them at `top`.
RuntimePlan PackedPersistent(const std::vector<uint64_t>& sizes) {
  RuntimePlan plan;
  plan.period = 2;
  uint64_t at = 0;
  for (uint64_t size : sizes) {
    plan.prologue.push_back({size, static_cast<int64_t>(at), 0, 1000});
    at += size;
  }
  plan.iteration.push_back({3 * kG, static_cast<int64_t>(at), 0, 2});
  plan.region_bytes = (at + 3 * kG + kG - 1) / kG * kG;
  return plan;
}

// Runs steady iterations of T; returns how many hit their planned place.
uint64_t RunT(Allocator& a, uint64_t first, int n) {
  const uint64_t hits = a.stats().plan_hits;
  for (int i = 0; i < n; ++i) {
    a.IterationBegin(first + i);
    const DevicePtr t = *a.Allocate(3 * kG, 0);
    EXPECT_TRUE(a.Free(t).ok());
    a.IterationEnd(first + i);
  }
  return a.stats().plan_hits - hits;
}

TEST(AllocatorPrologueTest, AGrownPersistentRequestPushesTheLaterOnes) {
  // A, B, C, D of 100, 100, 50 and 100 KiB packed at 0, 100, 200, 250 KiB.
  // The run makes A 4 KiB larger, then B, then D (it never makes C).
  constexpr uint64_t kK = 1024;
  const RuntimePlan plan =
      PackedPersistent({100 * kK, 100 * kK, 50 * kK, 100 * kK});
  auto d = Host();
  auto a = Make(*d);
  ASSERT_TRUE(a->LoadPlan(plan).ok());
  // A grown: the bytes after its own are B's, yet A takes its planned
  // offset; B is pushed up by 4 KiB, into C's bytes.
  const DevicePtr grown_a = *a->Allocate(104 * kK, 0);
  const DevicePtr b = *a->Allocate(100 * kK, 0);
  const DevicePtr base = grown_a;
  EXPECT_EQ(b, base + 104 * kK);
  // D's planned bytes are past B's end: C, never made, absorbed the push.
  const DevicePtr dd = *a->Allocate(100 * kK, 0);
  EXPECT_EQ(dd, base + 250 * kK);
  EXPECT_EQ(a->stats().persistent_pushes, 2u);
  EXPECT_EQ(a->stats().plan_misses, 0u);
  EXPECT_EQ(a->stats().plan_hits, 3u);
  EXPECT_EQ(a->stats().dynamic_bytes.current, 0u);
  ASSERT_NO_FATAL_FAILURE(test_support::Stamp(*d, grown_a, 104 * kK, 0xa1));
  ASSERT_NO_FATAL_FAILURE(test_support::Stamp(*d, b, 100 * kK, 0xb2));
  ASSERT_NO_FATAL_FAILURE(test_support::Stamp(*d, dd, 100 * kK, 0xd4));
  // The iteration above them is served at its planned place throughout.
  EXPECT_EQ(RunT(*a, 0, 4), 4u);
  ASSERT_NO_FATAL_FAILURE(
      test_support::ExpectStamp(*d, grown_a, 104 * kK, 0xa1));
  ASSERT_NO_FATAL_FAILURE(test_support::ExpectStamp(*d, b, 100 * kK, 0xb2));
  ASSERT_NO_FATAL_FAILURE(test_support::ExpectStamp(*d, dd, 100 * kK, 0xd4));
  a->CheckInvariants();
  for (DevicePtr p : {grown_a, b, dd}) ASSERT_TRUE(a->Free(p).ok());
  a->CheckInvariants();
}

TEST(AllocatorPrologueTest, APushNeverPassesTheEndOfThePersistentEntries) {
  // A and B of 100 KiB at 0 and 100 KiB; T's bytes start at 200 KiB. A
  // grown by 4 KiB pushes B, which would then end 4 KiB into T's bytes:
  // B is served elsewhere (a miss), and T keeps its place.
  constexpr uint64_t kK = 1024;
  const RuntimePlan plan = PackedPersistent({100 * kK, 100 * kK});
  auto d = Host();
  auto a = Make(*d);
  ASSERT_TRUE(a->LoadPlan(plan).ok());
  const DevicePtr grown_a = *a->Allocate(104 * kK, 0);
  const DevicePtr b = *a->Allocate(100 * kK, 0);
  EXPECT_EQ(a->stats().persistent_pushes, 1u);
  EXPECT_EQ(a->stats().plan_misses, 1u);
  EXPECT_FALSE(b >= grown_a && b < grown_a + 203 * kK);
  ASSERT_NO_FATAL_FAILURE(test_support::Stamp(*d, grown_a, 104 * kK, 0xa1));
  ASSERT_NO_FATAL_FAILURE(test_support::Stamp(*d, b, 100 * kK, 0xb2));
  EXPECT_EQ(RunT(*a, 0, 4), 4u);
  ASSERT_NO_FATAL_FAILURE(
      test_support::ExpectStamp(*d, grown_a, 104 * kK, 0xa1));
  ASSERT_NO_FATAL_FAILURE(test_support::ExpectStamp(*d, b, 100 * kK, 0xb2));
  for (DevicePtr p : {grown_a, b}) ASSERT_TRUE(a->Free(p).ok());
  a->CheckInvariants();
}

TEST(AllocatorPrologueTest, APushedPlaceTakenByALiveAllocationIsNotShared) {
  // A, B, C of 100, 60 and 80 KiB at 0, 100 and 160 KiB. A comes 4 KiB
  // larger and pushes B; C comes before B, at its own planned offset (not
  // pushed: it starts past A's end). B's pushed place would end 4 KiB into
  // C: B is served elsewhere, and C's bytes stay C's.
  constexpr uint64_t kK = 1024;
  const RuntimePlan plan = PackedPersistent({100 * kK, 60 * kK, 80 * kK});
  auto d = Host();
  auto a = Make(*d);
  ASSERT_TRUE(a->LoadPlan(plan).ok());
  const DevicePtr grown_a = *a->Allocate(104 * kK, 0);
  const DevicePtr c = *a->Allocate(80 * kK, 0);
  EXPECT_EQ(c, grown_a + 160 * kK);
  ASSERT_NO_FATAL_FAILURE(test_support::Stamp(*d, grown_a, 104 * kK, 0xa1));
  ASSERT_NO_FATAL_FAILURE(test_support::Stamp(*d, c, 80 * kK, 0xc3));
  const DevicePtr b = *a->Allocate(60 * kK, 0);
  EXPECT_EQ(a->stats().persistent_pushes, 1u);
  EXPECT_EQ(a->stats().plan_misses, 1u);
  EXPECT_FALSE(b + 60 * kK > grown_a && b < grown_a + 240 * kK);
  ASSERT_NO_FATAL_FAILURE(test_support::Stamp(*d, b, 60 * kK, 0xb2));
  ASSERT_NO_FATAL_FAILURE(
      test_support::ExpectStamp(*d, grown_a, 104 * kK, 0xa1));
  ASSERT_NO_FATAL_FAILURE(test_support::ExpectStamp(*d, c, 80 * kK, 0xc3));
  a->CheckInvariants();
  for (DevicePtr p : {grown_a, b, c}) ASSERT_TRUE(a->Free(p).ok());
  a->CheckInvariants();
}

}  // namespace
}  // namespace loom::vmm
