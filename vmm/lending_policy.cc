#include "vmm/lending_policy.h"

#include <algorithm>

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
                   const std::vector<PageId>& pages) {
  bool pending = tracker.NeedsWaitForUnmap();
  for (PageId id : pages) {
    for (const Fence& f : pool.page(id).fences) {
      pending |= !tracker.Complete(f.tag);
    }
  }
  if (pending) LOOM_RETURN_IF_ERROR(tracker.WaitForAll());
  for (PageId id : pages) pool.page(id).fences.clear();
  return OkStatus();
}

namespace {

// A spare run of up to `wanted` pages free of other streams' unfinished
// work for `stream` (count 0: none).
PageRun FreeSpareRun(PagePool& pool, StreamTracker& tracker, uint32_t wanted,
                     Stream stream) {
  const uint32_t g = static_cast<uint32_t>(pool.granularity());
  return pool.SpareRun(wanted, [&](Page& page) {
    return FencesAllow(page, 0, g, stream, tracker);
  });
}

// A page cached idle in an arena granule (not a static page), unmapped there
// once no queued work may touch it.
StatusOr<PageId> ReclaimFromArena(PagePool& pool, StreamTracker& tracker,
                                  Arena& arena) {
  return arena.ReclaimIdle(
      [&](PageId id) { return pool.page(id).static_granule == kNoGranule; },
      [&](PageId id) { return DrainFences(pool, tracker, {id}); });
}

}  // namespace

StatusOr<PageRun> StaticBacking::Take(uint32_t wanted, uint32_t max) {
  // 1. Spare pages, the first run of `wanted`, else the longest.
  const PageRun spare = FreeSpareRun(pool_, tracker_, wanted, stream_);
  if (spare.count > 0) return spare;
  // 2. A page cached idle in an arena granule, unmapped there (after
  // waiting for its work): memory the arena holds but does not use now,
  // taken before new memory is. (Warm-up only: a region's granules are
  // backed once.)
  StatusOr<PageId> reclaimed = ReclaimFromArena(pool_, tracker_, arena_);
  if (reclaimed.ok()) return PageRun{*reclaimed, 1};
  // 3. A new chunk.
  const uint32_t chunk = std::min(max, std::max(wanted, kChunkPages));
  StatusOr<PageRun> grown = pool_.GrowRun(chunk);
  if (grown.ok()) {
    on_grow_();
    return grown;
  }
  return grown.status();
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
  return IdleFor(granule) >= Needed();
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

StatusOr<PageRun> LendingPolicy::Acquire(uint32_t wanted, Stream stream,
                                         int64_t) {
  const uint32_t g = static_cast<uint32_t>(pool_.granularity());
  auto free_for = [&](Page& p) {
    return FencesAllow(p, 0, g, stream, tracker_);
  };
  // 0. The pages the plan reserved for the request being served.
  while (!context_.preferred.empty()) {
    PageId id = context_.preferred.back();
    context_.preferred.pop_back();
    Page& p = pool_.page(id);
    if (p.arena_granule == kNoGranule && p.static_users == 0 && free_for(p)) {
      return PageRun{id, 1};
    }
  }
  // 1. Spare pages (in the pool, mapped nowhere): the first run as long as
  // wanted, else the longest.
  const PageRun spare = FreeSpareRun(pool_, tracker_, wanted, stream);
  if (spare.count > 0) return spare;
  // 2. An idle static page whose next planned use is far enough away.
  PageId best = kNoPage;
  int64_t best_distance = -1;
  if (region_ != nullptr) {
    for (uint32_t k = 0; k < region_->backed_extent(); ++k) {
      PageId id = region_->page(k);
      if (id == kNoPage) continue;  // not backed
      Page& p = pool_.page(id);
      if (p.arena_granule != kNoGranule || p.static_users != 0) continue;
      int64_t distance = IdleFor(k);
      if (distance <= best_distance || !free_for(p)) continue;
      best = id;
      best_distance = distance;
    }
    if (best != kNoPage && best_distance >= Needed()) return PageRun{best, 1};
  }
  // 3. A new chunk of what is wanted. (Growing by more, and keeping or
  // mapping the rest, was measured on the plan-miss suite: fewer calls,
  // more memory held.)
  StatusOr<PageRun> grown = pool_.GrowRun(wanted);
  if (grown.ok()) {
    on_grow_();
    return grown;
  }
  // Out of memory (cap or device). 4. Spare pages cached idle in another
  // arena mapping: remapping costs driver calls (so it comes after growing,
  // which a repeating workload stops needing once warm). The pages move to
  // another address: every fence on them, the stream's own included, must
  // be complete first (waited for if need be).
  StatusOr<PageId> reclaimed = ReclaimFromArena(pool_, tracker_, arena_);
  if (reclaimed.ok()) return PageRun{*reclaimed, 1};
  // 5. Any idle static page: its planned owner may have to go elsewhere.
  if (best != kNoPage) return PageRun{best, 1};
  return grown.status();
}

}  // namespace loom::vmm
