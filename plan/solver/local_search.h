// Local search over placement orders (pure C++).
//
// For instances too large for the exact search: an iterated greedy. The
// state is a permutation of the buffers; its placement is best fit in that
// order (best_fit.h), or lowest-first with that order as the tie-break
// preorder (lowest_first.h). Each step takes the buffers that reach the current
// peak (the "critical" ones), moves a few of them earlier in the order by a
// random distance, re-places everything and keeps the new order if its peak
// is no higher (equal peaks are accepted so the search drifts across
// plateaus). The best placement seen is returned when the deadline passes
// (no step is started that would not finish before it, judging by the
// previous step).
// Deterministic for a given seed and number of steps.
#ifndef LOOM_PLAN_SOLVER_LOCAL_SEARCH_H_
#define LOOM_PLAN_SOLVER_LOCAL_SEARCH_H_

#include <cstdint>
#include <span>
#include <vector>

#include "plan/solver/deadline.h"
#include "plan/solver/gap_index.h"
#include "plan/solver/problem.h"

namespace loom::plan {

struct LocalSearchOptions {
  uint64_t seed = 1;
  FitRule rule = FitRule::kBestFit;
  // Stop early once the peak reaches this (e.g. the lower bound).
  uint64_t target = 0;
  // Stop after this many steps (0: until the deadline).
  int64_t max_steps = 0;
};

struct LocalSearchResult {
  Placement best;
  std::vector<uint32_t> order;  // the order that produced `best`
  int64_t steps = 0;
  int64_t improvements = 0;
};

// Improves `order` (a permutation of the buffers) until the deadline.
// REQUIRES: order is a permutation of [0, num_buffers).
LocalSearchResult ImproveOrder(const Problem& problem,
                               std::vector<uint32_t> order,
                               const LocalSearchOptions& options,
                               const Deadline& deadline);

// The same search over lowest-first preorders (lowest_first.h): `order`
// lists the buffers by rank (the tie-break order); each step re-runs
// PlaceLowestFirst. `best.offsets` is empty if not even the first
// placement finished before the deadline.
// REQUIRES: order is a permutation of [0, num_buffers).
LocalSearchResult ImproveLowestFirst(const Problem& problem,
                                     std::vector<uint32_t> order,
                                     const LocalSearchOptions& options,
                                     const Deadline& deadline);

}  // namespace loom::plan

#endif  // LOOM_PLAN_SOLVER_LOCAL_SEARCH_H_
