#include "plan/solver/local_search.h"

#include <gtest/gtest.h>

#include "plan/solver/best_fit.h"
#include "plan/solver/lowest_first.h"
#include "plan/solver/minimalloc_csv.h"
#include "plan/solver/verifier.h"

namespace loom::plan {
namespace {

TEST(LocalSearchTest, ImprovesGreedyOnChallengingB) {
  StatusOr<CsvInstance> csv =
      ReadMinimallocCsv("bench/data/minimalloc/challenging/B.1048576.csv");
  ASSERT_TRUE(csv.ok());
  StatusOr<Problem> p = Problem::Make(csv->instance);
  ASSERT_TRUE(p.ok());
  std::vector<uint32_t> order = MakeOrder(*p, Order::kSize);
  const uint64_t greedy = PlaceInOrder(*p, order).peak;
  LocalSearchOptions options;
  options.max_steps = 400;
  LocalSearchResult r = ImproveOrder(*p, order, options, Deadline::In(60));
  EXPECT_EQ(r.steps, 400);
  EXPECT_LT(r.best.peak, greedy);
  EXPECT_GT(r.improvements, 0);
  EXPECT_TRUE(VerifyPlacement(csv->instance, r.best.offsets).valid());
  // The returned order reproduces the returned placement.
  EXPECT_EQ(PlaceInOrder(*p, r.order).offsets, r.best.offsets);
  // Deterministic for a seed and a number of steps.
  LocalSearchResult again = ImproveOrder(*p, order, options, Deadline::In(60));
  EXPECT_EQ(again.best.offsets, r.best.offsets);
}

TEST(LocalSearchTest, LowestFirstNeighbourhoodOnChallengingB) {
  StatusOr<CsvInstance> csv =
      ReadMinimallocCsv("bench/data/minimalloc/challenging/B.1048576.csv");
  ASSERT_TRUE(csv.ok());
  StatusOr<Problem> p = Problem::Make(csv->instance);
  ASSERT_TRUE(p.ok());
  const std::vector<uint32_t> rank = PreorderRanks(*p, "TAW");
  std::vector<uint32_t> order(rank.size());
  for (size_t i = 0; i < rank.size(); ++i) order[rank[i]] = i;
  const uint64_t greedy = PlaceLowestFirst(*p, rank)->peak;
  LocalSearchOptions options;
  options.max_steps = 300;
  LocalSearchResult r =
      ImproveLowestFirst(*p, order, options, Deadline::In(60));
  EXPECT_EQ(r.steps, 300);
  EXPECT_LT(r.best.peak, greedy);
  EXPECT_TRUE(VerifyPlacement(csv->instance, r.best.offsets).valid());
  // The returned order, as ranks, reproduces the returned placement.
  std::vector<uint32_t> again(r.order.size());
  for (size_t k = 0; k < r.order.size(); ++k) again[r.order[k]] = k;
  EXPECT_EQ(PlaceLowestFirst(*p, again)->offsets, r.best.offsets);
}

TEST(LocalSearchTest, StopsAtTheTargetAndTheDeadline) {
  Instance inst;
  inst.buffers = {
      {0, 0, 3, 4}, {1, 3, 9, 4}, {2, 0, 9, 4}, {3, 9, 21, 4}, {4, 0, 21, 4}};
  StatusOr<Problem> p = Problem::Make(inst);
  ASSERT_TRUE(p.ok());
  LocalSearchOptions options;
  options.target = 12;
  LocalSearchResult r =
      ImproveOrder(*p, MakeOrder(*p, Order::kSize), options, Deadline::In(60));
  EXPECT_EQ(r.steps, 0);  // best fit already reaches the target
  EXPECT_EQ(r.best.peak, 12u);
  options.target = 0;
  r = ImproveOrder(*p, MakeOrder(*p, Order::kSize), options, Deadline::In(0));
  EXPECT_EQ(r.steps, 0);
  EXPECT_EQ(r.best.peak, 12u);
}

}  // namespace
}  // namespace loom::plan
