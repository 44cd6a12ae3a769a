// StaticRegion: one reservation laid out as the plan says; the planned
// hand-out's safety check; the schedule of each granule; undo on failure.
#include "vmm/static_region.h"

#include <gtest/gtest.h>

#include "vmm/fake_driver.h"

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
  EXPECT_EQ(region_->TimeToNextUse(0, 50), 60);  // next iteration's 10
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

}  // namespace
}  // namespace loom::vmm
