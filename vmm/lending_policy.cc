#include "vmm/lending_policy.h"

#include <algorithm>
#include <limits>

namespace loom::vmm {

bool FencesAllowSlow(Page& page, uint32_t lo, uint32_t hi, Stream stream,
                     StreamTracker& tracker) {
  std::vector<Fence>& fences = page.fences;
  for (size_t i = 0; i < fences.size();) {
    const Fence& f = fences[i];
    // The stream's own frees are safe for it (stream order); bytes outside
    // [lo, hi) do not matter to this request.
    if (f.tag.stream == stream || f.hi <= lo || hi <= f.lo) {
      ++i;
      continue;
    }
    if (!tracker.Complete(f.tag)) return false;
    fences[i] = fences.back();
    fences.pop_back();
  }
  return true;
}

Status DrainFences(PagePool& pool, StreamTracker& tracker,
                   const std::vector<PageId>& pages, WaitSite site) {
  bool pending = tracker.NeedsWaitForUnmap();
  for (PageId id : pages) {
    for (const Fence& f : pool.page(id).fences) {
      pending |= !tracker.Complete(f.tag);
    }
  }
  if (pending) LOOM_RETURN_IF_ERROR(tracker.WaitForAll(site));
  for (PageId id : pages) pool.page(id).fences.clear();
  return OkStatus();
}

namespace {

// A spare whole chunk free of other streams' unfinished work for `stream`,
// none of `taken`, for `wanted` granules with `room` to map it at
// (PagePool::SpareRun; count 0: none).
PageRun FreeSpareRun(PagePool& pool, StreamTracker& tracker, uint32_t wanted,
                     uint32_t room, Stream stream,
                     const std::vector<PageRun>& taken = {}) {
  const uint32_t g = static_cast<uint32_t>(pool.granularity());
  return pool.SpareRun(wanted, room, [&](PageId id) {
    for (const PageRun& run : taken) {
      if (id >= run.first && id < run.first + run.count) return false;
    }
    return FencesAllow(pool.page(id), 0, g, stream, tracker);
  });
}

// A chunk cached idle in an arena mapping (no static page), of at most
// `max_pages`, unmapped there once no queued work may touch it.
StatusOr<PageRun> ReclaimFromArena(PagePool& pool, StreamTracker& tracker,
                                   Arena& arena, uint32_t max_pages) {
  return arena.ReclaimIdle(
      max_pages,
      [&](PageId id) { return pool.page(id).static_granule == kNoGranule; },
      [&](PageId id) {
        return DrainFences(pool, tracker, {id}, WaitSite::kReclaim);
      });
}

}  // namespace

StatusOr<std::vector<PageRun>> StaticBacking::Take(uint32_t first,
                                                   uint32_t wanted,
                                                   uint32_t max,
                                                   uint32_t room) {
  // 1. Spare chunks for the `wanted` granules (a chunk larger than what
  // is left of them may go over the unbacked granules after the range, up
  // to `room`: memory already held).
  std::vector<PageRun> runs;
  uint32_t taken = 0;
  while (taken < wanted) {
    const PageRun spare = FreeSpareRun(pool_, tracker_, wanted - taken,
                                       room - taken, stream_, runs);
    if (spare.count == 0) break;
    runs.push_back(spare);
    taken += spare.count;
  }
  if (!runs.empty()) return runs;
  // 2. A chunk cached idle in an arena mapping, unmapped there (after
  // waiting for its work): memory the arena holds but does not use now,
  // taken before new memory is. (Warm-up only: a region's granules are
  // backed once.)
  StatusOr<PageRun> reclaimed = ReclaimFromArena(pool_, tracker_, arena_, room);
  if (reclaimed.ok()) return std::vector<PageRun>{*reclaimed};
  // 3. New pages: what is wanted, and at least kChunkPages when the
  // granules after the range are unbacked (the plan uses them soon; one
  // set-access covers them all).
  return Grow(first, std::min(max, std::max(wanted, kChunkPages)));
}

StatusOr<std::vector<PageRun>> StaticBacking::Grow(uint32_t first,
                                                   uint32_t count) {
  // Idle memory that did not fit goes back first, as far as the new pages
  // would otherwise raise the pool above its peak (below it, released
  // memory lowers no peak and is created and mapped again when wanted:
  // builtin:varlen's alternating shapes remapped 332 times per iteration).
  uint32_t released = pool_.ReleaseUnfencedSpareChunksFor(count);
  while (released < count && !pool_.FitsUnderPeak(count)) {
    StatusOr<PageRun> idle = ReclaimFromArena(
        pool_, tracker_, arena_, std::numeric_limits<uint32_t>::max());
    if (!idle.ok() || !pool_.ReleasePage(idle->first).ok()) break;
    released += idle->count;
  }
  std::vector<PageRun> runs;
  Status failed;
  for (uint32_t k = first; k < first + count && failed.ok();) {
    uint32_t n = 1;
    if (schedule_ != nullptr) {
      while (k + n < first + count && n < pool_.max_chunk_pages() &&
             schedule_->SameUse(k, k + n)) {
        ++n;
      }
    }
    StatusOr<PageRun> grown = pool_.GrowRun(n);
    if (!grown.ok()) {
      failed = grown.status();
      break;
    }
    runs.push_back(*grown);
    k += grown->count;  // fewer than n if the cap or the device said so
    if (grown->count < n) break;
  }
  if (runs.empty()) return failed;
  on_grow_();
  return runs;
}

int64_t LendingPolicy::Needed() const {
  // Unknown lifetime (an extra request): it may live for ever, and a static
  // page lent for ever would make its planned owner miss every iteration.
  // Only granules the plan never uses qualify.
  if (context_.until < 0) return PlanSchedule::kNever;
  return std::max<int64_t>(context_.until - context_.now, 0);
}

int64_t LendingPolicy::IdleFor(uint32_t granule) const {
  if (schedule_ == nullptr) return PlanSchedule::kNever;
  return schedule_->TimeToNextUse(granule, context_.now, context_.in_setup);
}

bool LendingPolicy::Lendable(uint32_t granule) const {
  return !Kept(granule) && IdleFor(granule) >= Needed();
}

bool LendingPolicy::Kept(uint32_t granule) const {
  for (const auto& [first, last] : context_.kept) {
    if (granule >= first && granule <= last) return true;
  }
  return false;
}

bool LendingPolicy::Preferred(PageId id) const {
  return std::find(context_.preferred.begin(), context_.preferred.end(), id) !=
         context_.preferred.end();
}

bool LendingPolicy::Usable(PageId id, uint32_t lo, uint32_t hi, Stream stream,
                           int64_t) {
  Page& page = pool_.page(id);
  if (page.static_users != 0) return false;
  // A static page cached in the arena: only as long as its schedule allows,
  // or its planned owner would find it taken. The pages reserved for the
  // request being served are always fine.
  if (page.static_granule != kNoGranule && region_ != nullptr &&
      !Preferred(id) && !Lendable(page.static_granule)) {
    return false;
  }
  return FencesAllow(page, lo, hi, stream, tracker_);
}

bool LendingPolicy::Idle(PageRun chunk, Stream stream) {
  const uint32_t g = static_cast<uint32_t>(pool_.granularity());
  for (uint32_t i = 0; i < chunk.count; ++i) {
    Page& p = pool_.page(chunk.first + i);
    if (p.arena_granule != kNoGranule || p.static_users != 0 ||
        !FencesAllow(p, 0, g, stream, tracker_)) {
      return false;
    }
  }
  return true;
}

StatusOr<PageRun> LendingPolicy::Acquire(uint32_t wanted, uint32_t room,
                                         Stream stream, int64_t) {
  // 0. The pages the plan reserved for the request being served (a whole
  // chunk each: static pages are chunks of one page unless the region took
  // a larger one).
  while (!context_.preferred.empty()) {
    const PageRun chunk = pool_.ChunkOf(context_.preferred.back());
    context_.preferred.pop_back();
    if (chunk.count <= wanted && Idle(chunk, stream)) return chunk;
  }
  // 1. A spare chunk (in the pool, mapped nowhere): the first of exactly
  // `wanted` pages, else the smallest larger one that has room, else the
  // largest smaller one.
  const PageRun spare = FreeSpareRun(pool_, tracker_, wanted, room, stream);
  if (spare.count > 0) return spare;
  // 2. An idle static chunk whose next planned use is far enough away (for
  // a chunk of several pages, the nearest use of any of them).
  PageRun best;
  int64_t best_distance = -2;  // a kept chunk (-1) only as the last resort
  if (region_ != nullptr) {
    for (uint32_t k = 0; k < region_->backed_extent(); ++k) {
      const PageId id = region_->page(k);
      if (id == kNoPage) continue;  // not backed
      const PageRun chunk = pool_.ChunkOf(id);
      if (chunk.first != id || chunk.count > room) continue;
      int64_t distance = PlanSchedule::kNever;
      for (uint32_t i = 0; i < chunk.count; ++i) {
        distance = std::min(distance, Kept(k + i) ? -1 : IdleFor(k + i));
      }
      if (distance <= best_distance || !Idle(chunk, stream)) continue;
      best = chunk;
      best_distance = distance;
    }
    if (best.count > 0 && best_distance >= Needed()) return best;
  }
  // 3. Stitching: where a new chunk would raise the memory held above its
  // peak, from the run's second iteration on, an idle chunk the
  // arena holds elsewhere is mapped here too (it stays mapped there; see
  // arena.h), the one idle the longest.
  // 4. Else a new chunk of what is wanted, at most kMaxNewChunkBytes (one
  // chunk of several for a larger stretch; the arena asks again for the
  // rest), after the spare chunks that did not fit went back, as far as the
  // new one would otherwise raise the pool above its peak.
  const uint64_t max_chunk_bytes =
      context_.in_dynamic_module ? kMaxNewDynamicChunkBytes : kMaxNewChunkBytes;
  const uint32_t pages = std::min<uint32_t>(
      wanted, static_cast<uint32_t>(std::max<uint64_t>(
                  1, max_chunk_bytes / pool_.granularity())));
  if (context_.stitch && !pool_.FitsUnderPeak(pages)) {
    const uint32_t g = static_cast<uint32_t>(pool_.granularity());
    // A page of a static granule too (an idle static chunk lent to the
    // arena before), as far as Usable lends it: its planned owner finds
    // it free.
    StatusOr<PageRun> idle = arena_.StitchableChunk(
        wanted, room,
        [&](PageId id) { return Usable(id, 0, g, stream, context_.until); });
    if (idle.ok()) return *idle;
  }
  pool_.ReleaseUnfencedSpareChunksFor(pages);
  StatusOr<PageRun> grown = pool_.GrowRun(pages);
  if (grown.ok()) {
    on_grow_();
    return grown;
  }
  // Out of memory (cap or device). 5. A chunk cached idle in another arena
  // mapping: remapping costs driver calls (so it comes after growing, which
  // a repeating workload stops needing once warm). The pages move to
  // another address: every fence on them, the stream's own included, must
  // be complete first (waited for if need be).
  StatusOr<PageRun> reclaimed = ReclaimFromArena(pool_, tracker_, arena_, room);
  if (reclaimed.ok()) return *reclaimed;
  // 6. Any idle static chunk: its planned owner may have to go elsewhere.
  if (best.count > 0) return best;
  return grown.status();
}

}  // namespace loom::vmm
