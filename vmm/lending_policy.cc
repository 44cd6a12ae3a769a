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

int64_t LendingPolicy::Needed() const {
  // Unknown lifetime (an extra request): it may live for ever, and a static
  // page lent for ever would make its planned owner miss every iteration.
  // Only granules the plan never uses qualify.
  if (context_.until < 0) return StaticRegion::kNever;
  return std::max<int64_t>(context_.until - context_.now, 0);
}

bool LendingPolicy::Lendable(uint32_t granule) const {
  return region_->TimeToNextUse(granule, context_.now, context_.in_setup) >=
         Needed();
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

StatusOr<PageId> LendingPolicy::Acquire(uint32_t lo, uint32_t hi,
                                        Stream stream, int64_t) {
  // 0. The pages the plan reserved for the request being served.
  while (!context_.preferred.empty()) {
    PageId id = context_.preferred.back();
    context_.preferred.pop_back();
    Page& p = pool_.page(id);
    if (p.arena_granule == kNoGranule && p.static_users == 0 &&
        FencesAllow(p, lo, hi, stream, tracker_)) {
      return id;
    }
  }
  // 1. A spare page: in the pool, mapped nowhere.
  for (PageId id = 0; id < pool_.slots(); ++id) {
    Page& p = pool_.page(id);
    if (p.live && p.static_granule == kNoGranule &&
        p.arena_granule == kNoGranule &&
        FencesAllow(p, lo, hi, stream, tracker_)) {
      return id;
    }
  }
  // 2. An idle static page whose next planned use is far enough away.
  PageId best = kNoPage;
  int64_t best_distance = -1;
  if (region_ != nullptr) {
    for (uint32_t k = 0; k < region_->granule_count(); ++k) {
      PageId id = region_->page(k);
      Page& p = pool_.page(id);
      if (p.arena_granule != kNoGranule || p.static_users != 0) continue;
      int64_t distance =
          region_->TimeToNextUse(k, context_.now, context_.in_setup);
      if (distance <= best_distance ||
          !FencesAllow(p, lo, hi, stream, tracker_)) {
        continue;
      }
      best = id;
      best_distance = distance;
    }
    if (best != kNoPage && best_distance >= Needed()) return best;
  }
  // 3. A new page.
  StatusOr<PageId> grown = pool_.Grow();
  if (grown.ok()) {
    on_grow_();
    return grown;
  }
  // Out of memory (cap or device). 4. A spare page cached idle in another
  // arena granule: remapping costs driver calls (so it comes after growing,
  // which a repeating workload stops needing once warm). The page moves to
  // another address: every fence on it, the stream's own included, must be
  // complete first (waited for if need be).
  StatusOr<PageId> reclaimed = arena_.ReclaimIdle(
      [&](PageId id) { return pool_.page(id).static_granule == kNoGranule; },
      [&](PageId id) { return DrainFences(pool_, tracker_, {id}); });
  if (reclaimed.ok()) return reclaimed;
  // 5. Any idle static page: its planned owner may have to go elsewhere.
  if (best != kNoPage) return best;
  return grown.status();
}

}  // namespace loom::vmm
