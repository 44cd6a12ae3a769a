// Where a request the plan does not place goes (the allocator's slow
// path): bytes of the static region the plan leaves idle while it lives; while
// no plan serves (suspended, lost), the region's backed bytes no live
// allocation occupies or the arena's mapped free space, whichever fits best
// (docs/design.md, "The idle region"); else the arena, its pages chosen by
// the lending policy.
#include <algorithm>

#include "vmm/allocator.h"

namespace loom::vmm {
StatusOr<DevicePtr> Allocator::ServeUnforeseen(uint64_t size, Stream stream,
                                               int64_t until,
                                               std::vector<PageId> preferred,
                                               Where* where,
                                               bool in_dynamic_module) {
  const PlanSchedule* plan_schedule = schedule();
  if (plan_schedule != nullptr && until >= 0 && !active_->matcher.in_setup()) {
    // Bytes of the static region the plan leaves idle until `until`:
    // checked free now by the same safety check as a planned hand-out.
    for (uint64_t offset :
         plan_schedule->IdleRanges(size, active_->matcher.now(), until, 8)) {
      if (OccupyStatic(offset, size, stream)) {
        ++stats_.idle_static_placements;
        *where = Where::kStatic;
        return region_->base() + offset;
      }
    }
  }
  if (serving_ == nullptr && region_ != nullptr) {
    // No plan serves (suspended, lost): memory already held first, without
    // a driver call, best fit across the region's idle bytes and the
    // arena's mapped free space (a smaller free block wins: the arena,
    // below, places in that block with no new page); new pages only when
    // neither fits.
    if (std::optional<DevicePtr> placed = PlaceInIdleRegion(
            size, stream, ArenaMappedFit(size, stream, until))) {
      *where = Where::kStatic;
      return *placed;
    }
  }
  *where = Where::kArena;
  return AllocateInArena(size, stream, until, std::move(preferred),
                         in_dynamic_module);
}

void Allocator::ServePersistent(size_t index) {
  const std::vector<PlannedRequest>& seq = active_->plan.prologue;
  const size_t entries = std::min(seq.size(), persistent_.served.size());
  if (index >= entries) return;
  persistent_.served[index] = true;
  while (persistent_.cursor < entries &&
         (persistent_.served[persistent_.cursor] ||
          !Persistent(seq[persistent_.cursor], active_->plan))) {
    ++persistent_.cursor;
  }
}

template <typename Visit>
void Allocator::ForEachNextPersistent(Visit&& visit) const {
  const std::vector<PlannedRequest>& seq = active_->plan.prologue;
  const size_t entries = std::min(seq.size(), persistent_.served.size());
  int looked = 0;
  for (size_t i = persistent_.cursor;
       i < entries && looked < kPersistentLookahead; ++i) {
    if (persistent_.served[i] || !Persistent(seq[i], active_->plan)) continue;
    ++looked;
    if (visit(i, seq[i])) return;
  }
}

std::vector<std::pair<uint32_t, uint32_t>> Allocator::KeptForWarmUp() const {
  std::vector<std::pair<uint32_t, uint32_t>> kept;
  if (serving_ != nullptr || !PlacesPersistent()) return kept;
  ForEachNextPersistent([&](size_t, const PlannedRequest& entry) {
    const uint64_t offset = static_cast<uint64_t>(entry.offset);
    kept.emplace_back(
        static_cast<uint32_t>(offset / granularity_),
        static_cast<uint32_t>((offset + entry.size - 1) / granularity_));
    return false;
  });
  return kept;
}

std::optional<DevicePtr> Allocator::PlacePersistent(uint64_t size,
                                                    Stream stream) {
  std::optional<DevicePtr> placed;
  ForEachNextPersistent([&](size_t i, const PlannedRequest& entry) {
    if (entry.size != size || PlaceRaisesPeak(entry)) return false;
    placed = TryStatic(entry, size, stream);
    if (!placed.has_value()) return false;
    ++stats_.persistent_placements;
    persistent_.taken.emplace(*placed, i);
    ServePersistent(i);
    return true;
  });
  return placed;
}

std::optional<DevicePtr> Allocator::TryPersistent(const PlannedRequest& entry,
                                                  uint64_t size, Stream stream,
                                                  bool grown) {
  Variant& v = *active_;
  const uint64_t planned = static_cast<uint64_t>(entry.offset);
  const bool pushed = planned > v.pushed_from && planned < v.pushed_to;
  if (!pushed && !grown) return TryStatic(entry, size, stream);
  const uint64_t place = pushed ? v.pushed_to : planned;
  const uint64_t end = place + RoundUp(size, kArenaAlignment);
  if (end > v.persistent_end || !OccupyStatic(place, size, stream)) {
    return std::nullopt;
  }
  v.pushed_from = planned;
  v.pushed_to = end;
  ++stats_.persistent_pushes;
  return region_->base() + place;
}

uint64_t Allocator::PersistentEnd(const RuntimePlan& plan) {
  uint64_t end = 0;
  for (const PlannedRequest& r : plan.prologue) {
    if (Persistent(r, plan)) {
      end = std::max(end, static_cast<uint64_t>(r.offset) +
                              RoundUp(r.size, kArenaAlignment));
    }
  }
  return end;
}

bool Allocator::PlaceRaisesPeak(const PlannedRequest& entry) const {
  if (stats_.iterations < kStitchFromIteration) return false;
  const uint32_t unbacked = region_->UnbackedGranules(
      static_cast<uint64_t>(entry.offset), entry.size);
  return unbacked > 0 && !pool_.FitsUnderPeak(unbacked);
}

RequestContext Allocator::ContextFor(uint64_t size, Stream stream,
                                     int64_t until,
                                     std::vector<PageId> preferred) const {
  RequestContext context;
  context.stream = stream;
  context.until = until;
  if (active_ != nullptr) {
    context.now = active_->matcher.now();
    context.in_setup = active_->matcher.in_setup();
  }
  context.preferred = std::move(preferred);
  context.kept = KeptForWarmUp();
  context.stitch = options_.stitch_idle_chunks &&
                   (stats_.iterations >= kStitchFromIteration ||
                    size >= options_.stitch_early_bytes);
  return context;
}

bool Allocator::InChunksServingStatic(uint64_t offset, uint64_t size) const {
  PageId checked = kNoPage;  // the head of the last chunk found serving
  for (uint64_t k = offset / granularity_;
       k <= (offset + size - 1) / granularity_; ++k) {
    const PageId page = region_->page(static_cast<uint32_t>(k));
    const PageRun chunk = pool_.ChunkOf(page);
    if (chunk.first == checked) continue;
    bool serving = false;
    for (uint32_t i = 0; i < chunk.count && !serving; ++i) {
      serving = pool_.page(chunk.first + i).static_users > 0;
    }
    if (!serving) return false;
    checked = chunk.first;
  }
  return true;
}

uint64_t Allocator::ArenaMappedFit(uint64_t size, Stream stream,
                                   int64_t until) {
  LendingPolicy policy(pool_, tracker_, *arena_, region_.get(), schedule(),
                       ContextFor(size, stream, until, {}),
                       [this] { UpdateReserved(); });
  return arena_->MappedFit(size, stream, until, policy);
}

std::optional<DevicePtr> Allocator::PlaceInIdleRegion(uint64_t size,
                                                      Stream stream,
                                                      uint64_t below) {
  if (!idle_region_.has_value()) {
    if (region_->backed_bytes() == 0) return std::nullopt;
    // A page the arena has mapped is the arena's free space (or in use
    // there): held memory counted once, served from one side.
    idle_region_.emplace();
    for (const auto& [offset, bytes] :
         region_->FreeBackedRanges([](const Page& page) {
           return page.arena_granule == kNoGranule;
         })) {
      idle_region_->Give(offset, bytes, "idle region");
    }
  }
  // Best fit among the first kExamined fitting blocks; at most kChecks of
  // them through the safety check: a block whose page the arena mapped
  // since (an idle static chunk lent to it), or that another stream's work
  // still fences, fails it and stays indexed.
  constexpr int kExamined = 64;
  constexpr int kChecks = 8;
  int examined = 0;
  int checks = 0;
  for (auto it = idle_region_->FirstFitting(size);
       it != idle_region_->end() && it->first < below && examined < kExamined &&
       checks < kChecks;
       ++it) {
    const auto [bytes, block] = *it;
    const uint64_t offset = RoundUp(block, kArenaAlignment);
    if (offset + size > block + bytes) continue;
    ++examined;
    // In a run with iteration markers, a chunk no static allocation holds
    // stays whole: the arena may take it (LendingPolicy), and a plan that
    // serves again next iteration finds it free (requests placed in its
    // holes may outlive the iteration).
    if (stats_.iterations > 0 && !InChunksServingStatic(offset, size)) continue;
    ++checks;
    const StaticRegion::Occupied occupied = region_->TryOccupy(
        offset, size, [&](Page& page, uint32_t lo, uint32_t hi) {
          return page.arena_granule == kNoGranule &&
                 FencesAllow(page, lo, hi, stream, tracker_);
        });
    if (occupied == StaticRegion::Occupied::kNo) continue;
    // Only backed granules are indexed (a granule stays backed).
    LOOM_CHECK(occupied == StaticRegion::Occupied::kYes,
               "idle region block at {} is not backed", offset);
    idle_region_->Take(block, offset, size);
    ++stats_.region_reuses;
    return region_->base() + offset;
  }
  return std::nullopt;
}

StatusOr<DevicePtr> Allocator::AllocateInArena(uint64_t size, Stream stream,
                                               int64_t until,
                                               std::vector<PageId> preferred,
                                               bool in_dynamic_module) {
  RequestContext context =
      ContextFor(size, stream, until, std::move(preferred));
  context.in_dynamic_module = in_dynamic_module;
  const PlanSchedule* plan_schedule = schedule();
  LendingPolicy policy(pool_, tracker_, *arena_, region_.get(), plan_schedule,
                       context, [this] { UpdateReserved(); });
  StatusOr<DevicePtr> ptr = arena_->Allocate(size, stream, until, policy);
  if (!ptr.ok() && ptr.status().code() == StatusCode::kOutOfMemory) {
    // Release what is cached and try once more (PyTorch's OOM retry).
    ++stats_.num_alloc_retries;
    Status released = EmptyCacheLocked();
    if (released.ok()) {
      LendingPolicy retry(pool_, tracker_, *arena_, region_.get(),
                          plan_schedule, std::move(context),
                          [this] { UpdateReserved(); });
      ptr = arena_->Allocate(size, stream, until, retry);
    }
  }
  UpdateReserved();
  if (!ptr.ok() && ptr.status().code() == StatusCode::kOutOfMemory)
    ++stats_.num_ooms;
  return ptr;
}

}  // namespace loom::vmm
