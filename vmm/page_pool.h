// PagePool: the physical memory loom holds, as pages of one granule each.
//
// Every page is one driver handle of exactly one granule, so any page can be
// mapped at any granule-aligned virtual address: into its fixed place in the
// static region, into a granule of the dynamic arena, or both at once. That
// double mapping is how idle static memory is lent to dynamic requests; the
// allocator's invariant is about *live allocations*, not mappings: at any
// moment a page serves live allocations through at most one of its mappings
// (`static_users` and `arena_users` are never both non-zero), and within that
// mapping live allocations never overlap.
//
// The pool grows from the driver on demand, within an optional byte cap, and
// shrinks only on request (ReleasePage, used by empty_cache). Not thread-safe:
// the allocator serialises access.
#ifndef LOOM_VMM_PAGE_POOL_H_
#define LOOM_VMM_PAGE_POOL_H_

#include <cstdint>
#include <vector>

#include "vmm/driver.h"
#include "vmm/stream_tracker.h"

namespace loom::vmm {

using PageId = uint32_t;
inline constexpr PageId kNoPage = ~PageId{0};
inline constexpr uint32_t kNoGranule = ~uint32_t{0};

// Bytes of a page freed on a stream whose queued work may still touch them
// (stream_tracker.h): per stream, the union of the byte ranges it freed on
// the page, with the latest tag (a later tag of the same stream covers the
// earlier ones). Other streams may use those bytes, and the page may be
// unmapped, only once the tag is complete.
struct Fence {
  FreeTag tag;
  uint32_t lo = 0;  // byte range within the page
  uint32_t hi = 0;
};

struct Page {
  PhysicalHandle handle;                 // one granule of physical memory
  uint32_t static_granule = kNoGranule;  // mapped there in the static region
  uint32_t arena_granule = kNoGranule;   // mapped there in the arena
  uint32_t static_users = 0;             // live static allocations touching it
  uint32_t arena_users = 0;              // live arena allocations touching it
  std::vector<Fence> fences;             // at most one per stream
  bool live = false;  // false once released (id may be reused)
};

// Records that bytes [lo, hi) of `page` were freed with `tag`.
void AddFence(Page& page, uint32_t lo, uint32_t hi, const FreeTag& tag);

class PagePool {
 public:
  // REQUIRES: granularity is the device's minimum granularity. `peers`:
  // the other devices that get access wherever the pages are mapped.
  PagePool(Driver& driver, int device, uint64_t granularity,
           uint64_t cap_bytes, std::vector<int> peers = {});
  // Releases every page. REQUIRES: no page is mapped.
  ~PagePool();
  PagePool(const PagePool&) = delete;
  PagePool& operator=(const PagePool&) = delete;

  // Creates one page. OUT_OF_MEMORY if the cap or the device is exhausted.
  StatusOr<PageId> Grow();
  // Gives a page back to the driver. REQUIRES: live, mapped nowhere, unused.
  Status ReleasePage(PageId id);

  Page& page(PageId id) { return pages_[id]; }
  const Page& page(PageId id) const { return pages_[id]; }
  // Number of page slots (live or released); iterate with page(id).live.
  size_t slots() const { return pages_.size(); }
  size_t live_pages() const { return live_pages_; }
  uint64_t bytes() const { return live_pages_ * granularity_; }
  uint64_t peak_bytes() const { return peak_pages_ * granularity_; }
  void ResetPeak() { peak_pages_ = live_pages_; }
  uint64_t granularity() const { return granularity_; }
  uint64_t cap_bytes() const { return cap_bytes_; }
  int device() const { return device_; }
  const std::vector<int>& peers() const { return peers_; }
  // Pages created and released over the pool's life.
  uint64_t creates() const { return creates_; }
  uint64_t releases() const { return releases_; }

 private:
  Driver& driver_;
  const int device_;
  const uint64_t granularity_;
  const uint64_t cap_bytes_;  // 0 = no cap
  const std::vector<int> peers_;
  std::vector<Page> pages_;
  std::vector<PageId> free_ids_;  // released slots to reuse
  size_t live_pages_ = 0;
  size_t peak_pages_ = 0;
  uint64_t creates_ = 0;
  uint64_t releases_ = 0;
};

}  // namespace loom::vmm

#endif  // LOOM_VMM_PAGE_POOL_H_
