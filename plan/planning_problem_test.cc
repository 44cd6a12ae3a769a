#include "plan/planning_problem.h"

#include <gtest/gtest.h>

#include <random>
#include <string>

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

TEST(PlanningProblemTest, ASetUpHoldingAnUnmarkedIterationIsReported) {
  // A loop marked only at its iterations' ends (loom.step()): iteration 0
  // comes before the first marker, in the set-up.
  auto trace = [](bool first_marked) {
    Trace t;
    t.AddAlloc(1, 4096);  // w
    uint64_t id = 10;
    for (uint64_t it = 0; it < 4; ++it) {
      if (it > 0 || first_marked) t.AddIterationBegin(it);
      uint64_t a = id++, b = id++, tmp = id++;
      t.AddAlloc(a, 1 << 20);
      t.AddAlloc(b, 3 << 20);
      t.AddAlloc(tmp, 512);
      t.AddFree(tmp);
      t.AddFree(b);
      t.AddFree(a);
      if (it > 0 || first_marked) t.AddIterationEnd(it);
    }
    return t;
  };
  StatusOr<PlanningProblem> unmarked = BuildPlanningProblem(trace(false));
  ASSERT_TRUE(unmarked.ok()) << unmarked.status().ToString();
  EXPECT_EQ(unmarked->setup_aligned, 3u);
  EXPECT_NE(unmarked->note.find("the set-up holds an iteration no marker "
                                "began (3 of its requests line up with the "
                                "steady iteration's 3)"),
            std::string::npos)
      << unmarked->note;
  StatusOr<PlanningProblem> marked = BuildPlanningProblem(trace(true));
  ASSERT_TRUE(marked.ok()) << marked.status().ToString();
  EXPECT_EQ(marked->setup_aligned, 0u);  // the set-up is the weights only
  EXPECT_EQ(marked->note.find("no marker"), std::string::npos) << marked->note;
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

// A recorder's trace names every module; the run time sees only the markers
// of modules marked dynamic, so a window is named after the innermost of
// those, not after a plain submodule (an MoE block's router) inside it.
TEST(PlanningProblemTest, WindowsAreNamedAfterTheInnermostDynamicModule) {
  Trace t;
  t.AddIterationBegin(0);
  t.AddAlloc(1, 100);
  t.AddModuleEnter("mlp", /*dynamic=*/true);
  t.AddModuleEnter("mlp.gate", /*dynamic=*/false);
  t.AddAlloc(2, 5000);
  t.AddModuleExit("mlp.gate");
  t.AddModuleEnter("mlp.experts", /*dynamic=*/true);
  t.AddModuleEnter("mlp.experts.act_fn", /*dynamic=*/false);
  t.AddAlloc(3, 7000);
  t.AddModuleExit("mlp.experts.act_fn");
  t.AddModuleExit("mlp.experts");
  t.AddFree(2);
  t.AddFree(3);
  t.AddModuleExit("mlp");
  t.AddFree(1);
  t.AddIterationEnd(0);
  Workload w = BuildWorkload(t);
  ASSERT_EQ(w.allocations.size(), 3u);
  EXPECT_EQ(w.allocations[0].alloc_dynamic_module, kNone);
  EXPECT_EQ(w.names[w.allocations[1].alloc_dynamic_module], "mlp");
  EXPECT_EQ(w.names[w.allocations[2].alloc_dynamic_module], "mlp.experts");
  PlanningProblemOptions options;
  options.scope = PlanScope::kIteration;
  StatusOr<PlanningProblem> p =
      BuildPlanningProblem(w, AnalyzeWorkload(w), options);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  ASSERT_EQ(p->windows.size(), 2u);
  EXPECT_EQ(p->windows[0].name, "mlp.experts@forward");
  EXPECT_EQ(p->windows[1].name, "mlp@forward");
}

// Four iterations of three dynamic windows: "same" always makes 1000 and
// 2000 bytes; "vary" makes 1000 or 1060 then 2000 (3% of its bytes vary);
// "wild" swaps 100 and 5000 (an expert's share of the routing). Iteration
// 0 also makes state inside "vary" (never freed: a module left open).
Trace DynamicWindows() {
  Trace t;
  uint64_t id = 1;
  t.AddAlloc(id++, 4096);  // weights
  for (uint64_t it = 0; it < 4; ++it) {
    t.AddIterationBegin(it);
    t.AddPhase("forward");
    const uint64_t act = id++;
    t.AddAlloc(act, 8192);
    auto window = [&](const char* name, std::vector<uint64_t> sizes,
                      bool state = false) {
      t.AddModuleEnter(name, /*dynamic=*/true);
      if (state) t.AddAlloc(1000000, 3000);  // never freed
      std::vector<uint64_t> ids;
      for (uint64_t size : sizes) {
        ids.push_back(id);
        t.AddAlloc(id++, size);
      }
      for (uint64_t i : ids) t.AddFree(i);
      t.AddModuleExit(name);
    };
    window("same", {1000, 2000});
    window("vary", {it == 1 ? 1060u : 1000u, 2000}, /*state=*/it == 0);
    window("wild", {it % 2 == 0 ? 100u : 5000u, it % 2 == 0 ? 5000u : 100u});
    t.AddFree(act);
    t.AddIterationEnd(it);
  }
  return t;
}

TEST(PlanningProblemTest, DynamicRequestsWhoseSizesVaryALittleGetSlots) {
  Trace trace = DynamicWindows();
  ASSERT_TRUE(ValidateTrace(trace).ok());
  Workload w = BuildWorkload(trace);
  PlanningProblemOptions options;
  options.scope = PlanScope::kIteration;
  options.steady_iteration = 3;
  StatusOr<PlanningProblem> p =
      BuildPlanningProblem(w, AnalyzeWorkload(w), options);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  const std::vector<DynamicSequence>& dynamic = p->requests.dynamic;
  // "same" never varies (the dynamic space reuses its blocks exactly) and
  // "wild" varies by far more than an eighth of its bytes: no slot.
  ASSERT_EQ(dynamic.size(), 1u);
  const DynamicSequence& vary = dynamic[0];
  EXPECT_EQ(vary.window, "vary@forward");
  // Sizes that varied a little: the largest recorded at each position.
  ASSERT_EQ(vary.steady.requests.size(), 2u);
  EXPECT_EQ(vary.steady.requests[0].size, 1060u);
  ASSERT_GE(vary.steady.requests[0].buffer, 0);
  EXPECT_EQ(p->instance.buffers[vary.steady.requests[0].buffer].size, 1060u);
  EXPECT_EQ(vary.steady.requests[1].size, 2000u);
  // The early iterations: iteration 0's state is a persistent buffer, its
  // other requests sit in the steady slots; iteration 1's 1060 bytes fit
  // the slot (the largest) with their own size.
  ASSERT_EQ(vary.early.size(), 3u);
  ASSERT_EQ(vary.early[0].requests.size(), 3u);
  const RequestRef& state = vary.early[0].requests[0];
  ASSERT_GE(state.buffer, 0);
  EXPECT_EQ(state.start, 0);
  EXPECT_EQ(state.end, p->instance.period);
  EXPECT_EQ(vary.early[0].requests[1].buffer, vary.steady.requests[0].buffer);
  EXPECT_EQ(vary.early[0].requests[1].size, 1000u);
  EXPECT_EQ(vary.early[0].requests[2].buffer, vary.steady.requests[1].buffer);
  EXPECT_EQ(vary.early[1].requests[0].buffer, vary.steady.requests[0].buffer);
  EXPECT_EQ(vary.early[1].requests[0].size, 1060u);
  EXPECT_TRUE(ValidateInstance(p->instance).ok());
  // Without plan_dynamic: windows only.
  options.plan_dynamic = false;
  StatusOr<PlanningProblem> bare =
      BuildPlanningProblem(w, AnalyzeWorkload(w), options);
  ASSERT_TRUE(bare.ok());
  EXPECT_TRUE(bare->requests.dynamic.empty());
  EXPECT_EQ(bare->windows.size(), 3u);
}

// A window whose module runs twice per iteration (two micro-batches), its
// sizes varying a little; in iteration 1 the first call makes one request
// fewer (an expert without tokens).
TEST(PlanningProblemTest, EarlyIterationsLineUpCallByCall) {
  Trace t;
  uint64_t id = 1;
  for (uint64_t it = 0; it < 3; ++it) {
    t.AddIterationBegin(it);
    t.AddPhase("forward");
    for (int call = 0; call < 2; ++call) {
      t.AddModuleEnter("moe", true);
      std::vector<uint64_t> sizes = {1020u - 10 * it, 2000};
      if (it == 1 && call == 0) sizes = {1010};
      std::vector<uint64_t> ids;
      for (uint64_t size : sizes) {
        ids.push_back(id);
        t.AddAlloc(id++, size);
      }
      for (uint64_t i : ids) t.AddFree(i);
      t.AddModuleExit("moe");
    }
    t.AddAlloc(id, 64);  // something outside the window to plan
    t.AddFree(id++);
    t.AddIterationEnd(it);
  }
  Workload w = BuildWorkload(t);
  PlanningProblemOptions options;
  options.scope = PlanScope::kIteration;
  options.steady_iteration = 2;
  StatusOr<PlanningProblem> p =
      BuildPlanningProblem(w, AnalyzeWorkload(w), options);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  ASSERT_EQ(p->requests.dynamic.size(), 1u);
  const DynamicSequence& moe = p->requests.dynamic[0];
  ASSERT_EQ(moe.steady.requests.size(), 4u);
  EXPECT_EQ(moe.steady.calls, (std::vector<uint32_t>{1, 1, 2, 2}));
  ASSERT_EQ(moe.early.size(), 2u);
  // Iteration 1: call 1 made one request of two: no slot for it; call 2
  // lines up with k's call 2.
  ASSERT_EQ(moe.early[1].requests.size(), 3u);
  EXPECT_EQ(moe.early[1].calls, (std::vector<uint32_t>{1, 2, 2}));
  EXPECT_EQ(moe.early[1].requests[0].buffer, -1);
  EXPECT_EQ(moe.early[1].requests[1].buffer, moe.steady.requests[2].buffer);
  EXPECT_EQ(moe.early[1].requests[2].buffer, moe.steady.requests[3].buffer);
  // Iteration 0 lines up whole.
  EXPECT_EQ(moe.early[0].requests[0].buffer, moe.steady.requests[0].buffer);
}

TEST(RequestTableTest, RoundTripAndBadPayloads) {
  PlanFile plan;
  plan.buffers = {{7, 0, 1024, 0, 5, 512}, {9, 1024, 512, 1, 3, 512}};
  RequestTable table;
  table.prologue_iterations = 1;
  table.prologue = {{1000, 7, 0, 5}, {64, -1, 0, 0}};
  table.iteration = {{500, 9, 1, 3}};
  plan.extra = EncodeRequestTable(table);
  ASSERT_EQ(plan.extra.size(), 1u);  // no dynamic sequences: no DREQ
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
  plan.extra = EncodeRequestTable(table);
  EXPECT_FALSE(DecodeRequestTable(plan, "p").ok());
  // A buffer id that does not exist.
  table.iteration = {{500, 42, 1, 3}};
  plan.extra = EncodeRequestTable(table);
  EXPECT_FALSE(DecodeRequestTable(plan, "p").ok());
  // No section at all: nullopt.
  plan.extra.clear();
  EXPECT_FALSE(DecodeRequestTable(plan, "p")->has_value());
}

TEST(RequestTableTest, DynamicSequencesRoundTripAndBadPayloads) {
  PlanFile plan;
  plan.buffers = {{7, 0, 1024, 0, 5, 512}, {9, 1024, 4096, 1, 3, 512}};
  RequestTable table;
  table.iteration = {{1000, 7, 0, 5}};
  table.prologue_iterations = 1;
  table.dynamic = {{"a@forward",
                    {{{4000, 9, 1, 3}, {77, -1, 2, 3}}, {1, 2}},
                    {{{{10, 9, 1, 3}}, {2}}}},
                   {"b@backward", {}, {}}};
  plan.extra = EncodeRequestTable(table);
  ASSERT_EQ(plan.extra.size(), 2u);
  EXPECT_EQ(plan.extra[1].tag, kDynamicRequestsTag);
  EXPECT_FALSE(plan.extra[1].required);  // older readers skip it
  StatusOr<std::optional<RequestTable>> back = DecodeRequestTable(plan, "p");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_EQ((*back)->dynamic.size(), 2u);
  EXPECT_EQ((*back)->dynamic[0].window, "a@forward");
  ASSERT_EQ((*back)->dynamic[0].steady.requests.size(), 2u);
  EXPECT_EQ((*back)->dynamic[0].steady.requests[0].buffer, 1);  // id 9: index 1
  EXPECT_EQ((*back)->dynamic[0].steady.requests[0].size, 4000u);
  EXPECT_EQ((*back)->dynamic[0].steady.requests[1].buffer, -1);
  EXPECT_TRUE((*back)->dynamic[1].steady.requests.empty());
  ASSERT_EQ((*back)->dynamic[0].early.size(), 1u);
  EXPECT_EQ((*back)->dynamic[0].early[0].requests[0].buffer, 1);
  EXPECT_EQ((*back)->dynamic[0].steady.calls, (std::vector<uint32_t>{1, 2}));
  EXPECT_EQ((*back)->dynamic[0].early[0].calls, (std::vector<uint32_t>{2}));
  // More early iterations than the plan has.
  RequestTable early = table;
  early.dynamic[0].early.push_back({});
  plan.extra = EncodeRequestTable(early);
  EXPECT_FALSE(DecodeRequestTable(plan, "p").ok());
  plan.extra = EncodeRequestTable(table);
  // Every truncation is an error, never a crash.
  const std::string payload = plan.extra[1].payload;
  for (size_t n = 0; n < payload.size(); ++n) {
    plan.extra[1].payload = payload.substr(0, n);
    EXPECT_FALSE(DecodeRequestTable(plan, "p").ok()) << n;
  }
  // A slot larger than its buffer; windows out of order.
  RequestTable bad = table;
  bad.dynamic[0].steady.requests[0].size = 5000;
  plan.extra = EncodeRequestTable(bad);
  EXPECT_FALSE(DecodeRequestTable(plan, "p").ok());
  bad = table;
  std::swap(bad.dynamic[0], bad.dynamic[1]);
  plan.extra = EncodeRequestTable(bad);
  StatusOr<std::optional<RequestTable>> order = DecodeRequestTable(plan, "p");
  ASSERT_FALSE(order.ok());
  EXPECT_NE(order.status().message().find("out of order"), std::string::npos);
}

// Seeded mutations of a DREQ payload (flips, random bytes, truncation,
// insertion): the decoder never crashes, and whatever it accepts names only
// buffers the plan has, in sizes they hold.
TEST(RequestTableTest, MutatedDynamicSequencesNeverCrash) {
  PlanFile plan;
  plan.buffers = {{7, 0, 1024, 0, 5, 512}, {9, 1024, 4096, 1, 3, 512}};
  RequestTable table;
  table.prologue_iterations = 2;
  table.iteration = {{1000, 7, 0, 5}};
  table.dynamic = {
      {"a@forward",
       {{{4000, 9, 1, 3}, {77, -1, 2, 3}}, {1, 2}},
       {{{{10, 9, 1, 3}}, {2}}, {{{20, 7, 0, 4}, {30, -1, 1, 2}}, {1, 1}}}},
      {"b@backward", {{{512, 7, 0, 1}}, {0}}, {}}};
  const std::vector<PlanSection> sections = EncodeRequestTable(table);
  ASSERT_EQ(sections.size(), 2u);
  std::mt19937_64 rng(20261127);
  int accepted = 0;
  for (int round = 0; round < 20000; ++round) {
    std::string payload = sections[1].payload;
    const int mutations = 1 + static_cast<int>(rng() % 3);
    for (int m = 0; m < mutations && !payload.empty(); ++m) {
      const size_t at = rng() % payload.size();
      switch (rng() % 4) {
        case 0:
          payload[at] = static_cast<char>(payload[at] ^ (1 << (rng() % 8)));
          break;
        case 1:
          payload[at] = static_cast<char>(rng());
          break;
        case 2:
          payload.resize(at);
          break;
        default:
          payload.insert(at, 1, static_cast<char>(rng()));
      }
    }
    plan.extra = {sections[0], sections[1]};
    plan.extra[1].payload = payload;
    StatusOr<std::optional<RequestTable>> back = DecodeRequestTable(plan, "m");
    if (!back.ok()) {
      EXPECT_EQ(back.status().message().rfind("m: DREQ: ", 0), 0u)
          << back.status().message();
      continue;
    }
    ++accepted;
    for (const DynamicSequence& seq : (*back)->dynamic) {
      EXPECT_EQ(seq.steady.calls.size(), seq.steady.requests.size());
      EXPECT_LE(seq.early.size(), 2u);
      for (const RequestRef& r : seq.steady.requests) {
        if (r.buffer < 0) continue;
        ASSERT_LT(static_cast<size_t>(r.buffer), plan.buffers.size());
        EXPECT_LE(r.size, plan.buffers[r.buffer].size);
      }
    }
  }
  EXPECT_GT(accepted, 10);
}

}  // namespace
}  // namespace loom::plan
