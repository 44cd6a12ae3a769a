// PagePool: one driver handle per page, within a cap; slots reused; nothing
// leaked on failure.
#include "vmm/page_pool.h"

#include <gtest/gtest.h>

#include <random>
#include <set>
#include <vector>

#include "vmm/fake_driver.h"

namespace loom::vmm {
namespace {

constexpr uint64_t kG = 64 << 10;

FakeDriverOptions Options() {
  FakeDriverOptions o;
  o.granularity = kG;
  o.capacity_per_device = 16 * kG;
  return o;
}

TEST(PagePoolTest, GrowsOneHandlePerPageWithinTheCap) {
  FakeDriver driver(Options());
  {
    PagePool pool(driver, 0, kG, 4 * kG);
    std::set<uint64_t> handles;
    for (int i = 0; i < 4; ++i) {
      StatusOr<PageId> id = pool.Grow();
      ASSERT_TRUE(id.ok()) << id.status().ToString();
      const Page& page = pool.page(*id);
      EXPECT_TRUE(page.live);
      EXPECT_EQ(page.static_granule, kNoGranule);
      EXPECT_EQ(page.arena_granule, kNoGranule);
      EXPECT_TRUE(handles.insert(page.handle.value).second)
          << "two pages share a handle";
    }
    EXPECT_EQ(pool.bytes(), 4 * kG);
    EXPECT_EQ(driver.physical_bytes(), 4 * kG);
    // The cap: OUT_OF_MEMORY, nothing created.
    StatusOr<PageId> over = pool.Grow();
    EXPECT_EQ(over.status().code(), StatusCode::kOutOfMemory);
    EXPECT_EQ(driver.calls(DriverOp::kCreate), 4u);
    EXPECT_EQ(pool.live_pages(), 4u);
    EXPECT_EQ(pool.peak_bytes(), 4 * kG);
  }
  // The pool's destructor gives every page back.
  EXPECT_EQ(driver.contract_counts().handles, 0u);
}

TEST(PagePoolTest, ReleasedSlotsAreReusedAndPeakResets) {
  FakeDriver driver(Options());
  PagePool pool(driver, 0, kG, 0);
  PageId a = *pool.Grow(), b = *pool.Grow(), c = *pool.Grow();
  ASSERT_TRUE(pool.ReleasePage(b).ok());
  EXPECT_FALSE(pool.page(b).live);
  EXPECT_EQ(pool.live_pages(), 2u);
  EXPECT_EQ(pool.bytes(), 2 * kG);
  EXPECT_EQ(pool.peak_bytes(), 3 * kG);
  pool.ResetPeak();
  EXPECT_EQ(pool.peak_bytes(), 2 * kG);
  PageId d = *pool.Grow();
  EXPECT_EQ(d, b) << "the released slot is taken again";
  EXPECT_EQ(pool.slots(), 3u);
  EXPECT_EQ(pool.creates(), 4u);
  EXPECT_EQ(pool.releases(), 1u);
  EXPECT_NE(pool.page(d).handle, pool.page(a).handle);
  EXPECT_NE(pool.page(d).handle, pool.page(c).handle);
}

TEST(PagePoolTest, SpareChunksGoBackOnlyAsFarAsThePeakNeeds) {
  FakeDriver driver(Options());
  PagePool pool(driver, 0, kG, 0);
  std::vector<PageId> ids;
  for (int i = 0; i < 6; ++i) ids.push_back(*pool.Grow());  // all spare
  ASSERT_TRUE(pool.ReleasePage(ids[4]).ok());
  ASSERT_TRUE(pool.ReleasePage(ids[5]).ok());
  ASSERT_EQ(pool.bytes(), 4 * kG);
  ASSERT_EQ(pool.peak_bytes(), 6 * kG);
  // Two new pages fit under the peak: nothing goes back (it would lower no
  // peak, and cost a create and a map when memory is wanted again).
  EXPECT_TRUE(pool.FitsUnderPeak(2));
  EXPECT_EQ(pool.ReleaseUnfencedSpareChunksFor(2), 0u);
  EXPECT_EQ(pool.bytes(), 4 * kG);
  // Four would raise it by two: two spare pages go back, no more.
  EXPECT_FALSE(pool.FitsUnderPeak(4));
  EXPECT_EQ(pool.ReleaseUnfencedSpareChunksFor(4), 2u);
  EXPECT_EQ(pool.bytes(), 2 * kG);
  EXPECT_TRUE(pool.FitsUnderPeak(4));
  EXPECT_EQ(pool.releases(), 4u);
  // Without a bound, every spare chunk.
  EXPECT_EQ(pool.ReleaseUnfencedSpareChunks(), 2u);
  EXPECT_EQ(pool.bytes(), 0u);
}

TEST(PagePoolTest, DriverFailuresLeaveThePoolUnchanged) {
  FakeDriver driver(Options());
  PagePool pool(driver, 0, kG, 0);
  PageId a = *pool.Grow();
  driver.InjectFailure(DriverOp::kCreate, 1, OutOfMemoryError("injected"));
  StatusOr<PageId> failed = pool.Grow();
  EXPECT_EQ(failed.status().code(), StatusCode::kOutOfMemory);
  EXPECT_EQ(pool.live_pages(), 1u);
  EXPECT_EQ(pool.slots(), 1u);
  // The device's own capacity (16 granules) is an out of memory too.
  for (int i = 1; i < 16; ++i) ASSERT_TRUE(pool.Grow().ok());
  EXPECT_EQ(pool.Grow().status().code(), StatusCode::kOutOfMemory);
  EXPECT_EQ(pool.live_pages(), 16u);
  // A failed release keeps the page.
  driver.InjectFailure(DriverOp::kRelease, 1, InternalError("injected"));
  EXPECT_FALSE(pool.ReleasePage(a).ok());
  EXPECT_TRUE(pool.page(a).live);
  EXPECT_EQ(pool.live_pages(), 16u);
}

TEST(PagePoolTest, FencesMergePerStream) {
  Page page;
  AddFence(page, 100, 200, FreeTag{7, 1});
  AddFence(page, 50, 120, FreeTag{7, 3});
  AddFence(page, 0, 10, FreeTag{9, 2});
  ASSERT_EQ(page.fences.size(), 2u);
  EXPECT_EQ(page.fences[0].tag.stream, 7u);
  EXPECT_EQ(page.fences[0].lo, 50u);
  EXPECT_EQ(page.fences[0].hi, 200u);
  EXPECT_EQ(page.fences[0].tag.epoch, 3u);  // the later free covers both
  EXPECT_EQ(page.fences[1].tag.stream, 9u);
  // An older tag of the same stream never lowers the epoch.
  AddFence(page, 300, 400, FreeTag{7, 2});
  EXPECT_EQ(page.fences[0].tag.epoch, 3u);
  EXPECT_EQ(page.fences[0].hi, 400u);
}

TEST(PagePoolTest, PeersAreKept) {
  FakeDriverOptions o = Options();
  o.device_count = 3;
  FakeDriver driver(o);
  PagePool pool(driver, 1, kG, 0, {0, 2});
  EXPECT_EQ(pool.device(), 1);
  EXPECT_EQ(pool.peers(), (std::vector<int>{0, 2}));
}

TEST(PagePoolTest, AFailedGrowKeepsTheReleasedSlotForTheNextOne) {
  FakeDriver driver(Options());
  PagePool pool(driver, 0, kG, 0);
  const PageId a = *pool.Grow();
  const PageId b = *pool.Grow();
  ASSERT_TRUE(pool.ReleasePage(a).ok());
  driver.InjectFailure(DriverOp::kCreate, 1, InternalError("injected"));
  EXPECT_EQ(pool.Grow().status().code(), StatusCode::kInternal);
  // Nothing changed: one live page, no handle leaked, the slot still free.
  EXPECT_EQ(pool.live_pages(), 1u);
  EXPECT_EQ(pool.creates(), 2u);
  EXPECT_FALSE(pool.page(a).live);
  EXPECT_EQ(driver.contract_counts().handles, 1u);
  EXPECT_EQ(*pool.Grow(), a);
  EXPECT_EQ(pool.slots(), 2u);
  EXPECT_TRUE(pool.page(b).live);
}

TEST(PagePoolTest, TheCapCountsWholePages) {
  FakeDriver driver(Options());
  PagePool pool(driver, 0, kG, 2 * kG + kG / 2);  // room for two pages
  ASSERT_TRUE(pool.Grow().ok());
  ASSERT_TRUE(pool.Grow().ok());
  StatusOr<PageId> third = pool.Grow();
  EXPECT_EQ(third.status().code(), StatusCode::kOutOfMemory);
  EXPECT_EQ(driver.physical_bytes(), 2 * kG);
  EXPECT_EQ(pool.cap_bytes(), 2 * kG + kG / 2);
}

// Random grows and releases: a page is never handed out while it is live,
// each live page has a handle of its own, and the pool's counts are the
// driver's.
TEST(PagePoolTest, NoPageIsHandedOutTwice) {
  FakeDriver driver(Options());
  PagePool pool(driver, 0, kG, 0);
  std::mt19937_64 rng(7);
  std::set<PageId> live;
  uint64_t created = 0;
  uint64_t released = 0;
  for (int step = 0; step < 2000; ++step) {
    if (!live.empty() && (live.size() == 16 || rng() % 2 == 0)) {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      ASSERT_TRUE(pool.ReleasePage(*it).ok());
      live.erase(it);
      ++released;
    } else {
      StatusOr<PageId> id = pool.Grow();
      ASSERT_TRUE(id.ok()) << id.status().ToString();
      ASSERT_TRUE(live.insert(*id).second)
          << "page " << *id << " handed out while live, step " << step;
      ++created;
    }
    std::set<uint64_t> handles;
    for (PageId id : live) {
      ASSERT_TRUE(pool.page(id).live);
      ASSERT_TRUE(handles.insert(pool.page(id).handle.value).second);
    }
    ASSERT_EQ(pool.live_pages(), live.size());
    ASSERT_EQ(pool.bytes(), live.size() * kG);
    ASSERT_EQ(driver.contract_counts().handles, live.size());
    ASSERT_LE(pool.slots(), 16u) << "released slots are reused";
  }
  EXPECT_EQ(pool.creates(), created);
  EXPECT_EQ(pool.releases(), released);
  for (PageId id : live) ASSERT_TRUE(pool.ReleasePage(id).ok());
  EXPECT_EQ(driver.physical_bytes(), 0u);
}

// Releasing a page that is still in use is a bug in the caller: it aborts.
TEST(PagePoolDeathTest, APageInUseIsNotReleased) {
  FakeDriver driver(Options());
  PagePool pool(driver, 0, kG, 0);
  const PageId id = *pool.Grow();
  pool.page(id).static_users = 1;
  EXPECT_DEATH(pool.ReleasePage(id).IgnoreError(), "released while in use");
  pool.page(id).static_users = 0;
  pool.page(id).arena_granule = 3;
  EXPECT_DEATH(pool.ReleasePage(id).IgnoreError(), "released while in use");
  pool.page(id).arena_granule = kNoGranule;
  ASSERT_TRUE(pool.ReleasePage(id).ok());
  EXPECT_DEATH(pool.ReleasePage(id).IgnoreError(), "released while in use");
}

}  // namespace
}  // namespace loom::vmm
