#include "whatif/loom/auto_replay.h"

#include <fmt/format.h>

#include <algorithm>

#include "base/text.h"
#include "plan/make_plan.h"
#include "whatif/loom/self_plan.h"

namespace loom::whatif {

StatusOr<AutoReplayResult> ReplayAutoMode(const plan::Trace& trace,
                                          const AutoReplayOptions& given) {
  AutoReplayOptions options = given;
  options.granularity =
      plan::ResolveGranule(options.granularity, trace.header.granularity);
  const int64_t k = options.record_iterations;
  const int64_t switch_at = options.switch_at < 0 ? k + 1 : options.switch_at;
  if (k < 1 || switch_at < k || options.planned_iterations < 0) {
    return InvalidArgumentError(
        "auto mode: record {} iterations (>= 1), switch before iteration {} "
        "(>= {}), {} iterations after it (>= 0)",
        k, switch_at, k, options.planned_iterations);
  }
  AutoReplayResult out;
  out.switch_at = switch_at;
  // What auto mode plans: the trace written at the end of iteration K - 1.
  LOOM_ASSIGN_OR_RETURN(RepeatedTrace first_k,
                        RepeatSteadyIteration(trace, RepeatOptions{k, 0}));
  plan::Trace recorded = std::move(first_k.trace);
  // The run: every complete iteration of the trace (the run's own, even
  // past the K planned: an early iteration that makes persistent state, as
  // an optimizer's first step does, must not be repeated), then copies of
  // the last one up to the switch and for planned_iterations after it.
  const int64_t complete = CompleteIterations(trace, k);
  LOOM_ASSIGN_OR_RETURN(
      RepeatedTrace run,
      RepeatSteadyIteration(
          trace,
          RepeatOptions{complete,
                        std::max<int64_t>(0, switch_at - complete +
                                                 options.planned_iterations)}));
  SelfPlanOptions plan_options;
  plan_options.time_limit_seconds = options.time_limit_seconds;
  plan_options.granularity = options.granularity;
  plan_options.include_persistent = false;  // session.py's auto mode
  StatusOr<SelfPlan> planned = PlanTraceForRuntime(recorded, plan_options);
  if (!planned.ok()) return planned.status().WithContext("planning");
  out.plan_note = fmt::format(
      "planned from the first {} iterations: the {} ({}, peak {}), installed "
      "before iteration {}",
      k, planned->note, planned->result.algorithm,
      FormatBytes(planned->result.peak_bytes), switch_at);
  out.planning_seconds = planned->result.seconds;
  out.plan_peak_bytes = planned->result.peak_bytes;
  // As libloom does before auto mode installs it.
  if (options.check_plan) {
    StatusOr<PlanCheck> check = CheckPlanOnRecording(
        recorded, planned->runtime, options.granularity, options.stitch);
    if (!check.ok()) return check.status();
    out.check = *check;
    out.declined = !check->earns_its_place;
    if (out.declined) out.plan_note += "; declined: " + check->Summary();
  }

  LoomSimOptions loom;
  loom.backend = options.backend;
  loom.granularity = options.granularity;
  loom.capacity = options.capacity;
  loom.check_data = options.check_data;
  loom.names = run.trace.names;
  loom.stitch = options.stitch;
  if (!out.declined) {
    loom.switch_plan = std::move(planned->runtime);
    loom.switch_at = switch_at;
    loom.record_capacity = run.trace.events.size();
    loom.replan = ReplanOptionsFor(plan_options);  // auto mode re-plans
  }
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<LoomSimAllocator> allocator,
                        LoomSimAllocator::Create(std::move(loom)));
  ReplayOptions replay_options;
  replay_options.check_invariants = options.check_invariants;
  replay_options.skip_failed_allocations = options.skip_failed_allocations;
  replay_options.max_samples = 0;
  LOOM_ASSIGN_OR_RETURN(out.replay,
                        Replay(run.trace, *allocator, replay_options));
  out.phases = allocator->switch_report();
  if (out.declined) {
    // Nothing switched: the whole run is the unplanned phase.
    out.phases.unplanned_peak_reserved = out.replay.peak_reserved;
    out.phases.unplanned_peak_allocated = out.replay.peak_allocated;
  }
  if (!out.phases.error.empty()) {
    return InternalError("installing the plan before iteration {}: {}",
                         switch_at, out.phases.error);
  }
  out.stats = allocator->loom_stats();
  out.corrupted = allocator->corrupted();
  run.trace = plan::Trace{};
  out.extension = std::move(run);
  return out;
}

}  // namespace loom::whatif
