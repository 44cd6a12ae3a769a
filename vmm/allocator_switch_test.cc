// Auto mode's switch: a plan installed mid-run (LoadPlan at an iteration
// boundary) while what the unplanned iterations allocated for good
// (weights, optimizer state) stays live in the arena. The physical memory
// those allocations hold after the switch is bounded by the arena's chunk
// size (LendingPolicy::kMaxNewChunkBytes): a chunk with a live page cannot
// go back, whole-handle mapping being all CUDA allows. The same cap serves
// every arena request, with a plan too (a chunk is stitched only whole).
#include <gtest/gtest.h>

#include <vector>

#include "vmm/allocator.h"
#include "vmm/fake_driver.h"
#include "vmm/lending_policy.h"

namespace loom::vmm {
namespace {

constexpr uint64_t kG = uint64_t{2} << 20;
constexpr uint64_t kMiB = uint64_t{1} << 20;
// Granules of the largest new arena chunk.
constexpr uint64_t kChunk = LendingPolicy::kMaxNewChunkBytes / kG;

std::unique_ptr<FakeDriver> Fake() {
  FakeDriverOptions options;
  options.granularity = kG;
  options.capacity_per_device = uint64_t{64} << 30;
  return std::make_unique<FakeDriver>(options);
}

std::unique_ptr<Allocator> Make(Driver& driver) {
  AllocatorOptions options;
  options.arena_va_bytes = uint64_t{16} << 30;
  return std::move(Allocator::Create(driver, options)).value();
}

TEST(AllocatorSwitchTest, ANewArenaChunkIsAtMostTheCap) {
  auto d = Fake();
  auto a = Make(*d);
  const uint64_t size = 256 * kMiB;  // 128 granules
  StatusOr<DevicePtr> p = a->Allocate(size, 0);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(d->calls(DriverOp::kCreate), 128 / kChunk);
  EXPECT_EQ(d->calls(DriverOp::kMap), 128 / kChunk);
  EXPECT_EQ(d->calls(DriverOp::kSetAccess), 1u);  // one for all of them
  ASSERT_TRUE(a->Free(*p).ok());
  // Repeating makes no call: the mappings are kept.
  const uint64_t calls = d->calls(DriverOp::kCreate) + d->calls(DriverOp::kMap);
  p = a->Allocate(size, 0);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(d->calls(DriverOp::kCreate) + d->calls(DriverOp::kMap), calls);
  ASSERT_TRUE(a->Free(*p).ok());
  a->CheckInvariants();
}

// A training loop in miniature, as auto mode serves it: weights made in
// the set-up, an activation A of 128 granules per iteration and an
// optimizer state S of 1 MiB made in iteration 0 right after A's free, in
// A's memory, where it lives for good. Iterations 0-2 run without a plan;
// the plan of A (128 granules) is installed before iteration 3. The
// weights are most of what the run holds (4 GiB), as in a model: the
// idle rest of S's chunk is then within the referee's slack (1/256 of
// what is held), where with 8 MiB of weights it is 5% of the run and the
// plan rightly loses.
TEST(AllocatorSwitchTest, ThePlanNeedsNoMoreThanTheCapBeyondTheArenasPeak) {
  auto d = Fake();
  auto a = Make(*d);
  const uint64_t act = 256 * kMiB;
  const uint64_t weight_granules = 2048;
  StatusOr<DevicePtr> weight = a->Allocate(weight_granules * kG, 0);
  ASSERT_TRUE(weight.ok());
  StatusOr<DevicePtr> state = DevicePtr{0};
  for (uint64_t it = 0; it < 3; ++it) {
    a->IterationBegin(it);
    StatusOr<DevicePtr> p = a->Allocate(act, 0);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    ASSERT_TRUE(a->Free(*p).ok());
    if (it == 0) {
      state = a->Allocate(kMiB, 0);
      ASSERT_TRUE(state.ok());
    }
    a->IterationEnd(it);
  }
  // The unplanned peak: the weight, the state's granule and A beside it.
  const uint64_t unplanned = a->stats().reserved_bytes.peak;
  EXPECT_EQ(unplanned, (weight_granules + 1 + 128) * kG);

  RuntimePlan plan;
  plan.period = 2;
  plan.iteration.push_back({act, 0, 0, 1});
  plan.region_bytes = act;
  ASSERT_TRUE(a->LoadPlan(plan).ok());
  for (uint64_t it = 3; it < 6; ++it) {
    a->IterationBegin(it);
    StatusOr<DevicePtr> p = a->Allocate(act, 0);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    ASSERT_TRUE(a->Free(*p).ok());
    a->IterationEnd(it);
  }
  const AllocatorStats s = a->stats();
  EXPECT_EQ(s.plan_hits, 3u);
  EXPECT_EQ(s.plan_misses, 0u);
  // What the state pins: its chunk, whose other granules nothing uses now.
  const MemoryBreakdown b = a->Breakdown();
  EXPECT_EQ(b.arena_live, weight_granules * kG + kG);
  EXPECT_EQ(b.arena_idle_pinned, (kChunk - 1) * kG);
  EXPECT_LT(b.arena_idle_pinned, 16 * kMiB);
  EXPECT_EQ(b.static_idle, 128 * kG);
  // The bound: the larger of the unplanned peak and what the planned
  // iterations hold (the live arena granules and the region), plus less
  // than 16 MiB (the idle rest of the one arena chunk a live allocation
  // keeps). Chunks as large as their request kept A's 256 MiB.
  const uint64_t planned_need = b.arena_live + plan.region_bytes;
  EXPECT_LT(s.reserved_bytes.peak,
            std::max(unplanned, planned_need) + 16 * kMiB);
  a->CheckInvariants();
  ASSERT_TRUE(a->Free(*state).ok());
  ASSERT_TRUE(a->Free(*weight).ok());
}

// With a plan from the start: the requests of its set-up and early
// iterations that it left to the dynamic space (no planned place: a
// pipeline's first iteration before its first marker) get chunks of at most
// the cap, as the unplanned warm-up's do, and so do the steady iteration's
// unplaced requests and misses (a chunk is stitched only whole and idle:
// lending_policy.h).
TEST(AllocatorSwitchTest, ThePlansWarmUpRequestsLeftUnplacedGetCappedChunks) {
  auto d = Fake();
  auto a = Make(*d);
  const uint64_t size = 256 * kMiB;  // 128 granules
  RuntimePlan plan;
  plan.period = 4;
  plan.prologue_iterations = 1;
  plan.prologue.push_back({size, kUnplanned, 0, 0});         // set-up
  plan.prologue.push_back({size + kMiB, kUnplanned, 0, 2});  // iteration 0
  plan.iteration.push_back({kG, 0, 0, 2});
  plan.iteration.push_back({size + 2 * kMiB, kUnplanned, 1, 3});
  plan.region_bytes = kG;
  ASSERT_TRUE(a->LoadPlan(plan).ok());
  auto creates = [&] { return d->calls(DriverOp::kCreate); };
  uint64_t before = creates();
  StatusOr<DevicePtr> setup = a->Allocate(size, 0);
  ASSERT_TRUE(setup.ok()) << setup.status().ToString();
  EXPECT_EQ(creates() - before, 128 / kChunk);
  a->IterationBegin(0);
  before = creates();
  StatusOr<DevicePtr> early = a->Allocate(size + kMiB, 0);
  ASSERT_TRUE(early.ok()) << early.status().ToString();
  EXPECT_EQ(creates() - before, 129 / kChunk + 1);  // 129 granules
  a->IterationEnd(0);
  a->IterationBegin(1);
  StatusOr<DevicePtr> planned = a->Allocate(kG, 0);
  ASSERT_TRUE(planned.ok());
  before = creates();
  // 130 granules, nothing idle in the arena: capped chunks too.
  StatusOr<DevicePtr> steady = a->Allocate(size + 2 * kMiB, 0);
  ASSERT_TRUE(steady.ok()) << steady.status().ToString();
  EXPECT_EQ(creates() - before, 130 / kChunk + 1);
  EXPECT_EQ(a->stats().plan_hits, 1u);
  ASSERT_TRUE(a->Free(*steady).ok());
  ASSERT_TRUE(a->Free(*planned).ok());
  a->IterationEnd(1);
  ASSERT_TRUE(a->Free(*early).ok());
  ASSERT_TRUE(a->Free(*setup).ok());
  a->CheckInvariants();
}

// An early iteration the plan does not fit is served dynamically: its new
// chunks are capped, as a steady iteration's that does not fit are.
TEST(AllocatorSwitchTest, ASuspendedEarlyIterationGetsCappedChunks) {
  auto d = Fake();
  auto a = Make(*d);
  RuntimePlan plan;
  plan.period = 40;
  plan.prologue_iterations = 1;
  for (int i = 0; i < 20; ++i) {
    const PlannedRequest entry{kG, static_cast<int64_t>(i * kG), i, 40 - i};
    plan.prologue.push_back(entry);
    plan.iteration.push_back(entry);
  }
  plan.region_bytes = 20 * kG;
  ASSERT_TRUE(a->LoadPlan(plan).ok());
  const uint64_t size = 256 * kMiB;  // 128 granules
  auto creates = [&] { return d->calls(DriverOp::kCreate); };
  auto run_foreign = [&](uint64_t number) {
    // 17 requests the plan never saw: suspended after 16; the 17th is
    // the large one, served dynamically.
    a->IterationBegin(number);
    std::vector<DevicePtr> live;
    for (int i = 0; i < 16; ++i) live.push_back(*a->Allocate(3 * kMiB, 0));
    EXPECT_TRUE(a->PlanSuspended());
    const uint64_t before = creates();
    StatusOr<DevicePtr> big = a->Allocate(size, 0);
    EXPECT_TRUE(big.ok()) << big.status().ToString();
    const uint64_t made = creates() - before;
    live.push_back(*big);
    for (DevicePtr p : live) EXPECT_TRUE(a->Free(p).ok());
    a->IterationEnd(number);
    return made;
  };
  EXPECT_EQ(run_foreign(0), 128 / kChunk);  // early: capped
  // The prologue ended with it; a large request of a steady iteration
  // that does not fit either finds the arena's idle chunks first (128
  // granules), then capped new ones for the other 128.
  a->IterationBegin(1);
  std::vector<DevicePtr> live;
  for (int i = 0; i < 16; ++i) live.push_back(*a->Allocate(3 * kMiB, 0));
  ASSERT_TRUE(a->PlanSuspended());
  const uint64_t before = creates();
  StatusOr<DevicePtr> bigger = a->Allocate(2 * size, 0);
  ASSERT_TRUE(bigger.ok()) << bigger.status().ToString();
  EXPECT_EQ(creates() - before, 128 / kChunk);
  live.push_back(*bigger);
  for (DevicePtr p : live) ASSERT_TRUE(a->Free(p).ok());
  a->IterationEnd(1);
  a->CheckInvariants();
}

// From the second iteration on, a request that would grow the pool past its
// peak gets an idle arena chunk mapped a second time (stitched) instead of
// new memory; with AllocatorOptions::stitch_idle_chunks off, or in the
// first iteration, the pool grows.
uint64_t PeakAfterAFreedPlaceIsOutgrown(bool stitch, int64_t iteration) {
  auto d = Fake();
  AllocatorOptions options;
  options.arena_va_bytes = uint64_t{16} << 30;
  options.stitch_idle_chunks = stitch;
  auto a = std::move(Allocator::Create(*d, options)).value();
  for (int64_t it = 0; it < iteration; ++it) {
    a->IterationBegin(it);
    a->IterationEnd(it);
  }
  a->IterationBegin(iteration);
  StatusOr<DevicePtr> x = a->Allocate(2 * kChunk * kG, 0);  // two chunks
  StatusOr<DevicePtr> y = a->Allocate(kG, 0);  // keeps x's place apart
  EXPECT_TRUE(x.ok() && y.ok());
  EXPECT_TRUE(a->Free(*x).ok());
  const uint64_t creates = d->calls(DriverOp::kCreate);
  // Three chunks' worth: x's place is too small for it.
  StatusOr<DevicePtr> z = a->Allocate(3 * kChunk * kG, 0);
  EXPECT_TRUE(z.ok());
  const uint64_t created = d->calls(DriverOp::kCreate) - creates;
  EXPECT_EQ(created, stitch && iteration >= 1 ? 1u : 3u);
  a->CheckInvariants();
  // x's place serves again once z is gone, with no call.
  EXPECT_TRUE(a->Free(*z).ok());
  const uint64_t calls = d->calls(DriverOp::kMap) + d->calls(DriverOp::kCreate);
  StatusOr<DevicePtr> again = a->Allocate(2 * kChunk * kG, 0);
  EXPECT_TRUE(again.ok());
  EXPECT_EQ(*again, *x);
  EXPECT_EQ(d->calls(DriverOp::kMap) + d->calls(DriverOp::kCreate), calls);
  EXPECT_TRUE(a->Free(*again).ok());
  EXPECT_TRUE(a->Free(*y).ok());
  a->IterationEnd(iteration);
  a->CheckInvariants();
  return a->stats().reserved_bytes.peak;
}

TEST(AllocatorSwitchTest, FromTheSecondIterationIdleChunksAreStitched) {
  const uint64_t grown = (5 * kChunk + 1) * kG;
  EXPECT_EQ(PeakAfterAFreedPlaceIsOutgrown(true, 1), (3 * kChunk + 1) * kG);
  EXPECT_EQ(PeakAfterAFreedPlaceIsOutgrown(true, 0), grown);
  EXPECT_EQ(PeakAfterAFreedPlaceIsOutgrown(false, 1), grown);
}

// Before the second iteration, only a request of kStitchEarlyBytes or more
// stitches: it outgrows a freed place by an idle chunk's worth, mapped
// there again, where a smaller one grows the pool.
uint64_t CreatedForAnOutgrownPlaceInTheSetUp(uint64_t place_bytes) {
  auto d = Fake();
  AllocatorOptions options;
  options.arena_va_bytes = uint64_t{16} << 30;
  auto a = std::move(Allocator::Create(*d, options)).value();
  StatusOr<DevicePtr> x = a->Allocate(place_bytes, 0);
  StatusOr<DevicePtr> wall = a->Allocate(kG, 0);
  EXPECT_TRUE(x.ok() && wall.ok());
  EXPECT_TRUE(a->Free(*x).ok());
  const uint64_t creates = d->calls(DriverOp::kCreate);
  StatusOr<DevicePtr> z = a->Allocate(place_bytes + kChunk * kG, 0);
  EXPECT_TRUE(z.ok());
  const uint64_t created = d->calls(DriverOp::kCreate) - creates;
  a->CheckInvariants();
  EXPECT_TRUE(a->Free(*z).ok());
  EXPECT_TRUE(a->Free(*wall).ok());
  return created;
}

TEST(AllocatorSwitchTest, LargeRequestsStitchFromTheFirstRequest) {
  const uint64_t large =
      (kStitchEarlyBytes + kChunk * kG - 1) / (kChunk * kG) * (kChunk * kG);
  // x's chunks are mapped again at z's start; one new chunk after them.
  EXPECT_EQ(CreatedForAnOutgrownPlaceInTheSetUp(large), 1u);
  // Below the threshold, the pool grows for all of z.
  const uint64_t small = 2 * kChunk * kG;
  ASSERT_LT(small + kChunk * kG, kStitchEarlyBytes);
  EXPECT_EQ(CreatedForAnOutgrownPlaceInTheSetUp(small), 3u);
}

}  // namespace
}  // namespace loom::vmm
