// GapIndex: which address ranges are used during a time span (pure C++).
//
// The data structure behind every greedy placement in the planner. Buffers
// are inserted one at a time with their slot spans (Problem) and address
// range; a query returns the union of the address ranges of all inserted
// buffers that share a slot with the queried spans, as sorted, coalesced
// ranges, from which best fit / first fit pick a gap.
//
// Layout: a segment tree over time slots. Every node keeps two coalesced
// sets of address ranges:
//   cover(v): buffers for which v is a canonical node (they span v's time);
//   sub(v):   every buffer with a canonical node in v's subtree (plus
//             possibly buffers that span v; harmless, they overlap v too).
// A query combines sub() of its canonical nodes and cover() of their
// ancestors: O(log S) sets. Because the sets are coalesced, a densely packed
// region of memory is one range however many buffers it holds. Find()
// intersects free intervals set by set (sets with the fewest ranges first),
// dropping every hole too small for the request at once and searching later
// sets only inside the surviving holes (galloping), so queries stay small
// where the XLA-style scan over all time-overlapping buffers costs O(n)
// each (O(n^2) in all); both choose the same offsets
// (bench/results/planner.md). Insert costs O(log S) set insertions. There
// is no removal: algorithms that undo placements rebuild the index.
#ifndef LOOM_PLAN_SOLVER_GAP_INDEX_H_
#define LOOM_PLAN_SOLVER_GAP_INDEX_H_

#include <cstdint>
#include <span>
#include <vector>

#include "plan/solver/problem.h"

namespace loom::plan {

// A half-open address range [lo, hi).
struct AddressRange {
  uint64_t lo = 0;
  uint64_t hi = 0;
  friend bool operator==(const AddressRange&, const AddressRange&) = default;
};

enum class FitRule {
  kBestFit,   // the smallest free gap that fits (lowest on ties), else on top
  kFirstFit,  // the lowest free gap that fits, else on top
};

class GapIndex {
 public:
  // REQUIRES: num_slots >= 0.
  explicit GapIndex(int32_t num_slots);

  // Marks [lo, hi) used during `spans`. REQUIRES: lo < hi, spans inside
  // [0, num_slots).
  void Insert(std::span<const SlotSpan> spans, uint64_t lo, uint64_t hi);

  // The used address ranges during `spans`, sorted and coalesced, in `out`
  // (overwritten).
  void Occupied(std::span<const SlotSpan> spans,
                std::vector<AddressRange>* out) const;

  // An offset, multiple of `alignment`, at which `size` bytes are free
  // during `spans`, chosen by `rule`. `limit` > 0 restricts the choice to
  // gaps ending at or below `limit` and returns UINT64_MAX if none fits
  // there; with limit 0 the answer is the top when no gap fits.
  // REQUIRES: size > 0, alignment a power of two.
  uint64_t Find(std::span<const SlotSpan> spans, uint64_t size,
                uint64_t alignment, FitRule rule, uint64_t limit = 0) const;

  int32_t num_slots() const { return num_slots_; }

 private:
  using RangeSet = std::vector<AddressRange>;
  static void Add(RangeSet& set, uint64_t lo, uint64_t hi);
  void Gather(std::span<const SlotSpan> spans,
              std::vector<AddressRange>* out) const;

  int32_t num_slots_;
  int32_t leaves_;               // power of two >= num_slots_
  std::vector<RangeSet> sub_;    // 2 * leaves_ nodes (1 is the root)
  std::vector<RangeSet> cover_;  // internal nodes only (leaves: sub_)
  struct Cursor {
    const AddressRange* next;
    const AddressRange* end;
  };
  void CollectSets(std::span<const SlotSpan> spans) const;

  mutable std::vector<Cursor> sets_;
  mutable std::vector<AddressRange> free_, next_free_;
};

}  // namespace loom::plan

#endif  // LOOM_PLAN_SOLVER_GAP_INDEX_H_
