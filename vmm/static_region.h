// StaticRegion: the virtual range laid out exactly as the plan says.
//
// One reservation of `region_bytes`, backed lazily: a granule gets a page
// from the pool the first time a planned allocation occupies it (Back, with
// the granules right after it that are still unbacked; each chunk mapped
// whole, one map call each, and one set-access for all of them) and keeps
// it for the region's life, so a repeating
// workload backs its region during the first iteration and makes no driver
// call after. Granules no allocation ever touches cost no memory (a plan
// made for a larger run, requests that did not come). Planned allocations
// are handed out at base + offset. The region tracks, per granule, which bytes
// live static allocations occupy, so that a planned hand-out can be checked
// to be free at that moment (the safety check: a planned range still in use,
// e.g. after a plan miss shifted lifetimes, must not be handed out twice).
// When each granule is next planned to be used is the plan's business
// (PlanSchedule): the region holds the layout of every plan variant
// installed (they share its address space and pages).
// Not thread-safe: the allocator serialises access.
#ifndef LOOM_VMM_STATIC_REGION_H_
#define LOOM_VMM_STATIC_REGION_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "vmm/driver.h"
#include "vmm/page_pool.h"

namespace loom::vmm {

// Where the pages that back static granules come from (the allocator's
// policy: spare pages, idle arena pages, a new chunk).
class PageSource {
 public:
  virtual ~PageSource() = default;
  // Live pages, mapped nowhere in the static region, for `wanted`
  // consecutive granules from granule `first`: whole chunks, mapped in the
  // order given, of 1 to `room` pages in all (more than `wanted` only to
  // back the unbacked granules after the range, which the plan uses: new
  // pages up to `max`, memory already held up to `room` >= max).
  // OUT_OF_MEMORY if none.
  virtual StatusOr<std::vector<PageRun>> Take(uint32_t first, uint32_t wanted,
                                              uint32_t max, uint32_t room) = 0;
};

class StaticRegion {
 public:
  // How many unbacked granules after a backed range may be backed with it.
  static constexpr uint32_t kMaxPrebacked = 64;

  // Reserves `bytes` of address space (nothing is backed yet). REQUIRES:
  // bytes a positive multiple of the pool's granularity.
  static StatusOr<std::unique_ptr<StaticRegion>> Create(Driver& driver,
                                                        PagePool& pool,
                                                        int device,
                                                        uint64_t bytes);
  // Unmaps the pages (they stay in the pool) and frees the reservation.
  // REQUIRES: no live static allocation.
  ~StaticRegion();

  DevicePtr base() const { return base_; }
  uint64_t bytes() const { return granules_.size() * granularity_; }
  uint32_t granule_count() const {
    return static_cast<uint32_t>(granules_.size());
  }
  // The page behind a granule, kNoPage while unbacked.
  PageId page(uint32_t granule) const { return granules_[granule].page; }
  // Granules of [offset, offset + size) without a page. REQUIRES: size > 0,
  // the range inside the region.
  uint32_t UnbackedGranules(uint64_t offset, uint64_t size) const {
    uint32_t unbacked = 0;
    for (uint64_t k = offset >> shift_; k <= (offset + size - 1) >> shift_;
         ++k) {
      unbacked += granules_[k].page == kNoPage;
    }
    return unbacked;
  }
  uint64_t granularity() const { return granularity_; }
  uint64_t backed_bytes() const { return backed_granules_ * granularity_; }
  // Backed granules no static allocation has occupied yet (backed ahead,
  // with the chunk of a granule the plan uses at the same times).
  uint64_t backed_unused_bytes() const {
    return backed_unused_granules_ * granularity_;
  }
  // One past the highest granule ever backed: granules from there on have
  // no page (loops over backed granules stop there).
  uint32_t backed_extent() const { return backed_extent_; }
  // Backed ranges, sorted and merged: (address, size).
  std::vector<std::pair<DevicePtr, uint64_t>> MappedRanges() const;

  // The bytes of backed granules that no live static allocation occupies,
  // on granules whose page passes `usable(page)`: (offset, size) runs,
  // sorted, adjacent runs merged. O(backed granules).
  template <typename Usable>
  std::vector<std::pair<uint64_t, uint64_t>> FreeBackedRanges(
      Usable&& usable) const;

  // True when no live static allocation overlaps [offset, offset + size).
  bool RangeFree(uint64_t offset, uint64_t size) const;

  // The planned hand-out, checked and recorded in one pass: succeeds only if
  // no live static allocation overlaps the range and `page_ok(page, lo, hi)`
  // holds for every page behind it and the bytes [lo, hi) of it the range
  // covers (not lent to the arena, no other stream's unfinished work there).
  // The hot path of every planned request. kNeedsBacking: occupied, but a
  // granule of it has no page yet (or no access): the caller must Back the
  // range (or Release it) before handing it out.
  enum class Occupied : uint8_t { kNo, kYes, kNeedsBacking };
  template <typename PageOk>
  Occupied TryOccupy(uint64_t offset, uint64_t size, PageOk&& page_ok);
  // Backs every unbacked granule of [offset, offset + size) with pages from
  // `source`, plus up to kMaxPrebacked unbacked granules right after it,
  // below granule `limit` (the plan's region: granules it will use), when
  // the source has pages to spare, then grants access to what it mapped
  // (one call). On failure nothing new stays mapped.
  // REQUIRES: the range was occupied by TryOccupy.
  Status Back(uint64_t offset, uint64_t size, PageSource& source,
              uint32_t limit = 0);
  // Forgets a live static allocation and fences its bytes with `tag` (the
  // free's stream may still use them). REQUIRES: [offset, offset + size)
  // was occupied by TryOccupy.
  void Release(uint64_t offset, uint64_t size, const FreeTag& tag);

