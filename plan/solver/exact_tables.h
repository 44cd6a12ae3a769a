// Tables of the exact search (exact_search.h), built once per problem:
// internal to the exact search, split out to keep files short.
//
// Sections are the time slots just before some buffer's span ends: every
// maximal set of simultaneously live buffers is the live set of one. A
// buffer belongs to one run of sections (two when its lifetime wraps); its
// envelope is the smallest section range covering them. Conflicts are the
// pairs of buffers sharing a section, found by a sweep in O(n log n +
// pairs). A boundary between sections k and k+1 is cut by every envelope
// crossing it; with no cut the two sides are independent.
#ifndef LOOM_PLAN_SOLVER_EXACT_TABLES_H_
#define LOOM_PLAN_SOLVER_EXACT_TABLES_H_

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "plan/solver/problem.h"

namespace loom::plan::exact_internal {

struct SectionRange {
  int32_t lo = 0;
  int32_t hi = 0;
};

struct SearchTables {
  int32_t num_sections = 0;
  std::vector<std::vector<uint32_t>> members;       // per section
  std::vector<std::array<SectionRange, 2>> ranges;  // per buffer
  std::vector<uint8_t> num_ranges;
  std::vector<SectionRange> env;                // per buffer
  std::vector<std::vector<uint32_t>> overlaps;  // per buffer: conflicts
  std::vector<uint64_t> section_total;          // bytes live per section
  std::vector<int32_t> initial_cuts;            // per section boundary
  std::vector<uint32_t> by_env_lo;     // buffers sorted by envelope start
  std::vector<int32_t> env_lo_sorted;  // their envelope starts

  std::span<const SectionRange> Ranges(size_t i) const {
    return {ranges[i].data(), num_ranges[i]};
  }
};

SearchTables BuildSearchTables(const Problem& problem);

// Conflicting pairs (an upper bound for cyclic instances), in O(n log n).
uint64_t CountConflicts(const Problem& problem);

// Max over a range of values that receive range additions (lazy segment
// tree): the largest section total still to place in a partition.
class RangeMax {
 public:
  void Init(const std::vector<uint64_t>& values) {
    n_ = static_cast<int32_t>(values.size());
    leaves_ = static_cast<int32_t>(
        std::bit_ceil(static_cast<uint32_t>(std::max(n_, 1))));
    max_.assign(2 * leaves_, 0);
    add_.assign(2 * leaves_, 0);
    for (int32_t i = 0; i < n_; ++i)
      max_[leaves_ + i] = static_cast<int64_t>(values[i]);
    for (int32_t v = leaves_ - 1; v > 0; --v)
      max_[v] = std::max(max_[2 * v], max_[2 * v + 1]);
  }
  void Add(int32_t lo, int32_t hi, int64_t delta) {
    Add(1, 0, leaves_, lo, hi, delta);
  }
  int64_t Max(int32_t lo, int32_t hi) const {
    return Max(1, 0, leaves_, lo, hi);
  }

 private:
  void Add(int32_t v, int32_t l, int32_t r, int32_t lo, int32_t hi, int64_t d) {
    if (hi <= l || r <= lo) return;
    if (lo <= l && r <= hi) {
      max_[v] += d;
      add_[v] += d;
      return;
    }
    const int32_t m = (l + r) / 2;
    Add(2 * v, l, m, lo, hi, d);
    Add(2 * v + 1, m, r, lo, hi, d);
    max_[v] = add_[v] + std::max(max_[2 * v], max_[2 * v + 1]);
  }
  int64_t Max(int32_t v, int32_t l, int32_t r, int32_t lo, int32_t hi) const {
    if (hi <= l || r <= lo) return INT64_MIN;
    if (lo <= l && r <= hi) return max_[v];
    const int32_t m = (l + r) / 2;
    const int64_t below =
        std::max(Max(2 * v, l, m, lo, hi), Max(2 * v + 1, m, r, lo, hi));
    return below == INT64_MIN ? below : below + add_[v];
  }
  int32_t n_ = 0;
  int32_t leaves_ = 1;
  std::vector<int64_t> max_;
  std::vector<int64_t> add_;
};

}  // namespace loom::plan::exact_internal

#endif  // LOOM_PLAN_SOLVER_EXACT_TABLES_H_
