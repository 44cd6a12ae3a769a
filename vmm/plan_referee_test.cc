#include "vmm/plan_referee.h"

#include <map>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace loom::vmm {
namespace {

constexpr uint64_t kG = 2 << 20;

TEST(ShadowArenaTest, BestFitReusesFreedBytesAndCountsTouchedGranules) {
  ShadowArena s(kG);
  const uint64_t a = s.Allocate(kG);
  const uint64_t b = s.Allocate(kG / 2);
  EXPECT_EQ(a, 0u);
  EXPECT_EQ(b, kG);
  EXPECT_EQ(s.touched_granules(), 2u);
  s.Free(a, kG);
  // Best fit: the freed granule, not the tail after b.
  EXPECT_EQ(s.Allocate(kG / 4), 0u);
  EXPECT_EQ(s.touched_granules(), 2u);
  s.CheckInvariants();
}

TEST(ShadowArenaTest, SeededRandomizedPlacementKeepsItsInvariants) {
  for (uint32_t seed : {1u, 2u, 3u}) {
    std::mt19937_64 rng(seed);
    ShadowArena s(kG);
    std::map<uint64_t, uint64_t> live;  // offset -> size
    uint64_t peak_live = 0, live_bytes = 0;
    for (int step = 0; step < 4000; ++step) {
      if (live.empty() || rng() % 3 != 0) {
        const uint64_t size = 1 + rng() % (3 * kG);
        const uint64_t at = s.Allocate(size);
        const uint64_t rounded = (size + 511) / 512 * 512;
        // Never overlaps a live block.
        auto next = live.lower_bound(at);
        if (next != live.end()) ASSERT_LE(at + rounded, next->first);
        if (next != live.begin()) {
          auto prev = std::prev(next);
          ASSERT_LE(prev->first + prev->second, at);
        }
        live[at] = rounded;
        live_bytes += rounded;
        peak_live = std::max(peak_live, live_bytes);
      } else {
        auto it = live.begin();
        std::advance(it, rng() % live.size());
        s.Free(it->first, it->second);
        live_bytes -= it->second;
        live.erase(it);
      }
      ASSERT_EQ(s.live_bytes(), live_bytes);
      // Touched granules hold at least the peak of live bytes.
      ASSERT_GE(s.touched_granules() * kG, peak_live);
    }
    s.CheckInvariants();
  }
}

TEST(PlanRefereeTest, APlanHoldingMoreThanTheDynamicSpaceLoses) {
  PlanReferee r(kG);
  r.Start(0);
  EXPECT_TRUE(r.watching());
  std::vector<uint64_t> at;
  for (int i = 0; i < 64; ++i) at.push_back(r.OnAllocate(kG));  // 128 MiB
  EXPECT_FALSE(r.Judge(128 << 20, 0));
  // Within the slack (kSlackBytes, as 128 MiB / kSlackFraction is less):
  // still fine; a byte more loses.
  static_assert((uint64_t{128} << 20) / PlanReferee::kSlackFraction <
                PlanReferee::kSlackBytes);
  EXPECT_FALSE(r.Judge((128 << 20) + PlanReferee::kSlackBytes, 0));
  EXPECT_TRUE(r.Judge((128 << 20) + PlanReferee::kSlackBytes + 1, 0));
  EXPECT_TRUE(r.lost());
  EXPECT_EQ(r.lost_dynamic_bytes(), uint64_t{128} << 20);
  EXPECT_EQ(r.losses(), 1u);
  // No longer watching: requests and frees are ignored.
  EXPECT_EQ(r.OnAllocate(kG), PlanReferee::kNoShadow);
  r.OnFree(at[0], kG);
  EXPECT_FALSE(r.Judge(uint64_t{1} << 40, 0));
}

TEST(PlanRefereeTest, MemoryHeldAtTheStartCountsForTheDynamicSpace) {
  PlanReferee r(kG);
  r.Start(uint64_t{1} << 30);  // installed mid-run, 1 GiB held
  r.OnAllocate(kG);
  // 1 GiB / kSlackFraction of slack on top of it.
  const uint64_t slack = (uint64_t{1} << 30) / PlanReferee::kSlackFraction;
  EXPECT_FALSE(r.Judge((uint64_t{1} << 30) + slack, 0));
  EXPECT_TRUE(r.Judge((uint64_t{1} << 30) + slack + (1 << 20), 0));
}

TEST(PlanRefereeTest, APlanThatFitsIsJudgedAgainstItsRegionToo) {
  PlanReferee r(kG);
  r.Start(0);
  r.OnAllocate(kG);
  // The plan backed its high granules first: the shadow has 2 MiB, but the
  // plan's requests will come (1 GiB region).
  EXPECT_FALSE(r.Judge(512 << 20, uint64_t{1} << 30));
  EXPECT_TRUE(r.Judge(512 << 20, 0));
}

TEST(PlanRefereeTest, APlanThatKeepsWinningIsConfirmedAndTheShadowStops) {
  PlanReferee r(kG);
  r.Start(0);
  r.IterationBegin();
  for (int it = 0; it < 3; ++it) {
    const uint64_t a = r.OnAllocate(8 * kG);
    EXPECT_FALSE(r.Judge(16 << 20, 0));
    r.OnFree(a, 8 * kG);
    r.IterationBegin();
  }
  // Two whole iterations without the shadow growing.
  EXPECT_EQ(r.verdict(), PlanReferee::Verdict::kConfirmed);
  EXPECT_EQ(r.OnAllocate(kG), PlanReferee::kNoShadow);
  EXPECT_FALSE(r.Judge(uint64_t{1} << 40, 0));
  EXPECT_STREQ(PlanReferee::Name(r.verdict()), "confirmed");
}

}  // namespace
}  // namespace loom::vmm
