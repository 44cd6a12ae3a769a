#include "vmm/free_blocks.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace loom::vmm {
namespace {

TEST(FreeBlocksTest, TakeSplitsAndGiveCoalesces) {
  FreeBlocks blocks(1000);
  blocks.Take(0, 100, 200);  // free: [0, 100), [300, 1000)
  EXPECT_EQ(blocks.CheckInvariants(1000, "test"), 800u);
  auto fit = blocks.FirstFitting(100);
  ASSERT_NE(fit, blocks.end());
  EXPECT_EQ(*fit, std::make_pair(uint64_t{100}, uint64_t{0}));  // best fit
  EXPECT_EQ(blocks.Last(), std::make_pair(uint64_t{300}, uint64_t{700}));
  EXPECT_EQ(blocks.FirstFitting(701), blocks.end());
  blocks.Give(100, 200, "test");  // merges both neighbours
  EXPECT_EQ(blocks.CheckInvariants(1000, "test"), 1000u);
  EXPECT_EQ(blocks.Last(), std::make_pair(uint64_t{0}, uint64_t{1000}));
}

TEST(FreeBlocksTest, GivingAFreeRangeIsABrokenInvariant) {
  FreeBlocks blocks(1000);
  blocks.Take(0, 0, 100);
  EXPECT_DEATH(blocks.Give(50, 100, "test"), "overlapping a free block");
}

TEST(FreeBlocksTest, SeededRandomTakesAndGivesKeepTheBytes) {
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    std::mt19937_64 rng(seed);
    const uint64_t space = 1 << 20;
    FreeBlocks blocks(space);
    std::vector<std::pair<uint64_t, uint64_t>> live;
    uint64_t live_bytes = 0;
    for (int step = 0; step < 400; ++step) {
      if (live.empty() || rng() % 3 != 0) {
        const uint64_t size = 1 + rng() % 4096;
        auto fit = blocks.FirstFitting(size);
        if (fit == blocks.end()) continue;
        const uint64_t offset = fit->second;
        blocks.Take(offset, offset, size);
        live.emplace_back(offset, size);
        live_bytes += size;
      } else {
        const size_t k = rng() % live.size();
        blocks.Give(live[k].first, live[k].second, "test");
        live_bytes -= live[k].second;
        live[k] = live.back();
        live.pop_back();
      }
      ASSERT_EQ(blocks.CheckInvariants(space, "test") + live_bytes, space)
          << "seed " << seed << " step " << step;
    }
  }
}

}  // namespace
}  // namespace loom::vmm
