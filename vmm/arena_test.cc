#include "vmm/arena.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "vmm/fake_driver.h"

namespace loom::vmm {
namespace {

constexpr uint64_t kG = 64 << 10;

// Grows the pool for every new granule; pages listed in `busy` are unusable.
class GrowingPolicy : public Arena::PagePolicy {
 public:
  explicit GrowingPolicy(PagePool& pool) : pool_(pool) {}
  bool Usable(PageId page, uint32_t, uint32_t, Stream, int64_t) override {
    return !busy.contains(page);
  }
  StatusOr<PageRun> Acquire(uint32_t wanted, uint32_t, Stream,
                            int64_t) override {
    ++acquired;
    asked.push_back(wanted);
    return pool_.GrowRun(chunk_pages == 0 ? 1 : std::min(wanted, chunk_pages));
  }
  uint32_t chunk_pages = 0;  // 0: one page per call
  std::vector<uint32_t> asked;
  std::set<PageId> busy;
  int acquired = 0;

 private:
  PagePool& pool_;
};

struct ArenaFixture : ::testing::Test {
  ArenaFixture() : driver(Options()), pool(driver, 0, kG, 0), policy(pool) {
    arena = std::move(Arena::Create(driver, pool, 0, 64 * kG)).value();
  }
  ~ArenaFixture() override {
    arena.reset();
    for (PageId id = 0; id < pool.slots(); ++id) {
      if (pool.page(id).live) {
        EXPECT_TRUE(pool.ReleasePage(id).ok());
      }
    }
  }
  static FakeDriverOptions Options() {
    FakeDriverOptions o;
    o.granularity = kG;
    return o;
  }
  FakeDriver driver;
  PagePool pool;
  GrowingPolicy policy;
  std::unique_ptr<Arena> arena;
};

TEST_F(ArenaFixture, SmallRequestsShareAGranuleAndCoalesceOnFree) {
  DevicePtr a = *arena->Allocate(1000, 0, -1, policy);  // rounds to 1024
  DevicePtr b = *arena->Allocate(512, 0, -1, policy);
  EXPECT_EQ(b, a + 1024);
  EXPECT_EQ(policy.acquired, 1);
  EXPECT_EQ(pool.page(arena->PageAt(a)).arena_users, 2u);
  arena->Free(a, 1000, FreeTag{});
  arena->Free(b, 512, FreeTag{});
  arena->CheckInvariants();
  EXPECT_EQ(arena->live_bytes(), 0u);
  // Everything coalesced back: a granule-sized request lands at the start.
  DevicePtr c = *arena->Allocate(kG, 0, -1, policy);
  EXPECT_EQ(c, a);
  EXPECT_EQ(policy.acquired, 1) << "the mapping was reused";
  arena->Free(c, kG, FreeTag{});
}

TEST_F(ArenaFixture, RepeatingWorkloadMakesNoNewMappings) {
  for (int round = 0; round < 5; ++round) {
    DevicePtr x = *arena->Allocate(3 * kG + 100, 0, -1, policy);
    DevicePtr y = *arena->Allocate(kG / 3, 0, -1, policy);
    arena->Free(x, 3 * kG + 100, FreeTag{});
    arena->Free(y, kG / 3, FreeTag{});
  }
  // x touches 4 granules; y fits in the tail of x's last granule.
  EXPECT_EQ(arena->maps(), 4u);
  arena->CheckInvariants();
}

TEST_F(ArenaFixture, BusyPagesAreSkipped) {
  DevicePtr x = *arena->Allocate(2 * kG, 0, -1, policy);
  arena->Free(x, 2 * kG, FreeTag{});
  // The first granule's page is now serving something else (e.g. a planned
  // static allocation): a new request must not use that granule.
  policy.busy.insert(arena->PageAt(x));
  DevicePtr y = *arena->Allocate(kG, 0, -1, policy);
  EXPECT_EQ(y, x + kG);
  EXPECT_EQ(pool.page(arena->PageAt(x)).arena_users, 0u);
  arena->Free(y, kG, FreeTag{});
  arena->CheckInvariants();
}

TEST_F(ArenaFixture, UnmapIdleReturnsPagesInOneCallPerMapping) {
  DevicePtr x = *arena->Allocate(3 * kG, 0, -1, policy);
  DevicePtr y = *arena->Allocate(kG, 0, -1, policy);
  arena->Free(x, 3 * kG, FreeTag{});
  uint64_t unmap_calls = driver.calls(DriverOp::kUnmap);
  std::vector<PageId> pages = *arena->UnmapIdle();
  EXPECT_EQ(pages.size(), 3u);
  // x's three pages are three chunks, three mappings: one call each.
  EXPECT_EQ(driver.calls(DriverOp::kUnmap), unmap_calls + 3);
  EXPECT_EQ(arena->mapped_granules(), 1u);
  arena->Free(y, kG, FreeTag{});
  arena->CheckInvariants();
}

TEST_F(ArenaFixture, FailedAcquireAllocatesNothing) {
  driver.InjectFailure(DriverOp::kCreate, 1, OutOfMemoryError("no more"));
  EXPECT_EQ(arena->Allocate(kG, 0, -1, policy).status().code(),
            StatusCode::kOutOfMemory);
  EXPECT_EQ(arena->live_bytes(), 0u);
  arena->CheckInvariants();
}

TEST_F(ArenaFixture, NewGranulesGetAccessInOneCall) {
  DevicePtr x = *arena->Allocate(kG, 0, -1, policy);  // granule 0
  const uint64_t access = driver.calls(DriverOp::kSetAccess);
  const uint64_t maps = driver.calls(DriverOp::kMap);
  // Granules 1-4 are new: four maps, one set-access over all of them.
  DevicePtr y = *arena->Allocate(4 * kG, 0, -1, policy);
  EXPECT_EQ(y, x + kG);
  EXPECT_EQ(driver.calls(DriverOp::kMap), maps + 4);
  EXPECT_EQ(driver.calls(DriverOp::kSetAccess), access + 1);
  EXPECT_EQ(arena->mapped_granules(), 5u);
  arena->Free(x, kG, FreeTag{});
  arena->Free(y, 4 * kG, FreeTag{});
  arena->CheckInvariants();
}

TEST_F(ArenaFixture, AFailedSetAccessLeavesNoMappingBehind) {
  DevicePtr x = *arena->Allocate(kG, 0, -1, policy);
  const uint64_t unmaps = driver.calls(DriverOp::kUnmap);
  driver.InjectFailure(DriverOp::kSetAccess, 1, InternalError("injected"));
  EXPECT_EQ(arena->Allocate(3 * kG, 0, -1, policy).status().code(),
            StatusCode::kInternal);
  // The three granules mapped for it were unmapped again; their pages are
  // mapped nowhere (spare), and nothing is live but x.
  EXPECT_EQ(arena->mapped_granules(), 1u);
  EXPECT_EQ(driver.calls(DriverOp::kUnmap), unmaps + 3);
  EXPECT_EQ(driver.contract_counts().mappings, 1u);
  for (PageId id = 0; id < pool.slots(); ++id) {
    if (id != arena->PageAt(x)) {
      EXPECT_EQ(pool.page(id).arena_granule, kNoGranule);
    }
  }
  EXPECT_EQ(arena->live_bytes(), kG);
  arena->CheckInvariants();
  // The next try succeeds, where the failed one would have been.
  DevicePtr y = *arena->Allocate(3 * kG, 0, -1, policy);
  EXPECT_EQ(y, x + kG);
  EXPECT_EQ(arena->mapped_granules(), 4u);
  arena->Free(x, kG, FreeTag{});
  arena->Free(y, 3 * kG, FreeTag{});
  arena->CheckInvariants();
}

TEST_F(ArenaFixture, AFailedMapUndoesTheGranulesMappedBeforeIt) {
  driver.InjectFailure(DriverOp::kMap, 3, InternalError("injected"));
  EXPECT_EQ(arena->Allocate(4 * kG, 0, -1, policy).status().code(),
            StatusCode::kInternal);
  EXPECT_EQ(arena->mapped_granules(), 0u);
  EXPECT_EQ(driver.contract_counts().mappings, 0u);
  EXPECT_EQ(driver.calls(DriverOp::kSetAccess), 0u);
  arena->CheckInvariants();
}

}  // namespace
}  // namespace loom::vmm

