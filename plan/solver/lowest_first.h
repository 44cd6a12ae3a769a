// Lowest-first placement: a skyline greedy (pure C++).
//
// Repeatedly places, among the buffers not yet placed, the one that can sit
// lowest: its offset is the top of the skyline (the highest placed buffer)
// over its lifetime, and ties go to the buffer ranked first by a static
// preorder (MiniMalloc's letters: T max live load over the lifetime, A
// area, W lifetime width, Z size, S start). This is exactly the first
// descent of the exact search (exact_search.h) with an unbounded capacity,
// but runs in O(n log n): a lazy priority queue over (offset, rank) and a
// segment tree over time slots holding the skyline (range max, range
// assign). Placements never leave a hole below a buffer that another
// buffer could fill at the time, which makes it strong on real traces
// (0.2% above the lower bound on idealloc's S_1, where best fit is 2.5%).
#ifndef LOOM_PLAN_SOLVER_LOWEST_FIRST_H_
#define LOOM_PLAN_SOLVER_LOWEST_FIRST_H_

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "plan/solver/deadline.h"
#include "plan/solver/problem.h"

namespace loom::plan {

// Preorder ranks: rank[i] is buffer i's position when sorted by `keys`
// (each letter a descending key among "TAWZ", or "S" for ascending start;
// ties by index). REQUIRES: keys only use those letters.
std::vector<uint32_t> PreorderRanks(const Problem& problem,
                                    std::string_view keys);

// Places every buffer lowest-first with ties broken by `rank` (one per
// buffer, all distinct). Returns nullopt if `deadline` passes first (the
// work is O(n log n) per time a buffer's lowest offset rises, which on
// some real traces is thousands of times per buffer).
// REQUIRES: rank.size() == num_buffers.
std::optional<Placement> PlaceLowestFirst(
    const Problem& problem, std::span<const uint32_t> rank,
    const Deadline& deadline = Deadline::Infinite());

}  // namespace loom::plan

#endif  // LOOM_PLAN_SOLVER_LOWEST_FIRST_H_
