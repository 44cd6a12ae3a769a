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
  // Keyed by module and the phase its requests open in: a forward request
  // of an MoE layer lives until its backward, a backward one briefly; one
  // window for both would lend nothing. The module is the innermost one
  // marked dynamic: the run time sees only their markers (a recorder's
  // trace also names the modules inside).
  auto window_name = [&](const Allocation& a) {
    std::string name = a.alloc_dynamic_module >= 0
                           ? workload.names[a.alloc_dynamic_module]
                           : "dynamic";
    if (a.alloc_phase >= 0) name += "@" + workload.phase_names[a.alloc_phase];
    return name;
  };
  // A request that lives more than a period cannot repeat every iteration
  // in one plan.
  auto long_lived = [&](const Allocation& a) {
    return period > 0 && (!a.freed() || a.free_time - a.alloc_time > period);
  };
  // A request of k: its lifetime in k's time, [alloc - B, free - B), to
  // the period's end if never freed.
  auto steady_span = [&](const Allocation& a) {
    const int64_t start = a.alloc_time - begin;
    const int64_t stop = a.freed() ? a.free_time - begin : period;
    return std::pair<int64_t, int64_t>{start, std::max(stop, start + 1)};
  };
  // Which windows' requests get slots, from the recorded iterations whose
  // requests there line up with k's (as many that live less than a
  // period): those whose sizes vary (an expert's follow its routing) by at
  // most kVaryingSlack of the window's bytes get slots of the largest size
  // seen at each position. Sizes that never vary: the dynamic space's best
  // fit finds the same blocks every iteration (no fragmentation to take
  // out); sizes that vary more: slots that large would hold more than the
  // dynamic space. Both stay with the dynamic space (in the window's idle
  // bytes), as with one recorded iteration (no evidence either way).
  constexpr uint64_t kVaryingSlack = 8;  // 1/8
  std::map<std::string, std::vector<uint64_t>> largest;
  if (options.plan_dynamic) {
    std::map<std::pair<int32_t, std::string>, std::vector<uint64_t>> made;
    for (const Allocation& a : workload.allocations) {
      if (!a.dynamic || long_lived(a)) continue;
      if (problem.steady_iteration >= 0 && a.alloc_iteration < 0) continue;
      const int32_t iteration =
          problem.steady_iteration >= 0 ? a.alloc_iteration : 0;
      made[{iteration, window_name(a)}].push_back(a.size);
    }
    const int32_t k = std::max(problem.steady_iteration, 0);
    for (const auto& [key, mine] : made) {
      if (key.first != k) continue;
      std::vector<uint64_t> most = mine;
      for (const auto& [other, theirs] : made) {
        if (other.second != key.second || theirs.size() != mine.size())
          continue;
        for (size_t n = 0; n < most.size(); ++n)
          most[n] = std::max(most[n], theirs[n]);
      }
      uint64_t own = 0, high = 0;
      for (size_t n = 0; n < most.size(); ++n) {
        own += mine[n];
        high += most[n];
      }
      if (high > own && (high - own) * kVaryingSlack <= own)
        largest[key.second] = std::move(most);
    }
  }
  std::map<std::string, DynamicSequence> dynamic;
  // Per window, the positions in its sequence of k's requests that live
  // less than a period (what early iterations line up with).
  std::map<std::string, std::vector<size_t>> repeating;
  // The steady iteration first: its buffers are what early requests map to.
  std::vector<size_t> steady_allocs;  // indices into workload.allocations
  for (size_t i = 0; i < workload.allocations.size(); ++i) {
    const Allocation& a = workload.allocations[i];
    if (a.dynamic) {
      if (a.alloc_time >= begin && a.alloc_time < end) {
        const std::string name = window_name(a);
        int64_t s = a.alloc_time - begin;
        int64_t e =
            a.freed() ? std::min(a.free_time - begin, s + period) : period;
        e = std::max(e, s + 1);
        auto [it, inserted] = windows.emplace(name, WindowSpan{s, e});
        if (!inserted) {
          it->second.start = std::min(it->second.start, s);
          it->second.end = std::max(it->second.end, e);
        }
        if (largest.count(name) != 0) {
          WindowRequests& steady = dynamic[name].steady;
          const auto [start, stop] = steady_span(a);
          RequestRef ref{a.size, -1, start, stop};
          if (!long_lived(a)) {
            std::vector<size_t>& positions = repeating[name];
            const std::vector<uint64_t>& sizes = largest[name];
            Allocation slot = a;
            if (positions.size() < sizes.size())
              slot.size = std::max(a.size, sizes[positions.size()]);
            ref.size = slot.size;
            ref.buffer = add_buffer(slot, start, stop);
            positions.push_back(steady.requests.size());
          }
          steady.requests.push_back(ref);
          steady.calls.push_back(a.dynamic_call);
        }
      }
      continue;
    }
    if (a.alloc_time < begin || a.alloc_time >= end) continue;
    const auto [start, stop] = steady_span(a);
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
  std::vector<uint64_t> setup_sizes;  // its transients, for the note
  for (; i < workload.allocations.size(); ++i) {
    const Allocation& a = workload.allocations[i];
    if (a.alloc_time >= setup_end || a.alloc_time >= begin) break;
    if (a.dynamic) continue;
    RequestRef ref{a.size, -1, 0, 0};
    take_persistent(a, ref);
    if (!persistent(a)) setup_sizes.push_back(a.size);
    problem.requests.prologue.push_back(ref);
  }
  // Placing such an iteration at its twins' places was measured and not
  // kept (docs/design.md, the plan check): it is only reported.
  if (!setup_sizes.empty() && !steady_sizes.empty()) {
    problem.setup_aligned = AlignSequences(setup_sizes, steady_sizes).matched;
  }
  // The early iterations, each aligned with the steady one.
  for (int32_t j = 0; j < problem.steady_iteration; ++j) {
    const Iteration& early = workload.iterations[j];
    std::vector<const Allocation*> allocs;
    std::map<std::string, std::vector<const Allocation*>> dynamic_allocs;
    for (; i < workload.allocations.size(); ++i) {
      const Allocation& a = workload.allocations[i];
      if (a.alloc_time >= early.end || a.alloc_time >= begin) break;
      if (!a.dynamic) {
        allocs.push_back(&a);
      } else if (options.plan_dynamic) {
        const std::string name = window_name(a);
        if (dynamic.count(name) != 0) dynamic_allocs[name].push_back(&a);
      }
    }
    // Each window's requests: persistent ones (state made inside a module
    // left open) planned as persistent buffers; the others, call by call
    // of the window's module, at the slot of k's request at the same
    // position of the same call when the call made as many as k's (an
    // expert without tokens makes fewer: a call that does not line up
    // takes no slot, whose lifetime would be another request's).
    for (const auto& [name, window_allocs] : dynamic_allocs) {
      DynamicSequence& seq = dynamic[name];
      // Per call, k's slots (their index in seq.steady) and this
      // iteration's requests that could take one.
      std::map<uint32_t, std::vector<size_t>> slots_of_call, mine_of_call;
      for (size_t p : repeating[name])
        slots_of_call[seq.steady.calls[p]].push_back(p);
      for (size_t n = 0; n < window_allocs.size(); ++n) {
        const Allocation& a = *window_allocs[n];
        if (!persistent(a) && !long_lived(a))
          mine_of_call[a.dynamic_call].push_back(n);
      }
      std::vector<size_t> twin(window_allocs.size(), SIZE_MAX);
      for (const auto& [call, mine] : mine_of_call) {
        auto slots = slots_of_call.find(call);
        if (slots == slots_of_call.end() || slots->second.size() != mine.size())
          continue;
        for (size_t i = 0; i < mine.size(); ++i)
          twin[mine[i]] = slots->second[i];
      }
      seq.early.resize(j + 1);
      for (size_t n = 0; n < window_allocs.size(); ++n) {
        const Allocation& a = *window_allocs[n];
        RequestRef ref{a.size, -1, 0, 0};
        if (persistent(a)) {
          take_persistent(a, ref);
        } else if (twin[n] != SIZE_MAX &&
                   a.size <= seq.steady.requests[twin[n]].size) {
          // Its own size in its twin's slot.
          ref = seq.steady.requests[twin[n]];
          ref.size = a.size;
        } else {
          ref.start = std::max<int64_t>(a.alloc_time - early.begin, 0);
          ref.end = std::max(ref.start + 1, a.free_time - early.begin);
        }
        seq.early[j].requests.push_back(ref);
        seq.early[j].calls.push_back(a.dynamic_call);
      }
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
  for (auto& [name, seq] : dynamic) {
    seq.window = name;
    // Every early iteration has its sequence (empty: none made there).
    seq.early.resize(problem.requests.prologue_iterations);
    problem.requests.dynamic.push_back(std::move(seq));
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
  const size_t steady = problem.requests.iteration.size();
  if (steady > 0 && 2 * problem.setup_aligned >= steady) {
    problem.note += fmt::format(
        "; the set-up holds an iteration no marker began ({} of its requests "
        "line up with the steady iteration's {}): the plan leaves it to the "
        "dynamic space, beside the region (mark where iterations begin: "
        "loom.watch(model) or loom.begin_iteration())",
        problem.setup_aligned, steady);
  }
  return problem;
}

}  // namespace loom::plan
