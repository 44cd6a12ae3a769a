#include "plan/planning_problem.h"

#include <gtest/gtest.h>

#include "plan/planfile/request_table.h"

namespace loom::plan {
namespace {

// Set-up: weights w (live forever). Iterations 0..2, each: activation a
// (freed in backward), temporary t; iteration 0 also creates optimizer
// state s (live forever). Iteration markers everywhere.
Trace ThreeIterations() {
  Trace t;
  t.AddAlloc(1, 4096);  // w
  uint64_t id = 10;
  for (uint64_t it = 0; it < 3; ++it) {
    t.AddIterationBegin(it);
    uint64_t a = id++, tmp = id++;
    t.AddAlloc(a, 1 << 20);
    t.AddAlloc(tmp, 512);
    t.AddFree(tmp);
    if (it == 0) t.AddAlloc(2, 1 << 20);  // state s: same size as a!
    t.AddFree(a);
    t.AddIterationEnd(it);
  }
  return t;
}

TEST(PlanningProblemTest, SteadyIterationPrologueAndPersistentBuffers) {
  Trace trace = ThreeIterations();
  ASSERT_TRUE(ValidateTrace(trace).ok());
  Workload w = BuildWorkload(trace);
  WorkloadAnalysis analysis = AnalyzeWorkload(w);
  StatusOr<PlanningProblem> p = BuildPlanningProblem(w, analysis);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  ASSERT_GE(p->steady_iteration, 1);
  const RequestTable& r = p->requests;
  // The steady iteration: a and t, planned within the period.
  ASSERT_EQ(r.iteration.size(), 2u);
  EXPECT_EQ(r.iteration[0].size, 1u << 20);
  EXPECT_GE(r.iteration[0].buffer, 0);
  EXPECT_EQ(r.prologue_iterations, p->steady_iteration);
  // The prologue: w, then the early iterations. w and s are persistent
  // buffers spanning the period; the early a and t map to the steady a and t.
  const int64_t period = p->instance.period;
  const RequestRef& w_ref = r.prologue[0];
  ASSERT_GE(w_ref.buffer, 0);
  EXPECT_EQ(p->instance.buffers[w_ref.buffer].start, 0);
  EXPECT_EQ(p->instance.buffers[w_ref.buffer].end, period);
  // Iteration 0 (a, t, s): s has a's size but lives on: never a's slot.
  const RequestRef& a0 = r.prologue[1];
  const RequestRef& s0 = r.prologue[3];
  EXPECT_EQ(a0.buffer, r.iteration[0].buffer);
  ASSERT_GE(s0.buffer, 0);
  EXPECT_NE(s0.buffer, r.iteration[0].buffer);
  EXPECT_EQ(
      p->instance.buffers[s0.buffer].end - p->instance.buffers[s0.buffer].start,
      period);
  EXPECT_TRUE(ValidateInstance(p->instance).ok());
}

TEST(PlanningProblemTest, MarkerFreeTracesArePlannedWhole) {
  Trace t;
  for (uint64_t i = 0; i < 6; ++i) {
    t.AddAlloc(i, 1000 + i);
    t.AddFree(i);
  }
  Workload w = BuildWorkload(t);
  StatusOr<PlanningProblem> p = BuildPlanningProblem(w, AnalyzeWorkload(w));
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->steady_iteration, -1);
  EXPECT_TRUE(p->requests.prologue.empty());
  EXPECT_EQ(p->requests.iteration.size(), 6u);
  EXPECT_EQ(p->instance.period, 12);
}

TEST(PlanningProblemTest, DynamicModulesGiveWindowsNotRequests) {
  Trace t;
  t.AddIterationBegin(0);
  t.AddAlloc(1, 100);
  t.AddModuleEnter("moe", /*dynamic=*/true);
  t.AddAlloc(2, 5000);
  t.AddFree(2);
  t.AddModuleExit("moe");
  t.AddFree(1);
  t.AddIterationEnd(0);
  Workload w = BuildWorkload(t);
  PlanningProblemOptions options;
  options.scope = PlanScope::kIteration;
  StatusOr<PlanningProblem> p =
      BuildPlanningProblem(w, AnalyzeWorkload(w), options);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->requests.iteration.size(), 1u);
  ASSERT_EQ(p->windows.size(), 1u);
  // Keyed by module and the phase its requests open in.
  EXPECT_EQ(p->windows[0].name, "moe@forward");
  EXPECT_LT(p->windows[0].start, p->windows[0].end);
}

TEST(RequestTableTest, RoundTripAndBadPayloads) {
  PlanFile plan;
  plan.buffers = {{7, 0, 1024, 0, 5, 512}, {9, 1024, 512, 1, 3, 512}};
  RequestTable table;
  table.prologue_iterations = 1;
  table.prologue = {{1000, 7, 0, 5}, {64, -1, 0, 0}};
  table.iteration = {{500, 9, 1, 3}};
  plan.extra.push_back(EncodeRequestTable(table));
  StatusOr<std::optional<RequestTable>> back = DecodeRequestTable(plan, "p");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_TRUE(back->has_value());
  // Ids 7 and 9 come back as plan indices 0 and 1.
  EXPECT_EQ((*back)->prologue[0].buffer, 0);
  EXPECT_EQ((*back)->iteration[0].buffer, 1);
  EXPECT_EQ((*back)->prologue[1].buffer, -1);
  // Every truncation is an error, never a crash.
  std::string payload = plan.extra[0].payload;
  for (size_t n = 0; n < payload.size(); ++n) {
    plan.extra[0].payload = payload.substr(0, n);
    EXPECT_FALSE(DecodeRequestTable(plan, "p").ok()) << n;
  }
  // A request larger than its buffer.
  table.iteration = {{600, 9, 1, 3}};
  plan.extra[0] = EncodeRequestTable(table);
  EXPECT_FALSE(DecodeRequestTable(plan, "p").ok());
  // A buffer id that does not exist.
  table.iteration = {{500, 42, 1, 3}};
  plan.extra[0] = EncodeRequestTable(table);
  EXPECT_FALSE(DecodeRequestTable(plan, "p").ok());
  // No section at all: nullopt.
  plan.extra.clear();
  EXPECT_FALSE(DecodeRequestTable(plan, "p")->has_value());
}

}  // namespace
}  // namespace loom::plan
