// A plan made from one trace, replayed on a different one: requests dropped,
// added, resized, and MoE-like dynamic sizes that change every iteration. On
// the host backend (real memory) with data stamps and every invariant
// checked after every event: no corruption, ever; the hit rate and the
// efficiency degrade gracefully (the matcher resynchronises).
#include <gtest/gtest.h>

#include <cstdio>

#include "plan/analysis/workload.h"
#include "whatif/loom/loom_sim_allocator.h"
#include "whatif/loom/self_plan.h"
#include "whatif/sim/caching_allocator.h"
#include "whatif/sim/replay.h"
#include "whatif/workloads/load.h"
#include "whatif/workloads/perturb.h"

namespace loom::whatif {
namespace {

// Drops, adds and resizes requests of `trace` (seeded); markers stay.
plan::Trace Perturb(const plan::Trace& trace, uint64_t seed, int drop_percent,
                    int add_percent, int resize_percent) {
  PerturbOptions options;
  options.drop = drop_percent / 100.0;
  options.add = add_percent / 100.0;
  options.resize = resize_percent / 100.0;
  options.seed = seed;
  return whatif::Perturb(trace, options);
}

struct Outcome {
  ReplayResult replay;
  vmm::AllocatorStats stats;
  uint64_t corrupted = 0;
};

Outcome ReplayWithPlan(const plan::Trace& trace, const vmm::RuntimePlan& plan) {
  LoomSimOptions options;
  options.backend = "host";
  options.check_data = true;
  options.capacity = uint64_t{64} << 30;
  options.names = trace.names;
  options.plan = plan;
  auto loom = LoomSimAllocator::Create(options);
  LOOM_CHECK(loom.ok(), "{}", loom.status().ToString());
  ReplayOptions replay_options;
  replay_options.check_invariants = true;
  replay_options.max_samples = 0;
  StatusOr<ReplayResult> result = Replay(trace, **loom, replay_options);
  LOOM_CHECK(result.ok(), "{}", result.status().ToString());
  return Outcome{*result, (*loom)->loom_stats(), (*loom)->corrupted()};
}

double HitRate(const vmm::AllocatorStats& s) {
  uint64_t total = s.plan_hits + s.plan_misses;
  return total == 0 ? 0 : static_cast<double>(s.plan_hits) / total;
}

class PerturbationTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto w = LoadWorkload("builtin:dense:layers=2,iterations=4,seq_len=256");
    LOOM_CHECK(w.ok());
    trace_ = new plan::Trace(std::move(w->trace));
    SelfPlanOptions options;
    options.time_limit_seconds = 2;
    auto planned = PlanTraceForRuntime(*trace_, options);
    LOOM_CHECK(planned.ok(), "{}", planned.status().ToString());
    plan_ = new vmm::RuntimePlan(std::move(planned->runtime));
  }
  static plan::Trace* trace_;
  static vmm::RuntimePlan* plan_;
};
plan::Trace* PerturbationTest::trace_ = nullptr;
vmm::RuntimePlan* PerturbationTest::plan_ = nullptr;

TEST_F(PerturbationTest, ItsOwnTraceHitsEverything) {
  Outcome o = ReplayWithPlan(*trace_, *plan_);
  EXPECT_EQ(o.corrupted, 0u);
  EXPECT_EQ(o.stats.plan_misses, 0u);
  EXPECT_GT(o.replay.efficiency(), 0.995);
}

TEST_F(PerturbationTest, DroppedAddedResizedRequestsCostOnlyThemselves) {
  for (uint64_t seed : {1, 2, 3}) {
    SCOPED_TRACE(testing::Message() << "seed " << seed);
    plan::Trace perturbed =
        Perturb(*trace_, seed, /*drop=*/3, /*add=*/3, /*resize=*/3);
    Outcome o = ReplayWithPlan(perturbed, *plan_);
    EXPECT_EQ(o.corrupted, 0u);
    EXPECT_FALSE(o.replay.oom);
    // About 9% of the requests changed: the matcher resynchronises, and
    // where it cannot keep up the plan is suspended for the rest of the
    // iteration (the dynamic space serves it). Either way the loss stays
    // small: never below PyTorch's caching allocator on the same trace.
    CachingAllocator pytorch(CachingConfig{}, SimOptions{});
    StatusOr<ReplayResult> baseline = Replay(perturbed, pytorch);
    ASSERT_TRUE(baseline.ok());
    std::printf(
        "seed %llu: loom %.4f (hit rate %.4f, %llu suspensions), "
        "pytorch %.4f\n",
        static_cast<unsigned long long>(seed), o.replay.efficiency(),
        HitRate(o.stats),
        static_cast<unsigned long long>(o.stats.plan_suspensions),
        baseline->efficiency());
    EXPECT_GT(o.stats.plan_hits, o.stats.plan_misses);
    EXPECT_GE(o.replay.efficiency(), baseline->efficiency());
    EXPECT_GT(o.replay.efficiency(), 0.95);
  }
}

