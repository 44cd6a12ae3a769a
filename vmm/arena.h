// Arena: the dynamic reusable space, for everything the plan did not foresee.
//
// One large virtual reservation, carved at 512-byte granularity by a best-fit
// allocator with coalescing free blocks. Its granules are mapped on demand to
// pages chosen by the allocator (PagePolicy): free pool pages, or static
// pages that are idle now (lent; the same physical page then has two
// mappings). Every mapping is one whole chunk (a handle: CUDA maps nothing
// less), its pages at consecutive granules: a request of many granules gets
// new chunks (of at most 16 MiB: lending_policy.h), one map each, one
// set-access for all; a chunk already held
// that is larger than the granules a request lacks may be mapped over the
// unmapped granules after them too (mapped ahead, free, at no cost in memory).
// A mapping is unmapped only whole, in one call of its own, once none of its
// granules is in use (CUDA unmaps exactly what one map mapped). Nothing is
// mapped ahead of requests: measured on the plan-miss suite, pages mapped past
// a request (as expandable segments map whole 20 MiB pages) saved driver calls
// but left idle granules that later requests did not fit into. Mappings are
// kept when allocations are freed, so a workload that repeats finds its
// granules already mapped and makes no driver call.
//
// An allocation is placed only where every granule it touches is either
// unmapped (a page is then acquired and mapped) or mapped to a page the
// policy says is usable now by the request's stream (not serving live static
// allocations, no unfinished work of another stream). Candidates are tried in
// best-fit order, preferring places that need no new mapping.
//
// Stitching: where growing would raise the memory held above its peak, the
// policy may hand over an idle chunk already mapped elsewhere in the arena
// (StitchableChunk); it is then mapped a second time, here, and the old
// mapping stays (no unmap, so the place it served is still mapped when its
// requests come back: a repeating workload makes no driver call once both
// places exist). A page mapped at several places serves allocations at one
// of them at a time (Page::arena_in_use_at: small allocations still share
// it there), and never twice in one allocation. GMLake stitches the same
// way (it keeps the blocks it stitched mapped); remapping instead,
// unmapping the chunk where it was, remapped every iteration (misses.md,
// fourth session).
//
// Invariants: free blocks never overlap or touch (they coalesce); live
// allocations never overlap; a page is mapped in at most kMaxArenaMappings
// arena granules (a static page lent to the arena too, besides its place
// in the region), its live arena allocations all at one of them
// (arena_in_use_at); a page's arena_users equals the live arena
// allocations touching it.
// Not thread-safe: the allocator serialises access.
#ifndef LOOM_VMM_ARENA_H_
#define LOOM_VMM_ARENA_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <vector>

#include "vmm/driver.h"
#include "vmm/free_blocks.h"
#include "vmm/page_pool.h"

namespace loom::vmm {

inline constexpr uint64_t kArenaAlignment = 512;
// The most places one page is mapped at in the arena (stitching). Each
// place is virtual address space only (the arena reserves twice the
// device's memory; a request that finds no place unmaps the idle mappings
// and tries again). 16, not 4: qwen3_moe_interleaved's small experts left
// idle chunks that had reached 4 places while the pool grew beside them
// (bench/results/misses.md, thirteenth session).
inline constexpr uint32_t kMaxArenaMappings = 16;

class Arena {
 public:
  // What the allocator decides about pages.
  class PagePolicy {
   public:
    virtual ~PagePolicy() = default;
    // True if bytes [lo, hi) of `page`, already mapped in the arena, may
    // serve a new arena allocation on `stream` now, expected to end at
    // iteration time `until` (-1: unknown).
    virtual bool Usable(PageId page, uint32_t lo, uint32_t hi, Stream stream,
                        int64_t until) = 0;
    // Live pages mapped nowhere in the arena, usable now by `stream`
    // (growing the pool if needed), for `wanted` consecutive granules: one
    // whole chunk of 1 to `room` pages (room >= wanted: the granules after
    // the stretch are unmapped, and a chunk already held that is larger
    // than the stretch may be mapped there too, never a new one). `until`
    // is the iteration time the request is expected to end (or -1 if
    // unknown). OUT_OF_MEMORY if none.
    virtual StatusOr<PageRun> Acquire(uint32_t wanted, uint32_t room,
                                      Stream stream, int64_t until) = 0;
  };

