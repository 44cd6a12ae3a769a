#include "plan/solver/gap_index.h"

#include <gtest/gtest.h>

#include <random>

namespace loom::plan {
namespace {

std::vector<SlotSpan> Span(int32_t lo, int32_t hi) { return {{lo, hi}}; }

TEST(GapIndexTest, OccupiedIsTheUnionOverTheQueriedSlots) {
  GapIndex index(8);
  index.Insert(Span(0, 4), 0, 10);   // slots 0-3, bytes [0, 10)
  index.Insert(Span(2, 6), 10, 20);  // slots 2-5
  index.Insert(Span(5, 8), 40, 50);  // slots 5-7
  std::vector<AddressRange> out;
  index.Occupied(Span(0, 1), &out);
  EXPECT_EQ(out, (std::vector<AddressRange>{{0, 10}}));
  index.Occupied(Span(3, 4), &out);  // touching ranges coalesce
  EXPECT_EQ(out, (std::vector<AddressRange>{{0, 20}}));
  index.Occupied(Span(4, 6), &out);
  EXPECT_EQ(out, (std::vector<AddressRange>{{10, 20}, {40, 50}}));
  index.Occupied(Span(6, 8), &out);
  EXPECT_EQ(out, (std::vector<AddressRange>{{40, 50}}));
  // Two spans (a wrapped lifetime): the union of both.
  std::vector<SlotSpan> both = {{0, 1}, {7, 8}};
  index.Occupied(both, &out);
  EXPECT_EQ(out, (std::vector<AddressRange>{{0, 10}, {40, 50}}));
}

TEST(GapIndexTest, BestFitFirstFitAndLimit) {
  GapIndex index(4);
  // Over slots [0, 4): used [0,10) [14,20) [40,50): gaps [10,14) (4 bytes),
  // [20,40) (20 bytes), then the top at 50.
  index.Insert(Span(0, 4), 0, 10);
  index.Insert(Span(1, 3), 14, 20);
  index.Insert(Span(0, 2), 40, 50);
  const auto all = Span(0, 4);
  EXPECT_EQ(index.Find(all, 4, 1, FitRule::kBestFit), 10u);
  EXPECT_EQ(index.Find(all, 5, 1, FitRule::kBestFit), 20u);
  EXPECT_EQ(index.Find(all, 3, 1, FitRule::kFirstFit), 10u);
  EXPECT_EQ(index.Find(all, 21, 1, FitRule::kBestFit), 50u);
  // Alignment 8: [10,14) cannot host an aligned 4-byte block; [20,40) can
  // at 24.
  EXPECT_EQ(index.Find(all, 4, 8, FitRule::kBestFit), 24u);
  EXPECT_EQ(index.Find(all, 21, 64, FitRule::kBestFit), 64u);
  // Limit 45: the top is not allowed; a 21-byte block does not fit.
  EXPECT_EQ(index.Find(all, 21, 1, FitRule::kBestFit, 45), UINT64_MAX);
  EXPECT_EQ(index.Find(all, 20, 1, FitRule::kBestFit, 45), 20u);
  // Only slot 3 is queried: [40,50) is not live there.
  EXPECT_EQ(index.Find(Span(3, 4), 30, 1, FitRule::kBestFit), 10u);
}

// Random inserts and queries against a brute-force list of rectangles.
TEST(GapIndexTest, AgreesWithBruteForce) {
  std::mt19937_64 rng(7);
  for (int round = 0; round < 200; ++round) {
    const int32_t slots = 1 + static_cast<int32_t>(rng() % 40);
    GapIndex index(slots);
    struct Rect {
      int32_t lo, hi;
      uint64_t a, b;
    };
    std::vector<Rect> rects;
    for (int k = 0; k < 30; ++k) {
      const int32_t lo = static_cast<int32_t>(rng() % slots);
      const int32_t hi = lo + 1 + static_cast<int32_t>(rng() % (slots - lo));
      const uint64_t a = rng() % 200;
      const uint64_t b = a + 1 + rng() % 20;
      index.Insert(Span(lo, hi), a, b);
      rects.push_back({lo, hi, a, b});
      const int32_t qlo = static_cast<int32_t>(rng() % slots);
      const int32_t qhi = qlo + 1 + static_cast<int32_t>(rng() % (slots - qlo));
      std::vector<bool> used(260, false);
      for (const Rect& r : rects) {
        if (r.lo < qhi && qlo < r.hi) {
          for (uint64_t x = r.a; x < r.b; ++x) used[x] = true;
        }
      }
      std::vector<AddressRange> expected;
      for (uint64_t x = 0; x < used.size(); ++x) {
        if (!used[x]) continue;
        if (!expected.empty() && expected.back().hi == x) {
          ++expected.back().hi;
        } else {
          expected.push_back({x, x + 1});
        }
      }
      std::vector<AddressRange> got;
      index.Occupied(Span(qlo, qhi), &got);
      ASSERT_EQ(got, expected) << "round " << round << " insert " << k;
      // First fit of a random size is the lowest free run that fits.
      const uint64_t size = 1 + rng() % 10;
      uint64_t lowest = 0;
      for (uint64_t x = 0;; ++x) {
        bool free = true;
        for (uint64_t y = x; y < x + size && free; ++y) {
          free = y >= used.size() || !used[y];
        }
        if (free) {
          lowest = x;
          break;
        }
      }
      // Runs start right after a used byte (or at 0): first fit finds it.
      ASSERT_EQ(index.Find(Span(qlo, qhi), size, 1, FitRule::kFirstFit),
                lowest);
    }
  }
}

}  // namespace
}  // namespace loom::plan
