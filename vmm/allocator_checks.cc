// The allocator's statistics, physical extents and invariant checks.
#include <algorithm>
#include <tuple>

#include "vmm/allocator.h"

namespace loom::vmm {
uint64_t Allocator::held_high_water() const {
  std::lock_guard<FutexMutex> lock(mu_);
  return held_high_water_;
}

AllocatorStats Allocator::stats() const {
  std::lock_guard<FutexMutex> lock(mu_);
  AllocatorStats out = stats_;
  out.stream_events = tracker_.events_recorded();
  out.device_syncs = tracker_.device_syncs();
  out.waits = tracker_.waits();
  out.layout = driver_.mapping_layout(options_.device);
  out.driver_calls = driver_.all_calls();
  // Derived from the state they describe (never stored twice).
  out.plan_variants = variants_.size();
  for (const std::unique_ptr<Variant>& v : variants_) {
    out.static_region_bytes =
        std::max(out.static_region_bytes, v->plan.region_bytes);
  }
  out.static_backed_bytes = region_ != nullptr ? region_->backed_bytes() : 0;
  out.arena_mapped_bytes = arena_->mapped_granules() * granularity_;
  out.arena_maps = arena_->maps();
  out.stitched_pages = arena_->stitched_pages();
  out.stitched_static_pages = arena_->stitched_static_pages();
  out.suspended_iterations = fit_.suspended_iterations();
  out.last_iteration_suspended = fit_.last_iteration_suspended();
  out.plan_verdict = PlanReferee::Name(referee_.verdict());
  out.plan_losses = referee_.losses();
  out.referee_plan_bytes = referee_.plan_bytes();
  out.referee_dynamic_bytes = referee_.dynamic_bytes();
  out.lost_plan_bytes = referee_.lost_plan_bytes();
  out.lost_dynamic_bytes = referee_.lost_dynamic_bytes();
  return out;
}

void Allocator::ResetPeakStats() {
  std::lock_guard<FutexMutex> lock(mu_);
  for (Stat* s : {&stats_.allocated_bytes, &stats_.active_bytes,
                  &stats_.reserved_bytes, &stats_.allocation, &stats_.segment,
                  &stats_.static_bytes, &stats_.dynamic_bytes}) {
    s->ResetPeak();
  }
  pool_.ResetPeak();
}

std::vector<PhysicalExtent> Allocator::ExtentsLocked(
    DevicePtr ptr, const Allocation& a) const {
  // Both the region and the arena start on a granule boundary.
  std::vector<PhysicalExtent> out;
  const uint64_t size =
      a.where == Where::kArena ? RoundUp(a.size, kArenaAlignment) : a.size;
  const DevicePtr end = ptr + size;
  for (DevicePtr cursor = ptr; cursor < end;) {
    const DevicePtr granule_start = cursor - cursor % granularity_;
    const DevicePtr piece_end = std::min(end, granule_start + granularity_);
    const PageId page =
        a.where == Where::kStatic
            ? region_->page(static_cast<uint32_t>(
                  (granule_start - region_->base()) / granularity_))
            : arena_->PageAt(granule_start);
    out.push_back(
        PhysicalExtent{page, static_cast<uint32_t>(cursor - granule_start),
                       static_cast<uint32_t>(piece_end - granule_start)});
    cursor = piece_end;
  }
  return out;
}
MemoryBreakdown Allocator::Breakdown() const {
  std::lock_guard<FutexMutex> lock(mu_);
  MemoryBreakdown out;
  const std::vector<PageId> idle = arena_->IdlePages();  // sorted
  for (PageId id = 0; id < pool_.slots(); ++id) {
    const Page& p = pool_.page(id);
    if (!p.live) continue;
    uint64_t* bucket = &out.static_idle;
    if (p.spare()) {
      bucket = &out.spare;
    } else if (p.static_users != 0) {
      bucket = &out.static_live;
    } else if (p.arena_users != 0) {
      bucket = &out.arena_live;
    } else if (std::binary_search(idle.begin(), idle.end(), id)) {
      bucket = &out.arena_idle;
    } else if (p.arena_granule != kNoGranule) {
      bucket = &out.arena_idle_pinned;
    }
    *bucket += granularity_;
  }
  return out;
}

std::vector<std::pair<DevicePtr, uint64_t>> Allocator::MappedRanges() const {
  std::lock_guard<FutexMutex> lock(mu_);
  std::vector<std::pair<DevicePtr, uint64_t>> out = arena_->MappedRanges();
  if (region_ != nullptr) {
    for (const auto& range : region_->MappedRanges()) out.push_back(range);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<PhysicalExtent> Allocator::PhysicalExtents(DevicePtr ptr) const {
  std::lock_guard<FutexMutex> lock(mu_);
  const Allocation* found = live_.Find(ptr);
  if (found == nullptr) return {};
  return ExtentsLocked(ptr, *found);
}

void Allocator::CheckInvariants() const {
  std::lock_guard<FutexMutex> lock(mu_);
  arena_->CheckInvariants();
  if (region_ != nullptr) region_->CheckInvariants();
  // No physical byte serves two live (or pending) allocations.
  std::vector<std::tuple<PageId, uint32_t, uint32_t, DevicePtr>> pieces;
  auto collect = [&](DevicePtr ptr, const Allocation& a) {
    for (const PhysicalExtent& e : ExtentsLocked(ptr, a)) {
      pieces.emplace_back(e.page, e.lo, e.hi, ptr);
    }
  };
  uint64_t live_bytes = 0;
  live_.ForEach([&](DevicePtr ptr, const Allocation& a) {
    collect(ptr, a);
    live_bytes += a.size;
  });
  uint64_t pending_bytes = 0;
  for (const PendingFree& p : pending_) {
    collect(p.ptr, p.allocation);
    pending_bytes += p.allocation.size;
  }
  std::sort(pieces.begin(), pieces.end());
  for (size_t i = 1; i < pieces.size(); ++i) {
    const auto& [page_a, lo_a, hi_a, ptr_a] = pieces[i - 1];
    const auto& [page_b, lo_b, hi_b, ptr_b] = pieces[i];
    LOOM_CHECK(page_a != page_b || hi_a <= lo_b,
               "allocations {:#x} and {:#x} share bytes [{}, {}) of page {}",
               ptr_a, ptr_b, lo_b, std::min(hi_a, hi_b), page_a);
  }
  LOOM_CHECK_EQ(live_bytes, stats_.allocated_bytes.current);
  LOOM_CHECK_EQ(live_bytes + pending_bytes, stats_.active_bytes.current);
  LOOM_CHECK_EQ(pool_.bytes(), stats_.reserved_bytes.current);
  for (PageId id = 0; id < pool_.slots(); ++id) {
    const Page& p = pool_.page(id);
    if (!p.live) continue;
    LOOM_CHECK(p.static_users == 0 || p.arena_users == 0,
               "page {} serves static and arena allocations at once", id);
    LOOM_CHECK(p.static_users == 0 || p.static_granule != kNoGranule);
    LOOM_CHECK(p.arena_users == 0 || p.arena_granule != kNoGranule);
  }
  // The idle region's index holds only free bytes of backed granules.
  if (idle_region_.has_value()) {
    LOOM_CHECK(region_ != nullptr, "idle region index without a region");
    idle_region_->CheckInvariants(region_->bytes(), "idle region");
    idle_region_->ForEach([&](uint64_t offset, uint64_t size) {
      LOOM_CHECK(region_->RangeFree(offset, size),
                 "idle region block [{}, {}) overlaps a live allocation",
                 offset, offset + size);
      for (uint64_t k = offset / granularity_;
           k <= (offset + size - 1) / granularity_; ++k) {
        LOOM_CHECK(region_->page(static_cast<uint32_t>(k)) != kNoPage,
                   "idle region block [{}, {}) on an unbacked granule", offset,
                   offset + size);
      }
    });
  }
}

}  // namespace loom::vmm
