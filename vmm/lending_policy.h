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
//    taken is served elsewhere: the safety check), except the granules the
//    request's context keeps (a suspended warm-up's next persistent
//    places), lent only when memory runs out;
//  - Acquire's order: the entry's own pages, a spare chunk, the idle
//    static chunk unused the longest (if long enough), an idle arena chunk
//    stitched (mapped here too, where a new chunk would raise the memory
//    held above its peak, from iteration kStitchFromIteration on; a static
//    chunk lent to the arena too, under the same lending test), a new
//    chunk of the pages wanted, a chunk reclaimed from an idle arena mapping
//    (after waiting for its work), and last any idle static chunk. Every
//    answer is one whole chunk (CUDA maps whole handles only); a chunk
//    already held may be larger than the stretch, over the unmapped
//    granules after it;
//  - a new chunk holds at most kMaxNewChunkBytes (kMaxNewDynamicChunkBytes
//    for a request made inside a module marked dynamic; a larger stretch
//    gets several, one map each). A chunk goes back, or is stitched, only
//    once no page of it serves a live allocation, so an allocation made
//    for good in reused memory (an optimizer state in a freed activation's
//    granules) keeps its whole chunk: each chunk a live arena allocation
//    keeps idle costs less than kMaxNewChunkBytes, where chunks as large as
//    their requests kept up to 1 GiB each idle (3.6 GiB on the H200's
//    gpt2_interleaved after auto mode's switch to a plan; 6 GiB beside the
//    region for a pipeline's first iteration before its first marker).
#ifndef LOOM_VMM_LENDING_POLICY_H_
#define LOOM_VMM_LENDING_POLICY_H_

#include <cstdint>
#include <functional>
#include <utility>
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
// forgets their fences. `site`: who waits (counted by the tracker).
Status DrainFences(PagePool& pool, StreamTracker& tracker,
                   const std::vector<PageId>& pages, WaitSite site);

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
  // Static granules [first, last] never lent to it, whatever the schedule
  // says: while a suspended early iteration is the run's warm-up, the
  // places of the next persistent entries not yet served (an optimizer
  // state about to be made for good takes its planned place,
  // Allocator::PlacePersistent).
  std::vector<std::pair<uint32_t, uint32_t>> kept;
  // Idle arena chunks may be stitched (mapped a second time) for it: from
  // the run's second iteration on (kStitchFromIteration), or from the first
  // request for a large one (kStitchEarlyBytes).
  bool stitch = false;
  // Made inside a module marked dynamic (an MoE expert's request): its new
  // chunks are smaller (kMaxNewDynamicChunkBytes).
  bool in_dynamic_module = false;
};

// The arena stitches idle chunks instead of growing past its peak once this
// many iteration markers began (2: from the run's second iteration on; the
// set-up and the first iteration lay out the dynamic space). Measured on the
// plan-miss suite (bench/results/misses.md, eleventh session), every other
// rule as kept: from the first request, 42 of 82 rows at target; from the
// first iteration, 57; from the second, 63 (57 with no stitching). Chunks
// stitched in the first iteration end up mapped at places the next
// iteration wants back, and their requests grow the pool elsewhere.
inline constexpr uint64_t kStitchFromIteration = 2;
// A request of at least this many bytes may stitch from the first request
// on: a pipeline's first forward passes outgrow the places their
// predecessors freed by hundreds of MiB at a time, and a new chunk there is
// memory the next iteration does not give back. Measured on the plan-miss
// suite (bench/results/misses.md, fourteenth session, 84 rows): 70 rows at
// target (-4.85 points summed) against 69 (-5.98) without, 3 fewer rows
// without a call in their last iteration; 64 MiB: 61 of 84 (-9.06); 32
// MiB: 61 of 83 (-9.16); every request: 54 of 83 (-10.39).
inline constexpr uint64_t kStitchEarlyBytes = uint64_t{256} << 20;

// Pages for static granules a planned allocation occupies for the first time
// (StaticRegion::Back), for a request on `stream`. Order: spare chunks; a
// chunk reclaimed from an idle arena mapping (unmapped there after its
// work: memory held but unused is taken before new memory; either may be
// larger than the range, over the unbacked granules after it); new pages
// (up to `max` of them, the extra ones backing the granules after the
// range: the plan uses them soon), after giving back the idle memory that
// did not fit. New pages come in one chunk per stretch of granules the plan
// uses at the same times (PlanSchedule::SameUse: idle at the same times, so
// lent together; a stretch where persistent requests live is never idle),
// one create and one map each; without a plan, a chunk of one page each.
// Idle arena pages are not mapped into the region while staying in the
// arena: a page serving both sides in turn makes the arena's cached places
// unusable whenever the static side is live, and the arena then maps more.
// Every page it gives is free of other streams' unfinished work.
class StaticBacking final : public PageSource {
 public:
  // How many new pages back the static region at least (when the region
  // has that many unbacked granules in a row): one set-access for them.
  static constexpr uint32_t kChunkPages = 16;

