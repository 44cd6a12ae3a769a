// Auto mode replayed on the CPU: `loom replay --auto K`.
//
// What `loom.enable(mode="auto", record_iterations=K)` does to a training
// run, on loom's real run-time allocator (fake or host backend): the first
// iterations are served without a plan (everything from the arena) and
// recorded; the first K (set-up included) are planned as auto mode plans
// them (plan::MakePlan without persistent buffers: what was recorded stays
// live in the arena; the worker's time limit); the plan is installed at the
// boundary before iteration `switch_at` begins (LoadPlan after the
// iteration's end, then the recording stops: session.py's order), with
// every allocation made before still live; a re-planner watches from then
// on, as libloom's does. The run is every complete iteration of the trace
// (the run's own, also past the K planned: an early iteration that makes
// lasting state, as an optimizer's first step does, is never repeated),
// extended with copies of its last one (whatif/workloads/repeat.h) up to
// `planned_iterations` iterations after the switch.
//
// Before the switch the plan is checked on the recorded iterations as auto
// mode checks it (whatif/loom/plan_check.h, mid-run): a plan that does not
// earn its place is declined and the whole run is served without it.
//
// Reports the whole run's peaks and each phase's (before the switch:
// unplanned; after it: the plan), and the allocator's state around the
// switch.
#ifndef LOOM_WHATIF_LOOM_AUTO_REPLAY_H_
#define LOOM_WHATIF_LOOM_AUTO_REPLAY_H_

#include <cstdint>
#include <optional>
#include <string>

#include "base/status.h"
#include "plan/trace/trace.h"
#include "whatif/loom/loom_sim_allocator.h"
#include "whatif/loom/plan_check.h"
#include "whatif/sim/replay.h"
#include "whatif/workloads/repeat.h"

namespace loom::whatif {

struct AutoReplayOptions {
  int64_t record_iterations = 3;  // K: iterations planned (set-up included)
  // The boundary the plan is installed at: before iteration `switch_at`
  // begins (>= K). -1: K + 1 (planning in the background takes longer
  // than the iteration during which it runs; K: plan_async=False).
  int64_t switch_at = -1;
  int64_t planned_iterations = 5;  // iterations served after the switch
  double time_limit_seconds = 20;  // bench/gpu/train/worker.py's default
  std::string backend = "fake";
  // The device's granularity; 0: the trace's recorded one, else 2 MiB, as
  // `loom plan` plans it (plan::ResolveGranule).
  uint64_t granularity = 0;
  uint64_t capacity = 0;  // LoomSimOptions::capacity
  bool check_data = false;
  bool check_invariants = false;
  bool skip_failed_allocations =
      false;  // ReplayOptions::skip_failed_allocations
  // Check the plan on the recorded iterations first and decline it if it
  // loses there, as libloom does in auto mode; false: switch anyway (to
  // study what the plan does after the switch).
  bool check_plan = true;
  bool stitch = true;  // LoomSimOptions::stitch (the plan check's too)
};

struct AutoReplayResult {
  ReplayResult replay;  // the whole run (peaks over both phases)
  SwitchReport phases;
  int64_t switch_at = 0;
  // The extended trace's shape (trace left empty).
  RepeatedTrace extension;
  std::string plan_note;
  // The plan on the recorded iterations (with check_plan).
  std::optional<PlanCheck> check;
  bool declined = false;  // check->earns_its_place is false: no switch
  double planning_seconds = 0;
  uint64_t plan_peak_bytes = 0;  // the plan's own peak (its region)
  vmm::AllocatorStats stats;     // the allocator's, at the end
  uint64_t corrupted = 0;
};

// INVALID_ARGUMENT for options the trace cannot satisfy (fewer than K
// recorded iterations, switch_at < K); planning errors as MakePlan's.
StatusOr<AutoReplayResult> ReplayAutoMode(const plan::Trace& trace,
                                          const AutoReplayOptions& options);

}  // namespace loom::whatif

#endif  // LOOM_WHATIF_LOOM_AUTO_REPLAY_H_
