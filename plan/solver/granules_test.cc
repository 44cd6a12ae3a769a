#include "plan/solver/granules.h"

#include <gtest/gtest.h>

#include <random>

namespace loom::plan {
namespace {

TEST(GranulesTest, PeakGranulesCountsTouchedGranules) {
  // Granule 10 bytes. t in [0,4): a [0,5) and b [25,40): granules {0} and
  // {2,3} -> 3. t in [4,8): c [8,12) touches {0,1}; with b -> 4.
  Instance inst;
  inst.buffers = {{0, 0, 4, 5}, {1, 0, 8, 15}, {2, 4, 8, 4}};
  const std::vector<uint64_t> offsets = {0, 25, 8};
  EXPECT_EQ(PeakGranules(inst, offsets, 10), 4u);
  // One granule holds everything at granule 64.
  EXPECT_EQ(PeakGranules(inst, offsets, 64), 1u);
  // Byte granules: the peak of live bytes, 20 (a and b).
  EXPECT_EQ(PeakGranules(inst, offsets, 1), 20u);
}

TEST(GranulesTest, PeakGranulesHonoursTheWrap) {
  // Period 10: a lives [8,10) and [0,2) at granule 0; b [1,5) at granule 1.
  Instance inst;
  inst.period = 10;
  inst.buffers = {{0, 8, 12, 4}, {1, 1, 5, 4}};
  EXPECT_EQ(PeakGranules(inst, std::vector<uint64_t>{0, 4}, 4), 2u);
  inst.period = 0;
  EXPECT_EQ(PeakGranules(inst, std::vector<uint64_t>{0, 4}, 4), 1u);
}

TEST(GranulesTest, DynamicReusableSpace) {
  // Region 64, granule 16. a [0,16) t[0,10); b [16,24) t[0,3); c [40,48)
  // t[6,9).
  Instance inst;
  inst.buffers = {{0, 0, 10, 16}, {1, 0, 3, 8}, {2, 6, 9, 8}};
  const std::vector<uint64_t> offsets = {0, 16, 40};
  const std::vector<TimeWindow> windows = {{3, 6}, {2, 7}, {10, 20}};
  StatusOr<std::vector<ReusableSpace>> spaces =
      DynamicReusableSpace(inst, offsets, 64, windows, 16);
  ASSERT_TRUE(spaces.ok()) << spaces.status().ToString();
  ASSERT_EQ(spaces->size(), 3u);
  // [3,6): only a is live -> [16, 64) idle, granules [16, 64).
  EXPECT_EQ((*spaces)[0].ranges, (std::vector<AddressRange>{{16, 64}}));
  EXPECT_EQ((*spaces)[0].granules, (std::vector<AddressRange>{{16, 64}}));
  EXPECT_EQ((*spaces)[0].bytes(), 48u);
  EXPECT_EQ((*spaces)[0].granule_count(16), 3u);
  // [2,7): a, b and c all meet it -> [24,40) and [48,64) idle; whole
  // granules [32,40)? no: [32,48) is cut by c, so only [48,64).
  EXPECT_EQ((*spaces)[1].ranges,
            (std::vector<AddressRange>{{24, 40}, {48, 64}}));
  EXPECT_EQ((*spaces)[1].granules, (std::vector<AddressRange>{{48, 64}}));
  // [10,20): nothing is live.
  EXPECT_EQ((*spaces)[2].ranges, (std::vector<AddressRange>{{0, 64}}));
}

TEST(GranulesTest, CyclicWindowsWrap) {
  // Period 10: window [8, 12) covers [8,10) and [0,2); a lives [1,3).
  Instance inst;
  inst.period = 10;
  inst.buffers = {{0, 1, 3, 8}, {1, 4, 6, 8}};
  const std::vector<TimeWindow> windows = {{8, 12}};
  StatusOr<std::vector<ReusableSpace>> spaces =
      DynamicReusableSpace(inst, std::vector<uint64_t>{0, 8}, 16, windows, 8);
  ASSERT_TRUE(spaces.ok());
  EXPECT_EQ((*spaces)[0].ranges, (std::vector<AddressRange>{{8, 16}}));
  const std::vector<TimeWindow> bad = {{5, 5}};
  EXPECT_EQ(DynamicReusableSpace(inst, std::vector<uint64_t>{0, 8}, 16, bad, 8)
                .status()
                .message(),
            "window 0: [5, 5) is empty or negative");
  const std::vector<TimeWindow> long_window = {{5, 16}};
  EXPECT_EQ(
      DynamicReusableSpace(inst, std::vector<uint64_t>{0, 8}, 16, long_window,
                           8)
          .status()
          .message(),
      "window 0: [5, 16) must start inside the period 10 and last at most one "
      "period");
}

// Random plans: every idle range really is idle during the whole window.
TEST(GranulesTest, ReusableSpaceAgreesWithBruteForce) {
  std::mt19937_64 rng(9);
  for (int round = 0; round < 300; ++round) {
    Instance inst;
    inst.period = round % 2 ? 30 : 0;
    std::vector<uint64_t> offsets;
    for (int i = 0; i < 12; ++i) {
      Buffer b;
      b.id = i;
      b.start = static_cast<int64_t>(rng() % 30);
      b.end = b.start + 1 + static_cast<int64_t>(rng() % 15);
      b.size = 1 + rng() % 10;
      inst.buffers.push_back(b);
      offsets.push_back(rng() % 90);
    }
    const int64_t ws = static_cast<int64_t>(rng() % 30);
    const std::vector<TimeWindow> windows = {
        {ws, ws + 1 + static_cast<int64_t>(rng() % 20)}};
    StatusOr<std::vector<ReusableSpace>> spaces =
        DynamicReusableSpace(inst, offsets, 100, windows, 8);
    ASSERT_TRUE(spaces.ok());
    std::vector<bool> busy(100, false);
    Buffer window{99, windows[0].start, windows[0].end, 1};
    for (size_t i = 0; i < inst.buffers.size(); ++i) {
      if (!Conflict(inst.buffers[i], window, inst.period)) continue;
      for (uint64_t x = offsets[i]; x < offsets[i] + inst.buffers[i].size; ++x)
        busy[x] = true;
    }
    std::vector<AddressRange> expected;
    for (uint64_t x = 0; x < 100; ++x) {
      if (busy[x]) continue;
      if (!expected.empty() && expected.back().hi == x) {
        ++expected.back().hi;
      } else {
        expected.push_back({x, x + 1});
      }
    }
    ASSERT_EQ((*spaces)[0].ranges, expected) << "round " << round;
  }
}

}  // namespace
}  // namespace loom::plan