  // REQUIRES: va_bytes a positive multiple of the pool's granularity.
  static StatusOr<std::unique_ptr<Arena>> Create(Driver& driver, PagePool& pool,
                                                 int device, uint64_t va_bytes);
  // Unmaps every granule and frees the reservation. REQUIRES: nothing live.
  ~Arena();

  // Places `size` bytes (rounded up to 512), mapping the granules it lacks
  // (one map per run of pages, one set-access for all of them). On
  // success, every page touched has arena_users incremented. On failure
  // nothing is allocated and the granules mapped on the way are unmapped
  // again.
  StatusOr<DevicePtr> Allocate(uint64_t size, Stream stream, int64_t until,
                               PagePolicy& policy);
  // The size of the free block Allocate would place `size` bytes in without
  // mapping anything (the best fit among mapped granules), or kNoFit when
  // it would need new pages. Allocates nothing.
  static constexpr uint64_t kNoFit = ~uint64_t{0};
  uint64_t MappedFit(uint64_t size, Stream stream, int64_t until,
                     PagePolicy& policy) const;
  // REQUIRES: (ptr, size) is a live allocation made by Allocate(size, ...).
  // Fences its bytes with `tag` (the free's stream may still use them).
  void Free(DevicePtr ptr, uint64_t size, const FreeTag& tag) {
    Free(ptr, size, std::span<const FreeTag>(&tag, 1));
  }
  // The same with several tags (each stream's work must be done).
  void Free(DevicePtr ptr, uint64_t size, std::span<const FreeTag> tags);

  // Unmaps one mapping of at most `max_pages` granules none of whose
  // granules serves a live allocation and whose pages all satisfy
  // `wanted`, after `prepare(page)` succeeded for each (the caller waits
  // there for the work that may still use them), and returns its chunk (for
  // reuse elsewhere: a driver call instead of a new chunk); its pages are
  // mapped nowhere in the arena any more. Never one of the granules being
  // mapped by the Allocate in progress. NOT_FOUND if there is none.
  StatusOr<PageRun> ReclaimIdle(uint32_t max_pages,
                                const std::function<bool(PageId)>& wanted,
                                const std::function<Status(PageId)>& prepare);

  // An idle chunk to map once more (stitch) over `wanted` unmapped
  // granules with `room` after them: mapped at fewer than
  // kMaxArenaMappings places in the arena, in a mapping no live allocation
  // touches, each page `usable` (the policy's say: no other stream's
  // unfinished work, and for a static page lent to the arena, no static
  // user and no planned use before the request ends); of at most `wanted`
  // pages before one mapped past them, the one idle the longest. Never
  // one mapped inside the Allocate in progress, nor one with a page mapped
  // there. Unmaps nothing. NOT_FOUND if none.
  StatusOr<PageRun> StitchableChunk(
      uint32_t wanted, uint32_t room,
      const std::function<bool(PageId)>& usable) const;

  // The pages of the mappings none of whose granules serves a live
  // allocation (what UnmapIdle would unmap), each once, sorted.
  std::vector<PageId> IdlePages() const;
  // Unmaps every mapping none of whose granules serves a live allocation,
  // one call each; returns the pages unmapped (their arena_granule is
  // cleared). REQUIRES:
  // the work that may still use them is done (the caller waits first).
  StatusOr<std::vector<PageId>> UnmapIdle();
  // The pages of the mappings that serve no live allocation while their
  // chunk serves one at another of its places (stitched): such a mapping
  // holds address space only. Each once, sorted.
  std::vector<PageId> BusyElsewherePages() const;
  // Unmaps those mappings, one call each (their pages stay mapped where
  // they serve): the address space a stitched chunk took is free again.
  // REQUIRES: the work that may still use their granules is done (the
  // caller waits first).
  Status UnmapBusyElsewhere();

