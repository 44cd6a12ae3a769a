#include "plan/solver/layers.h"

#include <gtest/gtest.h>

#include <random>

#include "plan/solver/verifier.h"

namespace loom::plan {
namespace {

TEST(LayersTest, SameSizeRequestsShareTwoLayers) {
  // Algorithm 1: [0,2) and [2,4) share a layer, [1,3) and [3,5) the other.
  Instance inst;
  inst.buffers = {{0, 0, 2, 8}, {1, 1, 3, 8}, {2, 2, 4, 8}, {3, 3, 5, 8}};
  StatusOr<Problem> p = Problem::Make(inst);
  ASSERT_TRUE(p.ok());
  LayersStats stats;
  Placement pl = PlaceByLayers(*p, {}, &stats);
  EXPECT_EQ(pl.offsets, (std::vector<uint64_t>{0, 8, 0, 8}));
  EXPECT_EQ(pl.peak, 16u);
  EXPECT_EQ(stats.layers, 2u);
  EXPECT_EQ(stats.gap_placed, 0u);
  EXPECT_TRUE(VerifyPlacement(inst, pl.offsets).valid());
}

TEST(LayersTest, SmallerRequestsFillTheGapsOfLargerLayers) {
  // A 16-byte layer over [0,4) and [6,10); a 4-byte request in [4,6) fits
  // in its idle time under the current peak; another in [2,8) does not.
  Instance inst;
  inst.buffers = {{0, 0, 4, 16}, {1, 6, 10, 16}, {2, 4, 6, 4}, {3, 2, 8, 4}};
  StatusOr<Problem> p = Problem::Make(inst);
  ASSERT_TRUE(p.ok());
  LayersStats stats;
  Placement pl = PlaceByLayers(*p, {}, &stats);
  EXPECT_EQ(pl.offsets, (std::vector<uint64_t>{0, 0, 0, 16}));
  EXPECT_EQ(stats.gap_placed, 1u);
  EXPECT_EQ(stats.layers, 2u);
  EXPECT_TRUE(VerifyPlacement(inst, pl.offsets).valid());
}

TEST(LayersTest, PhaseGroupsAreFusedByTimeMemoryProduct) {
  // Group 0 is a stack a, b, c (TMP 0.8); group 1 holds d, e (TMP 0.75).
  // They overlap in [8, 10); fused, d sits on a and b, e in b's old place:
  // TMP 120 / (12 x 12) = 0.83, and 0.83^2 > 0.8 x 0.75.
  Instance inst;
  inst.buffers = {
      {0, 0, 10, 4}, {1, 1, 9, 4}, {2, 2, 8, 4}, {3, 8, 12, 4}, {4, 9, 11, 4}};
  StatusOr<Problem> p = Problem::Make(inst);
  ASSERT_TRUE(p.ok());
  const std::vector<uint32_t> group = {0, 0, 0, 1, 1};
  LayersStats stats;
  Placement pl = PlaceByLayers(*p, {.group = group}, &stats);
  EXPECT_EQ(stats.groups, 1u);
  EXPECT_EQ(stats.fusions, 1u);
  EXPECT_EQ(pl.offsets, (std::vector<uint64_t>{0, 4, 8, 8, 4}));
  EXPECT_EQ(pl.peak, 12u);
  EXPECT_TRUE(VerifyPlacement(inst, pl.offsets).valid());
  // A strict TMP threshold dissolves the group: the buffers are planned
  // one by one, still validly.
  stats = {};
  pl = PlaceByLayers(*p, {.group = group, .min_tmp = 0.9}, &stats);
  EXPECT_EQ(stats.groups, 0u);
  EXPECT_TRUE(VerifyPlacement(inst, pl.offsets).valid());
}

TEST(LayersTest, CyclicLayersRespectTheWrap) {
  // Period 10, size 8: [6,12) wraps to [0,2) and must not share a layer
  // with [1,4), but [2,5) can follow it.
  Instance inst;
  inst.period = 10;
  inst.buffers = {{0, 1, 4, 8}, {1, 6, 12, 8}, {2, 4, 6, 8}};
  StatusOr<Problem> p = Problem::Make(inst);
  ASSERT_TRUE(p.ok());
  LayersStats stats;
  Placement pl = PlaceByLayers(*p, {}, &stats);
  EXPECT_TRUE(VerifyPlacement(inst, pl.offsets).valid());
  EXPECT_EQ(pl.peak, 16u);
  EXPECT_NE(pl.offsets[0], pl.offsets[1]);
}

TEST(LayersTest, RandomInstancesWithGroupsAreValid) {
  std::mt19937_64 rng(5);
  for (int round = 0; round < 300; ++round) {
    Instance inst;
    inst.period = round % 2 ? 40 : 0;
    const int n = 1 + static_cast<int>(rng() % 50);
    std::vector<uint32_t> group;
    for (int i = 0; i < n; ++i) {
      Buffer b;
      b.id = i;
      b.start = static_cast<int64_t>(rng() % 40);
      b.end = b.start + 1 + static_cast<int64_t>(rng() % 20);
      b.size = 8 * (1 + rng() % 4);  // few distinct sizes: real layers
      b.alignment = uint64_t{1} << (rng() % 3);
      inst.buffers.push_back(b);
      group.push_back(rng() % 3 == 0 ? kNoGroup
                                     : static_cast<uint32_t>(rng() % 4));
    }
    StatusOr<Problem> p = Problem::Make(inst);
    ASSERT_TRUE(p.ok());
    for (bool grouped : {false, true}) {
      LayersOptions options;
      if (grouped) options.group = group;
      Placement pl = PlaceByLayers(*p, options);
      Verdict v = VerifyPlacement(inst, pl.offsets);
      ASSERT_TRUE(v.valid()) << "round " << round << ": " << v.message;
      EXPECT_EQ(v.peak_bytes, pl.peak);
    }
  }
}

}  // namespace
}  // namespace loom::plan
