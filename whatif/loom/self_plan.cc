#include "whatif/loom/self_plan.h"

#include "plan/analysis/analysis.h"
#include "plan/planfile/request_table.h"
#include "plan/analysis/workload.h"
#include "vmm/plan_loader.h"

namespace loom::whatif {

StatusOr<SelfPlan> PlanTraceForRuntime(const plan::Trace& trace,
                                       const SelfPlanOptions& options) {
  plan::Workload workload = plan::BuildWorkload(trace);
  plan::WorkloadAnalysis analysis = plan::AnalyzeWorkload(workload);
  plan::PlanningProblemOptions problem_options;
  problem_options.scope = options.scope;
  LOOM_ASSIGN_OR_RETURN(
      plan::PlanningProblem problem,
      plan::BuildPlanningProblem(workload, analysis, problem_options));
  plan::PlannerOptions planner;
  planner.time_limit_seconds = options.time_limit_seconds;
  planner.size_round = 512;
  planner.min_alignment = 512;
  planner.granule_bytes = options.granularity;
  planner.group = problem.phase_group;
  planner.progress = false;
  SelfPlan out;
  LOOM_ASSIGN_OR_RETURN(out.result,
                        plan::PlanInstance(problem.instance, planner));
  LOOM_ASSIGN_OR_RETURN(
      plan::PlanFile file,
      plan::MakePlanFile(problem.instance, out.result, planner, "self-plan",
                         problem.windows));
  file.extra.push_back(plan::EncodeRequestTable(problem.requests));
  LOOM_ASSIGN_OR_RETURN(
      out.runtime, vmm::ToRuntimePlan(file, "self-plan", options.granularity));
  out.instance = std::move(problem.instance);
  out.note =
      problem.steady_iteration < 0
          ? "whole trace"
          : fmt::format("steady-state iteration #{}", problem.steady_iteration);
  return out;
}

}  // namespace loom::whatif
