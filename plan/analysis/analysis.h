// Workload analysis: lifetime classes, peaks, iterations and regularity of a
// workload (pure C++). Backs `loom_tool analyze`.
//
// Lifetime classes, after STAlloc (research/stalloc.md §1.2, §2.6). Every
// allocation gets exactly one, by the first rule that applies:
//  1. dynamic         allocated while a module marked dynamic was open;
//  2. persistent      never freed, or live through a whole iteration: some
//                     iteration j has alloc_time <= begin_j and
//                     free_time >= end_j (weights, gradients, optimizer
//                     state; head allocations freed after iteration 0 ends);
//  3. dynamic         its size or presence varies across iterations: in the
//                     alignment of two consecutive complete iterations (by
//                     alloc sizes, see Regularity below) it has no partner;
//  4. cross_iteration allocated in iteration i (or the head, i = -1), freed
//                     in iteration i + 1 without covering a whole iteration;
//  5. scoped          allocated and freed in the same iteration, in
//                     different phases (forward activations kept for
//                     backward);
//  6. transient       same iteration, same phase.
//
// Regularity of iteration k: the fraction of its allocations that have a
// partner in iteration k - 1 when the two sequences of allocation sizes are
// aligned by a longest common subsequence (a diff), so one extra request does
// not shift every later match. The steady-state iteration is the complete
// iteration k >= 1 with at least one allocation (and a complete
// predecessor) with the best regularity,
// the latest on ties; with no such pair, the last complete iteration, and no
// regularity.
//
// Peaks: max over time of the live bytes (the lower bound for any allocator),
// and the same with every allocation rounded up to 512 B (PyTorch's
// rounding) and to 2 MiB granules (one VMM granule per allocation at least).
#ifndef LOOM_PLAN_ANALYSIS_ANALYSIS_H_
#define LOOM_PLAN_ANALYSIS_ANALYSIS_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "plan/analysis/workload.h"

namespace loom::plan {

enum class LifetimeClass : uint8_t {
  kPersistent = 0,
  kScoped = 1,
  kTransient = 2,
  kDynamic = 3,
  kCrossIteration = 4,
};
inline constexpr size_t kNumLifetimeClasses = 5;

// "persistent", "scoped", "transient", "dynamic", "cross_iteration".
std::string_view LifetimeClassName(LifetimeClass c);

struct ClassTotals {
  uint64_t count = 0;
  uint64_t bytes = 0;
};

struct IterationStats {
  uint64_t allocs = 0;  // allocations made in the iteration
  // Allocations with a partner in the previous iteration (see Regularity);
  // unset for the first iteration and where either one is incomplete.
  std::optional<uint64_t> matched_previous;
  uint64_t peak_live_bytes = 0;  // max live bytes within the iteration
};

struct WorkloadAnalysis {
  std::vector<LifetimeClass> classes;  // one per Workload::allocations
  std::array<ClassTotals, kNumLifetimeClasses> totals{};
  uint64_t allocs = 0;
  uint64_t frees = 0;
  uint64_t never_freed = 0;
  uint64_t distinct_sizes = 0;
  uint64_t peak_live_bytes = 0;
  int64_t peak_time = -1;  // first event time at the peak
  uint64_t peak_live_bytes_512 = 0;
  uint64_t peak_live_bytes_2mib = 0;
  std::vector<IterationStats> iterations;  // per Workload::iterations
  int32_t steady_state = -1;               // index into iterations, -1: none
  std::optional<double> regularity;        // of the steady-state iteration
};

WorkloadAnalysis AnalyzeWorkload(const Workload& workload);

// Max over time of the live bytes, each allocation rounded up to a multiple
// of `round_to`. Sets *peak_time (if given) to the first time it is reached.
uint64_t PeakLiveBytes(const Workload& workload, uint64_t round_to = 1,
                       int64_t* peak_time = nullptr);

// A terminal-readable report (several lines).
std::string FormatAnalysisText(const Workload& workload,
                               const WorkloadAnalysis& analysis);

// JSON with the keys events, events_by_kind, allocs, frees, never_freed,
// distinct_sizes, peak_live_bytes, peak_live_bytes_512, peak_live_bytes_2mib,
// iterations (a count), iteration_source, period, iteration_boundaries,
// steady_state, regularity, phases_inferred, classes (name -> {count,
// bytes}).
std::string FormatAnalysisJson(const Workload& workload,
                               const WorkloadAnalysis& analysis,
                               int indent = 2);

}  // namespace loom::plan

#endif  // LOOM_PLAN_ANALYSIS_ANALYSIS_H_