  bool Contains(DevicePtr ptr) const {
    return ptr >= base_ && ptr < base_ + va_bytes_;
  }
  // The page behind a granule-aligned arena address. REQUIRES: Contains.
  PageId PageAt(DevicePtr ptr) const {
    return granule_page_[(ptr - base_) / granularity_];
  }
  uint64_t live_bytes() const { return live_bytes_; }
  // Mapped address ranges, sorted and merged: (address, size).
  std::vector<std::pair<DevicePtr, uint64_t>> MappedRanges() const;
  uint64_t mapped_granules() const { return mapped_granules_; }
  // Map calls made (a mapping of several granules is one).
  uint64_t maps() const { return maps_; }
  uint64_t unmaps() const { return unmaps_; }
  // Pages mapped a second time (stitched).
  uint64_t stitched_pages() const { return stitches_; }
  // Of those, pages of a static granule (idle static memory lent).
  uint64_t stitched_static_pages() const { return static_stitches_; }

  void CheckInvariants() const;

 private:
  Arena(Driver& driver, PagePool& pool, int device, DevicePtr base,
        uint64_t va_bytes);
  struct Candidate {
    uint64_t block = 0;       // offset of the free block
    uint64_t position = 0;    // offset of the allocation
    uint64_t unmapped = 0;    // granules that need a page
    uint64_t block_size = 0;  // of the free block (BestFit)
    bool found = false;
  };
  // The best place among the first kMaxBlocksExamined free blocks that fit
  // `size` (rounded) bytes, smallest first: the first that needs no new
  // mapping, else the one that needs the fewest granules mapped.
  Candidate BestFit(uint64_t size, Stream stream, int64_t until,
                    PagePolicy& policy) const;
  // Looks for a place for `size` bytes inside the free block [block, +bsize).
  Candidate Examine(uint64_t block, uint64_t bsize, uint64_t size,
                    Stream stream, int64_t until, PagePolicy& policy) const;
  // The bytes of granule `granule` that [offset, offset + size) covers, as
  // offsets within the granule. REQUIRES: they intersect.
  uint32_t PieceLo(uint64_t granule, uint64_t offset) const;
  uint32_t PieceHi(uint64_t granule, uint64_t offset, uint64_t size) const;
  // Maps the chunk `run` at granules [granule, granule + run.count) (access
  // is granted by the caller). REQUIRES: a whole chunk.
  Status MapRun(uint64_t granule, PageRun run);
  // Unmaps the mapping whose first granule is `head`; its pages are mapped
  // nowhere in the arena afterwards. REQUIRES: nothing live on it.
  Status UnmapMapping(uint64_t head);
  // True when no granule of the mapping at `head` serves a live allocation.
  bool MappingIdle(uint64_t head, uint64_t length) const;
  // No live allocation at this mapping's own granules (its pages may serve
  // one at another place).
  bool PlaceIdle(uint64_t head, uint64_t length) const;
  // Its place serves nothing while its pages serve at another place.
  bool BusyElsewhere(uint64_t head, uint64_t length) const;
  // Unmaps mappings made by the Allocate in progress (on its failure). A
  // mapping whose unmap fails stays, made accessible: an idle mapping like
  // any other (if access fails too, it stays in without_access_).
  void UnmapFresh(const std::vector<uint64_t>& heads);
  // Grants access to the mappings in without_access_ that granules
  // [first, last] touch; a placement there fails if it cannot.
  Status GrantAccess(uint64_t first, uint64_t last);

  Driver& driver_;
  PagePool& pool_;
  const int device_;
  const DevicePtr base_;
  const uint64_t va_bytes_;
  const uint64_t granularity_;
  std::vector<PageId> granule_page_;       // kNoPage = unmapped
  std::map<uint64_t, uint64_t> mappings_;  // first granule -> granules
  // Heads of mappings left without access by a failed undo (UnmapFresh):
  // granted access before any placement over them is handed out.
  std::set<uint64_t> without_access_;
  FreeBlocks free_;  // over [0, va_bytes_)
  uint64_t live_bytes_ = 0;
  uint64_t mapped_granules_ = 0;
  uint64_t maps_ = 0;
  uint64_t unmaps_ = 0;
  uint64_t stitches_ = 0;
  uint64_t static_stitches_ = 0;
  uint64_t clock_ = 0;  // frees so far (Page::arena_freed_at)
  static constexpr uint64_t kNoPlace = ~uint64_t{0};
  uint64_t mapped_extent_ = 0;  // one past the highest granule ever mapped
  uint64_t placing_first_ = kNoPlace;  // granules being mapped by Allocate
  uint64_t placing_last_ = kNoPlace;
};

}  // namespace loom::vmm

#endif  // LOOM_VMM_ARENA_H_
