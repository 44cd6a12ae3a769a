#include "whatif/loom/self_plan.h"

#include "plan/make_plan.h"
#include "vmm/plan_loader.h"

namespace loom::whatif {

StatusOr<SelfPlan> PlanTraceForRuntime(const plan::Trace& trace,
                                       const SelfPlanOptions& options) {
  plan::MakePlanOptions make;
  make.scope = options.scope;
  make.time_limit_seconds = options.time_limit_seconds;
  make.granule_bytes = options.granularity;
  make.include_persistent = options.include_persistent;
  make.source = "self-plan";
  LOOM_ASSIGN_OR_RETURN(plan::MadePlan made, plan::MakePlan(trace, make));
  SelfPlan out;
  LOOM_ASSIGN_OR_RETURN(out.runtime, vmm::ToRuntimePlan(made.file, "self-plan",
                                                        options.granularity));
  out.instance = std::move(made.instance);
  out.result = std::move(made.result);
  out.note = std::move(made.note);
  return out;
}

autoplan::ReplanOptions ReplanOptionsFor(const SelfPlanOptions& planning) {
  autoplan::ReplanOptions replan;
  replan.plan_options.time_limit_seconds = planning.time_limit_seconds;
  replan.plan_options.scope = planning.scope;
  return replan;
}

}  // namespace loom::whatif
