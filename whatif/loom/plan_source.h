// Where loom's row gets its plan from, so that loom is measured on a run it
// did not plan from (docs/design.md, "Honest measurement").
//
//   self          the measured trace itself: an oracle no user has (a
//                 profiled run never equals the run it serves); reports say
//                 so
//   first:K       the first K iterations of the input (as auto mode plans
//                 after recording K iterations), measured over the whole run
//   <workload>    another trace, CSV or builtin spec (e.g. the same builtin
//                 with another seed: builtin:moe:seed=2)
// With a perturbation (--perturb), the plan comes from the unperturbed
// input unless a source is named. Without either, a multi-iteration input
// (two or more iteration markers) plans from its first iterations
// (first:K, K = min(3, iterations - 1)); a one-iteration input (a snapshot
// of one step) can only plan from itself, and is labelled an oracle.
#ifndef LOOM_WHATIF_LOOM_PLAN_SOURCE_H_
#define LOOM_WHATIF_LOOM_PLAN_SOURCE_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "base/status.h"
#include "plan/trace/trace.h"

namespace loom::whatif {

struct PlanSource {
  enum class Kind : uint8_t { kSelf, kFirstIterations, kWorkload };
  Kind kind = Kind::kSelf;
  int64_t iterations = 0;  // kFirstIterations
  std::string spec;        // kWorkload
};

// "self", "first:K" (K >= 1) or a workload spec (whatif/workloads/load.h).
StatusOr<PlanSource> ParsePlanSource(std::string_view text);

// The default source for a measured input with `iterations` iteration
// markers: first:min(3, iterations - 1) when it has two or more, else self.
PlanSource DefaultPlanSource(uint64_t iterations);

// Iteration-begin markers in `trace`.
uint64_t CountIterations(const plan::Trace& trace);

// The trace loom plans from, given the input before any perturbation.
// Errors: first:K with K not below the input's iterations; the workload's.
StatusOr<plan::Trace> PlanningTrace(const PlanSource& source,
                                    const plan::Trace& input);

// How reports name the source: "own trace (oracle)", "first 3 iterations",
// "builtin:moe:seed=2". `perturbed`: the measured trace is a perturbation of
// the input, so a "self" plan is the unperturbed input's.
std::string DescribePlanSource(const PlanSource& source, bool perturbed);

// True when the plan comes from the very trace measured (an oracle).
inline bool IsOracle(const PlanSource& source, bool perturbed) {
  return source.kind == PlanSource::Kind::kSelf && !perturbed;
}

}  // namespace loom::whatif

#endif  // LOOM_WHATIF_LOOM_PLAN_SOURCE_H_
