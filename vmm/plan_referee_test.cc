#include "vmm/plan_referee.h"

#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "vmm/allocator.h"
#include "vmm/allocator_shadow.h"
#include "vmm/fake_driver.h"

namespace loom::vmm {
namespace {

constexpr uint64_t kG = 2 << 20;
constexpr uint64_t kDevice = uint64_t{80} << 30;

AllocatorShadow MakeShadow(AllocatorOptions options = {}) {
  return AllocatorShadow(options, kG, kDevice);
}

// The shadow holds, step by step, exactly what loom's allocator without a
// plan holds on the same program (same rules: stitching from the second
// iteration, large requests from the first).
TEST(AllocatorShadowTest, HoldsWhatTheAllocatorWithoutAPlanHolds) {
  for (uint32_t seed = 1; seed <= 6; ++seed) {
    SCOPED_TRACE(seed);
    AllocatorOptions options;
    options.stitch_early_bytes = uint64_t{64} << 20;
    AllocatorShadow shadow(options, kG, kDevice);
    shadow.Restart(0);
    FakeDriver driver(FakeDriverOptions{.granularity = kG});
    auto real = Allocator::Create(driver, options);
    ASSERT_TRUE(real.ok());
    std::mt19937_64 rng(seed);
    struct Live {
      uint64_t handle;
      DevicePtr ptr;
    };
    std::vector<Live> live;
    for (int step = 0; step < 3000; ++step) {
      if (step % 500 == 0) {
        shadow.IterationBegin();
        (*real)->IterationBegin(step / 500);
      }
      const bool alloc = live.empty() || rng() % 100 < 52;
      if (alloc) {
        const uint64_t size =
            rng() % 8 == 0 ? (rng() % 96 + 1) << 20 : rng() % (6 << 20) + 1;
        const Stream stream = rng() % 4 == 0 ? 7 : 0;
        const uint64_t h = shadow.Allocate(size, stream);
        ASSERT_NE(h, DynamicShadow::kNoShadow);
        auto ptr = (*real)->Allocate(size, stream);
        ASSERT_TRUE(ptr.ok());
        live.push_back({h, *ptr});
      } else {
        const size_t k = rng() % live.size();
        shadow.Free(live[k].handle);
        ASSERT_TRUE((*real)->Free(live[k].ptr).ok());
        live[k] = live.back();
        live.pop_back();
      }
      ASSERT_EQ(shadow.held_high_water(), (*real)->held_high_water());
      ASSERT_EQ(shadow.live(), live.size());
    }
    for (const Live& l : live) ASSERT_TRUE((*real)->Free(l.ptr).ok());
    shadow.Stop();
    EXPECT_EQ(shadow.live(), 0u);
  }
}

// An idle chunk is stitched where a larger request wants memory (from the
// second iteration): the shadow holds 24 MiB where a best fit over
// addresses alone touches 32 MiB of granules.
TEST(AllocatorShadowTest, ReusesIdleChunksAtAnotherPlace) {
  AllocatorShadow shadow = MakeShadow();
  shadow.Restart(2);  // installed in the run's third iteration
  const uint64_t a = shadow.Allocate(8 << 20, 0);
  const uint64_t b = shadow.Allocate(8 << 20, 0);
  shadow.Free(a);
  const uint64_t c = shadow.Allocate(16 << 20, 0);
  ASSERT_NE(c, DynamicShadow::kNoShadow);
  EXPECT_EQ(shadow.held_high_water(), uint64_t{24} << 20);
  shadow.Free(b);
  shadow.Free(c);
  // A restart forgets the high-water mark; a stopped shadow serves nothing.
  shadow.Restart(0);
  EXPECT_EQ(shadow.held_high_water(), 0u);
  shadow.Allocate(kG, 0);
  shadow.Stop();
  EXPECT_EQ(shadow.live(), 0u);
  EXPECT_EQ(shadow.Allocate(kG, 0), DynamicShadow::kNoShadow);
}

// Where the dynamic space alone runs out of memory (the device's, or the
// cap the shadowed allocator has), the plan never loses to it.
TEST(PlanRefereeTest, APlanNeverLosesToADynamicSpaceThatRanOut) {
  AllocatorOptions options;
  options.memory_cap_bytes = 8 * kG;
  AllocatorShadow shadow(options, kG, kDevice);
  PlanReferee r(shadow);
  r.Start(0, 0, 0);
  std::vector<uint64_t> at;
  for (int i = 0; i < 8; ++i) at.push_back(r.OnAllocate(kG, 0));
  EXPECT_FALSE(shadow.exhausted());
  EXPECT_EQ(r.OnAllocate(kG, 0), PlanReferee::kNoShadow);
  EXPECT_TRUE(shadow.exhausted());
  EXPECT_FALSE(r.Judge(uint64_t{1} << 30, 0));
  EXPECT_TRUE(r.watching());
  // A fresh watch forgets it.
  r.Start(0, 0, 0);
  EXPECT_FALSE(shadow.exhausted());
  r.OnAllocate(kG, 0);
  EXPECT_TRUE(r.Judge(uint64_t{1} << 30, 0));
}

// Options the allocator refuses (a handle of 0 granules): no shadow, and
// without one nothing says the plan loses.
TEST(PlanRefereeTest, WithoutAShadowThePlanNeverLoses) {
  AllocatorOptions options;
  options.max_chunk_pages = 0;
  AllocatorShadow shadow(options, kG, kDevice);
  PlanReferee r(shadow);
  r.Start(0, 0, 0);
  EXPECT_TRUE(shadow.exhausted());
  EXPECT_EQ(r.OnAllocate(kG, 0), PlanReferee::kNoShadow);
  EXPECT_FALSE(r.Judge(uint64_t{1} << 30, 0));
  EXPECT_TRUE(r.watching());
}

TEST(PlanRefereeTest, APlanHoldingMoreThanTheDynamicSpaceLoses) {
  AllocatorShadow shadow = MakeShadow();
  PlanReferee r(shadow);
  r.Start(0, 0, 0);
  EXPECT_TRUE(r.watching());
  std::vector<uint64_t> at;
  for (int i = 0; i < 64; ++i) at.push_back(r.OnAllocate(kG, 0));  // 128 MiB
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
  // No longer watching: the shadow's memory is gone, requests and frees
  // are ignored.
  EXPECT_EQ(shadow.live(), 0u);
  EXPECT_EQ(r.OnAllocate(kG, 0), PlanReferee::kNoShadow);
  r.OnFree(at[0]);
  EXPECT_FALSE(r.Judge(uint64_t{1} << 40, 0));
}

TEST(PlanRefereeTest, MemoryHeldAtTheStartCountsForTheDynamicSpace) {
  AllocatorShadow shadow = MakeShadow();
  PlanReferee r(shadow);
  r.Start(uint64_t{1} << 30, 5, 0);  // installed mid-run, 1 GiB held
  r.OnAllocate(kG, 0);
  // 1 GiB / kSlackFraction of slack on top of it.
  const uint64_t slack = (uint64_t{1} << 30) / PlanReferee::kSlackFraction;
  EXPECT_FALSE(r.Judge((uint64_t{1} << 30) + slack, 0));
  EXPECT_TRUE(r.Judge((uint64_t{1} << 30) + slack + (1 << 20), 0));
}

TEST(PlanRefereeTest, APlanThatFitsIsJudgedAgainstItsRegionToo) {
  AllocatorShadow shadow = MakeShadow();
  PlanReferee r(shadow);
  r.Start(0, 0, 0);
  r.OnAllocate(kG, 0);
  // The plan backed its high granules first: the shadow holds 2 MiB, but
  // the plan's requests will come (1 GiB region).
  EXPECT_FALSE(r.Judge(512 << 20, uint64_t{1} << 30));
  EXPECT_TRUE(r.Judge(512 << 20, 0));
}

TEST(PlanRefereeTest, APlanThatKeepsWinningIsConfirmedAndTheShadowStops) {
  AllocatorShadow shadow = MakeShadow();
  PlanReferee r(shadow);
  r.Start(0, 0, 0);
  r.IterationBegin();
  for (int it = 0; it < 3; ++it) {
    const uint64_t a = r.OnAllocate(8 * kG, 0);
    EXPECT_FALSE(r.Judge(16 << 20, 0));
    r.OnFree(a);
    r.IterationBegin();
  }
  // Two whole iterations without the shadow growing.
  EXPECT_EQ(r.verdict(), PlanReferee::Verdict::kConfirmed);
  EXPECT_EQ(shadow.live(), 0u);
  EXPECT_EQ(r.OnAllocate(kG, 0), PlanReferee::kNoShadow);
  EXPECT_FALSE(r.Judge(uint64_t{1} << 40, 0));
  EXPECT_STREQ(PlanReferee::Name(r.verdict()), "confirmed");
}

// Without iteration markers, kConfirmIterations times the plan's iteration
// of requests in a row without the shadow growing confirm the plan; a
// request that grows it starts the count again.
TEST(PlanRefereeTest, ARunWithoutMarkersIsConfirmedByItsRequests) {
  AllocatorShadow shadow = MakeShadow();
  PlanReferee r(shadow);
  constexpr uint64_t kIteration = 10;
  r.Start(0, 0, kIteration);
  // The same request and its free, over and over: the shadow holds 2 MiB.
  uint64_t served = 0;
  auto once = [&] {
    const uint64_t h = r.OnAllocate(kG, 0);
    ++served;
    if (h != PlanReferee::kNoShadow) r.OnFree(h);
  };
  for (int i = 0; i < 15; ++i) once();
  // A larger one grows the shadow: the count starts again.
  const uint64_t big = r.OnAllocate(8 * kG, 0);
  r.OnFree(big);
  for (uint64_t i = 0; i + 1 < PlanReferee::kConfirmIterations * kIteration;
       ++i) {
    once();
    ASSERT_TRUE(r.watching()) << i;
  }
  once();
  EXPECT_EQ(r.verdict(), PlanReferee::Verdict::kConfirmed);
  EXPECT_EQ(shadow.live(), 0u);
  EXPECT_EQ(r.dynamic_bytes(), uint64_t{8} * kG);
  // With markers, requests do not confirm: whole iterations do.
  r.Start(0, 0, kIteration);
  r.IterationBegin();
  for (int i = 0; i < 100; ++i) once();
  EXPECT_TRUE(r.watching());
}

}  // namespace
}  // namespace loom::vmm
