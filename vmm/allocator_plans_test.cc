// The allocator with plans that do not fit, several plan variants, plans
// removed, recordings started mid-run and requests that grew: the
// FitMonitor's suspension, AddPlanVariant, UnloadPlans, StartRecording and
// near-size growth, each with real memory (host backend) where data could
// be damaged. The set-up and early iterations a plan was recorded with:
// allocator_prologue_test.cc.
#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "plan/trace/trace.h"
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

std::unique_ptr<Allocator> Make(Driver& driver, size_t record = 0) {
  AllocatorOptions options;
  options.arena_va_bytes = 1024 * kG;
  options.record_capacity = record;
  return std::move(Allocator::Create(driver, options)).value();
}

// A plan for a stack of `n` buffers of `unit` bytes each, all live during
// [i, 2n - i) (a forward and backward), laid out one after the other.
RuntimePlan StackPlan(uint64_t unit, int n) {
  return test_plans::StackPlan(unit, n, kG);
}

TEST(AllocatorPlansTest, AForeignPlanIsSuspendedAndItsIdlePagesServeTheArena) {
  auto d = Host();
  auto a = Make(*d);
  ASSERT_TRUE(a->LoadPlan(StackPlan(kG, 64)).ok());
  RunStack(*a, *d, kG, 64, 0);  // the plan's own shape: backs 64 granules
  EXPECT_EQ(a->stats().plan_hits, 64u);
  const uint64_t reserved = a->stats().reserved_bytes.current;
  EXPECT_EQ(reserved, 64 * kG);
  // Another shape: 48 buffers of 1.25 granules. The matcher finds no entry
  // (every size differs); after FitMonitor::kMinRecords misses the plan is
  // suspended and the rest goes to the dynamic space, which takes the idle
  // static pages instead of new memory.
  RunStack(*a, *d, kG + kG / 4, 48, 1);
  AllocatorStats s = a->stats();
  EXPECT_EQ(s.plan_suspensions, 1u);
  EXPECT_TRUE(a->PlanSuspended());
  EXPECT_EQ(s.plan_misses, FitMonitor::kMinRecords);
  EXPECT_EQ(s.suspended_requests, 48u - FitMonitor::kMinRecords);
  // 48 x 1.25 granules = 60 granules: the 64 idle static pages hold them
  // (the first misses, before the suspension, could borrow nothing whose
  // planned use is soon: they took new pages).
  EXPECT_LE(s.reserved_bytes.peak, reserved + FitMonitor::kMinRecords * 2 * kG);
  EXPECT_LT(s.reserved_bytes.peak, reserved + 60 * kG);
  // The next iteration of the plan's shape: the plan is back, and hits.
  RunStack(*a, *d, kG, 64, 2);
  EXPECT_FALSE(a->PlanSuspended());
  s = a->stats();
  EXPECT_EQ(s.suspended_iterations, 1u);
  EXPECT_TRUE(s.last_iteration_suspended);
  EXPECT_EQ(s.plan_hits, 128u);
  a->CheckInvariants();
}

// Installing a plan mid-run unmaps the arena's idle mappings and reserves
// the region: a driver failure in either refuses the plan and changes
// nothing, the run goes on unplanned, and a later install works.
TEST(AllocatorPlansTest, APlanInstallTheDriverFailsChangesNothing) {
  auto d = Host();
  auto a = Make(*d);
  RunStack(*a, *d, kG, 64, 0);  // unplanned: the arena maps, then idles
  const uint64_t reserved = a->stats().reserved_bytes.current;
  for (DriverOp op : {DriverOp::kUnmap, DriverOp::kReserve}) {
    SCOPED_TRACE(DriverOpName(op));
    d->InjectFailure(op, 1, InternalError("injected"));
    EXPECT_EQ(a->LoadPlan(StackPlan(kG, 64)).code(), StatusCode::kInternal);
    d->ClearFailures();
    EXPECT_EQ(a->plan_variants(), 0u);
    EXPECT_EQ(a->stats().reserved_bytes.current, reserved);
    a->CheckInvariants();
    RunStack(*a, *d, kG, 64, 1);  // still served, from the same memory
    EXPECT_EQ(a->stats().plan_hits, 0u);
    EXPECT_EQ(a->stats().reserved_bytes.current, reserved);
  }
  ASSERT_TRUE(a->LoadPlan(StackPlan(kG, 64)).ok());
  RunStack(*a, *d, kG, 64, 2);
  EXPECT_EQ(a->stats().plan_hits, 64u);
  a->CheckInvariants();
}

