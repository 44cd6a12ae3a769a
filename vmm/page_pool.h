// PagePool: the physical memory loom holds, as pages of one granule each.
//
// Physical memory comes from the driver in chunks: one handle of one or more
// granules (cuMemCreate of n granules is one call). Each granule of a chunk
// is a page, but CUDA maps only whole handles (cuMemMap refuses an offset
// into a handle or part of one: docs/driver_contract.md), so a chunk is
// always mapped whole: its pages at consecutive granules, in order, one
// map call (MapRun). The allocator sizes chunks to how they will be used:
// an arena request's new granules are one chunk (chunks of at most 16 MiB
// while no plan is installed: lending_policy.h); the static region's
// granules come in one chunk per stretch the plan uses at the same times
// (lent together when idle). A page is mapped into its place in the static
// region, into a granule of the dynamic arena, or both at once (its chunk
// mapped at two addresses: CUDA allows it, the two alias). That double
// mapping is how idle static memory is lent to dynamic requests; the
// allocator's invariant is about *live allocations*, not mappings: at any
// moment a page serves live allocations through at most one of its
// mappings (`static_users` and `arena_users` are never both non-zero), and
// within that mapping live allocations never overlap.
//
// The pool grows from the driver on demand, within an optional byte cap, and
// shrinks only on request, a whole chunk at a time, once every page of it is
// spare (mapped nowhere): ReleaseSpareChunks, used by empty_cache. Page ids
// of one chunk are consecutive. Not thread-safe: the allocator serialises
// access.
#ifndef LOOM_VMM_PAGE_POOL_H_
#define LOOM_VMM_PAGE_POOL_H_

#include <cstdint>
#include <map>
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
  PhysicalHandle handle;                 // of the chunk the page belongs to
  uint32_t index = 0;                    // its granule within that chunk
  uint32_t static_granule = kNoGranule;  // mapped there in the static region
  uint32_t arena_granule = kNoGranule;   // mapped there in the arena
  // Arena mappings of the page: 1, or up to kMaxArenaMappings when its
  // idle chunk was also mapped at other places (Arena::StitchableChunk);
  // arena_granule is one of them. Such a page serves one place at a time.
  uint32_t arena_mappings = 0;
  uint32_t arena_in_use_at = kNoGranule;  // the granule of its arena_users
  uint64_t arena_freed_at = 0;  // Arena's clock at its last arena free
  uint32_t static_users = 0;    // live static allocations touching it
  uint32_t arena_users = 0;     // live arena allocations touching it
  std::vector<Fence> fences;    // at most one per stream
  bool live = false;            // false once released (id may be reused)
  // Held, mapped nowhere.
  bool spare() const {
    return live && static_granule == kNoGranule && arena_granule == kNoGranule;
  }
};

// Records that bytes [lo, hi) of `page` were freed with `tag`.
void AddFence(Page& page, uint32_t lo, uint32_t hi, const FreeTag& tag);

// Consecutive pages of one chunk: ids [first, first + count). Where a run is
// mapped, it is a whole chunk (WholeChunk).
struct PageRun {
  PageId first = kNoPage;
  uint32_t count = 0;
};

class PagePool {
 public:
  // The largest chunk GrowRun may create, in pages (the default limit).
  static constexpr uint32_t kMaxChunkPages = 512;

  // REQUIRES: granularity is the device's minimum granularity;
  // 1 <= max_chunk_pages <= kMaxChunkPages. `peers`: the other devices that
  // get access wherever the pages are mapped. `max_chunk_pages`: the largest
  // handle created, in pages (a physical-layout setting: smaller handles
  // mean more of them, more mappings and more driver calls).
  PagePool(Driver& driver, int device, uint64_t granularity, uint64_t cap_bytes,
           std::vector<int> peers = {},
           uint32_t max_chunk_pages = kMaxChunkPages);
  // Releases every chunk. REQUIRES: no page is mapped.
  ~PagePool();
  PagePool(const PagePool&) = delete;
  PagePool& operator=(const PagePool&) = delete;

  // Creates one chunk of `pages` pages (at most max_chunk_pages(); fewer if
  // the cap leaves room for fewer, or the device has no room for so many:
  // halved until it fits). OUT_OF_MEMORY if not even one page fits.
  // REQUIRES: pages >= 1.
  StatusOr<PageRun> GrowRun(uint32_t pages);
  // One page (a chunk of one).
  StatusOr<PageId> Grow();
  // Gives the chunk of page `id` back to the driver. REQUIRES: every page of
  // that chunk is spare and unused.
  Status ReleasePage(PageId id);
  // Releases every chunk whose pages are all spare; the first failure is
  // returned (the others are still tried).
  Status ReleaseSpareChunks();
  // Releases every spare chunk none of whose pages carries a fence (no
  // queued work may touch it: nothing to wait for). Called before the pool
  // grows: a chunk is mapped only whole, so a spare chunk that does not fit
  // where memory is wanted would otherwise stay held beside the new one.
  // Returns the pages released; a release that fails leaves its chunk.
  uint32_t ReleaseUnfencedSpareChunks();
  // The same, only as far as `incoming` new pages need to keep the pool
  // within its peak (peak_bytes()): nothing when they fit under it (a
  // chunk released there would not lower the peak, only cost a create and
  // a map when memory is wanted there again), else chunks in page order
  // until they fit or none is left. Returns the pages released.
  uint32_t ReleaseUnfencedSpareChunksFor(uint32_t incoming);
  // True when `incoming` new pages keep the pool within its peak.
  bool FitsUnderPeak(uint32_t incoming) const {
    return live_pages_ + incoming <= peak_pages_;
  }

