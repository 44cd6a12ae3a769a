#include "whatif/loom/plan_source.h"

#include <gtest/gtest.h>

#include "whatif/workloads/load.h"

namespace loom::whatif {
namespace {

TEST(PlanSourceTest, Parses) {
  EXPECT_EQ(ParsePlanSource("self")->kind, PlanSource::Kind::kSelf);
  StatusOr<PlanSource> first = ParsePlanSource("first:2");
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->kind, PlanSource::Kind::kFirstIterations);
  EXPECT_EQ(first->iterations, 2);
  StatusOr<PlanSource> other = ParsePlanSource("builtin:moe:seed=2");
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->kind, PlanSource::Kind::kWorkload);
  EXPECT_EQ(other->spec, "builtin:moe:seed=2");
  for (const char* bad : {"", "first:0", "first:x", "first:-1"}) {
    EXPECT_FALSE(ParsePlanSource(bad).ok()) << bad;
  }
}

TEST(PlanSourceTest, DefaultsToTheFirstIterationsOfAMultiIterationInput) {
  EXPECT_EQ(DefaultPlanSource(0).kind, PlanSource::Kind::kSelf);
  EXPECT_EQ(DefaultPlanSource(1).kind, PlanSource::Kind::kSelf);
  EXPECT_EQ(DefaultPlanSource(2).iterations, 1);
  EXPECT_EQ(DefaultPlanSource(4).iterations, 3);
  EXPECT_EQ(DefaultPlanSource(40).iterations, 3);
  EXPECT_EQ(DescribePlanSource(DefaultPlanSource(1), false),
            "own trace (oracle)");
  EXPECT_TRUE(IsOracle(DefaultPlanSource(1), false));
  EXPECT_FALSE(IsOracle(DefaultPlanSource(1), true));
  EXPECT_EQ(DescribePlanSource(DefaultPlanSource(4), false),
            "first 3 iterations");
}

TEST(PlanSourceTest, FirstIterationsCutsBeforeTheNextIterationBegins) {
  StatusOr<Workload> w = LoadWorkload("builtin:dense:layers=2,iterations=4");
  ASSERT_TRUE(w.ok());
  ASSERT_EQ(CountIterations(w->trace), 4u);
  StatusOr<plan::Trace> first =
      PlanningTrace(*ParsePlanSource("first:2"), w->trace);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(CountIterations(*first), 2u);
  EXPECT_TRUE(plan::ValidateTrace(*first).ok());
  EXPECT_LT(first->events.size(), w->trace.events.size());
  // A prefix of the input, event for event.
  for (size_t i = 0; i < first->events.size(); ++i) {
    ASSERT_EQ(first->events[i], w->trace.events[i]) << i;
  }
  EXPECT_FALSE(PlanningTrace(*ParsePlanSource("first:4"), w->trace).ok());
  StatusOr<plan::Trace> other = PlanningTrace(
      *ParsePlanSource("builtin:dense:layers=2,seed=5"), w->trace);
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  EXPECT_NE(other->events.size(), 0u);
}

}  // namespace
}  // namespace loom::whatif
