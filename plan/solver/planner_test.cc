#include "plan/solver/planner.h"

#include <gtest/gtest.h>

#include <random>

#include "plan/solver/layers.h"
#include "plan/solver/minimalloc_csv.h"
#include "plan/solver/verifier.h"
#include "plan/solver/testing/instances.h"

namespace loom::plan {
namespace {

Instance Readme() { return testing::ReadmeInstance(); }

Instance GapInstance() { return testing::GapInstance(); }

PlannerOptions Quiet(double seconds = 20) {
  PlannerOptions options;
  options.time_limit_seconds = seconds;
  options.progress = false;
  return options;
}

TEST(PlannerTest, ReadmeIsOptimal) {
  StatusOr<PlanResult> r = PlanInstance(Readme(), Quiet());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->peak_bytes, 12u);
  EXPECT_EQ(r->lower_bound_bytes, 12u);
  EXPECT_TRUE(r->optimal);
  EXPECT_TRUE(r->fits);
  EXPECT_EQ(r->algorithm, "layers");  // the first run already is
  EXPECT_EQ(r->sizes, (std::vector<uint64_t>{4, 4, 4, 4, 4}));
  EXPECT_EQ(r->peak_granules, 1u);  // 12 bytes in one 2 MiB granule
  EXPECT_TRUE(VerifyPlacement(Readme(), r->offsets, {.capacity = 12}).valid());
}

TEST(PlannerTest, MinimallocReadmeFileFitsInTwelve) {
  StatusOr<CsvInstance> csv =
      ReadMinimallocCsv("bench/data/minimalloc/examples/input.12.csv");
  ASSERT_TRUE(csv.ok()) << csv.status().ToString();
  for (Algorithm a :
       {Algorithm::kAuto, Algorithm::kBestFit, Algorithm::kLowestFirst,
        Algorithm::kLayers, Algorithm::kExact, Algorithm::kLocalSearch}) {
    PlannerOptions options = Quiet(5);
    options.algorithm = a;
    options.capacity = 12;
    StatusOr<PlanResult> r = PlanInstance(csv->instance, options);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->peak_bytes, 12u) << AlgorithmName(a);
    EXPECT_TRUE(r->fits);
    EXPECT_TRUE(
        VerifyPlacement(csv->instance, r->offsets, {.capacity = 12}).valid());
  }
}

TEST(PlannerTest, MinimisesBeyondTheLowerBoundAndProvesIt) {
  StatusOr<PlanResult> r = PlanInstance(GapInstance(), Quiet());
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->lower_bound_bytes, 6u);
  EXPECT_EQ(r->peak_bytes, 7u);
  EXPECT_TRUE(r->optimal);  // the exact search proved 6 is not enough
  EXPECT_TRUE(VerifyPlacement(GapInstance(), r->offsets).valid());
}

TEST(PlannerTest, CapacityMode) {
  PlannerOptions options = Quiet();
  options.capacity = 6;
  StatusOr<PlanResult> r = PlanInstance(GapInstance(), options);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->fits);
  EXPECT_TRUE(r->capacity_infeasible);
  EXPECT_EQ(r->peak_bytes, 7u);  // the best plan is still returned
  options.capacity = 11;
  r = PlanInstance(Readme(), options);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->fits);
  EXPECT_TRUE(r->capacity_infeasible);  // below the lower bound
  options.capacity = 7;
  options.minimize = false;
  r = PlanInstance(GapInstance(), options);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->fits);
  EXPECT_LE(r->peak_bytes, 7u);
}

TEST(PlannerTest, ChallengingCReachesItsLowerBound) {
  StatusOr<CsvInstance> csv =
      ReadMinimallocCsv("bench/data/minimalloc/challenging/C.1048576.csv");
  ASSERT_TRUE(csv.ok());
  PlannerOptions options = Quiet(60);
  options.capacity = 1048576;
  StatusOr<PlanResult> r = PlanInstance(csv->instance, options);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->peak_bytes, 1039360u);
  EXPECT_TRUE(r->optimal);
  EXPECT_TRUE(r->fits);
  EXPECT_EQ(r->algorithm.rfind("exact@", 0), 0u) << r->algorithm;
}

TEST(PlannerTest, RoundingAndAlignment) {
  PlannerOptions options = Quiet();
  options.size_round = 512;
  options.min_alignment = 1024;
  StatusOr<PlanResult> r = PlanInstance(Readme(), options);
  ASSERT_TRUE(r.ok());
  // Five 512-byte reservations at 1024-byte aligned offsets: three levels.
  EXPECT_EQ(r->sizes[0], 512u);
  EXPECT_EQ(r->lower_bound_bytes, 1536u);
  EXPECT_EQ(r->peak_bytes, 2560u);
  for (uint64_t offset : r->offsets) EXPECT_EQ(offset % 1024, 0u);
  EXPECT_TRUE(r->optimal);  // 2048 is proved infeasible
  EXPECT_TRUE(VerifyPlacement(Readme(), r->offsets,
                              {.size_round = 512, .min_alignment = 1024})
                  .valid());
}

TEST(PlannerTest, EveryAlgorithmGivesValidCyclicPlans) {
  std::mt19937_64 rng(17);
  for (int round = 0; round < 6; ++round) {
    Instance inst;
    inst.period = 60;
    std::vector<uint32_t> group;
    for (int i = 0; i < 60; ++i) {
      Buffer b;
      b.id = i;
      b.start = static_cast<int64_t>(rng() % 60);
      b.end = b.start + 1 + static_cast<int64_t>(rng() % 40);
      b.size = 64 * (1 + rng() % 5);
      inst.buffers.push_back(b);
      group.push_back(static_cast<uint32_t>(rng() % 6));
    }
    for (Algorithm a :
         {Algorithm::kAuto, Algorithm::kBestFit, Algorithm::kLowestFirst,
          Algorithm::kLayers, Algorithm::kExact, Algorithm::kLocalSearch}) {
      PlannerOptions options = Quiet(0.2);
      options.algorithm = a;
      options.group = group;
      StatusOr<PlanResult> r = PlanInstance(inst, options);
      ASSERT_TRUE(r.ok()) << AlgorithmName(a) << ": " << r.status().ToString();
      Verdict v = VerifyPlacement(inst, r->offsets);
      ASSERT_TRUE(v.valid()) << AlgorithmName(a) << ": " << v.message;
      EXPECT_EQ(v.peak_bytes, r->peak_bytes);
      EXPECT_GE(r->peak_bytes, r->lower_bound_bytes);
      EXPECT_FALSE(r->attempts.empty());
    }
  }
}

TEST(PlannerTest, BadOptions) {
  PlannerOptions options = Quiet();
  options.time_limit_seconds = 0;
  EXPECT_EQ(PlanInstance(Readme(), options).status().message(),
            "time limit 0 s must be positive");
  options = Quiet();
  options.group = {1, 2};
  EXPECT_EQ(PlanInstance(Readme(), options).status().message(),
            "2 group keys for 5 buffers");
  options = Quiet();
  options.min_alignment = 3;
  EXPECT_FALSE(PlanInstance(Readme(), options).ok());
  EXPECT_EQ(ParseAlgorithm("layers").value(), Algorithm::kLayers);
  EXPECT_FALSE(ParseAlgorithm("magic").ok());
}

TEST(PlannerTest, EmptyInstance) {
  StatusOr<PlanResult> r = PlanInstance(Instance{}, Quiet());
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->peak_bytes, 0u);
  EXPECT_TRUE(r->optimal);
}

}  // namespace
}  // namespace loom::plan
