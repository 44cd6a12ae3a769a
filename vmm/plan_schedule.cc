#include "vmm/plan_schedule.h"

#include <algorithm>
#include <tuple>

namespace loom::vmm {
namespace {

constexpr uint64_t kAlign = 512;

uint64_t RoundUp(uint64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

}  // namespace

PlanSchedule::PlanSchedule(const RuntimePlan& plan)
    : region_bytes_(plan.region_bytes), period_(plan.period) {
  for (const std::vector<PlannedRequest>* seq :
       {&plan.prologue, &plan.iteration}) {
    for (const PlannedRequest& r : *seq) {
      if (r.offset == kUnplanned) continue;
      const uint64_t offset = static_cast<uint64_t>(r.offset);
      occupants_.push_back(
          Occupant{offset, offset + RoundUp(r.size), r.start, r.end});
    }
  }
  std::sort(occupants_.begin(), occupants_.end(),
            [](const Occupant& a, const Occupant& b) {
              return std::tie(a.offset, a.end, a.start, a.stop) <
                     std::tie(b.offset, b.end, b.start, b.stop);
            });
  occupants_.erase(
      std::unique(occupants_.begin(), occupants_.end(),
                  [](const Occupant& a, const Occupant& b) {
                    return a.offset == b.offset && a.end == b.end &&
                           a.start == b.start && a.stop == b.stop;
                  }),
      occupants_.end());
}

bool PlanSchedule::Busy(const Occupant& o, int64_t now, int64_t until) const {
  if (until < 0 || period_ <= 0) return true;
  if (until - now >= period_ || o.stop - o.start >= period_) return true;
  // Both spans are shorter than a period: compare on the circle, the query
  // moved into [0, period), the occupant shifted by -1, 0 or +1 period.
  const int64_t q0 = ((now % period_) + period_) % period_;
  const int64_t q1 = q0 + (until - now);
  for (int64_t k = -1; k <= 1; ++k) {
    if (o.start + k * period_ < q1 && q0 < o.stop + k * period_) return true;
  }
  return false;
}

std::vector<uint64_t> PlanSchedule::IdleRanges(uint64_t size, int64_t now,
                                               int64_t until,
                                               size_t max_gaps) const {
  struct Gap {
    uint64_t begin;
    uint64_t end;
  };
  std::vector<Gap> gaps;
  const uint64_t need = RoundUp(size);
  auto consider = [&](uint64_t begin, uint64_t end) {
    const uint64_t aligned = RoundUp(begin);
    if (end > aligned && end - aligned >= need) gaps.push_back({aligned, end});
  };
  uint64_t cursor = 0;
  for (const Occupant& o : occupants_) {
    if (!Busy(o, now, until)) continue;
    if (o.offset > cursor) consider(cursor, o.offset);
    cursor = std::max(cursor, o.end);
  }
  consider(cursor, region_bytes_);
  std::stable_sort(gaps.begin(), gaps.end(), [](const Gap& a, const Gap& b) {
    return a.end - a.begin < b.end - b.begin;
  });
  if (gaps.size() > max_gaps) gaps.resize(max_gaps);
  std::vector<uint64_t> offsets;
  for (const Gap& g : gaps) {
    offsets.push_back(g.begin);
    const uint64_t high = (g.end - need) / kAlign * kAlign;
    if (high > g.begin) offsets.push_back(high);
  }
  return offsets;
}

}  // namespace loom::vmm
