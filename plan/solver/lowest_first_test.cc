#include "plan/solver/lowest_first.h"

#include <gtest/gtest.h>

#include <random>

#include "plan/solver/verifier.h"
#include "plan/solver/testing/instances.h"

namespace loom::plan {
namespace {

Instance Readme() { return testing::ReadmeInstance(); }

TEST(LowestFirstTest, PreorderRanks) {
  StatusOr<Problem> p = Problem::Make(Readme());
  ASSERT_TRUE(p.ok());
  // T: 12 for all but buffer 3 (8); A: 12, 24, 36, 48, 84.
  EXPECT_EQ(PreorderRanks(*p, "TAW"), (std::vector<uint32_t>{3, 2, 1, 4, 0}));
  EXPECT_EQ(PreorderRanks(*p, "AWT"), (std::vector<uint32_t>{4, 3, 2, 1, 0}));
  EXPECT_EQ(PreorderRanks(*p, "S"), (std::vector<uint32_t>{0, 3, 1, 4, 2}));
}

TEST(LowestFirstTest, ReadmeIsPackedTight) {
  StatusOr<Problem> p = Problem::Make(Readme());
  ASSERT_TRUE(p.ok());
  // b5 (rank 0) at 0; b3 at 4; b4 fits at 4 after b3 ends; b2 and b1 at 8.
  std::optional<Placement> pl = PlaceLowestFirst(*p, PreorderRanks(*p, "TAW"));
  ASSERT_TRUE(pl.has_value());
  EXPECT_EQ(pl->offsets, (std::vector<uint64_t>{8, 8, 4, 4, 0}));
  EXPECT_EQ(pl->peak, 12u);
}

TEST(LowestFirstTest, DeadlineStopsIt) {
  // 200,000 buffers all live together: the expired deadline is noticed.
  Instance inst;
  for (uint64_t i = 0; i < 200000; ++i) inst.buffers.push_back({i, 0, 10, 1});
  StatusOr<Problem> p = Problem::Make(inst);
  ASSERT_TRUE(p.ok());
  EXPECT_FALSE(PlaceLowestFirst(*p, PreorderRanks(*p, "Z"), Deadline::In(0))
                   .has_value());
}

// Random instances, cyclic or not, with alignments: always valid.
TEST(LowestFirstTest, RandomInstancesAreValid) {
  std::mt19937_64 rng(11);
  for (int round = 0; round < 300; ++round) {
    Instance inst;
    inst.period = round % 2 ? 50 : 0;
    const int n = 1 + static_cast<int>(rng() % 40);
    for (int i = 0; i < n; ++i) {
      Buffer b;
      b.id = i;
      b.start = static_cast<int64_t>(rng() % 50);
      b.end = b.start + 1 + static_cast<int64_t>(rng() % 30);
      b.size = 1 + rng() % 100;
      b.alignment = uint64_t{1} << (rng() % 4);
      inst.buffers.push_back(b);
    }
    StatusOr<Problem> p = Problem::Make(inst, 1 + rng() % 3);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    for (const char* keys : {"TAW", "AWT", "TWA", "Z"}) {
      std::optional<Placement> pl =
          PlaceLowestFirst(*p, PreorderRanks(*p, keys));
      ASSERT_TRUE(pl.has_value());
      EXPECT_GE(pl->peak, p->lower_bound());
      Instance reserved = inst;
      for (size_t i = 0; i < inst.buffers.size(); ++i) {
        reserved.buffers[i].size = p->size(i);
      }
      Verdict v = VerifyPlacement(reserved, pl->offsets);
      ASSERT_TRUE(v.valid()) << "round " << round << ": " << v.message;
      EXPECT_EQ(v.peak_bytes, pl->peak);
    }
  }
}

}  // namespace
}  // namespace loom::plan