// A variant that is refused (it would raise the peak) leaves the variants
// as they were, as AddPlanVariant promises: with the set full, the oldest
// stays (it used to go first, refused or not).
TEST(AllocatorPlansTest, ARefusedVariantEvictsNone) {
  auto d = Host();
  auto a = Make(*d);
  ASSERT_TRUE(a->LoadPlan(StackPlan(kG, 1)).ok());
  for (int n = 2; a->plan_variants() < Allocator::kMaxVariants; ++n) {
    ASSERT_TRUE(a->AddPlanVariant(StackPlan(kG, n)).ok());
  }
  // 400 granules: far more than loom has ever held.
  EXPECT_EQ(
      a->AddPlanVariant(StackPlan(kG, 400), /*never_raise_peak=*/true).code(),
      StatusCode::kOutOfMemory);
  EXPECT_EQ(a->plan_variants(), Allocator::kMaxVariants);
  // The oldest (the plan first loaded) is still there.
  EXPECT_EQ(a->AddPlanVariant(StackPlan(kG, 1)).code(),
            StatusCode::kAlreadyExists);
  a->CheckInvariants();
}

TEST(AllocatorPlansTest, VariantsServeTheirShapesWithoutDriverCalls) {
  auto d = Host();
  auto a = Make(*d);
  EXPECT_EQ(a->AddPlanVariant(StackPlan(kG, 8)).code(),
            StatusCode::kFailedPrecondition)
      << "no plan to add a variant to";
  ASSERT_TRUE(a->LoadPlan(StackPlan(kG, 40)).ok());
  ASSERT_TRUE(a->AddPlanVariant(StackPlan(3 * kG, 20)).ok());
  EXPECT_EQ(a->plan_variants(), 2u);
  EXPECT_EQ(a->AddPlanVariant(StackPlan(3 * kG, 20)).code(),
            StatusCode::kAlreadyExists);
  RuntimePlan too_big = StackPlan(kG, 40);
  too_big.region_bytes = 1024 * kG;  // past the region's address space
  too_big.iteration[0].size = 2 * kG;
  EXPECT_EQ(a->AddPlanVariant(too_big).code(), StatusCode::kFailedPrecondition);
  uint64_t n = 0;
  for (int round = 0; round < 2; ++round) {  // warm-up: both shapes once
    RunStack(*a, *d, kG, 40, n++);
    RunStack(*a, *d, 3 * kG, 20, n++);
  }
  auto vmm_calls = [&] {
    uint64_t n = 0;
    for (DriverOp op : {DriverOp::kCreate, DriverOp::kRelease, DriverOp::kMap,
                        DriverOp::kUnmap, DriverOp::kSetAccess}) {
      n += d->calls(op);
    }
    return n;
  };
  const uint64_t calls = vmm_calls();
  const AllocatorStats before = a->stats();
  for (int round = 0; round < 3; ++round) {
    RunStack(*a, *d, kG, 40, n++);
    RunStack(*a, *d, 3 * kG, 20, n++);
  }
  const AllocatorStats after = a->stats();
  EXPECT_EQ(after.plan_hits - before.plan_hits, 3u * (40 + 20));
  EXPECT_EQ(after.plan_misses, before.plan_misses);
  EXPECT_EQ(after.variant_switches - before.variant_switches, 6u);
  EXPECT_EQ(vmm_calls(), calls) << "a driver call in steady state";
  // One region for both: the larger layout's 60 granules.
  EXPECT_EQ(after.static_backed_bytes, 60 * kG);
  EXPECT_EQ(after.reserved_bytes.peak, 60 * kG);
}

