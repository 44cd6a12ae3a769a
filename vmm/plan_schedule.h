// PlanSchedule: where and when the plan uses the static region, so that
// requests the plan did not foresee (misses, extra requests, dynamic
// modules) can be placed in bytes the plan leaves idle for as long as they
// are expected to live, without a page or a driver call.
//
// Built once from a RuntimePlan: every planned request (prologue,
// iteration and the dynamic windows' slots, duplicates merged) is an
// occupant holding bytes
// [offset, offset + size rounded to 512) during iteration time
// [start, end), cyclic with the plan's period (persistent buffers hold
// their bytes the whole period). IdleRanges answers: which offsets could
// hold `size` bytes that no occupant uses during [now, until)? It knows
// nothing of what is live at run time (late frees, earlier misses placed
// in idle bytes): the caller checks every candidate with the static
// region's safety check before using it. TimeToNextUse answers the same
// question per granule: how long until the plan uses granule k again, so
// that its page can be lent to a request that ends before then.
#ifndef LOOM_VMM_PLAN_SCHEDULE_H_
#define LOOM_VMM_PLAN_SCHEDULE_H_

#include <cstdint>
#include <limits>
#include <vector>

#include "vmm/runtime_plan.h"

namespace loom::vmm {

class PlanSchedule {
 public:
  static constexpr int64_t kNever = std::numeric_limits<int64_t>::max();

  // REQUIRES: granularity a power of two.
  PlanSchedule(const RuntimePlan& plan, uint64_t granularity);

  // Candidate offsets (multiples of 512) for `size` bytes idle during
  // iteration time [now, until), smallest idle gap first; for each gap its
  // lowest and its highest fitting offset. `until` < 0 (unknown) or a span
  // of a whole period or more: only bytes the plan never uses. At most
  // `max_gaps` gaps.
  std::vector<uint64_t> IdleRanges(uint64_t size, int64_t now, int64_t until,
                                   size_t max_gaps) const;

  // True when no occupant uses bytes [offset, offset + size) at any time
  // of [now, until) (e.g. the bytes right after a planned request that
  // grew: it may take them while it lives).
  bool RangeIdle(uint64_t offset, uint64_t size, int64_t now,
                 int64_t until) const;

  // Iteration time until granule `granule` is next planned to start being
  // used, seen from iteration time `now` (0 if a persistent request lives
  // there; kNever if nothing is ever planned there, granules past the
  // plan's region included). During the set-up (`in_setup`) no iteration
  // has begun: the first planned start of the first iteration, counted
  // from its beginning. Without a period a used granule is always needed.
  int64_t TimeToNextUse(uint32_t granule, int64_t now,
                        bool in_setup = false) const;

  // True when granules `a` and `b` are idle at the same times, so that
  // their pages can be lent together: both persistent (never idle), or
  // neither and planned to start being used at the same times.
  bool SameUse(uint32_t a, uint32_t b) const {
    if (a >= granules_.size() || b >= granules_.size()) return false;
    const GranuleUse& x = granules_[a];
    const GranuleUse& y = granules_[b];
    if (x.persistent || y.persistent) return x.persistent && y.persistent;
    return x.planned_starts == y.planned_starts;
  }

  size_t occupants() const { return occupants_.size(); }

 private:
  struct Occupant {
    uint64_t offset = 0;
    uint64_t end = 0;  // offset + reserved size
    int64_t start = 0;
    int64_t stop = 0;
  };
  // Whether `o` holds its bytes at some time of [now, until).
  bool Busy(const Occupant& o, int64_t now, int64_t until) const;

  // When a granule is planned to be used.
  struct GranuleUse {
    std::vector<int64_t> planned_starts;  // sorted, in [0, period)
    bool persistent = false;
  };

  std::vector<Occupant> occupants_;  // by offset
  std::vector<GranuleUse> granules_;
  uint64_t region_bytes_ = 0;
  int64_t period_ = 0;
};

}  // namespace loom::vmm

#endif  // LOOM_VMM_PLAN_SCHEDULE_H_