  uint64_t occupied_bytes() const { return occupied_bytes_; }

  // Aborts if the byte bookkeeping is inconsistent.
  void CheckInvariants() const;

 private:
  // Occupancy of one granule (hot: read on every planned hand-out).
  struct Granule {
    PageId page = kNoPage;  // kNoPage: not backed yet
    bool full = false;      // one live allocation covers the whole granule
    bool used = false;      // a static allocation occupied it at least once
    // Mapped without access: a failed Back's undo could neither unmap it
    // nor grant access. Never handed out before Back grants access.
    bool no_access = false;
    // Live static pieces covering part of the granule, [lo, hi) in bytes.
    std::vector<std::pair<uint32_t, uint32_t>> partial;
  };
  StaticRegion(Driver& driver, PagePool& pool, int device, DevicePtr base,
               uint64_t granularity);
  // Unmaps the mappings made by Back, (first granule, pages) each (its
  // undo). A mapping whose unmap fails stays backed, made accessible (as
  // granules backed ahead are), so that no mapping without access is ever
  // handed out; if access fails too, its granules are marked no_access.
  void Unback(const std::vector<std::pair<uint32_t, uint32_t>>& runs);
  // Grants access to the no_access granules of [first, last], each stretch
  // of them whole (whole mappings). REQUIRES: no_access_granules_ > 0.
  Status GrantAccess(uint32_t first, uint32_t last);

  Driver& driver_;
  PagePool& pool_;
  const DevicePtr base_;
  const uint64_t granularity_;  // a power of two
  const int shift_;             // log2(granularity_)
  std::vector<Granule> granules_;
  uint64_t occupied_bytes_ = 0;
  uint64_t backed_granules_ = 0;
  uint64_t backed_unused_granules_ = 0;  // backed, !used
  uint32_t backed_extent_ = 0;
  uint32_t no_access_granules_ = 0;
  const int device_;
};

template <typename PageOk>
StaticRegion::Occupied StaticRegion::TryOccupy(uint64_t offset, uint64_t size,
                                               PageOk&& page_ok) {
  const uint64_t end = offset + size;
  if (size == 0 || end > bytes() || end < offset) return Occupied::kNo;
  const uint64_t mask = granularity_ - 1;
  const uint64_t first = offset >> shift_;
  const uint64_t last = (end - 1) >> shift_;
  const uint32_t g = static_cast<uint32_t>(granularity_);
  auto piece = [&](uint64_t k, uint32_t& lo, uint32_t& hi) {
    lo = k == first ? static_cast<uint32_t>(offset & mask) : 0;
    hi = k == last ? static_cast<uint32_t>(((end - 1) & mask) + 1) : g;
  };
  bool unbacked = false;
  for (uint64_t k = first; k <= last; ++k) {
    const Granule& granule = granules_[k];
    if (granule.full) return Occupied::kNo;
    uint32_t lo, hi;
    piece(k, lo, hi);
    if (lo == 0 && hi == g) {
      if (!granule.partial.empty()) return Occupied::kNo;
    } else {
      for (const auto& [a, b] : granule.partial) {
        if (a < hi && lo < b) return Occupied::kNo;
      }
    }
    if (granule.page == kNoPage) {
      unbacked = true;
    } else if (!page_ok(pool_.page(granule.page), lo, hi)) {
      return Occupied::kNo;
    } else if (granule.no_access) [[unlikely]] {
      unbacked = true;  // Back grants it access
    }
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
    if (granule.page != kNoPage) ++pool_.page(granule.page).static_users;
    if (!granule.used) {
      granule.used = true;
      if (granule.page != kNoPage) --backed_unused_granules_;
    }
  }
  occupied_bytes_ += size;
  return unbacked ? Occupied::kNeedsBacking : Occupied::kYes;
}

template <typename Usable>
std::vector<std::pair<uint64_t, uint64_t>> StaticRegion::FreeBackedRanges(
    Usable&& usable) const {
  std::vector<std::pair<uint64_t, uint64_t>> runs;
  auto add = [&](uint64_t lo, uint64_t hi) {
    if (lo >= hi) return;
    if (!runs.empty() && runs.back().first + runs.back().second == lo) {
      runs.back().second += hi - lo;
    } else {
      runs.emplace_back(lo, hi - lo);
    }
  };
  std::vector<std::pair<uint32_t, uint32_t>> pieces;
  for (uint32_t k = 0; k < backed_extent_; ++k) {
    const Granule& granule = granules_[k];
    if (granule.page == kNoPage || granule.full || granule.no_access ||
        !usable(pool_.page(granule.page)))
      continue;
    const uint64_t base = static_cast<uint64_t>(k) << shift_;
    pieces = granule.partial;
    std::sort(pieces.begin(), pieces.end());
    uint64_t at = 0;
    for (const auto& [a, b] : pieces) {
      add(base + at, base + a);
      at = std::max<uint64_t>(at, b);
    }
    add(base + at, base + granularity_);
  }
  return runs;
}

}  // namespace loom::vmm

#endif  // LOOM_VMM_STATIC_REGION_H_
