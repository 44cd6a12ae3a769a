// MakePlan: plan/'s one public entry point. A recorded trace (or a planning
// instance) and options in; a plan file and its report out (pure C++).
//
// For a trace: the workload is analysed (plan/analysis/), its steady-state
// iteration becomes a cyclic planning instance with the request table the
// runtime matcher replays and the time windows of its dynamic modules
// (plan/planning_problem.h), the solver places it within the time limit
// (plan/solver/planner.h), the independent verifier checks the placement
// (plan/solver/verifier.h), and the plan file is assembled
// (plan/planfile/). For an instance (a MiniMalloc CSV), the same without the
// request table: such a plan can be verified and inspected but not served.
// Every caller that plans (the command line, the comparison, `replay
// --self-plan`, libloom's C ABI) goes through here, so they all make the same
// plan from the same input.
#ifndef LOOM_PLAN_MAKE_PLAN_H_
#define LOOM_PLAN_MAKE_PLAN_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "plan/planfile/plan_file.h"
#include "plan/planfile/request_table.h"
#include "plan/planning_problem.h"
#include "plan/solver/granules.h"
#include "plan/solver/instance.h"
#include "plan/solver/planner.h"
#include "plan/solver/verifier.h"
#include "plan/trace/trace.h"

namespace loom::plan {

struct MakePlanOptions {
  // The solver (see PlannerOptions).
  Algorithm algorithm = Algorithm::kAuto;
  double time_limit_seconds = 10;
  uint64_t capacity = 0;  // 0: none; else report whether the plan fits
  bool minimize = true;
  // 0: 512 for traces (a GPU tensor's address must be aligned), 1 for
  // instances.
  uint64_t size_round = 0;
  uint64_t min_alignment = 0;
  // 0: a trace's recorded granularity (the granules the run time will map
  // on the device it was recorded on), else kDefaultGranule.
  uint64_t granule_bytes = 0;
  uint64_t seed = 1;
  bool progress = false;  // solver progress on stderr (a terminal only)
  // Instances only: a cyclic plan with this period (0: not cyclic). A trace
  // brings its own period (its steady-state iteration).
  int64_t period = 0;
  // Traces only (see PlanningProblemOptions).
  PlanScope scope = PlanScope::kAuto;
  int32_t steady_iteration = -1;
  bool include_persistent = true;
  // Dynamic windows of the caller's own, besides a trace's dynamic modules.
  std::vector<TimeWindow> windows;
  // Provenance written into the plan file (e.g. the input's path).
  std::string source;
};

// The granule a trace is planned for (and replayed at): `told` when not 0,
// else the granularity it was recorded at (`recorded`, its header's), else
// kDefaultGranule.
inline uint64_t ResolveGranule(uint64_t told, uint64_t recorded) {
  return told != 0 ? told : recorded != 0 ? recorded : kDefaultGranule;
}

// Parses "key=value" settings separated by ';' or newlines into `options`
// (the C ABI's and the Python package's form): algorithm, time_limit,
// capacity, minimize, round, align, granule, seed, period, scope,
// steady_iteration, persistent, source. Booleans are 0/1/true/false. Unknown
// keys and bad values are INVALID_ARGUMENT and leave `options` unchanged.
Status ParseMakePlanOptions(std::string_view settings,
                            MakePlanOptions* options);

struct MadePlan {
  PlanFile file;      // ready to write (plan/planfile/plan_file.h)
  Instance instance;  // the planned instance (buffer i = file.buffers[i])
  PlanResult result;  // the solver's figures, offsets and attempts
  Verdict verdict;    // the independent verifier on the placement
  // Traces: the request table (also inside `file`), which iteration was
  // planned (-1: the whole trace) and how the instance was derived.
  std::optional<RequestTable> requests;
  int32_t steady_iteration = -1;
  std::string note;
  // Within the capacity (always true without one) and verified.
  bool ok() const { return verdict.valid() && result.fits; }
};

// Plans a trace. Errors: INVALID_ARGUMENT when the trace has nothing to plan
// (no allocation outside dynamic modules, no such iteration) or an option
// is invalid.
StatusOr<MadePlan> MakePlan(const Trace& trace, const MakePlanOptions& options);

// Plans an instance (with options.period as its period).
StatusOr<MadePlan> MakePlan(const Instance& instance,
                            const MakePlanOptions& options);

// Plans the trace (text or binary) or MiniMalloc CSV at `path`; errors name
// the file. options.source defaults to `path`.
StatusOr<MadePlan> MakePlanFromFile(const std::string& path,
                                    const MakePlanOptions& options);

// The report as one JSON object: source, derived, requests, buffers,
// peak_bytes, lower_bound_bytes, ratio, peak_granules, granule_bytes,
// region_bytes, seconds, seconds_to_best, valid, algorithm, optimal,
// capacity, fits, capacity_infeasible, attempts[], dynamic_windows[].
// `indent` as JsonWriter's.
std::string MadePlanJson(const MadePlan& made, const MakePlanOptions& options,
                         int indent = 0);

}  // namespace loom::plan

#endif  // LOOM_PLAN_MAKE_PLAN_H_
