#include "vmm/allocator.h"

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <thread>

#include "vmm/allocator_testing.h"
#include "vmm/fake_driver.h"
#include "vmm/host_driver.h"

namespace loom::vmm {
namespace {

constexpr uint64_t kG = 64 << 10;

std::unique_ptr<HostDriver> Host(uint64_t capacity = 256 * kG) {
  HostDriverOptions options;
  options.granularity = kG;
  options.capacity_per_device = capacity;
  return std::move(HostDriver::Open(options)).value();
}

std::unique_ptr<Allocator> Make(Driver& driver, AllocatorOptions options = {}) {
  if (options.arena_va_bytes == 0) options.arena_va_bytes = 1024 * kG;
  StatusOr<std::unique_ptr<Allocator>> a = Allocator::Create(driver, options);
  LOOM_CHECK(a.ok(), "{}", a.status().ToString());
  return std::move(a).value();
}

using test_support::ExpectStamp;
using test_support::Stamp;

// One steady-state iteration: (size, alloc time, free time, offset).
struct Buf {
  uint64_t size;
  int64_t start;
  int64_t end;
  int64_t offset;
};

RuntimePlan PlanFor(const std::vector<Buf>& bufs, uint64_t region) {
  RuntimePlan plan;
  plan.region_bytes = region;
  int64_t period = 0;
  std::vector<Buf> by_start = bufs;
  std::stable_sort(
      by_start.begin(), by_start.end(),
      [](const Buf& a, const Buf& b) { return a.start < b.start; });
  for (const Buf& b : by_start) {
    plan.iteration.push_back({b.size, b.offset, b.start, b.end});
    period = std::max(period, b.end);
  }
  plan.period = period;
  return plan;
}

// Runs one iteration of `bufs` (events ordered by time, frees first),
// stamping every allocation and checking the stamp at its free.
void RunIteration(Allocator& a, Driver& d, const std::vector<Buf>& bufs,
                  uint64_t number) {
  a.IterationBegin(number);
  int64_t horizon = 0;
  for (const Buf& b : bufs) horizon = std::max(horizon, b.end);
  std::map<size_t, DevicePtr> live;
  for (int64_t t = 0; t <= horizon; ++t) {
    for (size_t i = 0; i < bufs.size(); ++i) {
      if (bufs[i].end == t && live.contains(i)) {
        ExpectStamp(d, live[i], bufs[i].size, static_cast<uint8_t>(i + 1));
        ASSERT_TRUE(a.Free(live[i]).ok());
        live.erase(i);
        a.CheckInvariants();
      }
    }
    for (size_t i = 0; i < bufs.size(); ++i) {
      if (bufs[i].start == t) {
        StatusOr<DevicePtr> p = a.Allocate(bufs[i].size, 0);
        ASSERT_TRUE(p.ok()) << p.status().ToString();
        live[i] = *p;
        Stamp(d, *p, bufs[i].size, static_cast<uint8_t>(i + 1));
        a.CheckInvariants();
      }
    }
  }
  a.IterationEnd(number);
}

// Three buffers; 0 and 2 share bytes at different times.
const std::vector<Buf> kIteration = {
    {100 << 10, 0, 2, 0},         // granules 0-1
    {64 << 10, 1, 4, 128 << 10},  // granule 2
    {120 << 10, 2, 5, 0},         // reuses 0's bytes after it died
};

TEST(AllocatorTest, RecordModeServesFromTheArenaAndRecordsTheTrace) {
  auto d = Host();
  AllocatorOptions options;
  options.record_capacity = 1000;
  auto a = Make(*d, options);
  RunIteration(*a, *d, kIteration, 0);
  AllocatorStats s = a->stats();
  EXPECT_EQ(s.allocated_bytes.current, 0u);
  EXPECT_EQ(s.allocated_bytes.peak, (64 << 10) + (120 << 10));
  EXPECT_EQ(s.dynamic_bytes.allocated, (100 << 10) + (64 << 10) + (120 << 10));
  EXPECT_EQ(s.plan_hits, 0u);
  plan::Trace trace = a->TakeTrace();
  ASSERT_EQ(trace.events.size(), 8u);  // begin, 3 allocs, 3 frees, end
  EXPECT_TRUE(plan::ValidateTrace(trace).ok());
  EXPECT_EQ(trace.events[1].kind, plan::EventKind::kAlloc);
  EXPECT_EQ(trace.events[1].size, 100u << 10);
}

TEST(AllocatorTest, PlannedIterationsHitEveryTimeWithNoDriverCalls) {
  auto d = Host();
  auto a = Make(*d);
  ASSERT_TRUE(a->LoadPlan(PlanFor(kIteration, 3 * kG)).ok());
  EXPECT_EQ(a->stats().reserved_bytes.current, 0u) << "backed lazily";
  RunIteration(*a, *d, kIteration, 0);
  EXPECT_EQ(a->stats().reserved_bytes.current, 3 * kG);
  EXPECT_EQ(a->stats().static_backed_bytes, 3 * kG);
  auto calls_after_first = d->all_calls();
  for (uint64_t i = 1; i < 10; ++i) RunIteration(*a, *d, kIteration, i);
  AllocatorStats s = a->stats();
  EXPECT_EQ(s.plan_hits, 30u);
  EXPECT_EQ(s.plan_misses, 0u);
  EXPECT_EQ(s.last_iteration_hit_rate, 1.0);
  EXPECT_EQ(s.reserved_bytes.peak, 3 * kG)
      << "nothing beyond the static region";
  auto calls = d->all_calls();
  for (DriverOp op : {DriverOp::kCreate, DriverOp::kMap, DriverOp::kUnmap,
                      DriverOp::kRelease}) {
    EXPECT_EQ(calls[static_cast<size_t>(op)],
              calls_after_first[static_cast<size_t>(op)])
        << DriverOpName(op) << " called in steady state";
  }
}

TEST(AllocatorTest, APlanIsBackedByItsFirstIterationWithOneSetAccess) {
  auto d = Host();
  auto a = Make(*d);
  auto before = d->all_calls();
  ASSERT_TRUE(a->LoadPlan(PlanFor(kIteration, 3 * kG)).ok());
  auto delta = [&](DriverOp op) {
    return d->all_calls()[static_cast<size_t>(op)] -
           before[static_cast<size_t>(op)];
  };
  EXPECT_EQ(delta(DriverOp::kReserve), 1u);
  EXPECT_EQ(delta(DriverOp::kCreate), 0u) << "nothing backed yet";
  EXPECT_EQ(delta(DriverOp::kMap), 0u);
  // The first planned request backs its granules and the rest of the
  // region (pages to spare): one chunk (a handle, mapped whole) per stretch
  // of granules the plan uses at the same times: granules 0-1 (buffers 0
  // and 2) and granule 2 (buffer 1): two creates, two maps, one set-access
  // for all of them. Access really covers every page: the host backend
  // faults otherwise.
  RunIteration(*a, *d, kIteration, 0);
  EXPECT_EQ(delta(DriverOp::kCreate), 2u);
  EXPECT_EQ(delta(DriverOp::kMap), 2u);
  EXPECT_EQ(delta(DriverOp::kSetAccess), 1u);
  EXPECT_EQ(d->contract_counts().handles, 2u);
  EXPECT_EQ(a->stats().plan_hits, 3u);
}

TEST(AllocatorTest, APlannedRangeStillInUseIsAMissServedElsewhere) {
  auto d = Host();
  auto a = Make(*d);
  ASSERT_TRUE(a->LoadPlan(PlanFor(kIteration, 3 * kG)).ok());
  a->IterationBegin(0);
  DevicePtr b0 = *a->Allocate(100 << 10, 0);
  Stamp(*d, b0, 100 << 10, 0xA0);
  DevicePtr b1 = *a->Allocate(64 << 10, 0);
  // Buffer 0 should die now, but the program keeps it: buffer 2's planned
  // bytes are still in use, so buffer 2 must go elsewhere.
  DevicePtr b2 = *a->Allocate(120 << 10, 0);
  EXPECT_NE(b2, b0);
  Stamp(*d, b2, 120 << 10, 0xB2);
  ExpectStamp(*d, b0, 100 << 10, 0xA0);
  a->CheckInvariants();
  AllocatorStats s = a->stats();
  EXPECT_EQ(s.plan_hits, 2u);
  EXPECT_EQ(s.plan_misses, 1u);
  ASSERT_TRUE(a->Free(b0).ok());
  ASSERT_TRUE(a->Free(b1).ok());
  ASSERT_TRUE(a->Free(b2).ok());
  a->CheckInvariants();
}

// The plan says module "moe" runs while the whole static region is idle.
RuntimePlan PlanWithIdleWindow() {
  RuntimePlan plan = PlanFor(kIteration, 3 * kG);
  plan.windows.push_back(DynamicWindow{"moe", 0, 0, {0, 1, 2}});
  return plan;
}

TEST(AllocatorTest, DynamicRequestsBorrowIdleStaticPages) {
  auto d = Host();
  auto a = Make(*d);
  ASSERT_TRUE(a->LoadPlan(PlanWithIdleWindow()).ok());
  RunIteration(*a, *d, kIteration, 0);  // backs the region
  a->IterationBegin(1);
  // Inside a dynamic module nothing static is live: the whole region is idle.
  a->ModuleEnter("moe", /*dynamic=*/true);
  DevicePtr x = *a->Allocate(2 * kG + 1000, 0);
  Stamp(*d, x, 2 * kG + 1000, 0x77);
  a->CheckInvariants();
  EXPECT_EQ(a->stats().reserved_bytes.current, 3 * kG)
      << "no new page was created";
  ASSERT_TRUE(a->Free(x).ok());
  a->ModuleExit("moe");
  // The planned requests still get their planned ranges.
  DevicePtr b0 = *a->Allocate(100 << 10, 0);
  a->CheckInvariants();
  EXPECT_EQ(a->stats().plan_hits, 4u) << "3 in iteration 0, then b0";
  ASSERT_TRUE(a->Free(b0).ok());
}

TEST(AllocatorTest, RequestsOfUnknownLifetimeBorrowNoPlannedPage) {
  auto d = Host();
  auto a = Make(*d);
  ASSERT_TRUE(a->LoadPlan(PlanFor(kIteration, 3 * kG)).ok());
  RunIteration(*a, *d, kIteration, 0);  // backs the region
  a->IterationBegin(1);
  a->ModuleEnter("moe", true);
  // No window for "moe": the request may live for ever, so no granule the
  // plan uses is lent (its owner would miss every iteration): new memory.
  DevicePtr x = *a->Allocate(3 * kG, 0);
  a->ModuleExit("moe");
  EXPECT_EQ(a->stats().reserved_bytes.current, 6 * kG);
  DevicePtr b0 = *a->Allocate(100 << 10, 0);
  EXPECT_EQ(a->stats().plan_hits, 4u) << "3 in iteration 0, then b0";
  a->CheckInvariants();
  ASSERT_TRUE(a->Free(x).ok());
  ASSERT_TRUE(a->Free(b0).ok());
}

// A long period in which A's bytes are idle from its free (time 10) to the
// next iteration's A (time 640) and B's granule until time 300.
const std::vector<Buf> kLongIdle = {
    {128 << 10, 0, 10, 0},            // A: granules 0-1
    {64 << 10, 300, 640, 128 << 10},  // B: granule 2
};

TEST(AllocatorTest, AMissTakesStaticBytesIdleForAShortWhile) {
  auto d = Host();
  auto a = Make(*d);
  ASSERT_TRUE(a->LoadPlan(PlanFor(kLongIdle, 3 * kG)).ok());
  RunIteration(*a, *d, kLongIdle, 0);  // backs the region
  const uint64_t held = a->stats().reserved_bytes.current;
  EXPECT_EQ(held, 3 * kG);
  a->IterationBegin(1);
  DevicePtr pa = *a->Allocate(128 << 10, 0);  // A: a hit
  Stamp(*d, pa, 128 << 10, 1);
  ASSERT_TRUE(a->Free(pa).ok());
  // A size the plan does not have: a miss, expected to live 1/64 of the
  // period; A's bytes are idle far longer, so it goes there, no new page.
  DevicePtr x = *a->Allocate(20 << 10, 0);
  Stamp(*d, x, 20 << 10, 2);
  a->CheckInvariants();
  EXPECT_EQ(a->stats().plan_misses, 1u);
  EXPECT_EQ(a->stats().idle_static_placements, 1u);
  EXPECT_EQ(a->stats().reserved_bytes.current, held) << "no new page";
  ExpectStamp(*d, x, 20 << 10, 2);
  ASSERT_TRUE(a->Free(x).ok());
  DevicePtr pb = *a->Allocate(64 << 10, 0);  // B: still a hit
  EXPECT_EQ(a->stats().plan_hits, 4u) << "2 in iteration 0, then A and B";
  ASSERT_TRUE(a->Free(pb).ok());
  a->IterationEnd(1);
  a->CheckInvariants();
}

TEST(AllocatorTest, AMissThatOutlivesItsGuessMakesItsOwnerMissNotShare) {
  auto d = Host();
  auto a = Make(*d);
  ASSERT_TRUE(a->LoadPlan(PlanFor(kLongIdle, 3 * kG)).ok());
  RunIteration(*a, *d, kLongIdle, 0);
  a->IterationBegin(1);
  DevicePtr pa = *a->Allocate(128 << 10, 0);
  ASSERT_TRUE(a->Free(pa).ok());
  DevicePtr x = *a->Allocate(20 << 10, 0);  // placed in A's idle bytes
  Stamp(*d, x, 20 << 10, 0x5a);
  ASSERT_EQ(a->stats().idle_static_placements, 1u);
  DevicePtr pb = *a->Allocate(64 << 10, 0);
  ASSERT_TRUE(a->Free(pb).ok());
  a->IterationEnd(1);
  // x lives on into the next iteration: A finds its bytes taken and is
  // served elsewhere; neither allocation overlaps the other.
  a->IterationBegin(2);
  const uint64_t misses = a->stats().plan_misses;
  DevicePtr pa2 = *a->Allocate(128 << 10, 0);
  Stamp(*d, pa2, 128 << 10, 0xa5);
  a->CheckInvariants();
  EXPECT_TRUE(pa2 + (128 << 10) <= x || x + (20 << 10) <= pa2);
  EXPECT_EQ(a->stats().plan_misses, misses + 1);
  ExpectStamp(*d, x, 20 << 10, 0x5a);
  ExpectStamp(*d, pa2, 128 << 10, 0xa5);
  ASSERT_TRUE(a->Free(x).ok());
  ASSERT_TRUE(a->Free(pa2).ok());
  a->CheckInvariants();
}

TEST(AllocatorTest, UnderACapAnIdleArenaPageIsRemappedInsteadOfGrowing) {
  auto d = Host();
  AllocatorOptions options;
  options.memory_cap_bytes = 4 * kG;
  auto a = Make(*d, options);
  DevicePtr x = *a->Allocate(2 * kG, 0);
  DevicePtr y = *a->Allocate(kG, 0);
  ASSERT_TRUE(a->Free(x).ok());  // two idle pages stay mapped in the arena
  // Needs 3 granules in a row: one new page, then the idle ones remapped.
  DevicePtr z = *a->Allocate(3 * kG, 0);
  EXPECT_EQ(a->stats().reserved_bytes.peak, 4 * kG);
  a->CheckInvariants();
  ASSERT_TRUE(a->Free(y).ok());
  ASSERT_TRUE(a->Free(z).ok());
}

TEST(AllocatorTest, LentPageBlocksItsPlannedOwnerUntilReturned) {
  auto d = Host();
  auto a = Make(*d);
  ASSERT_TRUE(a->LoadPlan(PlanWithIdleWindow()).ok());
  RunIteration(*a, *d, kIteration, 0);  // backs the region
  a->IterationBegin(1);
  a->ModuleEnter("moe", true);
  DevicePtr x = *a->Allocate(3 * kG, 0);  // borrows all three static pages
  a->ModuleExit("moe");
  Stamp(*d, x, 3 * kG, 0x55);
  // Buffer 0's planned pages are lent: it must be served elsewhere.
  DevicePtr b0 = *a->Allocate(100 << 10, 0);
  Stamp(*d, b0, 100 << 10, 0x66);
  ExpectStamp(*d, x, 3 * kG, 0x55);
  a->CheckInvariants();
  EXPECT_EQ(a->stats().plan_misses, 1u);
  ASSERT_TRUE(a->Free(x).ok());
  ASSERT_TRUE(a->Free(b0).ok());
  a->CheckInvariants();
}

TEST(AllocatorTest, OutOfMemoryReturnsAnErrorAndLeaksNothing) {
  auto d = Host(/*capacity=*/4 * kG);
  auto a = Make(*d);
  DevicePtr x = *a->Allocate(3 * kG, 0);
  StatusOr<DevicePtr> y = a->Allocate(2 * kG, 0);
  EXPECT_EQ(y.status().code(), StatusCode::kOutOfMemory);
  AllocatorStats s = a->stats();
  EXPECT_EQ(s.num_ooms, 1u);
  EXPECT_EQ(s.num_alloc_retries, 1u);
  a->CheckInvariants();
  ASSERT_TRUE(a->Free(x).ok());
  // After freeing, the same request fits.
  DevicePtr z = *a->Allocate(4 * kG, 0);
  ASSERT_TRUE(a->Free(z).ok());
  ASSERT_TRUE(a->EmptyCache().ok());
  EXPECT_EQ(a->stats().reserved_bytes.current, 0u);
  EXPECT_EQ(d->contract_counts().handles, 0u);
  EXPECT_EQ(d->contract_counts().mappings, 0u);
}

TEST(AllocatorTest, MemoryCapIsHonoured) {
  auto d = Host();
  AllocatorOptions options;
  options.memory_cap_bytes = 2 * kG;
  auto a = Make(*d, options);
  DevicePtr x = *a->Allocate(2 * kG, 0);
  EXPECT_EQ(a->Allocate(1, 0).status().code(), StatusCode::kOutOfMemory);
  ASSERT_TRUE(a->Free(x).ok());
}

TEST(AllocatorTest, BadCallsAreErrors) {
  auto d = Host();
  auto a = Make(*d);
  EXPECT_EQ(a->Allocate(0, 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(a->Allocate(uint64_t{1} << 60, 0).status().code(),
            StatusCode::kOutOfMemory);
  EXPECT_EQ(a->Free(0x1234).code(), StatusCode::kInvalidArgument);
  DevicePtr x = *a->Allocate(10, 0);
  ASSERT_TRUE(a->Free(x).ok());
  EXPECT_EQ(a->Free(x).code(), StatusCode::kInvalidArgument) << "double free";
  RuntimePlan bad;
  bad.region_bytes = kG + 1;
  EXPECT_EQ(a->LoadPlan(bad).code(), StatusCode::kInvalidArgument);
  bad.region_bytes = kG;
  bad.iteration.push_back({100, static_cast<int64_t>(kG) - 50, 0, 1});
  EXPECT_EQ(a->LoadPlan(bad).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(a->LoadPlan(PlanFor(kIteration, 3 * kG)).ok());
  EXPECT_EQ(a->LoadPlan(PlanFor(kIteration, 3 * kG)).code(),
            StatusCode::kFailedPrecondition);
}

TEST(AllocatorTest, FailedPageCreationIsCleanlyReported) {
  FakeDriverOptions fo;
  fo.granularity = kG;
  FakeDriver d(fo);
  auto a = Make(d);
  d.InjectFailure(DriverOp::kCreate, 1, InternalError("driver hiccup"));
  StatusOr<DevicePtr> x = a->Allocate(kG, 0);
  EXPECT_EQ(x.status().code(), StatusCode::kInternal);
  d.InjectFailure(DriverOp::kMap, 1, InternalError("map hiccup"));
  EXPECT_FALSE(a->Allocate(kG, 0).ok());
  a->CheckInvariants();
  DevicePtr y = *a->Allocate(kG, 0);  // works again afterwards
  ASSERT_TRUE(a->Free(y).ok());
  a->CheckInvariants();
}

TEST(AllocatorTest, OtherStreamsWaitForTheFreeingStream) {
  FakeDriverOptions fo;
  fo.granularity = kG;
  FakeDriver d(fo);
  d.set_events_complete_immediately(false);
  auto a = Make(d);
  const Stream s1 = 0x1000, s2 = 0x2000;
  DevicePtr x = *a->Allocate(kG, s1);
  ASSERT_TRUE(a->Free(x).ok());
  // Same stream: reuse right away (stream order protects it).
  EXPECT_EQ(*a->Allocate(kG, s1), x);
  ASSERT_TRUE(a->Free(x).ok());
  // Another stream: s1's work may still use the page, so not that page.
  DevicePtr y = *a->Allocate(kG, s2);
  EXPECT_NE(y, x);
  ASSERT_TRUE(a->Free(y).ok());
  d.CompleteEvents();
  // Once s1's work is done, the page can serve s2 (and y's page too).
  DevicePtr z = *a->Allocate(2 * kG, s2);
  a->CheckInvariants();
  ASSERT_TRUE(a->Free(z).ok());
}

TEST(AllocatorTest, RecordStreamKeepsMemoryActiveUntilTheStreamIsDone) {
  FakeDriverOptions fo;
  fo.granularity = kG;
  FakeDriver d(fo);
  d.set_events_complete_immediately(false);
  auto a = Make(d);
  const Stream s1 = 0x1000, s2 = 0x2000;
  DevicePtr x = *a->Allocate(kG, s1);
  ASSERT_TRUE(a->RecordStream(x, s2).ok());
  ASSERT_TRUE(a->Free(x).ok());
  AllocatorStats s = a->stats();
  EXPECT_EQ(s.allocated_bytes.current, 0u);
  EXPECT_EQ(s.active_bytes.current, kG) << "still in use by s2";
  DevicePtr y = *a->Allocate(kG, s1);
  EXPECT_NE(y, x) << "memory awaiting s2 was handed out again";
  a->CheckInvariants();
  d.CompleteEvents();
  ASSERT_TRUE(a->Free(y).ok());  // processes the pending free
  EXPECT_EQ(a->stats().active_bytes.current, 0u);
  EXPECT_EQ(a->RecordStream(0xdead, s2).code(), StatusCode::kInvalidArgument);
}

TEST(AllocatorTest, ManyThreadsAtOnce) {
  auto d = Host(4096 * kG);  // room for every thread's live set
  auto a = Make(*d);
  constexpr int kThreads = 4;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<DevicePtr> mine;
      for (int i = 0; i < 200; ++i) {
        uint64_t size = 1 + (i * 7919 + t * 104729) % (3 * kG);
        StatusOr<DevicePtr> p = a->Allocate(size, 0);
        if (!p.ok()) {
          ++failures;
          continue;
        }
        uint8_t tag = static_cast<uint8_t>(t * 50 + i);
        std::memset(reinterpret_cast<void*>(*p), tag, 64);
        mine.push_back(*p);
        if (i % 3 == 2) {
          DevicePtr victim = mine[mine.size() / 2];
          mine.erase(mine.begin() + mine.size() / 2);
          if (!a->Free(victim).ok()) ++failures;
        }
      }
      for (DevicePtr p : mine) {
        if (!a->Free(p).ok()) ++failures;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
  a->CheckInvariants();
  EXPECT_EQ(a->stats().allocated_bytes.current, 0u);
}

// Stitching spends virtual address space: a chunk stays mapped at every
// place it was stitched to (up to kMaxArenaMappings). When the arena has no
// place left, the OOM retry unmaps the places that serve nothing (a chunk
// in use at another of its places included) and the request is served, the
// live allocations' bytes intact.
TEST(AllocatorTest, AnArenaFullOfStitchedMappingsMakesRoomOnRetry) {
  auto d = Host();
  AllocatorOptions options;
  options.arena_va_bytes = 4 * kG;
  auto a = Make(*d, options);
  for (uint64_t it = 0; it < kStitchFromIteration; ++it) {
    a->IterationBegin(it);
    a->IterationEnd(it);
  }
  a->IterationBegin(kStitchFromIteration);
  DevicePtr x = *a->Allocate(kG, 0);     // granule 0, a chunk of one page
  DevicePtr wall = *a->Allocate(kG, 0);  // granule 1
  ASSERT_TRUE(a->Free(x).ok());
  // Two granules do not fit x's place: x's idle chunk is mapped again at
  // granule 2 (above the peak, stitched), one new page at 3.
  DevicePtr y = *a->Allocate(2 * kG, 0);
  EXPECT_EQ(y, x + 2 * kG);
  EXPECT_EQ(a->stats().stitched_pages, 1u);
  Stamp(*d, wall, kG, 0x11);
  Stamp(*d, y, 2 * kG, 0x22);
  // The only free place is granule 0, whose page serves y at granule 2:
  // unusable. The retry unmaps that idle mapping and maps a new page there.
  const uint64_t unmaps = d->calls(DriverOp::kUnmap);
  StatusOr<DevicePtr> z = a->Allocate(kG, 0);
  ASSERT_TRUE(z.ok()) << z.status().ToString();
  EXPECT_EQ(*z, x);
  EXPECT_EQ(a->stats().num_alloc_retries, 1u);
  EXPECT_EQ(a->stats().num_ooms, 0u);
  EXPECT_EQ(d->calls(DriverOp::kUnmap), unmaps + 1);
  Stamp(*d, *z, kG, 0x33);
  ExpectStamp(*d, wall, kG, 0x11);
  ExpectStamp(*d, y, 2 * kG, 0x22);
  a->CheckInvariants();
  for (DevicePtr p : {*z, wall, y}) ASSERT_TRUE(a->Free(p).ok());
  a->IterationEnd(kStitchFromIteration);
  ASSERT_TRUE(a->EmptyCache().ok());
  EXPECT_EQ(d->contract_counts().handles, 0u);
  EXPECT_EQ(d->contract_counts().mappings, 0u);
}

TEST(AllocatorTest, StatsJsonHasTorchKeys) {
  auto d = Host();
  auto a = Make(*d);
  DevicePtr x = *a->Allocate(1000, 0);
  std::string json = a->stats().ToJson();
  for (const char* key :
       {"\"allocated_bytes.all.current\":1000",
        "\"reserved_bytes.all.peak\":65536", "\"num_ooms\":0",
        "\"loom.plan_hits\":0", "\"loom.driver_calls.create\":1"}) {
    EXPECT_NE(json.find(key), std::string::npos) << key << " in " << json;
  }
  a->ResetPeakStats();
  ASSERT_TRUE(a->Free(x).ok());
  EXPECT_EQ(a->stats().allocated_bytes.peak, 1000u);
  a->ResetPeakStats();
  EXPECT_EQ(a->stats().allocated_bytes.peak, 0u);
}

}  // namespace
}  // namespace loom::vmm