namespace loom::vmm {
namespace {

// Chunks of several pages: one map per chunk (mapped whole: CUDA maps whole
// handles only); mappings unmapped only whole, one call each.
TEST_F(ArenaFixture, AChunkIsOneMappingUnmappedOnlyWhole) {
  policy.chunk_pages = 4;
  DevicePtr x = *arena->Allocate(4 * kG, 0, -1, policy);  // granules 0-3
  EXPECT_EQ(policy.asked, (std::vector<uint32_t>{4}));
  EXPECT_EQ(driver.calls(DriverOp::kMap), 1u);
  EXPECT_EQ(driver.calls(DriverOp::kSetAccess), 1u);
  EXPECT_EQ(arena->mapped_granules(), 4u);
  // A chunk shorter than wanted: the rest of the stretch gets another.
  policy.chunk_pages = 2;
  DevicePtr y = *arena->Allocate(3 * kG, 0, -1, policy);
  EXPECT_EQ(policy.asked, (std::vector<uint32_t>{4, 3, 1}));
  EXPECT_EQ(driver.calls(DriverOp::kMap), 3u);
  EXPECT_EQ(driver.calls(DriverOp::kSetAccess), 2u);
  arena->CheckInvariants();
  // x freed, and a small request placed on its first granule: the mapping
  // cannot be unmapped, nor reclaimed.
  arena->Free(x, 4 * kG, FreeTag{});
  DevicePtr z = *arena->Allocate(kG / 2, 0, -1, policy);
  EXPECT_EQ(z, x);
  EXPECT_EQ(arena->IdlePages().size(), 0u);
  auto any = [](PageId) { return true; };
  auto ready = [](PageId) { return OkStatus(); };
  EXPECT_EQ(arena->ReclaimIdle(8, any, ready).status().code(),
            StatusCode::kNotFound);
  // Once all of it is idle, it goes whole, in one call; a caller with room
  // for fewer pages than the chunk has gets nothing.
  arena->Free(z, kG / 2, FreeTag{});
  EXPECT_EQ(arena->IdlePages().size(), 4u);
  EXPECT_EQ(arena->ReclaimIdle(3, any, ready).status().code(),
            StatusCode::kNotFound);
  const uint64_t unmaps = driver.calls(DriverOp::kUnmap);
  StatusOr<PageRun> chunk = arena->ReclaimIdle(4, any, ready);
  ASSERT_TRUE(chunk.ok());
  EXPECT_EQ(chunk->count, 4u);
  EXPECT_TRUE(pool.WholeChunk(*chunk));
  EXPECT_EQ(driver.calls(DriverOp::kUnmap), unmaps + 1);
  EXPECT_EQ(arena->mapped_granules(), 3u);
  for (uint32_t i = 0; i < 4; ++i) {
    EXPECT_TRUE(pool.page(chunk->first + i).spare());
  }
  arena->Free(y, 3 * kG, FreeTag{});
  // UnmapIdle: y's two mappings (adjacent), one call each.
  const uint64_t before = driver.calls(DriverOp::kUnmap);
  EXPECT_EQ(arena->UnmapIdle()->size(), 3u);
  EXPECT_EQ(driver.calls(DriverOp::kUnmap), before + 2);
  EXPECT_EQ(driver.contract_counts().mappings, 0u);
  arena->CheckInvariants();
}

// A policy that hands out more pages than asked is a bug.
TEST_F(ArenaFixture, APolicyGivingTooManyPagesAborts) {
  class Greedy : public Arena::PagePolicy {
   public:
    explicit Greedy(PagePool& pool) : pool_(pool) {}
    bool Usable(PageId, uint32_t, uint32_t, Stream, int64_t) override {
      return true;
    }
    StatusOr<PageRun> Acquire(uint32_t, uint32_t room, Stream,
                              int64_t) override {
      return pool_.GrowRun(room + 1);
    }
    PagePool& pool_;
  } greedy(pool);
  EXPECT_DEATH(arena->Allocate(kG, 0, -1, greedy).status().IgnoreError(),
               "page policy gave");
}

}  // namespace
}  // namespace loom::vmm
