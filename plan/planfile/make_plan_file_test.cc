#include "plan/planfile/make_plan_file.h"

#include <gtest/gtest.h>

#include "plan/solver/testing/instances.h"
#include "plan/solver/verifier.h"

namespace loom::plan {
namespace {

Instance Readme() { return testing::ReadmeInstance(); }

PlannerOptions Quiet() {
  PlannerOptions options;
  options.time_limit_seconds = 20;
  options.progress = false;
  return options;
}

TEST(MakePlanFileTest, RoundTrips) {
  PlannerOptions options = Quiet();
  options.granule_bytes = 8;
  StatusOr<PlanResult> r = PlanInstance(Readme(), options);
  ASSERT_TRUE(r.ok());
  const std::vector<TimeWindow> windows = {{9, 21, "late"}};
  StatusOr<PlanFile> file =
      MakePlanFile(Readme(), *r, options, "readme.csv", windows);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ(file->region_size, 16u);  // 12 rounded up to 8-byte granules
  EXPECT_EQ(file->requested, "auto");
  EXPECT_EQ(file->fingerprint, InstanceFingerprint(Readme()));
  ASSERT_EQ(file->dynamic_spaces.size(), 1u);
  // In [9, 21) only b4 and b5 (8 bytes) are live: 8 of 16 bytes idle.
  EXPECT_EQ(file->dynamic_spaces[0].bytes(), 8u);
  StatusOr<PlanFile> back = DecodePlanFile(EncodePlanFile(*file), "x.plan");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, *file);
  EXPECT_TRUE(VerifyPlacement(PlanAsInstance(*back), PlanOffsets(*back),
                              {.capacity = back->region_size})
                  .valid());
  const std::vector<TimeWindow> bad = {{5, 2, "x"}};
  EXPECT_FALSE(MakePlanFile(Readme(), *r, options, "readme.csv", bad).ok());
}

}  // namespace
}  // namespace loom::plan
