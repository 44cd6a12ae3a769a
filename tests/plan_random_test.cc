// Seeded random training runs served with plans made from other runs, on
// real memory, with every invariant checked after every event.
//
// allocator_random_test drives the allocator with a plan of its own making
// (no prologue, one shape); the rows of bench/results/misses.md are a fixed
// set. Here each seed draws a whole case end to end, through the product's
// own planner (plan::MakePlan via PlanTraceForRuntime) and its own replay:
//  - a generated training run (whatif/workloads: dense, MoE in its variants,
//    variable sequence lengths, evaluation steps) of a random small shape;
//  - a plan from another run than the one served: the unperturbed run, the
//    run's first iterations, another routing seed, another sequence length
//    or micro-batch; or auto mode (no plan at first, a plan of the recorded
//    iterations installed mid-run, everything made before still live);
//  - the served run perturbed (requests dropped, added, resized), its
//    weights sometimes grown or shrunk by a few KiB (persistent requests
//    that no longer match their entries: pushes, near matches);
//  - re-planning on or off (variants added and switched mid-run);
//  - sometimes a plan that lies (entries moved over others, lifetimes cut
//    short, granules claimed idle that are not).
// The host backend maps real memory at 64 KiB pages, so requests share
// pages densely; every allocation is stamped and checked at its free
// (check_data), and after every event the harness checks that no two live
// allocations overlap, that each lies in mapped memory, and the
// allocator's own CheckInvariants (no physical byte owned twice). On a
// tight device the program sometimes catches each out-of-memory and goes
// on; sometimes the driver fails now and then (injected), and the program
// catches what that fails. A case fails on an invariant, a corrupted
// allocation, an out-of-memory on an ample device or a rejected free. The
// totals over all seeds must show the paths exercised (hits, misses,
// suspensions, losses, variants, pushes, dynamic hits, stitching, out-of-memory
// survived, driver failures met).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "plan/analysis/analysis.h"
#include "plan/analysis/workload.h"
#include "whatif/loom/auto_replay.h"
#include "whatif/loom/loom_sim_allocator.h"
#include "whatif/loom/plan_source.h"
#include "whatif/loom/self_plan.h"
#include "whatif/sim/replay.h"
#include "whatif/workloads/load.h"
#include "whatif/workloads/perturb.h"

namespace loom::whatif {
namespace {

constexpr uint64_t kPage = 64 << 10;

// One drawn case. Describe() names it for a failure; its seed reproduces it
// (LOOM_PLAN_RANDOM_SEEDS=S:S), and most cases replay by hand too
// (`loom_tool replay SERVED --plan-from PLAN --perturb ... --no-check
// --granularity 65536 --backend host --check-data --check-invariants`, or
// `--auto K`), all but the resized weights, a lying plan and a tight device.
struct Case {
  std::string served;     // workload spec
  std::string plan_from;  // "first:K" or a workload spec; "" in auto mode
  PerturbOptions perturb;
  int resized_weights_percent = 0;  // share of set-up requests grown/shrunk
  bool replan = false;              // served plans (auto mode always re-plans)
  int64_t auto_iterations = 0;      // > 0: auto mode recording K iterations
  bool check_plan = true;           // auto mode: decline a plan that loses
  // Share of the served plan's entries made to lie (LiePlan); auto mode's
  // plan is its own.
  int lies_percent = 0;
  // Device memory as a share of the served run's live peak (0: ample). A
  // tight device may run out (its cached memory released and the request
  // retried first); an out-of-memory then ends the run cleanly, and the
  // invariants hold up to it.
  int capacity_percent = 0;
  // Chance in percent that a Malloc or Free meets an injected driver
  // failure (LoomSimOptions::driver_failure_percent; not in auto mode).
  int driver_failure_percent = 0;
  // On a tight device or with driver failures: the program catches each
  // failed allocation and goes on without that request
  // (ReplayOptions::skip_failed_allocations), so the rest of the run is
  // served from the state a failure left, invariants checked.
  bool skip_failed_allocations = false;