// One disturbance in a steady iteration (a resized request, or an extra one
// freed before the iteration ends), then the plan's own pattern: the
// allocator must return to hitting every request. (An extra request that
// looks exactly like a planned one and lives for ever would keep its twin's
// slot for ever: no allocator can tell them apart.)
TEST_F(PerturbationTest, RecoversAfterADisturbance) {
  for (int which : {0, 1, 2}) {
    SCOPED_TRACE(testing::Message() << "disturbance " << which);
    // The same workload for 8 iterations; disturbed in the 5th.
    auto longer =
        LoadWorkload("builtin:dense:layers=2,iterations=8,seq_len=256");
    ASSERT_TRUE(longer.ok());
    const plan::Trace& base = longer->trace;
    plan::Trace t;
    t.header = base.header;
    t.names = base.names;
    int iteration = -1;
    bool done = false;
    uint64_t extra_id = uint64_t{1} << 40;
    for (const plan::Event& e : base.events) {
      if (e.kind == plan::EventKind::kIterationBegin) ++iteration;
      plan::Event copy = e;
      if (!done && iteration == 4 && e.kind == plan::EventKind::kAlloc &&
          e.size >= (8 << 20)) {
        done = true;
        if (which == 0) copy.size += 32768;  // resized
        if (which == 1)
          t.events.push_back(plan::Event::Alloc(extra_id, 9 << 20));
        if (which == 2)
          t.events.push_back(plan::Event::Alloc(extra_id, e.size));
      }
      if (which != 0 && done && e.kind == plan::EventKind::kIterationEnd &&
          iteration == 4) {
        t.events.push_back(plan::Event::Free(extra_id));
      }
      t.events.push_back(copy);
    }
    Outcome o = ReplayWithPlan(t, *plan_);
    EXPECT_EQ(o.corrupted, 0u);
    EXPECT_EQ(o.stats.last_iteration_hit_rate, 1.0)
        << o.stats.plan_misses << " misses in all";
  }
}

// Weights a few KiB larger than planned (a near match: the bytes after
// each are the next weight's): each takes its planned offset and pushes the
// later weights up (Allocator::TryPersistent), every placement checked by
// the safety check and every byte by the data stamps; the iteration's
// layout above the weights is untouched.
TEST_F(PerturbationTest, GrownWeightsPushTheLaterOnesAndKeepTheirData) {
  plan::Trace t = *trace_;
  int weights = 0;
  int grown = 0;
  // The set-up's requests that are never freed, of 64 KiB or more.
  for (const plan::Allocation& a : plan::BuildWorkload(t).allocations) {
    if (a.alloc_iteration != plan::kNoIteration || a.freed() ||
        a.size < (64 << 10)) {
      continue;
    }
    if (++weights % 3 == 2) {  // the 2nd, 5th, 8th, ... weight
      t.events[a.alloc_time].size += 4096;
      ++grown;
    }
  }
  ASSERT_GE(grown, 3);
  Outcome o = ReplayWithPlan(t, *plan_);
  EXPECT_EQ(o.corrupted, 0u);
  EXPECT_FALSE(o.replay.oom);
  EXPECT_GE(o.stats.persistent_pushes, static_cast<uint64_t>(grown));
  EXPECT_EQ(o.stats.last_iteration_hit_rate, 1.0);
}

TEST_F(PerturbationTest, HeavyPerturbationStaysSafe) {
  plan::Trace perturbed =
      Perturb(*trace_, 9, /*drop=*/20, /*add=*/20, /*resize=*/20);
  Outcome o = ReplayWithPlan(perturbed, *plan_);
  EXPECT_EQ(o.corrupted, 0u);
  EXPECT_FALSE(o.replay.oom);
}

TEST(MoePlanTest, SizesThatChangeEveryIterationKeepEfficiencyHigh) {
  // Plan one MoE run; replay another seed (different routing every
  // iteration): the dynamic space absorbs the expert buffers.
  auto planned_on =
      LoadWorkload("builtin:moe:layers=2,iterations=3,seq_len=512,seed=1");
  auto replayed =
      LoadWorkload("builtin:moe:layers=2,iterations=3,seq_len=512,seed=2");
  ASSERT_TRUE(planned_on.ok() && replayed.ok());
  SelfPlanOptions options;
  options.time_limit_seconds = 2;
  auto planned = PlanTraceForRuntime(planned_on->trace, options);
  ASSERT_TRUE(planned.ok()) << planned.status().ToString();
  Outcome o = ReplayWithPlan(replayed->trace, planned->runtime);
  EXPECT_EQ(o.corrupted, 0u);
  EXPECT_GT(o.stats.dynamic_requests, 0u);
  EXPECT_GT(o.replay.efficiency(), 0.95);
}

}  // namespace
}  // namespace loom::whatif
