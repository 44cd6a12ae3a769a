// StaticRegion: the virtual range laid out exactly as the plan says.
//
// One reservation of `region_bytes`; granule i is backed by its own page from
// the pool (mapped once, at creation, and kept). Planned allocations are
// handed out at base + offset. The region tracks, per granule, which bytes
// live static allocations occupy, so that a planned hand-out can be checked
// to be free at that moment (the safety check: a planned range still in use,
// e.g. after a plan miss shifted lifetimes, must not be handed out twice),
// and, from the plan, when each granule is next planned to be used, so that
// idle granules can be lent to dynamic requests that end before that.
// Not thread-safe: the allocator serialises access.
#ifndef LOOM_VMM_STATIC_REGION_H_
#define LOOM_VMM_STATIC_REGION_H_

#include <cstdint>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "vmm/driver.h"
#include "vmm/page_pool.h"
#include "vmm/runtime_plan.h"

namespace loom::vmm {

class StaticRegion {
 public:
  static constexpr int64_t kNever = std::numeric_limits<int64_t>::max();

  // Reserves the region and maps `pages[i]` at granule i, with access for
  // `device`. On failure everything done so far is undone.
  // REQUIRES: pages.size() * granularity == plan.region_bytes; each page is
  // live and mapped nowhere.
  static StatusOr<std::unique_ptr<StaticRegion>> Create(
      Driver& driver, PagePool& pool, int device, const RuntimePlan& plan,
      const std::vector<PageId>& pages);
  // Unmaps the pages (they stay in the pool) and frees the reservation.
  // REQUIRES: no live static allocation.
  ~StaticRegion();

  DevicePtr base() const { return base_; }
  uint64_t bytes() const { return granules_.size() * granularity_; }
  uint32_t granule_count() const {
    return static_cast<uint32_t>(granules_.size());
  }
  PageId page(uint32_t granule) const { return granules_[granule].page; }
  uint64_t granularity() const { return granularity_; }

  // True when no live static allocation overlaps [offset, offset + size).
  bool RangeFree(uint64_t offset, uint64_t size) const;
  // Records / forgets a live static allocation. REQUIRES (Occupy): RangeFree.
  void Occupy(uint64_t offset, uint64_t size);
  void Vacate(uint64_t offset, uint64_t size);
  uint64_t occupied_bytes() const { return occupied_bytes_; }

  // Iteration time until `granule` is next planned to start being used,
  // seen from iteration time `now` (0 if a persistent request lives there;
  // kNever if nothing is ever planned there).
  int64_t TimeToNextUse(uint32_t granule, int64_t now) const;

  // Aborts if the byte bookkeeping is inconsistent.
  void CheckInvariants() const;

 private:
  struct Granule {
    PageId page = kNoPage;
    // Live static ranges within the granule, [lo, hi) in bytes.
    std::vector<std::pair<uint32_t, uint32_t>> live;
    std::vector<int64_t> planned_starts;  // sorted, in [0, period)
    bool persistent = false;
  };
  StaticRegion(Driver& driver, PagePool& pool, DevicePtr base,
               uint64_t granularity, int64_t period);

  Driver& driver_;
  PagePool& pool_;
  const DevicePtr base_;
  const uint64_t granularity_;
  const int64_t period_;
  std::vector<Granule> granules_;
  uint64_t occupied_bytes_ = 0;
};

}  // namespace loom::vmm

#endif  // LOOM_VMM_STATIC_REGION_H_