  std::string Describe() const {
    return fmt::format(
        "served {} | plan {} | perturb {} | weights resized {}% | replan {} "
        "| lies {}% | device {}% of the live peak | driver failures {}%{}",
        served,
        auto_iterations > 0
            ? fmt::format("auto mode, first {} iterations{}", auto_iterations,
                          check_plan ? "" : ", not checked")
            : plan_from,
        FormatPerturbOptions(perturb), resized_weights_percent, replan,
        lies_percent, capacity_percent, driver_failure_percent,
        skip_failed_allocations ? ", failed allocations skipped" : "");
  }
};

struct Shape {
  std::string family;
  int layers, iterations;
  uint64_t hidden, heads, seq_len, micro_batch, vocab, seed;
  int experts, top_k;

  std::string Spec() const {
    std::string spec = fmt::format(
        "builtin:{}:layers={},iterations={},hidden={},heads={},ffn_hidden={},"
        "micro_batch={},vocab={},seed={}",
        family, layers, iterations, hidden, heads, 4 * hidden, micro_batch,
        vocab, seed);
    if (family == "varlen") {
      spec +=
          fmt::format(",seq_lens={}:{}:{}", seq_len / 2, seq_len, 2 * seq_len);
    } else {
      spec += fmt::format(",seq_len={}", seq_len);
    }
    if (family.starts_with("moe")) {
      spec += fmt::format(",experts={},top_k={},expert_ffn_hidden={}", experts,
                          top_k, 2 * hidden);
    }
    if (family == "eval") spec += ",eval_every=2,eval_batches=1";
    return spec;
  }
};

Case Draw(uint64_t seed) {
  std::mt19937_64 rng(seed * 0x9e3779b97f4a7c15ULL + 17);
  auto pick = [&](std::initializer_list<uint64_t> values) {
    return *(values.begin() + rng() % values.size());
  };
  static const char* kFamilies[] = {"dense",        "moe",    "moe_comm",
                                    "moe_capacity", "varlen", "eval"};
  Shape s;
  s.family = kFamilies[rng() % 6];
  s.layers = 1 + static_cast<int>(rng() % 3);
  s.iterations = 3 + static_cast<int>(rng() % 3);
  // Shapes that change per iteration need iterations to repeat in, for a
  // re-plan to be made and served.
  if (s.family == "varlen" || s.family == "eval") s.iterations += 3;
  s.hidden = pick({128, 256, 384});
  s.heads = pick({2, 4});
  s.seq_len = pick({64, 128, 256});
  s.micro_batch = pick({1, 2});
  s.vocab = pick({512, 3000, 8000});
  s.seed = 1 + rng() % 50;
  s.experts = static_cast<int>(pick({4, 8}));
  s.top_k = static_cast<int>(pick({1, 2}));

  Case c;
  c.served = s.Spec();
  Shape other = s;
  switch (rng() % 6) {
    case 0:  // the unperturbed run (perturbed below)
      c.plan_from = c.served;
      break;
    case 1:
      c.plan_from = fmt::format("first:{}", 1 + rng() % (s.iterations - 1));
      break;
    case 2:  // another routing (and, for the dense ones, nothing else)
      other.seed = s.seed + 1;
      c.plan_from = other.Spec();
      break;
    case 3:  // another sequence length: a user who kept the plan
      other.seq_len = s.seq_len == 128 ? 256 : 128;
      c.plan_from = other.Spec();
      break;
    case 4:  // another micro-batch
      other.micro_batch = 3 - s.micro_batch;
      c.plan_from = other.Spec();
      break;
    case 5:
      c.auto_iterations = 1 + static_cast<int64_t>(rng() % (s.iterations - 2));
      c.check_plan = rng() % 2 == 0;
      break;
  }
  c.perturb.drop = pick({0, 1, 3, 10, 20}) / 100.0;
  c.perturb.add = pick({0, 1, 3, 10}) / 100.0;
  c.perturb.resize = pick({0, 1, 3, 10}) / 100.0;
  c.perturb.seed = 1 + rng() % 1000;
  c.perturb.max_add_bytes = pick({kPage / 2, 4 * kPage, 40 * kPage});
  c.resized_weights_percent = static_cast<int>(pick({0, 0, 30, 100}));
  c.replan = rng() % 2 == 0;
  c.lies_percent = static_cast<int>(pick({0, 0, 0, 5, 30}));
  c.capacity_percent = static_cast<int>(pick({0, 0, 0, 0, 90, 102, 110}));
  // Drawn last, so that the draws above stay those of the seed.
  if (c.capacity_percent != 0 && rng() % 2 == 0) {
    c.skip_failed_allocations = true;
    c.capacity_percent -= static_cast<int>(pick({0, 20, 40}));
  }
  if (c.auto_iterations == 0) {
    c.driver_failure_percent = static_cast<int>(pick({0, 0, 0, 2, 10}));
    if (c.driver_failure_percent > 0) c.skip_failed_allocations = true;
  }
  return c;
}

// Grows or shrinks `percent` of the set-up's requests that are never freed
// (weights) by 512 B to 32 KiB, in place.
void ResizeWeights(plan::Trace& trace, int percent, uint64_t seed) {
  if (percent == 0) return;
  std::mt19937_64 rng(seed);
  for (const plan::Allocation& a : plan::BuildWorkload(trace).allocations) {
    if (a.alloc_iteration != plan::kNoIteration || a.freed()) continue;
    if (static_cast<int>(rng() % 100) >= percent) continue;
    const uint64_t delta = 512 * (1 + rng() % 64);
    uint64_t& size = trace.events[a.alloc_time].size;
    if (rng() % 3 != 0) {
      size += delta;
    } else if (size > delta + 512) {
      size -= delta;
    }
  }
}

// A plan that lies, as a stale or foreign plan file could while passing
// every format check: `percent` of its entries get another offset in the
// region (overlapping others), a lifetime cut short (its granules look idle
// while it lives), or a slot anywhere; windows claim granules idle that are
// not, or lie at other times; the period may be off by half. The run time's
// safety checks, not the layout, keep bytes single-owned.
void LiePlan(vmm::RuntimePlan& plan, int percent, uint64_t seed) {
  if (percent == 0) return;
  std::mt19937_64 rng(seed ^ 0x6c696573ULL);  // "lies"
  auto lie = [&] { return static_cast<int>(rng() % 100) < percent; };
  auto move = [&](vmm::PlannedRequest& r) {
    if (r.size > plan.region_bytes) return;
    r.offset = static_cast<int64_t>(rng() % (plan.region_bytes - r.size + 1) /
                                    512 * 512);
  };
  auto lie_about = [&](std::vector<vmm::PlannedRequest>& entries) {
    for (vmm::PlannedRequest& r : entries) {
      if (!lie()) continue;
      if (rng() % 2 == 0) {
        move(r);
      } else {
        r.end = r.start + 1;
      }
    }
  };
  lie_about(plan.prologue);
  lie_about(plan.iteration);
  // Another period: persistent entries look transient, or the reverse.
  if (lie()) plan.period = rng() % 2 == 0 ? plan.period / 2 : plan.period * 2;
  const uint64_t granules = plan.region_bytes / kPage;
  for (vmm::DynamicWindow& w : plan.windows) {
    for (vmm::PlannedRequest& slot : w.steady.requests) {
      if (lie()) move(slot);
    }
    for (vmm::WindowRequests& early : w.early) {
      for (vmm::PlannedRequest& slot : early.requests) {
        if (lie()) move(slot);
      }
    }
    if (lie() && plan.period > 0) {  // the window at another time
      w.start = static_cast<int64_t>(rng() % plan.period);
      w.end = w.start + static_cast<int64_t>(rng() % plan.period);
    }
    for (uint64_t k = 0; k < granules; ++k) {
      if (lie()) w.idle_granules.push_back(static_cast<uint32_t>(k));
    }
    std::sort(w.idle_granules.begin(), w.idle_granules.end());
    w.idle_granules.erase(
        std::unique(w.idle_granules.begin(), w.idle_granules.end()),
        w.idle_granules.end());
  }
}

// The device's memory for case `c` serving `trace`, in whole pages.
uint64_t Capacity(const Case& c, const plan::Trace& trace) {
  if (c.capacity_percent == 0) return uint64_t{8} << 30;
  const uint64_t bytes = plan::PeakLiveBytes(plan::BuildWorkload(trace)) / 100 *
                         c.capacity_percent;
  return std::max<uint64_t>(bytes / kPage, 8) * kPage;
}

struct Totals {
  uint64_t cases = 0, hits = 0, misses = 0, suspensions = 0, losses = 0,
           variants = 0, pushes = 0, dynamic_hits = 0, stitched = 0,
           auto_switched = 0, ooms = 0, survived = 0, driver_failures = 0,
           failed_allocations = 0;
  void Add(const vmm::AllocatorStats& s) {
    ++cases;
    hits += s.plan_hits;
    misses += s.plan_misses;
    suspensions += s.plan_suspensions;
    losses += s.plan_losses;
    variants += s.plan_variants > 1 ? s.plan_variants - 1 : 0;
    pushes += s.persistent_pushes;
    dynamic_hits += s.dynamic_hits;
    stitched += s.stitched_pages + s.stitched_static_pages;
  }
};

SelfPlanOptions Planning() {
  SelfPlanOptions options;
  options.time_limit_seconds = 0.5;
  options.granularity = kPage;
  return options;
}

constexpr uint64_t kDefaultSeeds = 60;

// An ample device never runs out, unless a driver failure says so; an
// allocation fails otherwise only from an injected failure. Counts the runs
// served on past their first out-of-memory (skipped).
void CountFailures(const Case& c, const ReplayResult& result, Totals& totals) {
  if (c.capacity_percent == 0 && c.driver_failure_percent == 0) {
    EXPECT_FALSE(result.oom) << result.oom_message;
  }
  if (c.driver_failure_percent == 0) EXPECT_EQ(result.other_failures, 0u);
  totals.ooms += result.ooms;
  totals.failed_allocations += result.other_failures;
  if (result.oom && result.events > result.oom_event + 1) ++totals.survived;
}

// Runs one case; fatal failures name the case.
void RunCase(const Case& c, Totals& totals) {
  SCOPED_TRACE(c.Describe());
  StatusOr<Workload> served = LoadWorkload(c.served);
  ASSERT_TRUE(served.ok()) << served.status().ToString();
  plan::Trace trace = served->trace;
  if (c.perturb.any()) trace = Perturb(trace, c.perturb);
  ResizeWeights(trace, c.resized_weights_percent, c.perturb.seed);

  if (c.auto_iterations > 0) {
    AutoReplayOptions options;
    options.record_iterations = c.auto_iterations;
    options.planned_iterations = 2;
    options.time_limit_seconds = 0.5;
    options.backend = "host";
    options.granularity = kPage;
    options.capacity = Capacity(c, trace);
    options.check_data = true;
    options.check_invariants = true;
    options.check_plan = c.check_plan;
    options.skip_failed_allocations = c.skip_failed_allocations;
    StatusOr<AutoReplayResult> result = ReplayAutoMode(trace, options);
    ASSERT_TRUE(result.ok()) << result.status().ToString();
    CountFailures(c, result->replay, totals);
    EXPECT_EQ(result->corrupted, 0u);
    totals.Add(result->stats);
    if (result->phases.switched) ++totals.auto_switched;
    return;
  }

  StatusOr<PlanSource> source = ParsePlanSource(c.plan_from);
  ASSERT_TRUE(source.ok()) << source.status().ToString();
  // The plan of the unperturbed run, its first iterations, or another run.
  StatusOr<plan::Trace> planning = PlanningTrace(*source, served->trace);
  ASSERT_TRUE(planning.ok()) << planning.status().ToString();
  StatusOr<SelfPlan> planned = PlanTraceForRuntime(*planning, Planning());
  ASSERT_TRUE(planned.ok()) << planned.status().ToString();

  LoomSimOptions options;
  options.backend = "host";
  options.granularity = kPage;
  options.capacity = Capacity(c, trace);
  options.check_data = true;
  options.names = trace.names;
  LiePlan(planned->runtime, c.lies_percent, c.perturb.seed);
  options.plan = std::move(planned->runtime);
  options.log_plan_loss = false;
  options.driver_failure_percent = c.driver_failure_percent;
  options.driver_failure_seed = c.perturb.seed;
  if (c.replan) options.replan = ReplanOptionsFor(Planning());
  StatusOr<std::unique_ptr<LoomSimAllocator>> loom =
      LoomSimAllocator::Create(options);
  ASSERT_TRUE(loom.ok()) << loom.status().ToString();
  ReplayOptions replay;
  replay.check_invariants = true;
  replay.max_samples = 0;
  replay.skip_failed_allocations = c.skip_failed_allocations;
  StatusOr<ReplayResult> result = Replay(trace, **loom, replay);
  ASSERT_TRUE(result.ok()) << result.status().ToString();
  CountFailures(c, *result, totals);
  EXPECT_EQ((*loom)->corrupted(), 0u);
  totals.Add((*loom)->loom_stats());
  totals.driver_failures += (*loom)->driver_failures();
}

// LOOM_PLAN_RANDOM_SEEDS=FIRST:LAST runs other seeds (a longer hunt); the
// path totals are asserted for the default range only.
std::pair<uint64_t, uint64_t> Seeds() {
  const char* text = std::getenv("LOOM_PLAN_RANDOM_SEEDS");
  unsigned long long first = 0, last = 0;
  if (text != nullptr && std::sscanf(text, "%llu:%llu", &first, &last) == 2 &&
      first <= last) {
    return {first, last};
  }
  return {1, kDefaultSeeds};
}

TEST(PlanRandomTest, DrawnCasesKeepEveryByteSingleOwned) {
  Totals totals;
  const auto [first, last] = Seeds();
  for (uint64_t seed = first; seed <= last; ++seed) {
    SCOPED_TRACE(testing::Message() << "seed " << seed);
    ASSERT_NO_FATAL_FAILURE(RunCase(Draw(seed), totals));
  }
  fmt::print(
      "{} cases: {} hits, {} misses, {} suspensions, {} losses, {} variants "
      "added, {} pushes, {} dynamic hits, {} pages stitched, {} auto-mode "
      "switches, {} out of memory ({} runs served on past theirs), {} "
      "driver failures injected ({} allocations failed otherwise)\n",
      totals.cases, totals.hits, totals.misses, totals.suspensions,
      totals.losses, totals.variants, totals.pushes, totals.dynamic_hits,
      totals.stitched, totals.auto_switched, totals.ooms, totals.survived,
      totals.driver_failures, totals.failed_allocations);
  if (first != 1 || last != kDefaultSeeds) return;
  // The cases must have reached each path they are drawn to reach.
  EXPECT_EQ(totals.cases, kDefaultSeeds);
  EXPECT_GT(totals.hits, 1000u);
  EXPECT_GT(totals.misses, 100u);
  EXPECT_GT(totals.suspensions, 0u);
  EXPECT_GT(totals.losses, 0u);
  EXPECT_GT(totals.variants, 0u);
  EXPECT_GT(totals.pushes, 0u);
  EXPECT_GT(totals.dynamic_hits, 0u);
  EXPECT_GT(totals.stitched, 0u);
  EXPECT_GT(totals.auto_switched, 0u);
  EXPECT_GT(totals.ooms, 0u);
  EXPECT_GT(totals.survived, 0u);
  EXPECT_GT(totals.driver_failures, 0u);
}

}  // namespace
}  // namespace loom::whatif