  // `schedule`: the installed plan's (null: none; every new page is then a
  // chunk of its own).
  StaticBacking(PagePool& pool, StreamTracker& tracker, Arena& arena,
                const PlanSchedule* schedule, Stream stream,
                std::function<void()> on_grow)
      : pool_(pool),
        tracker_(tracker),
        arena_(arena),
        schedule_(schedule),
        stream_(stream),
        on_grow_(std::move(on_grow)) {}

  StatusOr<std::vector<PageRun>> Take(uint32_t first, uint32_t wanted,
                                      uint32_t max, uint32_t room) override;

 private:
  // New chunks for `count` granules from `first`: one per stretch of
  // granules of the same use (at most PagePool::kMaxChunkPages). Memory
  // held idle goes back to the driver first, up to `count` pages: spare
  // chunks, then idle arena chunks (after their work), which did not fit
  // where pages were wanted and would otherwise stay held beside the new
  // ones. Fewer pages if the cap or the device runs out.
  StatusOr<std::vector<PageRun>> Grow(uint32_t first, uint32_t count);

  PagePool& pool_;
  StreamTracker& tracker_;
  Arena& arena_;
  const PlanSchedule* schedule_;
  Stream stream_;
  std::function<void()> on_grow_;
};

class LendingPolicy final : public Arena::PagePolicy {
 public:
  // The largest new arena chunk (as expandable segments' 20 MiB pages; 8
  // granules of 2 MiB): a chunk is mapped, unmapped and stitched whole, and
  // it is idle only when no live allocation touches any of its pages.
  // Measured with `loom replay --auto 3` on the H200's traces: the switch
  // to the plan keeps llama1b, gpt2_interleaved and moe at their unplanned
  // peak, and llama1b_recompute 0.28 GiB above it (1.88 with chunks as
  // large as their request; 8 MiB: 0.10, 2 MiB: 0 but moe 0.12 above);
  // warm-up driver time 41 -> 77 ms (llama1b), steady state still none.
  // Chunks as large as the stretch while a plan is installed (as before
  // stitching) gave 51 of 82 rows at target, this 63 (misses.md, eleventh
  // session): a large chunk that a small live allocation keeps cannot be
  // stitched. A new chunk holds only the pages wanted: taking the unmapped
  // granules after the place too (expandable segments' tail, which serves
  // the next requests with no call) brought 9 to 11 more rows' warm-ups
  // within 2x of expandable segments' but held more memory on every
  // variant measured (misses.md, nineteenth session).
  static constexpr uint64_t kMaxNewChunkBytes = uint64_t{16} << 20;
  // The same for a request made inside a module marked dynamic: 8 MiB. An
  // expert's requests change size every step, so a later one reaches a page
  // or two into a chunk an earlier one left, and that live sliver keeps the
  // whole chunk from being stitched (CUDA maps whole chunks only): at the
  // peak of qwen3_moe_plain at micro-batch 1, 25 idle pages in 8 chunks so
  // held. Measured on the plan-miss suite (bench/results/misses.md,
  // eighteenth session): MoE rows at 98% 19 -> 23 of 26, warm-ups within
  // 2x unchanged (66 of 84), rows at target unchanged (76), no other row
  // moved; 2 MiB: 24 MoE rows but warm-ups within 2x 52 (up to 4x
  // expandable segments' on the H200's moe rows); 4 MiB (nineteenth
  // session): 24 MoE rows, 77 at target, warm-ups within 2x 58; 8 MiB for
  // every request: 23 MoE rows, 74 at target, warm-ups 53.
  static constexpr uint64_t kMaxNewDynamicChunkBytes = uint64_t{8} << 20;

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
  StatusOr<PageRun> Acquire(uint32_t wanted, uint32_t room, Stream stream,
                            int64_t until) override;

 private:
  // Iteration time a lent static page must stay free for.
  int64_t Needed() const;
  // How long static granule k stays unused from now (kNever: no schedule).
  int64_t IdleFor(uint32_t granule) const;
  bool Lendable(uint32_t granule) const;
  // Granule in the request's kept ranges.
  bool Kept(uint32_t granule) const;
  bool Preferred(PageId id) const;
  // True when no page of `chunk` is mapped in the arena or serves a live
  // static allocation, and no other stream's free on it is incomplete.
  bool Idle(PageRun chunk, Stream stream);

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
