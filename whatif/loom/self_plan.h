// Planning a trace for loom's runtime in one call (no files): plan/'s entry
// point (plan/make_plan.h, the same plan as `loom plan <trace>`) followed by
// the runtime's plan loader, for `loom compare` and `loom replay
// --self-plan`.
#ifndef LOOM_WHATIF_LOOM_SELF_PLAN_H_
#define LOOM_WHATIF_LOOM_SELF_PLAN_H_

#include <string>

#include "autoplan/replanner.h"
#include "base/status.h"
#include "plan/make_plan.h"
#include "vmm/runtime_plan.h"

namespace loom::whatif {

struct SelfPlanOptions {
  plan::PlanScope scope = plan::PlanScope::kAuto;
  double time_limit_seconds = 10;
  uint64_t granularity = uint64_t{2} << 20;  // the device's
  // Plan the buffers that live the whole period too (weights, optimizer
  // state). Auto mode does not: what it recorded before its switch stays
  // live in the dynamic space (torch_plugin/loom/session.py).
  bool include_persistent = true;
};

struct SelfPlan {
  vmm::RuntimePlan runtime;
  plan::Instance instance;  // the planned instance (for pictures)
  plan::PlanResult result;  // figures and offsets of the planner run
  std::string note;         // which part of the trace was planned
};

StatusOr<SelfPlan> PlanTraceForRuntime(const plan::Trace& trace,
                                       const SelfPlanOptions& options = {});

// The re-planner with the same planner settings (time limit, scope), for
// each shape of iteration the plan does not fit, as auto mode re-plans at
// run time: compare's loom row, `loom replay --replan`, `--auto`.
autoplan::ReplanOptions ReplanOptionsFor(const SelfPlanOptions& planning);

}  // namespace loom::whatif

#endif  // LOOM_WHATIF_LOOM_SELF_PLAN_H_