TEST(AllocatorPlansTest, AVariantStartsAbovePersistentStaticAllocations) {
  auto d = Host();
  auto a = Make(*d);
  RuntimePlan plan = StackPlan(kG, 8);
  // A persistent buffer (a weight) planned at [8 kG, 10 kG).
  plan.prologue.push_back({2 * kG, static_cast<int64_t>(8 * kG), 0, 16});
  plan.region_bytes = 10 * kG;
  ASSERT_TRUE(a->LoadPlan(plan).ok());
  DevicePtr weight = *a->Allocate(2 * kG, 0);  // the set-up
  ASSERT_TRUE(d->Memset(weight, 0x5A, 2 * kG).ok());
  RunStack(*a, *d, kG, 8, 0);
  EXPECT_EQ(a->stats().plan_hits, 9u);
  // The variant knows nothing of the weight: it is laid out above it.
  ASSERT_TRUE(a->AddPlanVariant(StackPlan(2 * kG, 6)).ok());
  RunStack(*a, *d, 2 * kG, 6, 1);
  RunStack(*a, *d, 2 * kG, 6, 2);
  EXPECT_EQ(a->stats().plan_hits, 9u + 12u);
  EXPECT_EQ(a->stats().plan_misses, 0u);
  std::vector<uint8_t> back(2 * kG);
  ASSERT_TRUE(d->CopyToHost(back.data(), weight, 2 * kG).ok());
  for (uint8_t b : back) ASSERT_EQ(b, 0x5A);
  ASSERT_TRUE(a->Free(weight).ok());
  a->CheckInvariants();
}

// CUDA maps whole handles only: the static region's pages are chunks of one
// page (each lent alone when idle), except where the plan keeps a
// persistent buffer (never idle): one chunk for the stretch, one create
// and one map. After the plan goes, that chunk serves the arena only whole.
TEST(AllocatorPlansTest, PersistentGranulesAreOneChunkTheOthersOnePageEach) {
  auto d = Host();
  auto a = Make(*d);
  RuntimePlan plan = StackPlan(kG, 4);  // granules 0-3, not persistent
  // Two persistent buffers (weights) over granules 4-9.
  plan.prologue.push_back({2 * kG, static_cast<int64_t>(4 * kG), 0, 8});
  plan.prologue.push_back({4 * kG, static_cast<int64_t>(6 * kG), 0, 8});
  plan.region_bytes = 10 * kG;
  ASSERT_TRUE(a->LoadPlan(plan).ok());
  const auto creates = [&] { return d->calls(DriverOp::kCreate); };
  const auto maps = [&] { return d->calls(DriverOp::kMap); };
  const uint64_t creates0 = creates(), maps0 = maps();
  DevicePtr w1 = *a->Allocate(2 * kG, 0);  // backs granules 4-9: one chunk
  EXPECT_EQ(creates() - creates0, 1u);
  EXPECT_EQ(maps() - maps0, 1u);
  DevicePtr w2 = *a->Allocate(4 * kG, 0);  // already backed
  EXPECT_EQ(creates() - creates0, 1u);
  ASSERT_TRUE(d->Memset(w1, 0x11, 2 * kG).ok());
  ASSERT_TRUE(d->Memset(w2, 0x22, 4 * kG).ok());
  // The stack's four granules: four chunks of one page.
  RunStack(*a, *d, kG, 4, 0);
  EXPECT_EQ(creates() - creates0, 5u);
  EXPECT_EQ(maps() - maps0, 5u);
  EXPECT_EQ(a->stats().plan_hits, 2u + 4u);
  // Between iterations the stack's pages are idle: a dynamic request of
  // one granule borrows one of them, never a weight's page.
  a->IterationBegin(1);
  const uint64_t reserved = a->stats().reserved_bytes.current;
  a->ModuleEnter("experts", /*dynamic=*/true);
  DevicePtr dyn = *a->Allocate(kG / 2, 0);
  a->ModuleExit("experts");
  for (const PhysicalExtent& e : a->PhysicalExtents(dyn)) {
    for (const PhysicalExtent& w : a->PhysicalExtents(w1)) {
      EXPECT_NE(e.page, w.page);
    }
    for (const PhysicalExtent& w : a->PhysicalExtents(w2)) {
      EXPECT_NE(e.page, w.page);
    }
  }
  ASSERT_TRUE(a->Free(dyn).ok());
  a->IterationEnd(1);
  a->CheckInvariants();
  EXPECT_GE(a->stats().reserved_bytes.current, reserved);
  std::vector<uint8_t> back(4 * kG);
  ASSERT_TRUE(d->CopyToHost(back.data(), w2, 4 * kG).ok());
  for (uint8_t b : back) ASSERT_EQ(b, 0x22);
  ASSERT_TRUE(a->Free(w1).ok());
  ASSERT_TRUE(a->Free(w2).ok());
  // Without a plan, the weights' chunk is mapped whole in the arena: a
  // request as large as everything held (11 granules: the weights' 6, the
  // stack's 4, the page the dynamic request grew) is served without
  // growing, the chunk at six consecutive granules.
  ASSERT_TRUE(a->UnloadPlans().ok());
  const uint64_t held = a->stats().reserved_bytes.current;
  EXPECT_EQ(held, 11 * kG);
  const uint64_t creates1 = creates();
  DevicePtr big = *a->Allocate(11 * kG, 0);
  EXPECT_EQ(creates(), creates1);
  EXPECT_EQ(a->stats().reserved_bytes.current, held);
  ASSERT_TRUE(d->Memset(big, 0x33, 11 * kG).ok());
  ASSERT_TRUE(a->Free(big).ok());
  a->CheckInvariants();
}

