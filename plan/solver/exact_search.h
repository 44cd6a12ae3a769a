// Exact search: "does every buffer fit below capacity C?" (pure C++).
//
// A complete depth-first search in the spirit of MiniMalloc (Moffitt,
// ASPLOS 2023), for small hard instances where greedy orders end 30-40%
// above the lower bound. The techniques:
//  - canonical placements: buffers are placed in non-decreasing offset
//    order, each at the lowest offset above every placed buffer it
//    conflicts with (its "min offset"), and buffers at equal offsets in a
//    fixed preorder, so each packing is reached once;
//  - cross-section pruning: sections are the maximal sets of buffers live
//    together (the live set just before some buffer ends). For every
//    section, (height already used) + (sizes still to place) <= C, where
//    the used height is at least the current offset (offsets only grow)
//    and at least the smallest min offset of the unplaced buffers;
//  - dominance: a buffer is never placed at or above the lowest top any
//    unplaced buffer could reach (that would leave a gap it fits in);
//  - dynamic decomposition: once no unplaced buffer straddles a section
//    boundary, both sides are solved independently;
//  - ordering: children in (min offset, preorder) order; several static
//    preorders (by lifetime width, area and section total) are tried in
//    round robin with a node limit that doubles each round.
// Cyclic instances work unchanged: a wrapped buffer belongs to sections at
// both ends of the iteration (it then never lets the search decompose
// across the wrap, which is conservative and sound).
//
// The search is exponential in the worst case: run it under a Deadline.
#ifndef LOOM_PLAN_SOLVER_EXACT_SEARCH_H_
#define LOOM_PLAN_SOLVER_EXACT_SEARCH_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "plan/solver/deadline.h"
#include "plan/solver/problem.h"

namespace loom::plan {

enum class SearchOutcome {
  kFound,       // a placement with peak <= capacity
  kInfeasible,  // proved: no placement fits in capacity
  kTimeout,     // the deadline passed first
  kTooLarge,    // declined: more conflicts than options.max_conflicts
};

struct ExactOptions {
  uint64_t capacity = 0;  // REQUIRED: > 0
  // Static preorders tried in round robin. Letters are descending sort
  // keys: W lifetime width, A area (size x width), T max section total,
  // Z size, S start (ascending).
  std::vector<std::string> preorders = {"WAT", "TAW", "TWA"};
  // Optional: one entry per buffer, kFree or the offset the buffer must
  // keep (used to re-solve part of a plan with the rest held in place).
  std::vector<uint64_t> fixed;
  // The search declines (outcome kTooLarge) instances with more
  // conflicting pairs than this: its tables would not fit in memory.
  uint64_t max_conflicts = uint64_t{60} << 20;
  static constexpr uint64_t kFree = UINT64_MAX;
};

struct ExactResult {
  SearchOutcome outcome = SearchOutcome::kTimeout;
  Placement placement;     // valid when outcome == kFound
  int64_t nodes = 0;       // search nodes visited
  uint64_t conflicts = 0;  // conflicting pairs of the instance
};

// The search's tables (sections, conflicts) for one problem, built once and
// reused across capacities (the minimising loop probes several).
class ExactSearch {
 public:
  // Builds the tables, unless the problem has more than `max_conflicts`
  // conflicting pairs (then every Solve answers kTooLarge). `fixed`: as
  // ExactOptions::fixed. REQUIRES: `problem` outlives this object.
  ExactSearch(const Problem& problem, std::vector<uint64_t> fixed = {},
              uint64_t max_conflicts = ExactOptions{}.max_conflicts);
  ~ExactSearch();
  ExactSearch(const ExactSearch&) = delete;
  ExactSearch& operator=(const ExactSearch&) = delete;

  // REQUIRES: capacity > 0; preorders non-empty, letters from "WATZS".
  ExactResult Solve(uint64_t capacity,
                    const std::vector<std::string>& preorders,
                    const Deadline& deadline);

  uint64_t conflicts() const { return conflicts_; }

  // The number of conflicting pairs of `problem` (an upper bound for
  // cyclic instances), in O(n log n): what building the tables costs.
  static uint64_t CountConflicts(const Problem& problem);

 private:
  class Solver;
  const Problem& problem_;
  uint64_t conflicts_ = 0;
  std::unique_ptr<Solver> solver_;
};

// Searches for a placement of `problem` with peak <= options.capacity.
// REQUIRES: options.capacity > 0; preorders non-empty, letters from
// "WATZS"; fixed empty or one per buffer, fixed offsets aligned.
ExactResult SolveAtCapacity(const Problem& problem, const ExactOptions& options,
                            const Deadline& deadline);

}  // namespace loom::plan

#endif  // LOOM_PLAN_SOLVER_EXACT_SEARCH_H_
