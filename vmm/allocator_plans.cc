// The allocator's plans: installing, adding variants, choosing the variant
// that serves an iteration, suspending a plan that does not fit, unloading.
#include <algorithm>

#include "vmm/allocator.h"

namespace loom::vmm {
bool Allocator::has_plan() const {
  std::lock_guard<FutexMutex> lock(mu_);
  return !variants_.empty();
}

bool Allocator::PlanSuspended() const {
  std::lock_guard<FutexMutex> lock(mu_);
  return active_ != nullptr && fit_.suspended();
}

bool Allocator::PlansCrossIterations() const {
  std::lock_guard<FutexMutex> lock(mu_);
  for (const std::unique_ptr<Variant>& v : variants_) {
    const int64_t period = v->plan.period;
    for (const PlannedRequest& r : v->plan.iteration) {
      if (r.end > period) return true;
    }
    for (const DynamicWindow& w : v->plan.windows) {
      for (const PlannedRequest& r : w.steady.requests) {
        if (r.end > period) return true;
      }
    }
  }
  return false;
}

size_t Allocator::plan_variants() const {
  std::lock_guard<FutexMutex> lock(mu_);
  return variants_.size();
}

Status Allocator::CheckPlan(const RuntimePlan& plan,
                            uint64_t region_limit) const {
  if (plan.region_bytes == 0 || plan.region_bytes % granularity_ != 0) {
    return InvalidArgumentError(
        "plan region of {} bytes is not a positive multiple of the granularity "
        "{}",
        plan.region_bytes, granularity_);
  }
  if (plan.region_bytes > region_limit) {
    return FailedPreconditionError(
        "plan region of {} bytes exceeds the static region's {} bytes",
        plan.region_bytes, region_limit);
  }
  auto check = [&](const std::vector<PlannedRequest>& seq,
                   std::string_view what) -> Status {
    for (size_t i = 0; i < seq.size(); ++i) {
      const PlannedRequest& r = seq[i];
      if (r.size == 0 || r.size > kMaxRequest) {
        return InvalidArgumentError("plan {} entry {}: size {}", what, i,
                                    r.size);
      }
      if (r.offset != kUnplanned &&
          (r.offset < 0 ||
           static_cast<uint64_t>(r.offset) > plan.region_bytes ||
           r.size > plan.region_bytes - static_cast<uint64_t>(r.offset))) {
        return InvalidArgumentError(
            "plan {} entry {}: [{}, +{}) outside the region of {} bytes", what,
            i, r.offset, r.size, plan.region_bytes);
      }
    }
    return OkStatus();
  };
  LOOM_RETURN_IF_ERROR(check(plan.prologue, "prologue"));
  LOOM_RETURN_IF_ERROR(check(plan.iteration, "iteration"));
  if (plan.period < 0) return InvalidArgumentError("negative plan period");
  const uint64_t granules = plan.region_bytes / granularity_;
  for (const DynamicWindow& w : plan.windows) {
    LOOM_RETURN_IF_ERROR(check(w.steady.requests, "dynamic window"));
    for (const WindowRequests& early : w.early) {
      LOOM_RETURN_IF_ERROR(
          check(early.requests, "dynamic window (early iteration)"));
    }
    for (uint32_t k : w.idle_granules) {
      if (k >= granules) {
        return InvalidArgumentError(
            "dynamic window '{}': granule {} outside the region", w.module, k);
      }
    }
  }
  return OkStatus();
}

Status Allocator::LoadPlan(RuntimePlan plan) {
  std::lock_guard<FutexMutex> lock(mu_);
  if (!variants_.empty())
    return FailedPreconditionError("a plan is already installed");
  LOOM_RETURN_IF_ERROR(CheckPlan(plan, kMaxRequest));
  persistent_ = PersistentQueue();
  persistent_.served.assign(plan.prologue.size(), false);
  // Installed mid-run (after record mode): the arena's idle granules give
  // their pages back, so the region is backed with them, not new ones.
  LOOM_RETURN_IF_ERROR(FreeIdleArenaPages());
  // The region is backed lazily (static_region.h): installing it reserves
  // address space only, enough for later variants too (the device's
  // memory; address space costs nothing). It exists exactly while a plan
  // is installed.
  LOOM_CHECK(region_ == nullptr);
  StatusOr<std::unique_ptr<StaticRegion>> region =
      StaticRegion::Create(driver_, pool_, options_.device,
                           std::max(plan.region_bytes, device_bytes_));
  if (!region.ok()) {
    return region.status().WithContext("building the static region");
  }
  region_ = std::move(region).value();
  variants_.push_back(std::make_unique<Variant>(std::move(plan), granularity_));
  active_ = serving_ = variants_.back().get();
  active_->last_used = stats_.iterations;
  probed_ = kProbeRequests;
  // Installed mid-run (after record mode): start at the steady state.
  if (next_request_id_ > 1) active_->matcher.JumpToIteration();
  UpdateReserved();
  StartReferee();
  return OkStatus();
}

Status Allocator::AddPlanVariant(RuntimePlan plan, bool never_raise_peak) {
  std::lock_guard<FutexMutex> lock(mu_);
  if (variants_.empty() || region_ == nullptr) {
    return FailedPreconditionError("no plan installed to add a variant to");
  }
  // Above the bytes of live persistent static allocations (the installed
  // plans' weights and optimizer state, when they planned them): the new
  // layout knows nothing of them. Everything else of the region is shared
  // (only one iteration runs at a time), so are its pages.
  const uint64_t floor = VariantFloor();
  if (floor > 0) ShiftPlan(plan, floor);
  LOOM_RETURN_IF_ERROR(CheckPlan(plan, region_->bytes()));
  // The same requests as a variant already there: that one serves.
  for (const std::unique_ptr<Variant>& v : variants_) {
    const std::vector<PlannedRequest>& mine = v->plan.iteration;
    if (mine.size() == plan.iteration.size() &&
        std::equal(mine.begin(), mine.end(), plan.iteration.begin(),
                   [](const PlannedRequest& a, const PlannedRequest& b) {
                     return a.size == b.size;
                   })) {
      return AlreadyExistsError(
          "a plan variant with the same {} requests is installed", mine.size());
    }
  }
  if (never_raise_peak) {
    // Judged before anything changes (the idle arena mappings are not
    // unmapped for a variant that is refused). Memory held now or before
    // costs nothing more: only a variant that would raise the high-water
    // mark hurts.
    // One granule of slack: the variant's range ends on a whole granule,
    // where its layout may end inside one.
    const uint64_t needs = VariantHeldBytes(floor, plan.region_bytes);
    if (needs > held_high_water_ + granularity_) {
      ++stats_.plan_variants_refused;
      if (fit_.suspended()) {
        // The installed plans did not fit the iteration that just ended,
        // and planning it would hold more than serving it dynamically: the
        // plans lose (until a variant is installed).
        referee_.Forfeit(needs, held_high_water_);
        serving_ = nullptr;
      }
      return OutOfMemoryError(
          "the variant would hold {} bytes, more than the {} bytes held "
          "at most so far (its iteration served dynamically included)",
          needs, held_high_water_);
    }
  }
  LOOM_RETURN_IF_ERROR(FreeIdleArenaPages());
  // Only now, with nothing left to refuse or fail: a full set loses the
  // variant unused the longest (its windows' learned lifetimes with it).
  if (variants_.size() >= kMaxVariants) {
    auto oldest = std::min_element(
        variants_.begin(), variants_.end(), [&](const auto& a, const auto& b) {
          return (a.get() == active_ ? UINT64_MAX : a->last_used) <
                 (b.get() == active_ ? UINT64_MAX : b->last_used);
        });
    for (const DynamicWindow& w : (*oldest)->plan.windows) {
      lifetimes_.erase(&w);
      window_cursors_.erase(&w);
    }
    if (window_ != nullptr) FindWindow();
    variants_.erase(oldest);
  }
  variants_.push_back(std::make_unique<Variant>(std::move(plan), granularity_));
  active_ = variants_.back().get();
  // A re-plan gets its chance even after a plan lost: judged afresh.
  StartReferee();
  if (!fit_.suspended()) serving_ = active_;
  active_->last_used = stats_.iterations;
  active_->matcher.JumpToIteration();
  FindWindow();
  return OkStatus();
}

uint64_t Allocator::VariantFloor() const {
  uint64_t floor = PersistentFloor();
  // Region pages lent to the arena while the plans did not serve keep
  // their live arena allocations (a gradient made in a suspended iteration
  // lives on): a variant laid out over them would find its bytes taken in
  // every iteration, miss and be suspended for good.
  for (uint32_t k = region_->backed_extent(); k-- > 0;) {
    const PageId id = region_->page(k);
    if (id != kNoPage && pool_.page(id).arena_users > 0) {
      floor = std::max<uint64_t>(floor, uint64_t{k + 1} * granularity_);
      break;
    }
  }
  return floor;
}

uint64_t Allocator::PersistentFloor() const {
  std::vector<std::pair<uint64_t, uint64_t>> persistent;  // [offset, end)
  for (const std::unique_ptr<Variant>& v : variants_) {
    auto add = [&](const std::vector<PlannedRequest>& seq) {
      for (const PlannedRequest& r : seq) {
        if (Persistent(r, v->plan)) {
          const uint64_t at = static_cast<uint64_t>(r.offset);
          persistent.emplace_back(at, at + r.size);
        }
      }
    };
    add(v->plan.prologue);
    // State made inside a module left open (early iterations' windows).
    for (const DynamicWindow& w : v->plan.windows) {
      for (const WindowRequests& early : w.early) add(early.requests);
    }
  }
  uint64_t floor = 0;
  if (persistent.empty()) return 0;
  live_.ForEach([&](DevicePtr ptr, const Allocation& a) {
    if (a.where != Where::kStatic) return;
    const uint64_t at = ptr - region_->base();
    for (const auto& [lo, hi] : persistent) {
      if (at < hi && lo < at + a.size) {
        floor = std::max(floor, at + a.size);
        return;
      }
    }
  });
  return RoundUp(floor, granularity_);
}

uint64_t Allocator::VariantHeldBytes(uint64_t lo, uint64_t hi) const {
  std::vector<PageId> pinned;
  // Arena mappings with a live user stay mapped whole (a chunk maps whole).
  const std::vector<PageId> idle = arena_->IdlePages();  // sorted
  for (const auto& [address, bytes] : arena_->MappedRanges()) {
    for (uint64_t at = address; at < address + bytes; at += granularity_) {
      const PageId page = arena_->PageAt(at);
      if (!std::binary_search(idle.begin(), idle.end(), page))
        pinned.push_back(page);
    }
  }
  const uint32_t first = static_cast<uint32_t>(lo / granularity_);
  const uint32_t end =
      static_cast<uint32_t>(RoundUp(hi, granularity_) / granularity_);
  for (uint32_t k = 0; k < region_->backed_extent(); ++k) {
    if (k >= first && k < end) continue;
    if (region_->page(k) != kNoPage) pinned.push_back(region_->page(k));
  }
  // A lent static page is both mapped in the arena and backing the region:
  // counted once.
  std::sort(pinned.begin(), pinned.end());
  const uint64_t pages = static_cast<uint64_t>(
      std::unique(pinned.begin(), pinned.end()) - pinned.begin());
  // The requests of dynamic modules outside their slots are the arena's
  // (the plan leaves them to it): their live peak comes on top.
  return pages * granularity_ + (uint64_t{end} - first) * granularity_ +
         RoundUp(module_live_peak_, granularity_);
}

void Allocator::ShiftPlan(RuntimePlan& plan, uint64_t by) const {
  for (std::vector<PlannedRequest>* seq : {&plan.prologue, &plan.iteration}) {
    for (PlannedRequest& r : *seq) {
      if (r.offset != kUnplanned) r.offset += static_cast<int64_t>(by);
    }
  }
  const uint32_t granules = static_cast<uint32_t>(by / granularity_);
  for (DynamicWindow& w : plan.windows) {
    for (uint32_t& k : w.idle_granules) k += granules;
    auto shift = [&](std::vector<PlannedRequest>& seq) {
      for (PlannedRequest& r : seq) {
        if (r.offset != kUnplanned) r.offset += static_cast<int64_t>(by);
      }
    };
    shift(w.steady.requests);
    for (WindowRequests& early : w.early) shift(early.requests);
  }
  plan.region_bytes += by;
}

Status Allocator::FreeIdleArenaPages() {
  if (arena_->mapped_granules() == 0) return OkStatus();
  // Work queued before the frees that made them idle may still touch them.
  LOOM_RETURN_IF_ERROR(DrainPages(arena_->IdlePages(), WaitSite::kPlanInstall));
  return arena_->UnmapIdle().status();
}

Status Allocator::UnloadPlans() {
  std::lock_guard<FutexMutex> lock(mu_);
  persistent_ = PersistentQueue();
  if (region_ == nullptr) return OkStatus();
  if (region_->occupied_bytes() != 0) {
    return FailedPreconditionError(
        "{} bytes of static allocations are live: the plans stay",
        region_->occupied_bytes());
  }
  // The region's mappings go: wait for the work that may still use them.
  std::vector<PageId> pages;
  for (uint32_t k = 0; k < region_->backed_extent(); ++k) {
    if (region_->page(k) != kNoPage) pages.push_back(region_->page(k));
  }
  LOOM_RETURN_IF_ERROR(DrainPages(pages, WaitSite::kPlanUnload));
  window_ = nullptr;
  lifetimes_.clear();
  window_cursors_.clear();
  referee_.Stop();
  active_ = serving_ = nullptr;
  probed_ = kProbeRequests;
  variants_.clear();
  idle_region_.reset();
  region_.reset();
  ++stats_.plans_unloaded;
  return OkStatus();
}

void Allocator::Suspend() {
  ++stats_.plan_suspensions;
  serving_ = nullptr;
}

void Allocator::StartReferee() {
  referee_.Start(pool_.bytes(), stats_.iterations,
                 active_ != nullptr ? active_->plan.iteration.size() : 0);
  // Every live allocation (and every free awaiting other streams) gets its
  // place in the fresh shadow: the dynamic space would hold them too.
  std::vector<DevicePtr> live;
  live_.ForEach([&](DevicePtr ptr, const Allocation& a) {
    if (!a.in_pool) live.push_back(ptr);
  });
  for (DevicePtr ptr : live) {
    Allocation* a = live_.Find(ptr);
    a->shadow = referee_.OnAllocate(a->size, a->stream);
  }
  for (PendingFree& p : pending_) {
    if (!p.allocation.in_pool)
      p.allocation.shadow =
          referee_.OnAllocate(p.allocation.size, p.allocation.stream);
  }
}

void Allocator::JudgePlan(uint64_t held_bytes) {
  // The plan's cost: what is held, less the region's granules backed ahead
  // of their first use (a chunk of granules used at the same times comes
  // whole): the plan needs them only when it reaches them, and they count
  // once it does.
  const uint64_t ahead =
      region_ != nullptr ? region_->backed_unused_bytes() : 0;
  // While the plan fits (serving, not suspended), the dynamic space would
  // need what the plan foresees too: its region, and the live peak of the
  // requests made in dynamic modules outside their slots (which the plan
  // leaves to the arena).
  const uint64_t expected =
      serving_ != nullptr ? serving_->plan.region_bytes + module_live_peak_ : 0;
  if (!referee_.Judge(held_bytes - std::min(ahead, held_bytes), expected))
    return;
  // The plan holds more than the dynamic space alone would: it stops
  // serving. Its live static allocations stay where they are; its idle
  // granules are any arena request's (as while suspended), so the memory
  // it backed serves the dynamic space instead of new memory.
  serving_ = nullptr;
  if (!options_.log_plan_loss) return;
  fmt::print(stderr,
             "loom: the plan lost to the dynamic space ({} MiB held, the "
             "dynamic space alone would hold {} MiB): it stops serving\n",
             referee_.lost_plan_bytes() >> 20,
             referee_.lost_dynamic_bytes() >> 20);
}

Matcher::Match Allocator::ProbeVariants(uint64_t size) {
  if (active_->matcher.in_prologue()) return active_->matcher.Next(size);
  // The iteration's first requests: every variant follows them; the one
  // that matched the most serves (the active one keeps serving on a tie).
  ++probed_;
  std::vector<Matcher::Match> matches(variants_.size());
  for (size_t i = 0; i < variants_.size(); ++i) {
    Variant& v = *variants_[i];
    matches[i] = v.matcher.Next(size);
    if (matches[i].entry != nullptr && !matches[i].near) ++v.probe_hits;
  }
  size_t best = 0, current = 0;
  for (size_t i = 0; i < variants_.size(); ++i) {
    if (variants_[i].get() == active_) current = i;
  }
  best = current;
  for (size_t i = 0; i < variants_.size(); ++i) {
    if (variants_[i]->probe_hits > variants_[best]->probe_hits) best = i;
  }
  const Matcher::Match& mine = matches[current];
  if (best != current && (mine.entry == nullptr || mine.near)) {
    // Another variant has matched this iteration's first requests better
    // (its cursor followed the same requests): it serves from now on.
    active_ = variants_[best].get();
    serving_ = referee_.lost() ? nullptr : active_;
    active_->last_used = stats_.iterations;
    ++stats_.variant_switches;
    FindWindow();
    return matches[best];
  }
  return mine;
}

}  // namespace loom::vmm