  // Maps the chunk `run` (all its pages, in order) at `at`, one driver call.
  // REQUIRES: WholeChunk(run); the caller records where the pages are
  // mapped.
  Status MapRun(DevicePtr at, PageRun run);
  // The chunk page `id` belongs to. REQUIRES: the page is live.
  PageRun ChunkOf(PageId id) const;
  // True when `run` is exactly one live chunk (what MapRun takes).
  bool WholeChunk(PageRun run) const;
  // A whole chunk, every page spare and accepted by `usable(id)`, for
  // `wanted` granules with `room` >= wanted granules free to map it at:
  // the first of exactly `wanted` pages, else the smallest of more (up to
  // `room`), else the largest of fewer (count 0: none).
  template <typename Usable>
  PageRun SpareRun(uint32_t wanted, uint32_t room, Usable&& usable);

  Page& page(PageId id) { return pages_[id]; }
  const Page& page(PageId id) const { return pages_[id]; }
  // Number of page slots (live or released); iterate with page(id).live.
  size_t slots() const { return pages_.size(); }
  size_t live_pages() const { return live_pages_; }
  uint64_t bytes() const { return live_pages_ * granularity_; }
  uint64_t peak_bytes() const { return peak_pages_ * granularity_; }
  void ResetPeak() { peak_pages_ = live_pages_; }
  uint64_t granularity() const { return granularity_; }
  uint32_t max_chunk_pages() const { return max_chunk_pages_; }
  uint64_t cap_bytes() const { return cap_bytes_; }
  int device() const { return device_; }
  const std::vector<int>& peers() const { return peers_; }
  // Chunks created and released over the pool's life (driver calls).
  uint64_t creates() const { return creates_; }
  uint64_t releases() const { return releases_; }

 private:
  // Page ids for a new chunk of `count` pages: a released range, else new.
  PageId TakeIds(uint32_t count);
  void GiveBackIds(PageId first, uint32_t count);
  Status ReleaseChunk(PageId first, uint32_t count);
  // Releases every chunk all of whose pages are spare and unused (and
  // carry no fence, with `unfenced_only`); returns the pages released and
  // keeps the first failure in `first_error` (if given).
  uint32_t ReleaseSpareChunksWhere(bool unfenced_only, Status* first_error,
                                   uint32_t incoming = kReleaseAll);
  static constexpr uint32_t kReleaseAll = ~uint32_t{0};

  Driver& driver_;
  const int device_;
  const uint64_t granularity_;
  const uint64_t cap_bytes_;  // 0 = no cap
  const uint32_t max_chunk_pages_;
  const std::vector<int> peers_;
  std::vector<Page> pages_;
  // At the first page id of each live chunk, its page count.
  std::vector<uint32_t> chunk_count_;
  std::map<PageId, uint32_t> free_ids_;  // released id ranges: first -> count
  size_t live_pages_ = 0;
  size_t peak_pages_ = 0;
  uint64_t creates_ = 0;
  uint64_t releases_ = 0;
};

template <typename Usable>
PageRun PagePool::SpareRun(uint32_t wanted, uint32_t room, Usable&& usable) {
  PageRun over;   // the smallest chunk of more than `wanted`, within room
  PageRun under;  // the largest chunk of fewer than `wanted`
  for (PageId id = 0; id < pages_.size();) {
    if (!pages_[id].live) {
      ++id;
      continue;
    }
    const uint32_t count = chunk_count_[id];  // id is a chunk's first page
    const bool better =
        count == wanted ||
        (count > wanted && count <= room &&
         (over.count == 0 || count < over.count)) ||
        (count < wanted && over.count == 0 && count > under.count);
    bool fits = better;
    for (PageId p = id; p < id + count && fits; ++p) {
      fits = pages_[p].spare() && usable(p);
    }
    if (fits) {
      if (count == wanted) return PageRun{id, count};
      (count > wanted ? over : under) = PageRun{id, count};
    }
    id += count;
  }
  return over.count > 0 ? over : under;
}

}  // namespace loom::vmm

#endif  // LOOM_VMM_PAGE_POOL_H_
