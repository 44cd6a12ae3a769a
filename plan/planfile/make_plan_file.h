// MakePlanFile: the plan file of a solver result (pure C++).
//
// Bridges the solver (plan/solver/planner.h) and the plan file format
// (plan_file.h): provenance, algorithm, options, figures, the buffers with
// their reserved sizes, the region (the peak rounded up to whole granules)
// and, per dynamic window, the static space idle during it.
#ifndef LOOM_PLAN_PLANFILE_MAKE_PLAN_FILE_H_
#define LOOM_PLAN_PLANFILE_MAKE_PLAN_FILE_H_

#include <span>
#include <string_view>

#include "base/status.h"
#include "plan/planfile/plan_file.h"
#include "plan/solver/granules.h"
#include "plan/solver/instance.h"
#include "plan/solver/planner.h"

namespace loom::plan {

// The plan file of `result` (PlanInstance(instance, options)): provenance
// (`source`, the instance's fingerprint), algorithm, options, figures, the
// buffers with their reserved sizes, and the region: the peak rounded up to
// whole granules. Each of `windows` gets its dynamic reusable space; fails
// on an invalid window. REQUIRES: `result` comes from `instance`.
StatusOr<PlanFile> MakePlanFile(const Instance& instance,
                                const PlanResult& result,
                                const PlannerOptions& options,
                                std::string_view source,
                                std::span<const TimeWindow> windows = {});

}  // namespace loom::plan

#endif  // LOOM_PLAN_PLANFILE_MAKE_PLAN_FILE_H_
