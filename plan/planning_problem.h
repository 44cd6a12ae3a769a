// PlanningProblem: what the planner and the run-time matcher need from a
// recorded workload (pure C++).
//
// From a Workload and its steady-state iteration k = [B, E) (period
// P = E - B, times relative to B), with S the start of the first iteration:
//  - the iteration sequence: every allocation made in k outside dynamic
//    modules, in order; each becomes a buffer of the cyclic instance with
//    lifetime [alloc - B, free - B), wrapping past P when it is freed in the
//    next iteration, or [alloc - B, P) when it is never freed. An allocation
//    that lives longer than a whole period cannot repeat every iteration in
//    one plan: it stays unplanned (served by the dynamic space).
//  - the prologue sequence: every allocation before B outside dynamic
//    modules, in order: the set-up (before S) and the early iterations.
//    Those that live through all of k (never freed, or freed at or after E:
//    weights, optimizer state created by the first step) are persistent
//    buffers [0, P). The others of an early iteration point at the buffer of
//    their counterpart in k, found by aligning the two iterations' request
//    sizes (a diff), so the early iterations are served from the plan too;
//    the rest are unplanned.
//  - dynamic windows: per module marked dynamic (the innermost one open)
//    that allocated in k and per phase its requests were made in (named
//    "module@phase"), the time window [first alloc, last free) relative to
//    B, for the dynamic reusable space;
//  - dynamic requests with a home (`plan_dynamic`): the n-th request of each
//    window in k is a buffer too, its lifetime k's and its size the
//    largest the n-th request of that window had in any recorded
//    iteration (expert sizes follow the routing, which changes every
//    step), so the run time serves a dynamic request at its window's n-th
//    slot when it fits (RequestTable::dynamic), the dynamic space
//    otherwise.
// Buffer ids in the instance are their index. Request sizes are exact (the
// runtime matches on them); the planner may round buffer sizes.
#ifndef LOOM_PLAN_PLANNING_PROBLEM_H_
#define LOOM_PLAN_PLANNING_PROBLEM_H_

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "plan/analysis/analysis.h"
#include "plan/analysis/workload.h"
#include "plan/planfile/request_table.h"
#include "plan/solver/granules.h"
#include "plan/solver/instance.h"

namespace loom::plan {

struct PlanningProblem {
  Instance instance;  // cyclic (period P) unless the iteration is empty
  RequestTable requests;
  int32_t steady_iteration = -1;  // index into Workload::iterations; -1: whole
  int64_t begin = 0;              // the planned span of the trace [begin, end)
  int64_t end = 0;
  std::vector<TimeWindow> windows;  // dynamic modules, one per module name
  // Per buffer, a key of its (alloc phase, free phase) pair, for STAlloc's
  // same-phase groups (PlannerOptions::group).
  std::vector<uint32_t> phase_group;
  // The set-up's transient requests (neither persistent nor dynamic) that
  // line up with the steady iteration's (a size alignment): when they are
  // at least half of its requests, the set-up holds an iteration that no
  // marker began (a loop marked only at its iterations' ends), which the
  // plan leaves to the dynamic space as set-up.
  size_t setup_aligned = 0;
  // How the instance was derived, for reports (set by the Trace overload).
  std::string note;
};

enum class PlanScope : uint8_t {
  kAuto,       // kIteration when the trace has iteration markers, else kTrace
  kIteration,  // the steady-state iteration, repeated (cyclic)
  kTrace,      // the whole trace as one iteration (a one-step snapshot)
};

// "auto", "iteration", "trace".
StatusOr<PlanScope> ParsePlanScope(std::string_view text);

struct PlanningProblemOptions {
  // Marker-free traces are usually one-step snapshots, whose layer-level
  // repetition must not be taken for iterations: kAuto plans them whole.
  PlanScope scope = PlanScope::kAuto;
  // Which iteration is the steady state (index into Workload::iterations);
  // -1: the analysis's choice, else the last one. kIteration only.
  int32_t steady_iteration = -1;
  // Plan the persistent prologue buffers (weights, optimizer state). False
  // when they were already allocated elsewhere (auto mode switches to a plan
  // after recording, when those tensors already live in the dynamic space).
  bool include_persistent = true;
  // Give the requests of dynamic modules planned slots (see above); false:
  // they are left to the dynamic space (only their windows are planned).
  bool plan_dynamic = true;
};

// Errors: INVALID_ARGUMENT when the workload has no allocation outside
// dynamic modules, or the requested iteration does not exist.
StatusOr<PlanningProblem> BuildPlanningProblem(
    const Workload& workload, const WorkloadAnalysis& analysis,
    const PlanningProblemOptions& options = {});

// The same from a trace: its workload is built and analysed first, and
// `note` says which part was planned ("steady-state iteration #3 of 5 (...),
// events [a, b): N buffers, ...").
StatusOr<PlanningProblem> BuildPlanningProblem(
    const Trace& trace, const PlanningProblemOptions& options = {});

}  // namespace loom::plan

#endif  // LOOM_PLAN_PLANNING_PROBLEM_H_
