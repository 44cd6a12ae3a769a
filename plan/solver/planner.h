// The planner: picks and runs placement algorithms on an Instance within a
// time budget and returns the best plan found (pure C++).
//
// kAuto runs, cheapest first, until the plan is optimal or time is up:
//  1. constructive heuristics: STAlloc memory layers, best fit in size
//     order, lowest-first with the preorders TAW/AWT/TWA (each capped at a
//     quarter of the time left), then the other best-fit orders (first fit
//     and best fit);
//  2. if a capacity is given and nothing fits yet: the exact search at that
//     capacity ("does it fit in C bytes?");
//  3. minimisation (unless options.minimize is false), while the instance
//     is small enough for the exact search (conflicting pairs <=
//     ExactOptions::max_conflicts): the exact search at the lower bound (a
//     quarter of the time left), then "is there anything better?" at the
//     best peak minus the quantum (the gcd of sizes and alignments: every
//     optimum is a multiple of it), until a proof of infeasibility (the
//     plan is then optimal) or two probes in a row time out;
//  4. the local search (local_search.h) for the time that is left.
// Cyclic instances are first rotated so that the iteration boundary falls
// where the fewest bytes are live (offsets carry over unchanged).
// Every plan returned satisfies the verifier (plan/solver/verifier.h); the planner
// checks its own result with it and fails with an internal error
// otherwise. Progress goes to stderr only when stderr is a terminal and
// options.progress is set.
#ifndef LOOM_PLAN_SOLVER_PLANNER_H_
#define LOOM_PLAN_SOLVER_PLANNER_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "plan/solver/granules.h"
#include "plan/solver/instance.h"

namespace loom::plan {

enum class Algorithm {
  kAuto,         // the portfolio above
  kBestFit,      // best fit / first fit, every order; keep the best
  kLowestFirst,  // lowest-first with several preorders; keep the best
  kLayers,       // STAlloc grouping and memory layers only
  kExact,        // best fit, then the exact search (capacity / minimise)
  kLocalSearch,  // best fit, then the local search until the time limit
};

// "auto", "best-fit", "lowest-first", "layers", "exact", "local-search".
std::string_view AlgorithmName(Algorithm algorithm);
StatusOr<Algorithm> ParseAlgorithm(std::string_view name);

struct PlannerOptions {
  Algorithm algorithm = Algorithm::kAuto;
  double time_limit_seconds = 10;
  // 0: none. Otherwise the plan must fit in `capacity` bytes; the result
  // says whether it does (PlanResult::fits).
  uint64_t capacity = 0;
  // Keep searching for a lower peak after a fitting plan is found.
  bool minimize = true;
  uint64_t size_round = 1;     // sizes rounded up to a multiple (e.g. 512)
  uint64_t min_alignment = 1;  // offsets multiples of this (power of two)
  uint64_t granule_bytes = kDefaultGranule;
  // Optional phase-group key per buffer for the memory-layer algorithm
  // (kNoGroup from layers.h: none); empty when unknown.
  std::vector<uint32_t> group;
  uint64_t seed = 1;
  bool progress = true;  // report on stderr when it is a terminal
};

// One algorithm run, for reports.
struct Attempt {
  std::string algorithm;
  uint64_t peak_bytes = 0;  // 0 when it found no plan (timeout, infeasible)
  double seconds = 0;
  std::string note;  // e.g. "infeasible", "timeout"
};

struct PlanResult {
  std::vector<uint64_t> offsets;   // one per buffer of the instance
  std::vector<uint64_t> sizes;     // reserved (rounded) size per buffer
  uint64_t peak_bytes = 0;         // max offset + reserved size
  uint64_t lower_bound_bytes = 0;  // max live reserved bytes over time
  uint64_t peak_granules = 0;      // granules touched by live buffers, max
  uint64_t granule_bytes = 0;
  std::string algorithm;       // the run that produced the plan
  double seconds = 0;          // total planning time
  double seconds_to_best = 0;  // when the returned plan was found
  // True when no plan can have a lower peak: peak == lower bound, or the
  // exact search proved that peak - 1 bytes is not enough.
  bool optimal = false;
  // Capacity mode: the plan fits (always true without a capacity).
  bool fits = true;
  // Capacity mode: proved that nothing fits in the capacity.
  bool capacity_infeasible = false;
  std::vector<Attempt> attempts;
};

// Plans `instance`. Fails on an invalid instance or options.
StatusOr<PlanResult> PlanInstance(const Instance& instance,
                                  const PlannerOptions& options);

}  // namespace loom::plan

#endif  // LOOM_PLAN_SOLVER_PLANNER_H_