TEST(AllocatorPlansTest, UnloadingGivesTheRegionBackOnceNothingStaticLives) {
  auto d = Host();
  auto a = Make(*d);
  ASSERT_TRUE(a->LoadPlan(StackPlan(kG, 16)).ok());
  RunStack(*a, *d, kG, 16, 0);
  a->IterationBegin(1);
  DevicePtr held = *a->Allocate(kG, 0);  // a hit: static
  EXPECT_EQ(a->UnloadPlans().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(a->has_plan());
  ASSERT_TRUE(a->Free(held).ok());
  ASSERT_TRUE(a->UnloadPlans().ok());
  EXPECT_FALSE(a->has_plan());
  AllocatorStats s = a->stats();
  EXPECT_EQ(s.plans_unloaded, 1u);
  EXPECT_EQ(s.static_backed_bytes, 0u);
  // The pages stay in the pool, mapped nowhere: the dynamic space takes
  // them without growing.
  const uint64_t reserved = s.reserved_bytes.current;
  DevicePtr x = *a->Allocate(16 * kG, 0);
  EXPECT_EQ(a->stats().reserved_bytes.current, reserved);
  ASSERT_TRUE(a->Free(x).ok());
  // A plan can be installed again.
  ASSERT_TRUE(a->LoadPlan(StackPlan(kG, 16)).ok());
  RunStack(*a, *d, kG, 16, 2);
  EXPECT_EQ(a->stats().plan_hits, 33u);
  a->CheckInvariants();
}

TEST(AllocatorPlansTest, ARecordingStartedMidRunIsAValidTrace) {
  auto d = Host();
  auto a = Make(*d);
  a->IterationBegin(0);
  DevicePtr old = *a->Allocate(1000, 0);  // made before the recording
  a->StartRecording(1000);
  EXPECT_TRUE(a->recording());
  DevicePtr young = *a->Allocate(2000, 0);
  ASSERT_TRUE(a->Free(old).ok());  // its free is not recorded
  ASSERT_TRUE(a->Free(young).ok());
  a->IterationEnd(0);
  plan::Trace trace = a->RecordedTrace();
  EXPECT_TRUE(plan::ValidateTrace(trace).ok());
  ASSERT_EQ(trace.events.size(), 3u);  // alloc, free, iteration end
  EXPECT_EQ(trace.events[0].size, 2000u);
  a->ClearRecording();
  EXPECT_TRUE(a->RecordedTrace().events.empty());
  a->StopRecording();
  EXPECT_FALSE(a->recording());
}

TEST(AllocatorPlansTest, AGrownRequestTakesIdleBytesAfterItsEntryOnly) {
  auto d = Host();
  auto a = Make(*d);
  // A [0, 40 KiB) during [0, 4); B [40 KiB, 80 KiB) during [2, 4): the
  // bytes after A are idle in [0, 2) only.
  RuntimePlan plan;
  plan.period = 4;
  plan.region_bytes = 2 * kG;
  plan.iteration = {{40 << 10, 0, 0, 4},
                    {40 << 10, 40 << 10, 2, 4},
                    {8 << 10, 80 << 10, 0, 1}};
  ASSERT_TRUE(a->LoadPlan(plan).ok());  // (the third entry is never used)
  a->IterationBegin(0);
  // A grew by 4 KiB (within the matcher's near-size tolerance): the bytes
  // it would take are B's, planned while A lives: a miss.
  DevicePtr grown = *a->Allocate((40 << 10) + 4096, 0);
  EXPECT_EQ(a->stats().plan_misses, 1u);
  DevicePtr b = *a->Allocate(40 << 10, 0);
  EXPECT_EQ(a->stats().plan_hits, 1u);
  ASSERT_TRUE(a->Free(grown).ok());
  ASSERT_TRUE(a->Free(b).ok());
  a->IterationEnd(0);
  // An entry [80 KiB, 120 KiB) with nothing after it in the region: grown
  // by 4 KiB it keeps its planned place.
  RuntimePlan tail;
  tail.period = 4;
  tail.region_bytes = 2 * kG;
  tail.iteration = {{40 << 10, 80 << 10, 0, 1}};
  auto d2 = Host();
  auto a2 = Make(*d2);
  ASSERT_TRUE(a2->LoadPlan(tail).ok());
  a2->IterationBegin(0);
  DevicePtr t = *a2->Allocate((40 << 10) + 4096, 0);
  EXPECT_EQ(a2->stats().plan_hits, 1u);
  ASSERT_TRUE(d2->Memset(t, 7, (40 << 10) + 4096).ok());
  ASSERT_TRUE(a2->Free(t).ok());
  a2->CheckInvariants();
}

TEST(AllocatorPlansTest, AnIterationALostPlanDidNotServeHasHitRateZero) {
  auto d = Host();
  auto a = Make(*d);
  ASSERT_TRUE(a->LoadPlan(StackPlan(kG, 40)).ok());
  // Iteration 0: its first 20 requests hit, then another shape's miss
  // until the plan is suspended.
  a->IterationBegin(0);
  std::vector<DevicePtr> live;
  for (int i = 0; i < 20; ++i) live.push_back(*a->Allocate(kG, 0));
  for (int i = 0; i < 20; ++i) live.push_back(*a->Allocate(3 * kG, 0));
  for (DevicePtr p : live) ASSERT_TRUE(a->Free(p).ok());
  a->IterationEnd(0);
  ASSERT_TRUE(a->PlanSuspended());
  // Its layout would raise the peak: refused, and the plan loses.
  EXPECT_FALSE(a->AddPlanVariant(StackPlan(3 * kG, 60), true).ok());
  ASSERT_EQ(a->stats().plan_verdict, "lost");
  RunStack(*a, *d, kG, 40, 1);
  const AllocatorStats first = a->stats();  // iteration 0's rate
  EXPECT_GT(first.last_iteration_hit_rate, 0.5);
  EXPECT_LT(first.last_iteration_hit_rate, 1.0);
  RunStack(*a, *d, kG, 40, 2);
  const AllocatorStats lost = a->stats();  // iteration 1's: nothing routed
  EXPECT_EQ(lost.plan_hits, first.plan_hits);
  EXPECT_EQ(lost.last_iteration_hit_rate, 0.0);
  a->CheckInvariants();
}

TEST(AllocatorPlansTest,
     AVariantThatWouldRaiseThePeakIsRefusedAndThePlanLoses) {
  auto d = Host();
  auto a = Make(*d);
  ASSERT_TRUE(a->LoadPlan(StackPlan(kG, 40)).ok());
  // Another shape: 40 buffers of 3 granules, served dynamically once the
  // plan is suspended.
  RunStack(*a, *d, 3 * kG, 40, 0);
  ASSERT_TRUE(a->PlanSuspended());
  const AllocatorStats ran = a->stats();
  EXPECT_GE(ran.reserved_bytes.peak, 120 * kG);
  // A layout of that iteration needing 180 granules would raise the peak:
  // refused, nothing installed, and the plan that did not fit loses.
  Status refused =
      a->AddPlanVariant(StackPlan(3 * kG, 60), /*never_raise_peak=*/true);
  EXPECT_EQ(refused.code(), StatusCode::kOutOfMemory) << refused.ToString();
  AllocatorStats s = a->stats();
  EXPECT_EQ(s.plan_variants, 1u);
  EXPECT_EQ(s.plan_variants_refused, 1u);
  EXPECT_EQ(s.plan_verdict, "lost");
  // The next iteration of that shape: everything dynamic from its first
  // request (no plan hit, no miss, no suspension), in the memory held.
  const uint64_t creates = d->calls(DriverOp::kCreate);
  RunStack(*a, *d, 3 * kG, 40, 1);
  s = a->stats();
  EXPECT_EQ(s.plan_hits, ran.plan_hits);
  EXPECT_EQ(s.plan_misses, ran.plan_misses);
  EXPECT_EQ(s.plan_suspensions, ran.plan_suspensions);
  EXPECT_EQ(d->calls(DriverOp::kCreate), creates) << "new memory";
  EXPECT_EQ(s.reserved_bytes.peak, ran.reserved_bytes.peak);
  // A layout that fits in what is held is installed and serves (a re-plan
  // wins back what a refusal lost).
  ASSERT_TRUE(a->AddPlanVariant(StackPlan(3 * kG, 40),
                                /*never_raise_peak=*/true)
                  .ok());
  RunStack(*a, *d, 3 * kG, 40, 2);
  s = a->stats();
  EXPECT_EQ(s.plan_hits, ran.plan_hits + 40);
  EXPECT_EQ(s.plan_variants_refused, 1u);
  EXPECT_EQ(s.reserved_bytes.peak, ran.reserved_bytes.peak);
  a->CheckInvariants();
}

TEST(AllocatorPlansTest,
     TheMatcherFollowsASuspendedSetUpIntoTheFirstIteration) {
  // A set-up of 100 weights (one granule each, persistent), then one early
  // iteration and the steady one: a stack of 8 buffers of two granules.
  RuntimePlan plan;
  plan.period = 16;
  plan.prologue_iterations = 1;
  for (int i = 0; i < 100; ++i) {
    plan.prologue.push_back({kG, static_cast<int64_t>(i * kG), 0, 1000});
  }
  for (int i = 0; i < 8; ++i) {
    const PlannedRequest entry{2 * kG, static_cast<int64_t>((100 + 2 * i) * kG),
                               i, 16 - i};
    plan.prologue.push_back(entry);
    plan.iteration.push_back(entry);
  }
  plan.region_bytes = 116 * kG;
  auto d = Host();
  auto a = Make(*d);
  ASSERT_TRUE(a->LoadPlan(plan).ok());
  std::vector<DevicePtr> weights, extras;
  for (int i = 0; i < 10; ++i) weights.push_back(*a->Allocate(kG, 0));
  // Requests the plan never saw, in the middle of the set-up: suspended.
  for (int i = 0; i < 40; ++i) extras.push_back(*a->Allocate(3 * kG + 512, 0));
  ASSERT_TRUE(a->PlanSuspended());
  // The rest of the set-up, served dynamically; the matcher follows it.
  for (int i = 10; i < 100; ++i) weights.push_back(*a->Allocate(kG, 0));
  const uint64_t hits = a->stats().plan_hits;
  EXPECT_EQ(hits, 10u);
  // The early iteration meets its own entries (90 set-up entries behind the
  // cursor otherwise: out of the matcher's reach).
  RunStack(*a, *d, 2 * kG, 8, 0);
  EXPECT_EQ(a->stats().plan_hits, hits + 8);
  RunStack(*a, *d, 2 * kG, 8, 1);
  EXPECT_EQ(a->stats().plan_hits, hits + 16);
  for (DevicePtr p : extras) ASSERT_TRUE(a->Free(p).ok());
  for (DevicePtr p : weights) ASSERT_TRUE(a->Free(p).ok());
  a->CheckInvariants();
}

TEST(AllocatorPlansTest, AVariantOneGranuleAboveTheHighWaterMarkIsInstalled) {
  auto d = Host();
  auto a = Make(*d);
  ASSERT_TRUE(a->LoadPlan(StackPlan(kG, 40)).ok());
  RunStack(*a, *d, 3 * kG, 40, 0);  // another shape, served dynamically
  ASSERT_TRUE(a->PlanSuspended());
  const uint64_t held = a->stats().reserved_bytes.peak;
  ASSERT_EQ(held % kG, 0u);
  const int granules = static_cast<int>(held / kG);
  // Nothing is live: a layout of its range alone needs what it spans.
  // Two granules above the most ever held: refused.
  EXPECT_EQ(a->AddPlanVariant(StackPlan(kG, granules + 2),
                              /*never_raise_peak=*/true)
                .code(),
            StatusCode::kOutOfMemory);
  // One granule above (the rounding of a layout's end to a granule): in.
  ASSERT_TRUE(a->AddPlanVariant(StackPlan(kG, granules + 1),
                                /*never_raise_peak=*/true)
                  .ok());
  EXPECT_EQ(a->stats().plan_variants, 2u);
  EXPECT_EQ(a->stats().plan_variants_refused, 1u);
  RunStack(*a, *d, kG, granules + 1, 1);
  EXPECT_EQ(a->stats().reserved_bytes.peak, held + kG);
  a->CheckInvariants();
}

TEST(AllocatorPlansTest, AVariantStartsAboveRegionPagesServingLiveArenaData) {
  auto d = Host();
  auto a = Make(*d);
  ASSERT_TRUE(a->LoadPlan(StackPlan(kG, 40)).ok());
  // The plan's own shape backs the region's 40 granules: their pages.
  std::set<PageId> region_pages;
  a->IterationBegin(0);
  std::vector<DevicePtr> planned;
  for (int i = 0; i < 40; ++i) planned.push_back(*a->Allocate(kG, 0));
  for (DevicePtr p : planned) {
    for (const PhysicalExtent& e : a->PhysicalExtents(p))
      region_pages.insert(e.page);
  }
  for (auto it = planned.rbegin(); it != planned.rend(); ++it)
    ASSERT_TRUE(a->Free(*it).ok());
  a->IterationEnd(0);
  ASSERT_EQ(a->stats().plan_hits, 40u);
  // Another shape, suspended: the arena takes the idle static pages, and
  // one of its allocations (a gradient, say) outlives the iteration.
  a->IterationBegin(1);
  std::vector<DevicePtr> live;
  for (int i = 0; i < 20; ++i) live.push_back(*a->Allocate(kG + kG / 2, 0));
  ASSERT_TRUE(a->PlanSuspended());
  const DevicePtr kept = live.back();
  live.pop_back();
  ASSERT_TRUE(d->Memset(kept, 0x6B, kG + kG / 2).ok());
  for (DevicePtr p : live) ASSERT_TRUE(a->Free(p).ok());
  a->IterationEnd(1);
  // The kept allocation sits on region pages lent to the arena.
  bool on_region_pages = false;
  for (const PhysicalExtent& e : a->PhysicalExtents(kept))
    on_region_pages |= region_pages.count(e.page) > 0;
  ASSERT_TRUE(on_region_pages);
  // A variant laid out from the region's start would find those bytes
  // taken in every iteration (misses, suspension); it starts above them.
  ASSERT_TRUE(a->AddPlanVariant(StackPlan(2 * kG, 8)).ok());
  const AllocatorStats before = a->stats();
  RunStack(*a, *d, 2 * kG, 8, 2);
  RunStack(*a, *d, 2 * kG, 8, 3);
  const AllocatorStats after = a->stats();
  EXPECT_EQ(after.plan_hits - before.plan_hits, 16u);
  EXPECT_EQ(after.plan_misses, before.plan_misses);
  EXPECT_EQ(after.plan_suspensions, before.plan_suspensions);
  std::vector<uint8_t> back(kG + kG / 2);
  ASSERT_TRUE(d->CopyToHost(back.data(), kept, kG + kG / 2).ok());
  for (uint8_t b : back) ASSERT_EQ(b, 0x6B);
  ASSERT_TRUE(a->Free(kept).ok());
  a->CheckInvariants();
}

}  // namespace
}  // namespace loom::vmm
