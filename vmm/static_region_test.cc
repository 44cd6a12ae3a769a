// StaticRegion: one reservation laid out as the plan says, backed lazily; the
// planned hand-out's safety check; the schedule of each granule; undo on
// failure.
#include "vmm/static_region.h"

#include <gtest/gtest.h>

#include <deque>
#include <map>
#include <random>

#include "vmm/fake_driver.h"
#include "vmm/host_driver.h"

namespace loom::vmm {
namespace {

constexpr uint64_t kG = 64 << 10;

// The region's size in the tests: 4 granules.
constexpr uint64_t kRegion = 4 * kG;

// Hands out the chunks of the pages it was given, in order, whole: as many
// as fit in what Back asks for (`max`, or `wanted` when `prefer_wanted`).
// Counts its calls; can run dry (OUT_OF_MEMORY).
class FixedSource : public PageSource {
 public:
  FixedSource(PagePool& pool, std::vector<PageId> pages,
              bool prefer_wanted = false)
      : prefer_wanted_(prefer_wanted) {
    for (PageId id : pages) {
      const PageRun chunk = pool.ChunkOf(id);
      if (chunks_.empty() || chunks_.back().first != chunk.first) {
        chunks_.push_back(chunk);
      }
    }
  }
  StatusOr<std::vector<PageRun>> Take(uint32_t, uint32_t wanted, uint32_t max,
                                      uint32_t) override {
    ++calls;
    asked.emplace_back(wanted, max);
    if (chunks_.empty()) return OutOfMemoryError("no page left");
    const uint32_t limit = prefer_wanted_ ? wanted : max;
    std::vector<PageRun> out;
    uint32_t n = 0;
    while (!chunks_.empty() && n + chunks_.front().count <= limit) {
      n += chunks_.front().count;
      out.push_back(chunks_.front());
      chunks_.pop_front();
    }
    if (out.empty()) return OutOfMemoryError("no chunk fits");
    return out;
  }
  int calls = 0;
  std::vector<std::pair<uint32_t, uint32_t>> asked;

 private:
  std::deque<PageRun> chunks_;
  bool prefer_wanted_;
};

class StaticRegionTest : public ::testing::Test {
 protected:
  StaticRegionTest() : driver_(Options()), pool_(driver_, 0, kG, 0) {}
  ~StaticRegionTest() override {
    region_.reset();
    for (PageId id = 0; id < pool_.slots(); ++id) {
      if (pool_.page(id).live) EXPECT_TRUE(pool_.ReleasePage(id).ok());
    }
  }
  static FakeDriverOptions Options() {
    FakeDriverOptions o;
    o.granularity = kG;
    return o;
  }
  std::vector<PageId> Pages(int n) {
    std::vector<PageId> pages;
    for (int i = 0; i < n; ++i) pages.push_back(*pool_.Grow());
    return pages;
  }
  static bool AnyPage(Page&, uint32_t, uint32_t) { return true; }
  // Creates the region and backs granule k with pages[k].
  void CreateBacked(const std::vector<PageId>& pages) {
    region_ =
        std::move(StaticRegion::Create(driver_, pool_, 0, kRegion)).value();
    FixedSource source(pool_, pages, /*prefer_wanted=*/true);
    const uint64_t all = kRegion;
    ASSERT_EQ(region_->TryOccupy(0, all, AnyPage),
              StaticRegion::Occupied::kNeedsBacking);
    ASSERT_TRUE(region_->Back(0, all, source).ok());
    region_->Release(0, all, FreeTag{});
    ASSERT_EQ(region_->backed_bytes(), all);
  }
  void CreateBacked(int n) { CreateBacked(Pages(n)); }

