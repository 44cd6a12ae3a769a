// StaticRegion: one reservation laid out as the plan says; the planned
// hand-out's safety check; the schedule of each granule; undo on failure.
#include "vmm/static_region.h"

#include <gtest/gtest.h>

#include <map>
#include <random>

#include "vmm/fake_driver.h"
#include "vmm/host_driver.h"

namespace loom::vmm {
namespace {

constexpr uint64_t kG = 64 << 10;

// A 4-granule plan, period 100: A [0, kG + 512) during [10, 30), B
// [2 kG, 3 kG) during [60, 120) (wraps), P [3 kG, 4 kG) persistent.
RuntimePlan Plan() {
  RuntimePlan plan;
  plan.region_bytes = 4 * kG;
  plan.period = 100;
  plan.iteration = {{kG + 512, 0, 10, 30}, {kG, 2 * kG, 60, 120}};
  plan.prologue = {{kG, 3 * kG, 0, 100}};
  return plan;
}

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

  FakeDriver driver_;
  PagePool pool_;
  RuntimePlan plan_ = Plan();
  std::unique_ptr<StaticRegion> region_;
};

TEST_F(StaticRegionTest, MapsEveryPageAndGrantsAccessOnce) {
  std::vector<PageId> pages = Pages(4);
  StatusOr<std::unique_ptr<StaticRegion>> r =
      StaticRegion::Create(driver_, pool_, 0, plan_, pages);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  region_ = std::move(r).value();
  EXPECT_EQ(region_->bytes(), 4 * kG);
  for (uint32_t k = 0; k < 4; ++k) {
    EXPECT_EQ(region_->page(k), pages[k]);
    EXPECT_EQ(pool_.page(pages[k]).static_granule, k);
  }
  EXPECT_EQ(driver_.calls(DriverOp::kMap), 4u);
  EXPECT_EQ(driver_.calls(DriverOp::kSetAccess), 1u);
  EXPECT_EQ(driver_.contract_counts().mappings, 4u);
  region_.reset();  // unmaps, frees the reservation; the pages stay
  EXPECT_EQ(driver_.contract_counts().mappings, 0u);
  EXPECT_EQ(driver_.contract_counts().reservations, 0u);
  for (PageId id : pages) {
    EXPECT_EQ(pool_.page(id).static_granule, kNoGranule);
  }
}

TEST_F(StaticRegionTest, AFailedMapUndoesEverything) {
  std::vector<PageId> pages = Pages(4);
  driver_.InjectFailure(DriverOp::kMap, 3, InternalError("injected"));
  EXPECT_FALSE(StaticRegion::Create(driver_, pool_, 0, plan_, pages).ok());
  EXPECT_EQ(driver_.contract_counts().mappings, 0u);
  EXPECT_EQ(driver_.contract_counts().reservations, 0u);
  for (PageId id : pages) {
    EXPECT_EQ(pool_.page(id).static_granule, kNoGranule);
  }
  driver_.InjectFailure(DriverOp::kSetAccess, 1, InternalError("injected"));
  EXPECT_FALSE(StaticRegion::Create(driver_, pool_, 0, plan_, pages).ok());
  EXPECT_EQ(driver_.contract_counts().mappings, 0u);
  EXPECT_EQ(driver_.contract_counts().reservations, 0u);
}

TEST_F(StaticRegionTest, TryOccupyIsTheSafetyCheck) {
  region_ = std::move(StaticRegion::Create(driver_, pool_, 0, plan_, Pages(4)))
                .value();
  // A spans granule 0 and 512 bytes of granule 1.
  ASSERT_TRUE(region_->TryOccupy(0, kG + 512, AnyPage));
  EXPECT_EQ(pool_.page(region_->page(0)).static_users, 1u);
  EXPECT_EQ(pool_.page(region_->page(1)).static_users, 1u);
  EXPECT_EQ(region_->occupied_bytes(), kG + 512);
  // Anything overlapping a live byte is refused, and records nothing.
  EXPECT_FALSE(region_->TryOccupy(kG, 1024, AnyPage));
  EXPECT_FALSE(region_->TryOccupy(100, 10, AnyPage));
  EXPECT_FALSE(region_->RangeFree(kG + 511, 1));
  EXPECT_TRUE(region_->RangeFree(kG + 512, 512));
  // The bytes right after are free, in the same granule.
  ASSERT_TRUE(region_->TryOccupy(kG + 512, 512, AnyPage));
  EXPECT_EQ(pool_.page(region_->page(1)).static_users, 2u);
  // A page the caller refuses (lent to the arena, another stream's work):
  // nothing is recorded.
  EXPECT_FALSE(region_->TryOccupy(
      2 * kG, kG, [](Page&, uint32_t, uint32_t) { return false; }));
  EXPECT_EQ(pool_.page(region_->page(2)).static_users, 0u);
  // The bytes the check is asked about, per page.
  std::vector<std::pair<uint32_t, uint32_t>> asked;
  ASSERT_TRUE(region_->TryOccupy(2 * kG + 4096, kG + 100,
                                 [&](Page&, uint32_t lo, uint32_t hi) {
                                   asked.emplace_back(lo, hi);
                                   return true;
                                 }));
  EXPECT_EQ(asked, (std::vector<std::pair<uint32_t, uint32_t>>{
                       {4096, kG}, {0, 4096 + 100}}));
  // Out of the region, or empty: refused.
  EXPECT_FALSE(region_->TryOccupy(4 * kG - 10, 20, AnyPage));
  EXPECT_FALSE(region_->TryOccupy(0, 0, AnyPage));
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

TEST_F(StaticRegionTest, TimeToNextUseFollowsThePlanCyclically) {
  region_ = std::move(StaticRegion::Create(driver_, pool_, 0, plan_, Pages(4)))
                .value();
  // Granule 0: A starts at 10.
  EXPECT_EQ(region_->TimeToNextUse(0, 5), 5);
  EXPECT_EQ(region_->TimeToNextUse(0, 50), 60);   // next iteration's 10
  EXPECT_EQ(region_->TimeToNextUse(0, 150), 60);  // times wrap the period
  // Granule 2: B starts at 60.
  EXPECT_EQ(region_->TimeToNextUse(2, 10), 50);
  // Granule 3: persistent.
  EXPECT_EQ(region_->TimeToNextUse(3, 10), 0);
  // In the set-up: the first planned start of the first iteration.
  EXPECT_EQ(region_->TimeToNextUse(0, 0, /*in_setup=*/true), 10);
  EXPECT_EQ(region_->TimeToNextUse(3, 0, /*in_setup=*/true), 0);
}

TEST_F(StaticRegionTest, NeverUsedGranulesAreNeverNeeded) {
  RuntimePlan plan = plan_;
  plan.region_bytes = 5 * kG;  // granule 4: no planned request
  region_ = std::move(StaticRegion::Create(driver_, pool_, 0, plan, Pages(5)))
                .value();
  EXPECT_EQ(region_->TimeToNextUse(4, 10), StaticRegion::kNever);
  EXPECT_EQ(region_->TimeToNextUse(4, 0, true), StaticRegion::kNever);
}

TEST_F(StaticRegionTest, AFailedReserveTouchesNoPage) {
  std::vector<PageId> pages = Pages(4);
  driver_.InjectFailure(DriverOp::kReserve, 1, OutOfMemoryError("injected"));
  StatusOr<std::unique_ptr<StaticRegion>> r =
      StaticRegion::Create(driver_, pool_, 0, plan_, pages);
  EXPECT_EQ(r.status().code(), StatusCode::kOutOfMemory);
  EXPECT_EQ(driver_.calls(DriverOp::kMap), 0u);
  EXPECT_EQ(driver_.contract_counts().reservations, 0u);
  for (PageId id : pages) {
    EXPECT_EQ(pool_.page(id).static_granule, kNoGranule);
  }
}

TEST_F(StaticRegionTest, AFailedSetAccessLeavesThePagesAsTheyWere) {
  std::vector<PageId> pages = Pages(4);
  driver_.InjectFailure(DriverOp::kSetAccess, 1, InternalError("injected"));
  StatusOr<std::unique_ptr<StaticRegion>> r =
      StaticRegion::Create(driver_, pool_, 0, plan_, pages);
  EXPECT_EQ(r.status().code(), StatusCode::kInternal);
  // Every page mapped for it was unmapped again and is still the pool's:
  // live, mapped nowhere, no handle released or leaked.
  EXPECT_EQ(driver_.calls(DriverOp::kUnmap), 4u);
  const ContractCounts counts = driver_.contract_counts();
  EXPECT_EQ(counts.mappings, 0u);
  EXPECT_EQ(counts.reservations, 0u);
  EXPECT_EQ(counts.handles, 4u);
  for (PageId id : pages) {
    EXPECT_TRUE(pool_.page(id).live);
    EXPECT_EQ(pool_.page(id).static_granule, kNoGranule);
    EXPECT_EQ(pool_.page(id).static_users, 0u);
  }
  // The same pages make a region on the next try.
  r = StaticRegion::Create(driver_, pool_, 0, plan_, pages);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  region_ = std::move(r).value();
  EXPECT_EQ(driver_.contract_counts().mappings, 4u);
}

TEST_F(StaticRegionTest, ARegionWithoutGranulesIsRefused) {
  RuntimePlan empty;
  StatusOr<std::unique_ptr<StaticRegion>> r =
      StaticRegion::Create(driver_, pool_, 0, empty, {});
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(driver_.calls(DriverOp::kReserve), 0u);
}

TEST_F(StaticRegionTest, ARangeWrappingPastTheAddressSpaceIsNotFree) {
  region_ = std::move(StaticRegion::Create(driver_, pool_, 0, plan_, Pages(4)))
                .value();
  const uint64_t near_end = ~uint64_t{0} - 10;
  // offset + size wraps to 89, inside the region: still not a free range of
  // it (nor one TryOccupy takes).
  EXPECT_FALSE(region_->RangeFree(near_end, 100));
  EXPECT_FALSE(region_->TryOccupy(near_end, 100, AnyPage));
  EXPECT_FALSE(region_->RangeFree(4 * kG, 1));
  EXPECT_TRUE(region_->RangeFree(4 * kG - 1, 1));
  EXPECT_TRUE(region_->RangeFree(0, 4 * kG));
}

TEST_F(StaticRegionTest, ABlockedLaterGranuleRecordsNothingInEarlierOnes) {
  region_ = std::move(StaticRegion::Create(driver_, pool_, 0, plan_, Pages(4)))
                .value();
  ASSERT_TRUE(region_->TryOccupy(2 * kG + 100, 100, AnyPage));
  // [0, 3 kG) would be fine in granules 0 and 1 but meets the live piece of
  // granule 2: refused, and granules 0 and 1 are untouched.
  EXPECT_FALSE(region_->TryOccupy(0, 3 * kG, AnyPage));
  EXPECT_EQ(pool_.page(region_->page(0)).static_users, 0u);
  EXPECT_EQ(pool_.page(region_->page(1)).static_users, 0u);
  EXPECT_TRUE(region_->RangeFree(0, 2 * kG));
  EXPECT_EQ(region_->occupied_bytes(), 100u);
  region_->CheckInvariants();
  // The same when the caller refuses the last page only.
  const Page* last = &pool_.page(region_->page(3));
  EXPECT_FALSE(
      region_->TryOccupy(0, 2 * kG + 1, [&](Page& page, uint32_t, uint32_t) {
        return &page != &pool_.page(region_->page(2));
      }));
  EXPECT_FALSE(region_->TryOccupy(
      3 * kG - 10, 20,
      [&](Page& page, uint32_t, uint32_t) { return &page != last; }));
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
  region_ = std::move(StaticRegion::Create(driver_, pool_, 0, plan_, Pages(4)))
                .value();
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
          });
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

TEST_F(StaticRegionTest, WithoutAPeriodAPlannedGranuleIsAlwaysNeeded) {
  RuntimePlan plan = plan_;
  plan.period = 0;
  plan.region_bytes = 5 * kG;
  region_ = std::move(StaticRegion::Create(driver_, pool_, 0, plan, Pages(5)))
                .value();
  // Not cyclic: nothing says when a used granule is free again.
  EXPECT_EQ(region_->TimeToNextUse(0, 50), 0);
  EXPECT_EQ(region_->TimeToNextUse(2, 0), 0);
  EXPECT_EQ(region_->TimeToNextUse(4, 10), StaticRegion::kNever);
  EXPECT_EQ(region_->TimeToNextUse(2, 0, /*in_setup=*/true), 60);
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
  RuntimePlan plan;
  plan.region_bytes = 3 * kG;
  std::unique_ptr<StaticRegion> region =
      std::move(StaticRegion::Create(*driver, pool, 0, plan, pages)).value();
  auto any = [](Page&, uint32_t, uint32_t) { return true; };
  // A: [100, kG + 100), B: [kG + 100, 2 kG + 50).
  ASSERT_TRUE(region->TryOccupy(100, kG, any));
  ASSERT_TRUE(region->TryOccupy(kG + 100, kG - 50, any));
  const DevicePtr base = region->base();
  ASSERT_TRUE(driver->Memset(base + 100, 0xA1, kG).ok());
  ASSERT_TRUE(driver->Memset(base + kG + 100, 0xB2, kG - 50).ok());
  // Granule 1 seen through a second mapping of pages[1]'s handle.
  const DevicePtr view = *driver->Reserve(kG);
  ASSERT_TRUE(driver->Map(view, kG, pool.page(pages[1]).handle).ok());
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

TEST_F(StaticRegionDeathTest, PagesMustCoverTheRegionExactly) {
  std::vector<PageId> pages = Pages(3);
  EXPECT_DEATH(StaticRegion::Create(driver_, pool_, 0, plan_, pages)
                   .status()
                   .IgnoreError(),
               "region of 262144 bytes with 3 pages");
}

TEST_F(StaticRegionDeathTest, APageBacksOneStaticGranuleOnly) {
  std::vector<PageId> pages = Pages(4);
  region_ =
      std::move(StaticRegion::Create(driver_, pool_, 0, plan_, pages)).value();
  EXPECT_DEATH(StaticRegion::Create(driver_, pool_, 0, plan_, pages)
                   .status()
                   .IgnoreError(),
               "static_granule == kNoGranule");
  std::vector<PageId> twice = Pages(3);
  twice.push_back(twice[0]);
  EXPECT_DEATH(StaticRegion::Create(driver_, pool_, 0, plan_, twice)
                   .status()
                   .IgnoreError(),
               "static_granule == kNoGranule");
}

TEST_F(StaticRegionDeathTest, ReleasingBytesThatAreNotLiveAborts) {
  region_ = std::move(StaticRegion::Create(driver_, pool_, 0, plan_, Pages(4)))
                .value();
  ASSERT_TRUE(region_->TryOccupy(0, kG + 512, AnyPage));
  EXPECT_DEATH(region_->Release(2 * kG, kG, FreeTag{}), "not live");
  EXPECT_DEATH(region_->Release(kG + 512, 512, FreeTag{}), "not live");
  EXPECT_DEATH(region_->Release(0, 100, FreeTag{}), "not live");
  EXPECT_DEATH(region_.reset(), "destroyed with 66048 bytes live");
  region_->Release(0, kG + 512, FreeTag{});
}

}  // namespace
}  // namespace loom::vmm
