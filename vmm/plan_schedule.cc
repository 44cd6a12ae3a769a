#include "vmm/plan_schedule.h"

#include <algorithm>
#include <tuple>

namespace loom::vmm {
namespace {

constexpr uint64_t kAlign = 512;

uint64_t RoundUp(uint64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

}  // namespace

PlanSchedule::PlanSchedule(const RuntimePlan& plan, uint64_t granularity)
    : region_bytes_(plan.region_bytes), period_(plan.period) {
  const uint64_t g = granularity;
  granules_.resize((plan.region_bytes + g - 1) / g);
  auto touch = [&](const PlannedRequest& r, auto&& visit) {
    if (r.offset == kUnplanned) return;
    const uint64_t first = static_cast<uint64_t>(r.offset) / g;
    const uint64_t last = (static_cast<uint64_t>(r.offset) + r.size - 1) / g;
    for (uint64_t k = first; k <= last && k < granules_.size(); ++k) {
      visit(granules_[k]);
    }
  };
  // Once: the prologue, and the early iterations' requests of the dynamic
  // windows (at their slots, or persistent).
  std::vector<const std::vector<PlannedRequest>*> once{&plan.prologue};
  for (const DynamicWindow& w : plan.windows) {
    for (const WindowRequests& early : w.early) once.push_back(&early.requests);
  }
  // Persistent: entries planned for the whole period.
  for (const std::vector<PlannedRequest>* seq : once) {
    for (const PlannedRequest& r : *seq) {
      if (Persistent(r, plan)) {
        touch(r, [](GranuleUse& use) { use.persistent = true; });
      }
    }
  }
  // Every iteration: the sequence and the dynamic windows' slots.
  std::vector<const std::vector<PlannedRequest>*> repeated{&plan.iteration};
  for (const DynamicWindow& w : plan.windows)
    repeated.push_back(&w.steady.requests);
  for (const std::vector<PlannedRequest>* seq : repeated) {
    for (const PlannedRequest& r : *seq) {
      const int64_t start = plan.period > 0 ? r.start % plan.period : r.start;
      touch(r, [&](GranuleUse& use) { use.planned_starts.push_back(start); });
    }
  }
  for (GranuleUse& use : granules_) {
    std::sort(use.planned_starts.begin(), use.planned_starts.end());
  }
  repeated.insert(repeated.end(), once.begin(), once.end());
  for (const std::vector<PlannedRequest>* seq : repeated) {
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
  occupants_.erase(std::unique(occupants_.begin(), occupants_.end(),
                               [](const Occupant& a, const Occupant& b) {
                                 return a.offset == b.offset &&
                                        a.end == b.end && a.start == b.start &&
                                        a.stop == b.stop;
                               }),
                   occupants_.end());
}

int64_t PlanSchedule::TimeToNextUse(uint32_t granule, int64_t now,
                                    bool in_setup) const {
  if (granule >= granules_.size()) return kNever;
  const GranuleUse& use = granules_[granule];
  if (use.persistent) return 0;
  if (use.planned_starts.empty()) return kNever;
  // In the set-up no iteration has begun: the granule is next used at its
  // first planned start of the first iteration, whenever that begins (a
  // request that may outlive the set-up must not take it).
  if (in_setup) return use.planned_starts.front();
  if (period_ <= 0) return 0;
  now %= period_;
  auto it = std::lower_bound(use.planned_starts.begin(),
                             use.planned_starts.end(), now);
  if (it != use.planned_starts.end()) return *it - now;
  return use.planned_starts.front() + period_ - now;  // the next iteration's
}

bool PlanSchedule::RangeIdle(uint64_t offset, uint64_t size, int64_t now,
                             int64_t until) const {
  const uint64_t end = offset + size;
  if (end > region_bytes_ || end < offset) return false;
  for (const Occupant& o : occupants_) {
    if (o.offset >= end) break;  // sorted by offset
    if (o.end > offset && Busy(o, now, until)) return false;
  }
  return true;
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
