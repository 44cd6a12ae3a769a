#include "vmm/arena.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <tuple>

#include "vmm/fake_driver.h"

namespace loom::vmm {
namespace {

constexpr uint64_t kG = 64 << 10;

// Grows the pool for every new granule; pages listed in `busy` are unusable.
class GrowingPolicy : public Arena::PagePolicy {
 public:
  explicit GrowingPolicy(PagePool& pool) : pool_(pool) {}
  bool Usable(PageId page, uint32_t, uint32_t, Stream, int64_t) override {
    return !busy.contains(page) && !unusable_in_place.contains(page);
  }
  StatusOr<PageRun> Acquire(uint32_t wanted, uint32_t, Stream,
                            int64_t) override {
    ++acquired;
    asked.push_back(wanted);
    if (stitch_from != nullptr) {
      StatusOr<PageRun> idle = stitch_from->StitchableChunk(
          wanted, wanted, [&](PageId id) { return !busy.contains(id); });
      if (idle.ok()) {
        ++stitched;
        return *idle;
      }
    }
    return pool_.GrowRun(chunk_pages == 0 ? 1 : std::min(wanted, chunk_pages));
  }
  uint32_t chunk_pages = 0;  // 0: one page per call
  // Set: an idle chunk mapped elsewhere is stitched before the pool grows.
  Arena* stitch_from = nullptr;
  int stitched = 0;
  std::vector<uint32_t> asked;
  std::set<PageId> busy;
  std::set<PageId> unusable_in_place;  // Usable says no, stitching may
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

TEST_F(ArenaFixture, AnUndoThatCannotUnmapLeavesAnAccessibleIdleMapping) {
  DevicePtr x = *arena->Allocate(kG, 0, -1, policy);
  driver.InjectFailure(DriverOp::kSetAccess, 1, InternalError("injected"));
  driver.InjectFailure(DriverOp::kUnmap, 1, InternalError("injected"));
  EXPECT_EQ(arena->Allocate(3 * kG, 0, -1, policy).status().code(),
            StatusCode::kInternal);
  // The first granule mapped for it could not be unmapped: it stays, with
  // access, idle; the two others went.
  EXPECT_EQ(arena->mapped_granules(), 2u);
  EXPECT_EQ(driver.contract_counts().mappings, 2u);
  EXPECT_TRUE(driver.Memset(x + kG, 0, kG).ok()) << "kept without access";
  EXPECT_EQ(arena->live_bytes(), kG);
  arena->CheckInvariants();
  // It serves the next try, which maps only the two granules missing.
  const uint64_t maps = driver.calls(DriverOp::kMap);
  DevicePtr y = *arena->Allocate(3 * kG, 0, -1, policy);
  EXPECT_EQ(y, x + kG);
  EXPECT_EQ(driver.calls(DriverOp::kMap), maps + 2);
  EXPECT_TRUE(driver.Memset(y, 0, 3 * kG).ok());
  arena->Free(x, kG, FreeTag{});
  arena->Free(y, 3 * kG, FreeTag{});
  arena->CheckInvariants();
}

TEST_F(ArenaFixture, AMappingLeftWithoutAccessGetsItBeforeItIsHandedOut) {
  DevicePtr x = *arena->Allocate(kG, 0, -1, policy);
  // The placement's set-access fails, the undo's unmap fails, and so does
  // the set-access that would keep the mapping as an idle one.
  driver.InjectFailure(DriverOp::kSetAccess, 1, InternalError("injected"));
  driver.InjectFailure(DriverOp::kSetAccess, 2, InternalError("injected"));
  driver.InjectFailure(DriverOp::kUnmap, 1, InternalError("injected"));
  EXPECT_EQ(arena->Allocate(3 * kG, 0, -1, policy).status().code(),
            StatusCode::kInternal);
  EXPECT_EQ(arena->mapped_granules(), 2u);
  EXPECT_EQ(driver.Memset(x + kG, 0, kG).code(),
            StatusCode::kFailedPrecondition);  // no access yet
  arena->CheckInvariants();
  // A placement over it that cannot grant access fails, handing out
  // nothing.
  driver.InjectFailure(DriverOp::kSetAccess, 2, InternalError("injected"));
  EXPECT_EQ(arena->Allocate(3 * kG, 0, -1, policy).status().code(),
            StatusCode::kInternal);
  EXPECT_EQ(arena->mapped_granules(), 2u);
  arena->CheckInvariants();
  // The next one grants it first.
  DevicePtr y = *arena->Allocate(3 * kG, 0, -1, policy);
  EXPECT_EQ(y, x + kG);
  EXPECT_TRUE(driver.Memset(y, 0, 3 * kG).ok());
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

// The pages behind [ptr, ptr + granules * kG).
std::vector<PageId> PagesOf(const Arena& arena, DevicePtr ptr,
                            uint64_t granules) {
  std::vector<PageId> out;
  for (uint64_t i = 0; i < granules; ++i)
    out.push_back(arena.PageAt(ptr + i * kG));
  return out;
}

// True when no page appears twice in `pages`.
bool AllDistinct(std::vector<PageId> pages) {
  std::sort(pages.begin(), pages.end());
  return std::adjacent_find(pages.begin(), pages.end()) == pages.end();
}

TEST_F(ArenaFixture, AnIdleChunkIsStitchedWhereANewOneWouldGo) {
  policy.chunk_pages = 2;
  DevicePtr a = *arena->Allocate(2 * kG, 0, -1, policy);  // one chunk of 2
  DevicePtr b = *arena->Allocate(kG, 0, -1, policy);      // keeps a's place
  arena->Free(a, 2 * kG, FreeTag{});
  const std::vector<PageId> a_pages = PagesOf(*arena, a, 2);
  const size_t held = pool.live_pages();
  const uint64_t creates = driver.calls(DriverOp::kCreate);
  // 3 granules do not fit a's place: a's chunk is mapped a second time
  // beside b, one new page after it.
  policy.stitch_from = arena.get();
  DevicePtr c = *arena->Allocate(3 * kG, 0, -1, policy);
  EXPECT_EQ(policy.stitched, 1);
  EXPECT_EQ(pool.live_pages(), held + 1);
  EXPECT_EQ(driver.calls(DriverOp::kCreate), creates + 1);
  const std::vector<PageId> c_pages = PagesOf(*arena, c, 3);
  EXPECT_EQ(c_pages[0], a_pages[0]);
  EXPECT_EQ(c_pages[1], a_pages[1]);
  EXPECT_EQ(pool.page(a_pages[0]).arena_mappings, 2u);
  EXPECT_EQ(arena->stitched_pages(), 2u);
  arena->CheckInvariants();
  // a's place still maps the chunk, but its pages serve c: a request there
  // goes elsewhere, on other pages.
  policy.stitch_from = nullptr;
  DevicePtr d = *arena->Allocate(2 * kG, 0, -1, policy);
  EXPECT_NE(d, a);
  for (PageId page : PagesOf(*arena, d, 2)) {
    EXPECT_EQ(std::count(c_pages.begin(), c_pages.end(), page), 0);
  }
  // Once c is freed, a's place serves again, with no new mapping.
  arena->Free(c, 3 * kG, FreeTag{});
  const uint64_t maps = driver.calls(DriverOp::kMap);
  DevicePtr e = *arena->Allocate(2 * kG, 0, -1, policy);
  EXPECT_EQ(e, a);
  EXPECT_EQ(driver.calls(DriverOp::kMap), maps);
  arena->CheckInvariants();
  // A stitched chunk is never reclaimed (its pages must end mapped
  // nowhere); UnmapIdle unmaps both of its mappings and lists its pages
  // once.
  arena->Free(e, 2 * kG, FreeTag{});
  auto any = [](PageId) { return true; };
  auto ready = [](PageId) { return OkStatus(); };
  StatusOr<PageRun> reclaimed = arena->ReclaimIdle(8, any, ready);
  if (reclaimed.ok()) EXPECT_NE(reclaimed->first, a_pages[0]);
  arena->Free(b, kG, FreeTag{});
  arena->Free(d, 2 * kG, FreeTag{});
  EXPECT_TRUE(AllDistinct(*arena->UnmapIdle()));
  EXPECT_EQ(pool.page(a_pages[0]).arena_mappings, 0u);
  EXPECT_TRUE(pool.page(a_pages[0]).spare());
  EXPECT_EQ(driver.contract_counts().mappings, 0u);
  arena->CheckInvariants();
}

TEST_F(ArenaFixture, AChunkIsStitchedAtMostKMaxArenaMappingsPlaces) {
  arena.reset();
  arena = std::move(Arena::Create(driver, pool, 0, 1024 * kG)).value();
  DevicePtr a = *arena->Allocate(kG, 0, -1, policy);  // a chunk of one page
  DevicePtr blocker = *arena->Allocate(kG, 0, -1, policy);
  std::vector<DevicePtr> blockers = {blocker};
  const PageId a_page = arena->PageAt(a);
  arena->Free(a, kG, FreeTag{});
  policy.stitch_from = arena.get();
  // Requests ever larger, each walled in by a live blocker so no later one
  // fits its place: each maps a's idle chunk at its start again (the other
  // pages are new, and never stitched: busy), until the chunk has
  // kMaxArenaMappings places; the pool grows from then on.
  for (uint32_t i = 1; i <= kMaxArenaMappings + 2; ++i) {
    SCOPED_TRACE(i);
    const uint64_t size = (i + 1) * kG;
    const int stitched = policy.stitched;
    const size_t held = pool.live_pages();
    DevicePtr x = *arena->Allocate(size, 0, -1, policy);
    const std::vector<PageId> pages = PagesOf(*arena, x, i + 1);
    for (PageId page : pages) {
      if (page != a_page) policy.busy.insert(page);
    }
    if (i < kMaxArenaMappings) {
      EXPECT_EQ(policy.stitched, stitched + 1);
      EXPECT_EQ(pages[0], a_page);
      EXPECT_EQ(pool.live_pages(), held + i);
    } else {
      EXPECT_EQ(policy.stitched, stitched);
      EXPECT_EQ(std::count(pages.begin(), pages.end(), a_page), 0);
      EXPECT_EQ(pool.live_pages(), held + i + 1);
    }
    EXPECT_LE(pool.page(a_page).arena_mappings, kMaxArenaMappings);
    blockers.push_back(*arena->Allocate(kG, 0, -1, policy));
    arena->Free(x, size, FreeTag{});
    arena->CheckInvariants();
  }
  EXPECT_EQ(pool.page(a_page).arena_mappings, kMaxArenaMappings);
  for (DevicePtr b : blockers) arena->Free(b, kG, FreeTag{});
  EXPECT_TRUE(AllDistinct(*arena->UnmapIdle()));
  EXPECT_EQ(pool.page(a_page).arena_mappings, 0u);
  EXPECT_EQ(driver.contract_counts().mappings, 0u);
  arena->CheckInvariants();
}

TEST_F(ArenaFixture, NoAllocationMapsOnePageTwice) {
  // An idle chunk at the start of a free block, unmapped granules after
  // it: a request over both must not be given that chunk again for the
  // unmapped part.
  policy.chunk_pages = 2;
  DevicePtr a = *arena->Allocate(2 * kG, 0, -1, policy);
  arena->Free(a, 2 * kG, FreeTag{});
  policy.stitch_from = arena.get();
  DevicePtr c = *arena->Allocate(4 * kG, 0, -1, policy);
  EXPECT_EQ(c, a);
  EXPECT_EQ(policy.stitched, 0);
  EXPECT_TRUE(AllDistinct(PagesOf(*arena, c, 4)));
  arena->CheckInvariants();
  arena->Free(c, 4 * kG, FreeTag{});
}

TEST_F(ArenaFixture, NoAllocationMapsOnePageTwiceThroughAnotherMapping) {
  // A chunk of 4 pages mapped at granules 0-3 and stitched at 5-8; a place
  // from granule 6 covers the tail of its second mapping and unmapped
  // granules after: the chunk (idle, through its first mapping) must not
  // be stitched there too (a regression: only its first page was looked
  // for in the place).
  policy.chunk_pages = 4;
  DevicePtr x = *arena->Allocate(4 * kG, 0, -1, policy);  // granules 0-3
  DevicePtr y = *arena->Allocate(kG, 0, -1, policy);      // granule 4
  arena->Free(x, 4 * kG, FreeTag{});
  policy.stitch_from = arena.get();
  DevicePtr z = *arena->Allocate(5 * kG, 0, -1, policy);  // granules 5-9
  ASSERT_EQ(policy.stitched, 1);
  ASSERT_EQ(arena->PageAt(z), arena->PageAt(x));
  arena->Free(z, 5 * kG, FreeTag{});
  const PageId chunk = arena->PageAt(x);
  policy.unusable_in_place.insert(chunk);  // the place starts at granule 6
  DevicePtr w = *arena->Allocate(8 * kG, 0, -1, policy);
  EXPECT_EQ(w, z + kG);
  EXPECT_EQ(policy.stitched, 1);
  EXPECT_TRUE(AllDistinct(PagesOf(*arena, w, 8)));
  arena->CheckInvariants();
  arena->Free(w, 8 * kG, FreeTag{});
  arena->Free(y, kG, FreeTag{});
}

TEST_F(ArenaFixture, AChunkMappedTwiceServesOnePlaceAtATime) {
  policy.chunk_pages = 1;
  DevicePtr a = *arena->Allocate(kG, 0, -1, policy);
  DevicePtr b = *arena->Allocate(kG, 0, -1, policy);
  arena->Free(a, kG, FreeTag{});
  policy.stitch_from = arena.get();
  DevicePtr c = *arena->Allocate(2 * kG, 0, -1, policy);  // a's page + new
  ASSERT_EQ(policy.stitched, 1);
  const PageId shared = arena->PageAt(a);
  EXPECT_EQ(arena->PageAt(c), shared);
  policy.stitch_from = nullptr;
  // Once c is freed, two small requests share the page at a's place (the
  // mapping in use may hold several allocations).
  arena->Free(c, 2 * kG, FreeTag{});
  DevicePtr s1 = *arena->Allocate(kG / 4, 0, -1, policy);
  DevicePtr s2 = *arena->Allocate(kG / 4, 0, -1, policy);
  EXPECT_EQ(arena->PageAt(s1 - s1 % kG), arena->PageAt(s2 - s2 % kG));
  EXPECT_EQ(s1 / kG, s2 / kG) << "the granule in use is shared";
  // While they live, c's place (the same page) is not usable.
  DevicePtr d = *arena->Allocate(2 * kG, 0, -1, policy);
  EXPECT_NE(arena->PageAt(d), shared);
  EXPECT_NE(arena->PageAt(d + kG), shared);
  arena->CheckInvariants();
  for (auto [p, n] :
       {std::pair{s1, kG / 4}, {s2, kG / 4}, {b, kG}, {d, 2 * kG}}) {
    arena->Free(p, n, FreeTag{});
  }
}

// Seeded random programs with stitching: after every step, no two live
// allocations share a byte of physical memory (through any mapping) and the
// arena's invariants hold.
TEST_F(ArenaFixture, RandomProgramsWithStitchingNeverShareABytePhysically) {
  size_t unmapped_elsewhere = 0;
  for (uint32_t seed = 1; seed <= 40; ++seed) {
    SCOPED_TRACE(seed);
    std::mt19937 rng(seed);
    struct Live {
      DevicePtr ptr;
      uint64_t size;
    };
    std::vector<Live> live;
    policy.stitch_from = arena.get();
    for (int step = 0; step < 300; ++step) {
      policy.chunk_pages = 1u << (rng() % 3);
      const uint32_t action = rng() % 10;
      if (action < 5 || live.empty()) {
        const uint64_t size = rng() % 3 == 0
                                  ? 512 * (1 + rng() % 64)
                                  : kG * (1 + rng() % 6) - rng() % 512;
        StatusOr<DevicePtr> p = arena->Allocate(size, 0, -1, policy);
        if (!p.ok()) continue;  // the arena's 64 granules are full
        live.push_back({*p, size});
      } else if (action < 9) {
        const size_t i = rng() % live.size();
        arena->Free(live[i].ptr, live[i].size, FreeTag{});
        live.erase(live.begin() + static_cast<long>(i));
      } else if (rng() % 2 == 0) {
        (void)*arena->UnmapIdle();
      } else {
        // A stitched chunk's places that serve nothing while it serves at
        // another: unmapped, the live allocations untouched.
        const std::vector<PageId> elsewhere = arena->BusyElsewherePages();
        ASSERT_TRUE(arena->UnmapBusyElsewhere().ok());
        for (PageId page : elsewhere) {
          EXPECT_GT(pool.page(page).arena_mappings, 0u);
        }
        unmapped_elsewhere += elsewhere.size();
      }
      // (page, first byte, end) of every live allocation, 512 B rounded.
      std::vector<std::tuple<PageId, uint64_t, uint64_t>> pieces;
      for (const Live& l : live) {
        const uint64_t size = (l.size + 511) / 512 * 512;
        for (uint64_t at = l.ptr; at < l.ptr + size;) {
          const uint64_t granule_start = at - at % kG;
          const uint64_t end = std::min(l.ptr + size, granule_start + kG);
          pieces.emplace_back(arena->PageAt(granule_start), at % kG,
                              end - granule_start);
          at = end;
        }
      }
      std::sort(pieces.begin(), pieces.end());
      for (size_t i = 1; i < pieces.size(); ++i) {
        const auto& [page, lo, hi] = pieces[i];
        const auto& [prev_page, prev_lo, prev_hi] = pieces[i - 1];
        ASSERT_FALSE(page == prev_page && lo < prev_hi)
            << "step " << step << ": page " << page << " bytes " << lo
            << " shared";
      }
      arena->CheckInvariants();
    }
    for (const Live& l : live) arena->Free(l.ptr, l.size, FreeTag{});
    ASSERT_TRUE(arena->UnmapIdle().ok());
    arena->CheckInvariants();
  }
  EXPECT_GT(policy.stitched, 0);
  EXPECT_GT(unmapped_elsewhere, 0u);
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
