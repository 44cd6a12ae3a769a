#include "plan/planning_problem.h"

#include <algorithm>
#include <cstdint>
#include <map>

#include "plan/analysis/periodicity.h"

namespace loom::plan {

StatusOr<PlanScope> ParsePlanScope(std::string_view text) {
  if (text == "auto") return PlanScope::kAuto;
  if (text == "iteration") return PlanScope::kIteration;
  if (text == "trace") return PlanScope::kTrace;
  return InvalidArgumentError("plan scope '{}' is not auto, iteration or trace",
                              text);
}

StatusOr<PlanningProblem> BuildPlanningProblem(
    const Workload& workload, const WorkloadAnalysis& analysis,
    const PlanningProblemOptions& options) {
  if (workload.events == 0) {
    return InvalidArgumentError("the workload is empty");
  }
  PlanScope scope = options.scope;
  if (scope == PlanScope::kAuto) {
    scope = workload.iteration_source == IterationSource::kMarkers
                ? PlanScope::kIteration
                : PlanScope::kTrace;
  }
  PlanningProblem problem;
  int64_t begin = 0;
  int64_t end = static_cast<int64_t>(workload.events);
  if (scope == PlanScope::kIteration) {
    if (workload.iterations.empty()) {
      return InvalidArgumentError("the workload has no iteration to plan");
    }
    int32_t k = options.steady_iteration;
    if (k < 0) k = analysis.steady_state;
    if (k < 0) k = static_cast<int32_t>(workload.iterations.size()) - 1;
    if (k >= static_cast<int32_t>(workload.iterations.size())) {
      return InvalidArgumentError("iteration {} does not exist ({} iterations)",
                                  k, workload.iterations.size());
    }
    problem.steady_iteration = k;
    begin = workload.iterations[k].begin;
    end = workload.iterations[k].end;
    if (workload.iteration_source == IterationSource::kMarkers) {
      problem.requests.prologue_iterations = k;
    }
  }
  const int64_t period = end - begin;
  problem.begin = begin;
  problem.end = end;
  problem.instance.period = period;
  const uint32_t phases =
      static_cast<uint32_t>(workload.phase_names.size()) + 1;
  auto add_buffer = [&](const Allocation& a, int64_t start, int64_t stop) {
    Buffer b;
    b.id = problem.instance.buffers.size();
    b.start = start;
    b.end = stop;
    b.size = a.size;
    problem.instance.buffers.push_back(b);
    problem.phase_group.push_back(static_cast<uint32_t>(a.alloc_phase + 1) *
                                      phases +
                                  static_cast<uint32_t>(a.free_phase + 1));
    return static_cast<int64_t>(b.id);
  };
  struct WindowSpan {
    int64_t start = 0;
    int64_t end = 0;
  };
  std::map<std::string, WindowSpan> windows;
  // The steady iteration first: its buffers are what early requests map to.
  std::vector<size_t> steady_allocs;  // indices into workload.allocations
  for (size_t i = 0; i < workload.allocations.size(); ++i) {
    const Allocation& a = workload.allocations[i];
    if (a.dynamic) {
      if (a.alloc_time >= begin && a.alloc_time < end) {
        // Keyed by module and the phase its requests open in: a forward
        // request of an MoE layer lives until its backward, a backward one
        // briefly; one window for both would lend nothing.
        std::string name =
            a.alloc_module >= 0 ? workload.names[a.alloc_module] : "dynamic";
        if (a.alloc_phase >= 0) {
          name += "@" + workload.phase_names[a.alloc_phase];
        }
        int64_t s = a.alloc_time - begin;
        int64_t e =
            a.freed() ? std::min(a.free_time - begin, s + period) : period;
        e = std::max(e, s + 1);
        auto [it, inserted] = windows.emplace(name, WindowSpan{s, e});
        if (!inserted) {
          it->second.start = std::min(it->second.start, s);
          it->second.end = std::max(it->second.end, e);
        }
      }
      continue;
    }
    if (a.alloc_time < begin || a.alloc_time >= end) continue;
    int64_t start = a.alloc_time - begin;
    int64_t stop = a.freed() ? a.free_time - begin : period;
    if (stop <= start) stop = start + 1;
    RequestRef ref{a.size, -1, start, stop};
    if (stop - start <= period) ref.buffer = add_buffer(a, start, stop);
    problem.requests.iteration.push_back(ref);
    steady_allocs.push_back(i);
  }
  std::vector<uint64_t> steady_sizes;
  for (const RequestRef& r : problem.requests.iteration)
    steady_sizes.push_back(r.size);

  // Then everything before it, in order, early iterations aligned to it.
  auto persistent = [&](const Allocation& a) {
    return !a.freed() || a.free_time >= end;
  };
  size_t i = 0;
  auto take_persistent = [&](const Allocation& a, RequestRef& ref) {
    if (persistent(a) && options.include_persistent && period > 0) {
      ref.buffer = add_buffer(a, 0, period);
      ref.start = 0;
      ref.end = period;
    }
  };
  // The set-up: before the first iteration (none for a whole-trace plan).
  const int64_t setup_end =
      problem.steady_iteration >= 0 ? workload.iterations.front().begin : begin;
  for (; i < workload.allocations.size(); ++i) {
    const Allocation& a = workload.allocations[i];
    if (a.alloc_time >= setup_end || a.alloc_time >= begin) break;
    if (a.dynamic) continue;
    RequestRef ref{a.size, -1, 0, 0};
    take_persistent(a, ref);
    problem.requests.prologue.push_back(ref);
  }
  // The early iterations, each aligned with the steady one.
  for (int32_t j = 0; j < problem.steady_iteration; ++j) {
    const Iteration& early = workload.iterations[j];
    std::vector<const Allocation*> allocs;
    for (; i < workload.allocations.size(); ++i) {
      const Allocation& a = workload.allocations[i];
      if (a.alloc_time >= early.end || a.alloc_time >= begin) break;
      if (!a.dynamic) allocs.push_back(&a);
    }
    // Align only what dies within the run of iterations: a persistent
    // allocation (e.g. optimizer state made by the first step) must not take
    // the place of the steady request of the same size it sits next to.
    std::vector<uint64_t> sizes;
    std::vector<size_t> aligned_index(allocs.size(), SIZE_MAX);
    for (size_t n = 0; n < allocs.size(); ++n) {
      if (persistent(*allocs[n])) continue;
      aligned_index[n] = sizes.size();
      sizes.push_back(allocs[n]->size);
    }
    Alignment alignment = AlignSequences(sizes, steady_sizes);
    for (size_t n = 0; n < allocs.size(); ++n) {
      const Allocation& a = *allocs[n];
      RequestRef ref{a.size, -1, 0, 0};
      if (persistent(a)) {
        take_persistent(a, ref);
      } else if (alignment.a_to_b[aligned_index[n]] >= 0) {
        const RequestRef& twin =
            problem.requests.iteration[alignment.a_to_b[aligned_index[n]]];
        ref.buffer = twin.buffer;
        ref.start = twin.start;
        ref.end = twin.end;
      } else {
        // No steady twin (e.g. an evaluation step's request): unplanned,
        // with its own lifetime in its iteration's time, so the run time
        // knows how long it is expected to live.
        ref.start = std::max<int64_t>(a.alloc_time - early.begin, 0);
        ref.end = std::max(ref.start + 1, a.free_time - early.begin);
      }
      problem.requests.prologue.push_back(ref);
    }
  }
  // Anything left before the steady iteration (between marked iterations).
  for (; i < workload.allocations.size(); ++i) {
    const Allocation& a = workload.allocations[i];
    if (a.alloc_time >= begin) break;
    if (a.dynamic) continue;
    RequestRef ref{a.size, -1, 0, 0};
    take_persistent(a, ref);
    problem.requests.prologue.push_back(ref);
  }
  if (problem.requests.prologue.empty() && problem.requests.iteration.empty()) {
    return InvalidArgumentError(
        "the workload has no allocation outside dynamic modules to plan");
  }
  for (const auto& [name, span] : windows) {
    // Windows longer than the period cover it all.
    int64_t stop = std::min(span.end, span.start + period);
    problem.windows.push_back(TimeWindow{span.start, stop, name});
  }
  return problem;
}

StatusOr<PlanningProblem> BuildPlanningProblem(
    const Trace& trace, const PlanningProblemOptions& options) {
  const Workload workload = BuildWorkload(trace);
  const WorkloadAnalysis analysis = AnalyzeWorkload(workload);
  LOOM_ASSIGN_OR_RETURN(PlanningProblem problem,
                        BuildPlanningProblem(workload, analysis, options));
  const std::string what =
      problem.steady_iteration < 0
          ? std::string("the whole trace as one iteration")
          : fmt::format("steady-state iteration #{} of {} ({})",
                        problem.steady_iteration, workload.iterations.size(),
                        IterationSourceName(workload.iteration_source));
  problem.note = fmt::format(
      "{}, events [{}, {}): {} buffers, {} prologue and {} iteration requests",
      what, problem.begin, problem.end, problem.instance.buffers.size(),
      problem.requests.prologue.size(), problem.requests.iteration.size());
  return problem;
}

}  // namespace loom::plan