  FakeDriver driver_;
  PagePool pool_;
  std::unique_ptr<StaticRegion> region_;
};

TEST_F(StaticRegionTest, CreationReservesAndBacksNothing) {
  StatusOr<std::unique_ptr<StaticRegion>> r =
      StaticRegion::Create(driver_, pool_, 0, kRegion);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  region_ = std::move(r).value();
  EXPECT_EQ(region_->bytes(), 4 * kG);
  EXPECT_EQ(region_->backed_bytes(), 0u);
  for (uint32_t k = 0; k < 4; ++k) EXPECT_EQ(region_->page(k), kNoPage);
  EXPECT_EQ(driver_.calls(DriverOp::kReserve), 1u);
  EXPECT_EQ(driver_.calls(DriverOp::kCreate), 0u);
  EXPECT_EQ(driver_.calls(DriverOp::kMap), 0u);
  EXPECT_TRUE(region_->MappedRanges().empty());
  region_.reset();
  EXPECT_EQ(driver_.contract_counts().reservations, 0u);
}

TEST_F(StaticRegionTest, BackingMapsAChunkWholeAndPrebacksWhatFollows) {
  region_ = std::move(StaticRegion::Create(driver_, pool_, 0, kRegion)).value();
  // A chunk of three pages, then one of one page: backing granule 1 for
  // [kG + 100, +512) takes the first chunk, mapped whole in one call, over
  // granules 1..3 (the unbacked ones after it).
  PageRun chunk = *pool_.GrowRun(3);
  PageRun single = *pool_.GrowRun(1);
  FixedSource source(pool_, {chunk.first, single.first});
  std::vector<std::pair<uint32_t, uint32_t>> asked;
  EXPECT_EQ(region_->TryOccupy(kG + 100, 512,
                               [&](Page&, uint32_t lo, uint32_t hi) {
                                 asked.emplace_back(lo, hi);
                                 return true;
                               }),
            StaticRegion::Occupied::kNeedsBacking);
  EXPECT_TRUE(asked.empty()) << "an unbacked granule has no page to check";
  EXPECT_EQ(region_->UnbackedGranules(0, kRegion), 4u);
  ASSERT_TRUE(region_->Back(kG + 100, 512, source, /*limit=*/4).ok());
  EXPECT_EQ(region_->UnbackedGranules(0, kRegion), 1u);
  EXPECT_EQ(region_->UnbackedGranules(kG + 100, 2 * kG), 0u);
  EXPECT_EQ(region_->UnbackedGranules(100, kG), 1u);
  EXPECT_EQ(source.asked, (std::vector<std::pair<uint32_t, uint32_t>>{{1, 3}}));
  EXPECT_EQ(driver_.calls(DriverOp::kMap), 1u);
  EXPECT_EQ(driver_.calls(DriverOp::kSetAccess), 1u);
  EXPECT_EQ(region_->page(0), kNoPage);
  for (uint32_t k = 1; k < 4; ++k) {
    EXPECT_EQ(region_->page(k), chunk.first + k - 1);
    EXPECT_EQ(pool_.page(region_->page(k)).static_granule, k);
  }
  EXPECT_EQ(pool_.page(region_->page(1)).static_users, 1u);
  EXPECT_EQ(pool_.page(region_->page(2)).static_users, 0u);
  EXPECT_EQ(region_->backed_bytes(), 3 * kG);
  EXPECT_EQ(region_->MappedRanges(),
            (std::vector<std::pair<DevicePtr, uint64_t>>{
                {region_->base() + kG, 3 * kG}}));
  region_->CheckInvariants();
  // A backed granule is checked as before; the next hand-out there needs
  // no backing.
  EXPECT_EQ(region_->TryOccupy(2 * kG, 100, AnyPage),
            StaticRegion::Occupied::kYes);
  // Granule 0 gets the single page; access is granted over what was mapped.
  ASSERT_EQ(region_->TryOccupy(0, kG + 100, AnyPage),
            StaticRegion::Occupied::kNeedsBacking);
  ASSERT_TRUE(region_->Back(0, kG + 100, source).ok());
  EXPECT_EQ(region_->page(0), single.first);
  EXPECT_EQ(pool_.page(region_->page(1)).static_users, 2u);
  EXPECT_EQ(driver_.calls(DriverOp::kMap), 2u);
  EXPECT_EQ(driver_.calls(DriverOp::kSetAccess), 2u);
  region_->CheckInvariants();
  region_->Release(kG + 100, 512, FreeTag{});
  region_->Release(2 * kG, 100, FreeTag{});
  region_->Release(0, kG + 100, FreeTag{});
  // The destructor unmaps each mapping in a call of its own (CUDA unmaps
  // exactly what one map mapped); the pages stay in the pool, spare.
  region_.reset();
  EXPECT_EQ(driver_.calls(DriverOp::kUnmap), 2u);
  EXPECT_EQ(driver_.contract_counts().mappings, 0u);
  for (uint32_t i = 0; i < 3; ++i) {
    EXPECT_TRUE(pool_.page(chunk.first + i).spare());
  }
  EXPECT_TRUE(pool_.page(single.first).spare());
}

TEST_F(StaticRegionTest, AChunkLargerThanTheRoomIsNotTaken) {
  region_ = std::move(StaticRegion::Create(driver_, pool_, 0, kRegion)).value();
  PageRun chunk = *pool_.GrowRun(4);
  FixedSource source(pool_, {chunk.first});
  // Granule 3 alone: a chunk of four cannot be mapped there (only whole).
  ASSERT_EQ(region_->TryOccupy(3 * kG, 100, AnyPage),
            StaticRegion::Occupied::kNeedsBacking);
  EXPECT_EQ(region_->Back(3 * kG, 100, source, /*limit=*/4).code(),
            StatusCode::kOutOfMemory);
  region_->Release(3 * kG, 100, FreeTag{});
  EXPECT_EQ(driver_.calls(DriverOp::kMap), 0u);
  EXPECT_EQ(region_->backed_bytes(), 0u);
  region_->CheckInvariants();
}

TEST_F(StaticRegionTest, PagesOfSeveralChunksAreMappedRunByRun) {
  // Granule k backed with pages[k], each a chunk of its own: one map each.
  CreateBacked(4);
  EXPECT_EQ(driver_.calls(DriverOp::kMap), 4u);
  EXPECT_EQ(driver_.calls(DriverOp::kSetAccess), 1u);
  EXPECT_EQ(driver_.contract_counts().mappings, 4u);
  region_.reset();
  EXPECT_EQ(driver_.contract_counts().mappings, 0u);
}

TEST_F(StaticRegionTest, AFailedBackingMapsNothing) {
  region_ = std::move(StaticRegion::Create(driver_, pool_, 0, kRegion)).value();
  std::vector<PageId> pages = Pages(4);
  auto attempt = [&](FixedSource& source) {
    EXPECT_EQ(region_->TryOccupy(0, 4 * kG, AnyPage),
              StaticRegion::Occupied::kNeedsBacking);
    Status status = region_->Back(0, 4 * kG, source);
    region_->Release(0, 4 * kG, FreeTag{});
    return status;
  };
  auto nothing_mapped = [&] {
    EXPECT_EQ(driver_.contract_counts().mappings, 0u);
    EXPECT_EQ(region_->backed_bytes(), 0u);
    for (PageId id : pages) {
      EXPECT_TRUE(pool_.page(id).spare());
      EXPECT_EQ(pool_.page(id).static_users, 0u);
    }
    region_->CheckInvariants();
  };
  // The third map fails: the two before are unmapped again.
  driver_.InjectFailure(DriverOp::kMap, 3, InternalError("injected"));
  FixedSource a(pool_, pages);
  EXPECT_EQ(attempt(a).code(), StatusCode::kInternal);
  nothing_mapped();
  // Access cannot be granted: every page mapped for it goes back.
  driver_.InjectFailure(DriverOp::kSetAccess, 1, InternalError("injected"));
  FixedSource b(pool_, pages);
  EXPECT_EQ(attempt(b).code(), StatusCode::kInternal);
  nothing_mapped();
  // Access cannot be granted, and the undo cannot unmap the first page:
  // it stays backed, with access (backed ahead of use), the rest goes.
  driver_.InjectFailure(DriverOp::kSetAccess, 1, InternalError("injected"));
  driver_.InjectFailure(DriverOp::kUnmap, 1, InternalError("injected"));
  FixedSource kept(pool_, pages);
  EXPECT_EQ(attempt(kept).code(), StatusCode::kInternal);
  EXPECT_EQ(region_->backed_bytes(), kG);
  EXPECT_EQ(driver_.contract_counts().mappings, 1u);
  EXPECT_TRUE(driver_.Memset(region_->base(), 0, kG).ok());
  EXPECT_EQ(pool_.page(pages[0]).static_granule, 0u);
  region_->CheckInvariants();
  // The next try maps the three others only.
  const uint64_t maps = driver_.calls(DriverOp::kMap);
  FixedSource again(pool_, {pages[1], pages[2], pages[3]});
  EXPECT_TRUE(attempt(again).ok());
  EXPECT_EQ(driver_.calls(DriverOp::kMap), maps + 3);
  EXPECT_EQ(region_->backed_bytes(), 4 * kG);
  region_ = std::move(StaticRegion::Create(driver_, pool_, 0, kRegion)).value();
  nothing_mapped();
  // The source runs dry after two pages.
  FixedSource c(pool_, {pages[0], pages[1]});
  EXPECT_EQ(attempt(c).code(), StatusCode::kOutOfMemory);
  nothing_mapped();
  // The same pages back it on the next try.
  FixedSource d(pool_, pages);
  EXPECT_TRUE(attempt(d).ok());
  EXPECT_EQ(region_->backed_bytes(), 4 * kG);
  EXPECT_EQ(driver_.contract_counts().mappings, 4u);
}

TEST_F(StaticRegionTest, AMappingLeftWithoutAccessGetsItBeforeItIsHandedOut) {
  region_ = std::move(StaticRegion::Create(driver_, pool_, 0, kRegion)).value();
  std::vector<PageId> pages = Pages(2);
  // The backing's set-access fails, the undo cannot unmap the first page,
  // and the set-access that would keep it backed fails too.
  driver_.InjectFailure(DriverOp::kSetAccess, 1, InternalError("injected"));
  driver_.InjectFailure(DriverOp::kSetAccess, 2, InternalError("injected"));
  driver_.InjectFailure(DriverOp::kUnmap, 1, InternalError("injected"));
  ASSERT_EQ(region_->TryOccupy(0, 2 * kG, AnyPage),
            StaticRegion::Occupied::kNeedsBacking);
  FixedSource first(pool_, pages);
  EXPECT_EQ(region_->Back(0, 2 * kG, first).code(), StatusCode::kInternal);
  region_->Release(0, 2 * kG, FreeTag{});
  // It stays backed, marked: not offered as idle backed bytes, and a
  // hand-out over it needs backing (access) first.
  EXPECT_EQ(region_->backed_bytes(), kG);
  EXPECT_EQ(driver_.Memset(region_->base(), 0, kG).code(),
            StatusCode::kFailedPrecondition);
  EXPECT_TRUE(
      region_->FreeBackedRanges([](const Page&) { return true; }).empty());
  region_->CheckInvariants();
  ASSERT_EQ(region_->TryOccupy(0, kG, AnyPage),
            StaticRegion::Occupied::kNeedsBacking);
  // Access cannot be granted: the hand-out fails.
  driver_.InjectFailure(DriverOp::kSetAccess, 1, InternalError("injected"));
  FixedSource none(pool_, {});
  EXPECT_EQ(region_->Back(0, kG, none).code(), StatusCode::kInternal);
  region_->Release(0, kG, FreeTag{});
  region_->CheckInvariants();
  // Now it can: no new page, one set-access, and the memory is usable.
  ASSERT_EQ(region_->TryOccupy(0, kG, AnyPage),
            StaticRegion::Occupied::kNeedsBacking);
  const uint64_t maps = driver_.calls(DriverOp::kMap);
  ASSERT_TRUE(region_->Back(0, kG, none).ok());
  EXPECT_EQ(driver_.calls(DriverOp::kMap), maps);
  EXPECT_TRUE(driver_.Memset(region_->base(), 0, kG).ok());
  region_->Release(0, kG, FreeTag{});
  region_->CheckInvariants();
  ASSERT_EQ(region_->TryOccupy(0, kG, AnyPage), StaticRegion::Occupied::kYes);
  region_->Release(0, kG, FreeTag{});
}

TEST_F(StaticRegionTest, TryOccupyIsTheSafetyCheck) {
  CreateBacked(4);
  // A spans granule 0 and 512 bytes of granule 1.
  ASSERT_EQ(region_->TryOccupy(0, kG + 512, AnyPage),
            StaticRegion::Occupied::kYes);
  EXPECT_EQ(pool_.page(region_->page(0)).static_users, 1u);
  EXPECT_EQ(pool_.page(region_->page(1)).static_users, 1u);
  EXPECT_EQ(region_->occupied_bytes(), kG + 512);
  // Anything overlapping a live byte is refused, and records nothing.
  EXPECT_EQ(region_->TryOccupy(kG, 1024, AnyPage), StaticRegion::Occupied::kNo);
  EXPECT_EQ(region_->TryOccupy(100, 10, AnyPage), StaticRegion::Occupied::kNo);
  EXPECT_FALSE(region_->RangeFree(kG + 511, 1));
  EXPECT_TRUE(region_->RangeFree(kG + 512, 512));
  // The bytes right after are free, in the same granule.
  ASSERT_EQ(region_->TryOccupy(kG + 512, 512, AnyPage),
            StaticRegion::Occupied::kYes);
  EXPECT_EQ(pool_.page(region_->page(1)).static_users, 2u);
  // A page the caller refuses (lent to the arena, another stream's work):
  // nothing is recorded.
  EXPECT_EQ(region_->TryOccupy(2 * kG, kG,
                               [](Page&, uint32_t, uint32_t) { return false; }),
            StaticRegion::Occupied::kNo);
  EXPECT_EQ(pool_.page(region_->page(2)).static_users, 0u);
  // The bytes the check is asked about, per page.
  std::vector<std::pair<uint32_t, uint32_t>> asked;
  ASSERT_EQ(region_->TryOccupy(2 * kG + 4096, kG + 100,
                               [&](Page&, uint32_t lo, uint32_t hi) {
                                 asked.emplace_back(lo, hi);
                                 return true;
                               }),
            StaticRegion::Occupied::kYes);
  EXPECT_EQ(asked, (std::vector<std::pair<uint32_t, uint32_t>>{
                       {4096, kG}, {0, 4096 + 100}}));
  // Out of the region, or empty: refused.
  EXPECT_EQ(region_->TryOccupy(4 * kG - 10, 20, AnyPage),
            StaticRegion::Occupied::kNo);
  EXPECT_EQ(region_->TryOccupy(0, 0, AnyPage), StaticRegion::Occupied::kNo);
  region_->CheckInvariants();
  // Releasing fences the bytes with the free's tag (not for epoch 0: one
  // stream, nothing to wait for).
  region_->Release(2 * kG + 4096, kG + 100, FreeTag{5, 7});
  ASSERT_EQ(pool_.page(region_->page(2)).fences.size(), 1u);
  EXPECT_EQ(pool_.page(region_->page(2)).fences[0].lo, 4096u);
  EXPECT_EQ(pool_.page(region_->page(3)).fences[0].hi, 4196u);
  region_->Release(kG + 512, 512, FreeTag{});
  EXPECT_TRUE(pool_.page(region_->page(1)).fences.empty());
  region_->Release(0, kG + 512, FreeTag{});
  EXPECT_EQ(region_->occupied_bytes(), 0u);
  region_->CheckInvariants();
}

TEST_F(StaticRegionTest, AFailedReserveLeavesNothing) {
  driver_.InjectFailure(DriverOp::kReserve, 1, OutOfMemoryError("injected"));
  StatusOr<std::unique_ptr<StaticRegion>> r =
      StaticRegion::Create(driver_, pool_, 0, kRegion);
  EXPECT_EQ(r.status().code(), StatusCode::kOutOfMemory);
  EXPECT_EQ(driver_.contract_counts().reservations, 0u);
}

TEST_F(StaticRegionTest, ARegionWithoutGranulesIsRefused) {
  StatusOr<std::unique_ptr<StaticRegion>> r =
      StaticRegion::Create(driver_, pool_, 0, 0);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  r = StaticRegion::Create(driver_, pool_, 0, 4 * kG + 512);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(driver_.calls(DriverOp::kReserve), 0u);
}

TEST_F(StaticRegionTest, ARangeWrappingPastTheAddressSpaceIsNotFree) {
  CreateBacked(4);
  const uint64_t near_end = ~uint64_t{0} - 10;
  // offset + size wraps to 89, inside the region: still not a free range of
  // it (nor one TryOccupy takes).
  EXPECT_FALSE(region_->RangeFree(near_end, 100));
  EXPECT_EQ(region_->TryOccupy(near_end, 100, AnyPage),
            StaticRegion::Occupied::kNo);
  EXPECT_FALSE(region_->RangeFree(4 * kG, 1));
  EXPECT_TRUE(region_->RangeFree(4 * kG - 1, 1));
  EXPECT_TRUE(region_->RangeFree(0, 4 * kG));
}

TEST_F(StaticRegionTest, ABlockedLaterGranuleRecordsNothingInEarlierOnes) {
  CreateBacked(4);
  ASSERT_EQ(region_->TryOccupy(2 * kG + 100, 100, AnyPage),
            StaticRegion::Occupied::kYes);
  // [0, 3 kG) would be fine in granules 0 and 1 but meets the live piece of
  // granule 2: refused, and granules 0 and 1 are untouched.
  EXPECT_EQ(region_->TryOccupy(0, 3 * kG, AnyPage),
            StaticRegion::Occupied::kNo);
  EXPECT_EQ(pool_.page(region_->page(0)).static_users, 0u);
  EXPECT_EQ(pool_.page(region_->page(1)).static_users, 0u);
  EXPECT_TRUE(region_->RangeFree(0, 2 * kG));
  EXPECT_EQ(region_->occupied_bytes(), 100u);
  region_->CheckInvariants();
  // The same when the caller refuses the last page only.
  const Page* last = &pool_.page(region_->page(3));
  EXPECT_EQ(region_->TryOccupy(0, 2 * kG + 1,
                               [&](Page& page, uint32_t, uint32_t) {
                                 return &page != &pool_.page(region_->page(2));
                               }),
            StaticRegion::Occupied::kNo);
  EXPECT_EQ(region_->TryOccupy(
                3 * kG - 10, 20,
                [&](Page& page, uint32_t, uint32_t) { return &page != last; }),
            StaticRegion::Occupied::kNo);
  EXPECT_EQ(pool_.page(region_->page(0)).static_users, 0u);
  EXPECT_EQ(pool_.page(region_->page(2)).static_users, 1u);
  EXPECT_EQ(region_->occupied_bytes(), 100u);
  region_->Release(2 * kG + 100, 100, FreeTag{});
  region_->CheckInvariants();
}

// Random hand-outs and releases against a model of the live byte ranges:
// TryOccupy succeeds exactly when the range is inside the region, overlaps
// no live allocation and every page behind it is acceptable, so no byte is
// ever held by two live allocations; each page counts the live allocations
// on it.
TEST_F(StaticRegionTest, RandomHandOutsNeverShareAByte) {
  CreateBacked(4);
  std::mt19937_64 rng(12);
  std::map<uint64_t, uint64_t> live;  // offset -> end
  uint64_t live_bytes = 0;
  int handed_out = 0;
  for (int step = 0; step < 4000; ++step) {
    if (!live.empty() && rng() % 3 == 0) {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      region_->Release(it->first, it->second - it->first, FreeTag{});
      live_bytes -= it->second - it->first;
      live.erase(it);
    } else {
      const uint64_t offset = rng() % (4 * kG + kG / 2);
      const uint64_t size =
          rng() % 2 == 0 ? 1 + rng() % (kG / 8) : 1 + rng() % (2 * kG);
      const uint64_t end = offset + size;
      const int refused = rng() % 8 == 0 ? static_cast<int>(rng() % 4) : -1;
      bool expected = end <= 4 * kG;
      for (const auto& [lo, hi] : live) {
        if (lo < end && offset < hi) expected = false;
      }
      ASSERT_EQ(region_->RangeFree(offset, size), expected);
      if (refused >= 0 && refused >= static_cast<int>(offset / kG) &&
          refused <= static_cast<int>((end - 1) / kG)) {
        expected = false;
      }
      const Page* refused_page =
          refused >= 0 ? &pool_.page(region_->page(refused)) : nullptr;
      const bool got =
          region_->TryOccupy(offset, size, [&](Page& page, uint32_t, uint32_t) {
            return &page != refused_page;
          }) == StaticRegion::Occupied::kYes;
      ASSERT_EQ(got, expected)
          << "step " << step << ": [" << offset << ", " << end << ")";
      if (got) {
        live[offset] = end;
        live_bytes += size;
        ++handed_out;
      }
    }
    ASSERT_EQ(region_->occupied_bytes(), live_bytes);
    for (uint32_t k = 0; k < 4; ++k) {
      uint32_t users = 0;
      for (const auto& [lo, hi] : live) {
        users += lo < (k + 1) * kG && k * kG < hi;
      }
      ASSERT_EQ(pool_.page(region_->page(k)).static_users, users)
          << "granule " << k << " at step " << step;
    }
    region_->CheckInvariants();
  }
  EXPECT_GT(handed_out, 500);
  for (const auto& [lo, hi] : live) region_->Release(lo, hi - lo, FreeTag{});
  EXPECT_EQ(region_->occupied_bytes(), 0u);
}

// With real memory: granule k is backed by pages[k] (whatever its id), and
// two planned allocations next to each other keep their own bytes.
TEST(StaticRegionHostTest, PlannedBytesLandOnTheirGranulesPage) {
  HostDriverOptions options;
  options.granularity = kG;
  options.capacity_per_device = 16 * kG;
  std::unique_ptr<HostDriver> driver =
      std::move(HostDriver::Open(options)).value();
  PagePool pool(*driver, 0, kG, 0);
  std::vector<PageId> ids = {*pool.Grow(), *pool.Grow(), *pool.Grow()};
  const std::vector<PageId> pages = {ids[2], ids[0], ids[1]};
  std::unique_ptr<StaticRegion> region =
      std::move(StaticRegion::Create(*driver, pool, 0, 3 * kG)).value();
  auto any = [](Page&, uint32_t, uint32_t) { return true; };
  {
    FixedSource source(pool, pages);
    ASSERT_EQ(region->TryOccupy(0, 3 * kG, any),
              StaticRegion::Occupied::kNeedsBacking);
    ASSERT_TRUE(region->Back(0, 3 * kG, source).ok());
    region->Release(0, 3 * kG, FreeTag{});
  }
  // A: [100, kG + 100), B: [kG + 100, 2 kG + 50).
  ASSERT_EQ(region->TryOccupy(100, kG, any), StaticRegion::Occupied::kYes);
  ASSERT_EQ(region->TryOccupy(kG + 100, kG - 50, any),
            StaticRegion::Occupied::kYes);
  const DevicePtr base = region->base();
  ASSERT_TRUE(driver->Memset(base + 100, 0xA1, kG).ok());
  ASSERT_TRUE(driver->Memset(base + kG + 100, 0xB2, kG - 50).ok());
  // Granule 1 seen through a second mapping of pages[1]'s handle.
  const DevicePtr view = *driver->Reserve(kG);
  ASSERT_TRUE(pool.MapRun(view, PageRun{pages[1], 1}).ok());
  ASSERT_TRUE(driver->SetAccess(view, kG, 0).ok());
  std::vector<uint8_t> bytes(kG);
  ASSERT_TRUE(driver->CopyToHost(bytes.data(), view, kG).ok());
  for (uint64_t i = 0; i < kG; ++i) {
    ASSERT_EQ(bytes[i], i < 100 ? 0xA1 : 0xB2) << "byte " << i;
  }
  // And A is intact after B's writes.
  ASSERT_TRUE(driver->CopyToHost(bytes.data(), base + 100, kG).ok());
  for (uint64_t i = 0; i < kG; ++i) ASSERT_EQ(bytes[i], 0xA1) << "byte " << i;
  ASSERT_TRUE(driver->Unmap(view, kG).ok());
  ASSERT_TRUE(driver->Unreserve(view, kG).ok());
  region->Release(100, kG, FreeTag{});
  region->Release(kG + 100, kG - 50, FreeTag{});
  region.reset();
  for (PageId id : ids) ASSERT_TRUE(pool.ReleasePage(id).ok());
  EXPECT_EQ(driver->contract_counts().handles, 0u);
}

// Broken preconditions are bugs in the caller: they abort, naming them.
using StaticRegionDeathTest = StaticRegionTest;

TEST_F(StaticRegionDeathTest, APageBacksOneStaticGranuleOnly) {
  std::vector<PageId> pages = Pages(4);
  CreateBacked(pages);
  // A source that gives a page already backing a granule is a bug.
  std::unique_ptr<StaticRegion> second =
      std::move(StaticRegion::Create(driver_, pool_, 0, kRegion)).value();
  FixedSource source(pool_, {pages[0]});
  ASSERT_EQ(second->TryOccupy(0, 100, AnyPage),
            StaticRegion::Occupied::kNeedsBacking);
  EXPECT_DEATH(second->Back(0, 100, source).IgnoreError(),
               "static_granule == kNoGranule");
  second->Release(0, 100, FreeTag{});
}

TEST_F(StaticRegionDeathTest, ASourceGivingTooManyPagesAborts) {
  region_ = std::move(StaticRegion::Create(driver_, pool_, 0, kRegion)).value();
  class Greedy : public PageSource {
   public:
    explicit Greedy(PageRun run) : run_(run) {}
    StatusOr<std::vector<PageRun>> Take(uint32_t, uint32_t, uint32_t,
                                        uint32_t) override {
      return std::vector<PageRun>{run_};
    }
    PageRun run_;
  };
  Greedy greedy(*pool_.GrowRun(8));
  ASSERT_EQ(region_->TryOccupy(0, 100, AnyPage),
            StaticRegion::Occupied::kNeedsBacking);
  EXPECT_DEATH(region_->Back(0, 100, greedy).IgnoreError(),
               "page source gave 8 pages for 1 granules");
  region_->Release(0, 100, FreeTag{});
}

TEST_F(StaticRegionDeathTest, ReleasingBytesThatAreNotLiveAborts) {
  CreateBacked(4);
  ASSERT_EQ(region_->TryOccupy(0, kG + 512, AnyPage),
            StaticRegion::Occupied::kYes);
  EXPECT_DEATH(region_->Release(2 * kG, kG, FreeTag{}), "not live");
  EXPECT_DEATH(region_->Release(kG + 512, 512, FreeTag{}), "not live");
  EXPECT_DEATH(region_->Release(0, 100, FreeTag{}), "not live");
  EXPECT_DEATH(region_.reset(), "destroyed with 66048 bytes live");
  region_->Release(0, kG + 512, FreeTag{});
}

// The free bytes of backed granules, as the allocator's idle region index
// starts from them: live pieces cut them, unbacked granules and granules
// whose page the predicate refuses are left out, adjacent runs merge.
TEST_F(StaticRegionTest, FreeBackedRangesAreTheBackedBytesNoAllocationHolds) {
  region_ = std::move(StaticRegion::Create(driver_, pool_, 0, kRegion)).value();
  FixedSource source(pool_, Pages(3), /*prefer_wanted=*/true);
  // Granules 0..2 backed (one page each), granule 3 never.
  ASSERT_EQ(region_->TryOccupy(0, 3 * kG, AnyPage),
            StaticRegion::Occupied::kNeedsBacking);
  ASSERT_TRUE(region_->Back(0, 3 * kG, source).ok());
  region_->Release(0, 3 * kG, FreeTag{});
  auto all = [](const Page&) { return true; };
  using Runs = std::vector<std::pair<uint64_t, uint64_t>>;
  EXPECT_EQ(region_->FreeBackedRanges(all), (Runs{{0, 3 * kG}}));
  // Two live pieces: [100, 612) in granule 0 and all of granule 1 plus 512
  // bytes of granule 2.
  ASSERT_EQ(region_->TryOccupy(100, 512, AnyPage),
            StaticRegion::Occupied::kYes);
  ASSERT_EQ(region_->TryOccupy(kG, kG + 512, AnyPage),
            StaticRegion::Occupied::kYes);
  EXPECT_EQ(region_->FreeBackedRanges(all),
            (Runs{{0, 100}, {612, kG - 612}, {2 * kG + 512, kG - 512}}));
  // A page refused (say, mapped in the arena): its granule is left out.
  const PageId g2 = region_->page(2);
  EXPECT_EQ(region_->FreeBackedRanges(
                [&](const Page& p) { return &p != &pool_.page(g2); }),
            (Runs{{0, 100}, {612, kG - 612}}));
  region_->Release(100, 512, FreeTag{});
  region_->Release(kG, kG + 512, FreeTag{});
  EXPECT_EQ(region_->FreeBackedRanges(all), (Runs{{0, 3 * kG}}));
  region_->CheckInvariants();
}

}  // namespace
}  // namespace loom::vmm
