// LendingPolicy: which physical pages an arena allocation may use, for one
// request (the page filler of the allocator, apart from its front door).
//
// The arena (arena.h) places a request in its address space and asks its
// PagePolicy whether an already mapped page may serve it (Usable) and for a
// page to map where none is (Acquire). This policy answers for one request,
// described by its RequestContext (stream, expected end, the pages its plan
// entry reserved), so no per-request state lives in the allocator. Its
// rules:
//  - a page serving live static allocations never serves the arena (the
//    allocator's invariant: a page serves one side at a time);
//  - bytes another stream freed are used only once that free's work is done
//    (FencesAllow, stream_tracker.h);
//  - a static page (idle now) is lent only if its next planned use is later
//    than the request's expected end, so its planned owner finds it free; a
//    request of unknown lifetime gets only pages the plan never uses; the
//    pages the request's own plan entry reserved are always fine; without a
//    schedule (the plan is suspended: it does not fit this iteration) every
//    idle static page may be lent (a planned owner that finds its page
//    taken is served elsewhere: the safety check);
//  - Acquire's order: the entry's own pages, a run of spare pages, the idle
//    static page unused the longest (if long enough), a new chunk of the
//    pages wanted, pages reclaimed from an idle arena mapping (after waiting
//    for their work), and last any idle static page.
#ifndef LOOM_VMM_LENDING_POLICY_H_
#define LOOM_VMM_LENDING_POLICY_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "vmm/arena.h"
#include "vmm/page_pool.h"
#include "vmm/plan_schedule.h"
#include "vmm/static_region.h"
#include "vmm/stream_tracker.h"

namespace loom::vmm {

// True when `stream` may use bytes [lo, hi) of `page` now: no other
// stream's free there is incomplete. Forgets the complete fences it meets.
inline bool FencesAllow(Page& page, uint32_t lo, uint32_t hi, Stream stream,
                        StreamTracker& tracker);
bool FencesAllowSlow(Page& page, uint32_t lo, uint32_t hi, Stream stream,
                     StreamTracker& tracker);
inline bool FencesAllow(Page& page, uint32_t lo, uint32_t hi, Stream stream,
                        StreamTracker& tracker) {
  return page.fences.empty() || FencesAllowSlow(page, lo, hi, stream, tracker);
}

// Before `pages` are unmapped or remapped: waits until no queued work may
// still touch them (every fence complete, or a device-wide wait), then
// forgets their fences.
Status DrainFences(PagePool& pool, StreamTracker& tracker,
                   const std::vector<PageId>& pages);

struct RequestContext {
  Stream stream = 0;
  // Iteration time now and the request's expected end (-1: unknown), from
  // the matcher; `in_setup`: no iteration has begun yet.
  int64_t now = 0;
  int64_t until = -1;
  bool in_setup = false;
  // The pages of the static granules the request's plan entry covers whole
  // (a missed entry: idle for the lifetime the request takes over).
  std::vector<PageId> preferred;
};

// Pages for static granules a planned allocation occupies for the first time
// (StaticRegion::Back), for a request on `stream`. Order: a run of spare
// pages; a page reclaimed from an idle arena granule (unmapped there after
// its work: memory held but unused is taken before new memory); a new
// chunk (up to `max` pages, the extra ones backing the granules after the
// range: the plan uses them soon). Idle arena pages are not mapped into
// the region while staying in the arena: a page serving both sides in turn
// makes the arena's cached places unusable whenever the static side is
// live, and the arena then maps more.
// Every page it gives is free of other streams' unfinished work.
class StaticBacking final : public PageSource {
 public:
  // How many pages a new chunk for the static region holds at least (when
  // the region has that many unbacked granules in a row).
  static constexpr uint32_t kChunkPages = 16;

  StaticBacking(PagePool& pool, StreamTracker& tracker, Arena& arena,
                Stream stream, std::function<void()> on_grow)
      : pool_(pool),
        tracker_(tracker),
        arena_(arena),
        stream_(stream),
        on_grow_(std::move(on_grow)) {}

  StatusOr<PageRun> Take(uint32_t wanted, uint32_t max) override;

 private:
  PagePool& pool_;
  StreamTracker& tracker_;
  Arena& arena_;
  Stream stream_;
  std::function<void()> on_grow_;
};

class LendingPolicy final : public Arena::PagePolicy {
 public:
  // `region` may be null (no plan); `schedule` null: no plan in force (every
  // idle static page may be lent). `on_grow` is called after the pool grew.
  // REQUIRES: everything referenced outlives the policy.
  LendingPolicy(PagePool& pool, StreamTracker& tracker, Arena& arena,
                const StaticRegion* region, const PlanSchedule* schedule,
                RequestContext context, std::function<void()> on_grow)
      : pool_(pool),
        tracker_(tracker),
        arena_(arena),
        region_(region),
        schedule_(schedule),
        context_(std::move(context)),
        on_grow_(std::move(on_grow)) {}

  bool Usable(PageId page, uint32_t lo, uint32_t hi, Stream stream,
              int64_t until) override;
  StatusOr<PageRun> Acquire(uint32_t wanted, Stream stream,
                            int64_t until) override;

 private:
  // Iteration time a lent static page must stay free for.
  int64_t Needed() const;
  // How long static granule k stays unused from now (kNever: no schedule).
  int64_t IdleFor(uint32_t granule) const;
  bool Lendable(uint32_t granule) const;
  bool Preferred(PageId id) const;

  PagePool& pool_;
  StreamTracker& tracker_;
  Arena& arena_;
  const StaticRegion* region_;
  const PlanSchedule* schedule_;
  RequestContext context_;
  std::function<void()> on_grow_;
};

}  // namespace loom::vmm

#endif  // LOOM_VMM_LENDING_POLICY_H_
