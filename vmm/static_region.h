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

  // Reserves the region and maps `pages[i]` at granule i, then grants
  // `device` access to the whole region in one call. On failure everything
  // done so far is undone.
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

  // The planned hand-out, checked and recorded in one pass: succeeds only if
  // no live static allocation overlaps the range and `page_ok(page, lo, hi)`
  // holds for every page behind it and the bytes [lo, hi) of it the range
  // covers (not lent to the arena, no other stream's unfinished work there).
  // The hot path of every planned request.
  template <typename PageOk>
  bool TryOccupy(uint64_t offset, uint64_t size, PageOk&& page_ok);
  // Forgets a live static allocation and fences its bytes with `tag` (the
  // free's stream may still use them). REQUIRES: [offset, offset + size)
  // was occupied by TryOccupy.
  void Release(uint64_t offset, uint64_t size, const FreeTag& tag);

  uint64_t occupied_bytes() const { return occupied_bytes_; }

  // Iteration time until `granule` is next planned to start being used,
  // seen from iteration time `now` (0 if a persistent request lives there;
  // kNever if nothing is ever planned there). During the set-up
  // (`in_setup`) no iteration has begun: the first planned start of the
  // first iteration, counted from its beginning.
  int64_t TimeToNextUse(uint32_t granule, int64_t now,
                        bool in_setup = false) const;

  // Aborts if the byte bookkeeping is inconsistent.
  void CheckInvariants() const;

 private:
  // Occupancy of one granule (hot: read on every planned hand-out).
  struct Granule {
    PageId page = kNoPage;
    bool full = false;  // one live allocation covers the whole granule
    // Live static pieces covering part of the granule, [lo, hi) in bytes.
    std::vector<std::pair<uint32_t, uint32_t>> partial;
  };
  // When a granule is planned to be used (cold: read on the dynamic path).
  struct Schedule {
    std::vector<int64_t> planned_starts;  // sorted, in [0, period)
    bool persistent = false;
  };
  StaticRegion(Driver& driver, PagePool& pool, DevicePtr base,
               uint64_t granularity, int64_t period);

  Driver& driver_;
  PagePool& pool_;
  const DevicePtr base_;
  const uint64_t granularity_;  // a power of two
  const int shift_;             // log2(granularity_)
  const int64_t period_;
  std::vector<Granule> granules_;
  std::vector<Schedule> schedule_;  // by granule
  uint64_t occupied_bytes_ = 0;
};

template <typename PageOk>
bool StaticRegion::TryOccupy(uint64_t offset, uint64_t size, PageOk&& page_ok) {
  const uint64_t end = offset + size;
  if (size == 0 || end > bytes() || end < offset) return false;
  const uint64_t mask = granularity_ - 1;
  const uint64_t first = offset >> shift_;
  const uint64_t last = (end - 1) >> shift_;
  const uint32_t g = static_cast<uint32_t>(granularity_);
  auto piece = [&](uint64_t k, uint32_t& lo, uint32_t& hi) {
    lo = k == first ? static_cast<uint32_t>(offset & mask) : 0;
    hi = k == last ? static_cast<uint32_t>(((end - 1) & mask) + 1) : g;
  };
  for (uint64_t k = first; k <= last; ++k) {
    const Granule& granule = granules_[k];
    if (granule.full) return false;
    uint32_t lo, hi;
    piece(k, lo, hi);
    if (lo == 0 && hi == g) {
      if (!granule.partial.empty()) return false;
    } else {
      for (const auto& [a, b] : granule.partial) {
        if (a < hi && lo < b) return false;
      }
    }
    if (!page_ok(pool_.page(granule.page), lo, hi)) return false;
  }
  for (uint64_t k = first; k <= last; ++k) {
    Granule& granule = granules_[k];
    uint32_t lo, hi;
    piece(k, lo, hi);
    if (lo == 0 && hi == g) {
      granule.full = true;
    } else {
      granule.partial.emplace_back(lo, hi);
    }
    ++pool_.page(granule.page).static_users;
  }
  occupied_bytes_ += size;
  return true;
}

}  // namespace loom::vmm

#endif  // LOOM_VMM_STATIC_REGION_H_
