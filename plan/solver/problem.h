// Problem: the planner's normalised view of an Instance (pure C++).
//
// Every placement algorithm (best fit, memory layers, exact search, local
// search) works on a Problem rather than on the Instance itself:
//  - sizes are rounded up to `size_round` and alignments raised to
//    `min_alignment` (PlannerOptions), so a placement of the Problem is a
//    placement of the Instance with those reservations;
//  - time is compressed to slots: the distinct interval end points
//    t_0 < t_1 < ... < t_S, slot j being [t_j, t_{j+1}). A buffer is live in
//    a contiguous run of slots, or in two runs when a cyclic lifetime wraps
//    around the period (Instance::period; LiveIntervals).
// Two buffers conflict iff they share a slot. Buffer i of the Problem is
// buffer i of the Instance.
//
// Placement is the result type shared by the algorithms: one offset per
// buffer and the peak (max offset + rounded size).
#ifndef LOOM_PLAN_SOLVER_PROBLEM_H_
#define LOOM_PLAN_SOLVER_PROBLEM_H_

#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"
#include "plan/solver/instance.h"

namespace loom::plan {

// A run of time slots [lo, hi), lo < hi.
struct SlotSpan {
  int32_t lo = 0;
  int32_t hi = 0;
};

struct Placement {
  std::vector<uint64_t> offsets;  // one per buffer
  uint64_t peak = 0;              // max offset + (rounded) size
};

class Problem {
 public:
  // Largest rounded size or alignment accepted: 2^56 bytes (offsets of a
  // plan then stay far from 2^64 even with every buffer stacked).
  static constexpr uint64_t kMaxBytes = uint64_t{1} << 56;

  // Builds the view. Fails on an invalid instance (ValidateInstance), a
  // rounding or alignment that is zero or not a power of two, sizes beyond
  // kMaxBytes after rounding, or a total size (plus alignment padding)
  // beyond 2^62, so that no offset a placement computes can overflow.
  static StatusOr<Problem> Make(const Instance& instance,
                                uint64_t size_round = 1,
                                uint64_t min_alignment = 1);

  size_t num_buffers() const { return items_.size(); }
  int32_t num_slots() const { return num_slots_; }
  int64_t period() const { return period_; }

  uint64_t size(size_t i) const { return items_[i].size; }
  uint64_t alignment(size_t i) const { return items_[i].alignment; }
  // Live time in the instance's units (both runs for a wrapped lifetime).
  int64_t duration(size_t i) const { return items_[i].duration; }
  // First time step of the lifetime (the instance's `start`).
  int64_t start(size_t i) const { return items_[i].start; }
  std::span<const SlotSpan> spans(size_t i) const {
    return {items_[i].spans, items_[i].num_spans};
  }
  // Time at which slot j begins.
  int64_t slot_time(int32_t j) const { return slot_times_[j]; }

  // Max over slots of the live (rounded) bytes: no placement can do better.
  uint64_t lower_bound() const { return lower_bound_; }
  // Live (rounded) bytes in each slot.
  const std::vector<uint64_t>& slot_load() const { return slot_load_; }
  uint64_t total_bytes() const { return total_bytes_; }

  // For each buffer, the max over its lifetime of slot_load().
  std::vector<uint64_t> MaxLoadOverLifetime() const;

  // Peak of `offsets` (max offset + size); REQUIRES one offset per buffer.
  uint64_t PeakOf(std::span<const uint64_t> offsets) const;

 private:
  struct Item {
    uint64_t size = 0;
    uint64_t alignment = 1;
    int64_t duration = 0;
    int64_t start = 0;
    SlotSpan spans[2];
    uint8_t num_spans = 0;
  };
  std::vector<Item> items_;
  std::vector<int64_t> slot_times_;  // num_slots_ + 1 entries
  std::vector<uint64_t> slot_load_;
  int32_t num_slots_ = 0;
  int64_t period_ = 0;
  uint64_t lower_bound_ = 0;
  uint64_t total_bytes_ = 0;
};

// Rounds `value` up to a multiple of the power of two `alignment`.
inline uint64_t AlignUp(uint64_t value, uint64_t alignment) {
  return (value + alignment - 1) & ~(alignment - 1);
}

}  // namespace loom::plan

#endif  // LOOM_PLAN_SOLVER_PROBLEM_H_
