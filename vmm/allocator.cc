#include "vmm/allocator.h"

#include <algorithm>
#include <bit>

namespace loom::vmm {
StatusOr<std::unique_ptr<Allocator>> Allocator::Create(
    Driver& driver, AllocatorOptions options) {
  if (options.memory_fraction < 0 || options.memory_fraction > 1) {
    return InvalidArgumentError("memory fraction {} outside [0, 1]",
                                options.memory_fraction);
  }
  if (options.max_chunk_pages < 1 ||
      options.max_chunk_pages > PagePool::kMaxChunkPages) {
    return InvalidArgumentError("largest handle of {} granules outside 1..{}",
                                options.max_chunk_pages,
                                PagePool::kMaxChunkPages);
  }
  LOOM_ASSIGN_OR_RETURN(DeviceProperties props,
                        driver.Properties(options.device));
  const uint64_t g = props.granularity_minimum;
  uint64_t cap = options.memory_cap_bytes;
  if (options.memory_fraction > 0) {
    uint64_t by_fraction = static_cast<uint64_t>(
        options.memory_fraction * static_cast<double>(props.total_bytes));
    cap = cap == 0 ? by_fraction : std::min(cap, by_fraction);
  }
  if (cap != 0) {
    cap = cap / g * g;
    if (cap == 0) {
      return InvalidArgumentError("memory cap below one granule ({} bytes)", g);
    }
  }
  for (int peer : options.peer_devices) {
    StatusOr<bool> can = driver.CanAccessPeer(options.device, peer);
    if (!can.ok()) return can.status().WithContext("peer devices");
    if (!*can) {
      return InvalidArgumentError("device {} cannot access device {}'s memory",
                                  peer, options.device);
    }
  }
  uint64_t arena = options.arena_va_bytes;
  if (arena == 0) arena = RoundUp(2 * std::max(props.total_bytes, g), g);
  if (arena % g != 0) {
    return InvalidArgumentError(
        "arena size {} is not a multiple of the granularity {}", arena, g);
  }
  std::unique_ptr<Allocator> allocator(new Allocator(
      driver, options, g, cap, RoundUp(std::max(props.total_bytes, g), g)));
  LOOM_RETURN_IF_ERROR(allocator->Init(arena));
  return allocator;
}

Allocator::Allocator(Driver& driver, AllocatorOptions options,
                     uint64_t granularity, uint64_t cap_bytes,
                     uint64_t device_bytes)
    : driver_(driver),
      options_(options),
      granularity_(granularity),
      device_bytes_(device_bytes),
      pool_(driver, options.device, granularity, cap_bytes,
            options.peer_devices, options.max_chunk_pages),
      tracker_(driver, options.device) {}

Status Allocator::Init(uint64_t arena_va_bytes) {
  LOOM_ASSIGN_OR_RETURN(
      arena_, Arena::Create(driver_, pool_, options_.device, arena_va_bytes));
  trace_.header.device = options_.device;
  trace_.header.granularity = granularity_;
  if (options_.record_capacity > 0) {
    recording_ = true;
    record_capacity_ = options_.record_capacity;
    trace_.events.reserve(options_.record_capacity);
    trace_.header.device = options_.device;
    trace_.header.granularity = granularity_;
    trace_.header.provenance = "loom record mode";
  }
  return OkStatus();
}

Allocator::~Allocator() {
  std::lock_guard<FutexMutex> lock(mu_);
  for (PendingFree& pending : pending_) {
    for (Event e : pending.events) idle_events_.push_back(e);
    live_.Insert(pending.ptr, pending.allocation);
  }
  pending_.clear();
  // Graph pools' free blocks are the arena's again (their graphs are gone
  // with the process's allocator).
  for (const std::unique_ptr<GraphPool>& pool : pools_) {
    for (const auto& [ptr, block] : pool->free_blocks) {
      arena_->Free(ptr, block, FreeTag{});
    }
    pool->free_blocks.clear();
  }
  if (!live_.empty()) {
    fmt::print(
        stderr,
        "loom: allocator for device {} destroyed with {} live allocations; "
        "their memory is leaked\n",
        options_.device, live_.size());
    return;  // unmapping would pull memory from under live tensors
  }
  for (Event e : idle_events_) driver_.DestroyEvent(e).IgnoreError();
  // Queued work may still use memory freed last: wait before unmapping.
  Status drained = tracker_.WaitForAll(WaitSite::kShutdown);
  if (!drained.ok()) {
    fmt::print(stderr,
               "loom: waiting for device {} before release failed: {}\n",
               options_.device, drained.ToString());
  }
  active_ = serving_ = nullptr;
  variants_.clear();
  region_.reset();
  arena_.reset();
  Status released = pool_.ReleaseSpareChunks();
  if (!released.ok()) {
    fmt::print(stderr, "loom: releasing pages failed: {}\n",
               released.ToString());
  }
}

void Allocator::UpdateReserved() {
  uint64_t now = pool_.bytes();
  held_high_water_ = std::max(held_high_water_, now);
  if (now > stats_.reserved_bytes.current) {
    stats_.reserved_bytes.Increase(now - stats_.reserved_bytes.current);
    stats_.segment.Increase(pool_.live_pages() - stats_.segment.current);
    if (referee_.watching()) JudgePlan(now);
  } else if (now < stats_.reserved_bytes.current) {
    stats_.reserved_bytes.Decrease(stats_.reserved_bytes.current - now);
    stats_.segment.Decrease(stats_.segment.current - pool_.live_pages());
  }
  stats_.num_device_alloc = pool_.creates();
  stats_.num_device_free = pool_.releases();
}

StatusOr<Event> Allocator::TakeEvent() {
  if (!idle_events_.empty()) {
    Event e = idle_events_.back();
    idle_events_.pop_back();
    return e;
  }
  return driver_.CreateEvent(options_.device);
}

void Allocator::ReturnEvent(Event event) { idle_events_.push_back(event); }

void Allocator::FenceEveryPage(const std::vector<FreeTag>& tags) {
  const uint32_t g = static_cast<uint32_t>(granularity_);
  for (PageId id = 0; id < pool_.slots(); ++id) {
    Page& page = pool_.page(id);
    if (!page.live) continue;
    for (const FreeTag& tag : tags) AddFence(page, 0, g, tag);
  }
}

std::vector<PageId> Allocator::PagesOf(const PlannedRequest& entry) const {
  std::vector<PageId> pages;
  const uint64_t g = granularity_;
  const uint64_t begin = static_cast<uint64_t>(entry.offset);
  if (region_ == nullptr) return pages;
  const uint64_t end = begin + entry.size;
  // Only granules the entry covers whole: its edges may be shared.
  for (uint64_t k = (begin + g - 1) / g; (k + 1) * g <= end; ++k) {
    if (k < region_->granule_count() &&
        region_->page(static_cast<uint32_t>(k)) != kNoPage) {
      pages.push_back(region_->page(static_cast<uint32_t>(k)));
    }
  }
  return pages;
}

StatusOr<DevicePtr> Allocator::Allocate(uint64_t size, Stream stream) {
  std::lock_guard<FutexMutex> lock(mu_);
  tracker_.NewCall();
  UseStream(stream);
  return AllocateLocked(size, stream);
}

StatusOr<DevicePtr> Allocator::AllocateLocked(uint64_t size, Stream stream) {
  if (size == 0) return InvalidArgumentError("allocation of 0 bytes");
  if (size > kMaxRequest) {
    ++stats_.num_ooms;
    return OutOfMemoryError("allocation of {} bytes is absurd", size);
  }
  if (!pending_.empty()) ProcessPendingFrees();
  if (open_pools_ > 0) {
    if (GraphPool* pool = PoolFor(stream))
      return AllocatePooled(*pool, size, stream);
  }
  const uint64_t request_id = next_request_id_++;
  // What the dynamic space alone would do with it (while the referee
  // watches a plan).
  const uint64_t shadow = referee_.OnAllocate(size, stream);
  if (recording_) {
    Record(plan::Event::Alloc(request_id, size, stream,
                              static_cast<int16_t>(options_.device)));
  }

  StatusOr<DevicePtr> ptr = DevicePtr{0};  // every branch below assigns it
  Where where = Where::kArena;
  bool learned = false;
  DynamicBirth birth;
  bool in_module = false;
  if (!dynamic_modules_.empty()) {
    ++stats_.dynamic_requests;
    // At its window's planned slot if it fits there (one that grew past it
    // only if the bytes after it are idle in the plan while the slot
    // lives, as a planned request).
    uint32_t position = 0;
    const PlannedRequest* slot = DynamicSlot(&position);
    std::optional<DevicePtr> planned;
    if (slot != nullptr && (size <= RoundUp(slot->size, kArenaAlignment) ||
                            GrowthFits(*slot, size))) {
      planned = TryStatic(*slot, size, stream);
    }
    if (planned.has_value()) {
      ++stats_.dynamic_hits;
      ptr = *planned;
      where = Where::kStatic;
    } else {
      in_module = true;
      // Expected to live as its counterpart did last iteration, else until
      // its window ends; its slot's pages (if any) first.
      const int64_t until = DynamicUntil(position, &birth);
      learned = birth.window != nullptr;
      ptr = ServeUnforeseen(
          size, stream, until,
          slot != nullptr ? PagesOf(*slot) : std::vector<PageId>{}, &where,
          /*in_dynamic_module=*/true);
    }
  } else if (serving_ != nullptr && trial_left_ > 0) [[unlikely]] {
    // A trial (IterationBegin): the matcher follows, the arena serves; the
    // plan serves the rest only if kTrialHits of them met their entries.
    ++stats_.suspended_requests;
    Matcher::Match match = MatchRequest(size);
    if (match.entry != nullptr && !match.near) ++trial_hits_;
    if (--trial_left_ == 0 && trial_hits_ < kTrialHits) {
      fit_.SuspendNow();
      Suspend();
    }
    ptr = AllocateInArena(size, stream, -1);
  } else if (serving_ != nullptr) {
    Matcher::Match match = MatchRequest(size);
    if (match.entry == nullptr) {
      ++stats_.plan_misses;
      ++iteration_misses_;
      if (fit_.Record(false)) Suspend();
      ptr = ServeUnforeseen(size, stream, MissUntil(), {}, &where);
    } else if (match.entry->offset == kUnplanned) {
      ++stats_.unplanned;
      // After the set-up, an early iteration's request without a steady
      // twin counts against the fit like a miss. Otherwise the plan
      // foresaw it (a set-up transient, a steady request that outlives the
      // iteration): a hit for the fit, or a long stretch of them (a
      // pipeline's warm-up before its first iteration) would leave the
      // window to the few extra requests among them.
      if (match.prologue && !active_->matcher.in_setup()) {
        if (fit_.Record(false)) Suspend();
      } else {
        fit_.RecordHit();
      }
      // Expected to live as recorded (an early iteration's request carries
      // its own lifetime; a set-up one none).
      const bool known =
          !match.prologue || match.entry->end > match.entry->start;
      ptr = AllocateInArena(size, stream, known ? match.entry->end : -1);
    } else {
      // A request that shrank takes its planned bytes; one that grew takes
      // them only if the bytes after them are idle in the plan for as long
      // as it lives (else they are another buffer's), or, for a persistent
      // entry, by pushing the persistent entries after it up.
      const bool grown = match.near &&
                         size > RoundUp(match.entry->size, kArenaAlignment) &&
                         !GrowthFits(*match.entry, size);
      std::optional<DevicePtr> planned;
      if (match.prologue && Persistent(*match.entry, active_->plan))
          [[unlikely]] {
        planned = TryPersistent(*match.entry, size, stream, grown);
      } else if (!grown) {
        planned = TryStatic(*match.entry, size, stream);
      }
      if (planned.has_value()) {
        // The hot path: a hit, recorded without going through a StatusOr.
        if (match.prologue) [[unlikely]] {
          ServePersistent(
              static_cast<size_t>(match.entry - active_->plan.prologue.data()));
        }
        ++stats_.plan_hits;
        ++iteration_hits_;
        fit_.RecordHit();
        live_.Insert(*planned, Allocation{size, stream, Where::kStatic, false,
                                          false, false, request_id, shadow});
        stats_.allocated_bytes.Increase(size);
        stats_.active_bytes.Increase(size);
        stats_.allocation.Increase(1);
        stats_.static_bytes.Increase(size);
        return *planned;
      } else {
        ++stats_.plan_misses;
        ++iteration_misses_;
        if (fit_.Record(false)) Suspend();
        // The entry's planned lifetime is this request's expected one; its
        // own pages are idle for it (the plan reserved them for it).
        ptr = ServeUnforeseen(size, stream, ExpectedEnd(*match.entry),
                              PagesOf(*match.entry), &where);
      }
    }
  } else {
    // No plan, or the plan does not fit this iteration (suspended) or lost:
    // the region's idle bytes, then the dynamic space, which may take any
    // idle static page.
    if (active_ != nullptr) {
      ++stats_.suspended_requests;
      ++iteration_unrouted_;
      // In the prologue the matcher's cursor keeps its place across
      // iteration markers: it follows the run while the plan is suspended,
      // so the next iteration's requests meet their own entries.
      if (active_->matcher.in_prologue() && !referee_.lost())
        active_->matcher.Next(size);
    }
    // An early iteration that did not fit is still the run's warm-up: its
    // persistent requests take their planned places, the rest are served
    // dynamically.
    std::optional<DevicePtr> persistent;
    if (PlacesPersistent()) persistent = PlacePersistent(size, stream);
    if (persistent.has_value()) {
      ptr = *persistent;
      where = Where::kStatic;
    } else {
      ptr = ServeUnforeseen(size, stream, -1, {}, &where);
    }
  }
  if (!ptr.ok()) {
    referee_.OnFree(shadow);
    return ptr.status();
  }
  live_.Insert(*ptr, Allocation{size, stream, where, false, learned, in_module,
                                request_id, shadow});
  if (in_module) {
    module_live_ += size;
    module_live_peak_ = std::max(module_live_peak_, module_live_);
  }
  if (learned) dynamic_births_.Insert(*ptr, birth);
  stats_.allocated_bytes.Increase(size);
  stats_.active_bytes.Increase(size);
  stats_.allocation.Increase(1);
  if (where == Where::kStatic) {
    stats_.static_bytes.Increase(size);
  } else {
    stats_.dynamic_bytes.Increase(size);
  }
  return ptr;
}

bool Allocator::GrowthFits(const PlannedRequest& entry, uint64_t size) const {
  const uint64_t planned = RoundUp(entry.size, kArenaAlignment);
  const uint64_t extra = RoundUp(size, kArenaAlignment) - planned;
  return active_->schedule.RangeIdle(
      static_cast<uint64_t>(entry.offset) + planned, extra, entry.start,
      entry.end);
}

int64_t Allocator::ExpectedEnd(const PlannedRequest& entry) const {
  // The entry's planned end (an early iteration's entry carries its steady
  // twin's times), unless it lives a whole period (a persistent buffer).
  if (active_ == nullptr || entry.end - entry.start >= active_->plan.period)
    return -1;
  return entry.end;
}

int64_t Allocator::MissUntil() const {
  if (active_ == nullptr || active_->plan.period <= 0 ||
      active_->matcher.in_setup()) {
    return -1;
  }
  // A request the plan did not foresee (an extra request, one whose size
  // no entry near the cursor has) is expected to live a short while, as a
  // temporary does: 1/kMissLifetimeDivisor of the period. If it lives longer,
  // a planned request that finds its bytes taken misses and is served
  // elsewhere (the safety check): memory, never data.
  return active_->matcher.now() +
         std::max<int64_t>(1, active_->plan.period / kMissLifetimeDivisor);
}

std::optional<DevicePtr> Allocator::TryStatic(const PlannedRequest& entry,
                                              uint64_t size, Stream stream) {
  const uint64_t offset = static_cast<uint64_t>(entry.offset);
  if (!OccupyStatic(offset, size, stream)) return std::nullopt;
  return region_->base() + offset;
}

bool Allocator::BackStatic(uint64_t offset, uint64_t size, Stream stream) {
  // First use of a granule: pages for it (warm-up, or a new plan).
  StaticBacking source(pool_, tracker_, *arena_,
                       active_ != nullptr ? &active_->schedule : nullptr,
                       stream, [this] { UpdateReserved(); });
  // Pages to spare go to the next granules the plan uses.
  const uint32_t limit =
      active_ != nullptr
          ? static_cast<uint32_t>(active_->plan.region_bytes / granularity_)
          : 0;
  Status backed = region_->Back(offset, size, source, limit);
  UpdateReserved();
  if (backed.ok()) return true;
  // No page for it: the request is served elsewhere (and runs into the
  // out-of-memory path there if memory is exhausted).
  region_->Release(offset, size, FreeTag{});
  return false;
}

Status Allocator::Free(DevicePtr ptr) {
  std::lock_guard<FutexMutex> lock(mu_);
  Allocation allocation;
  if (!live_.Take(ptr, &allocation)) {
    return InvalidArgumentError(
        "free of {:#x}, which is not a live loom allocation", ptr);
  }
  if (recording_ && !allocation.in_pool) {  // pool requests: not
    Record(plan::Event::Free(allocation.request_id, allocation.stream,
                             static_cast<int16_t>(options_.device)));
  }
  stats_.allocated_bytes.Decrease(allocation.size);
  stats_.allocation.Decrease(1);
  if (!persistent_.taken.empty()) [[unlikely]] {
    auto taken = persistent_.taken.find(ptr);
    if (taken != persistent_.taken.end()) {
      // It did not live on (a gradient of its parameter's size): the
      // entry is offered again.
      persistent_.served[taken->second] = false;
      persistent_.cursor = std::min(persistent_.cursor, taken->second);
      persistent_.taken.erase(taken);
    }
  }
  if (allocation.learned) {
    DynamicBirth birth;
    if (dynamic_births_.Take(ptr, &birth)) LearnDynamicLifetime(birth);
  }
  const FreeTag tag = tracker_.Released(allocation.stream);
  auto extra =
      extra_streams_.empty() ? extra_streams_.end() : extra_streams_.find(ptr);
  if (extra != extra_streams_.end()) {
    // Other streams use this memory: it stays active until they are done.
    PendingFree pending{ptr, allocation, tag, {}};
    for (Stream s : extra->second) {
      StatusOr<Event> event = TakeEvent();
      if (!event.ok() || !driver_.RecordEvent(*event, s).ok()) {
        // Cannot track the stream: wait for it now rather than risk reuse.
        if (event.ok()) ReturnEvent(*event);
        driver_.SynchronizeStream(s).IgnoreError();
        tracker_.Count(WaitSite::kRecordStreamSync, WaitKind::kStreamSync);
        continue;
      }
      tracker_.Count(WaitSite::kRecordStream, WaitKind::kEventRecord);
      pending.events.push_back(*event);
    }
    extra_streams_.erase(extra);
    if (!pending.events.empty()) {
      pending_.push_back(std::move(pending));
      ProcessPendingFrees();
      return OkStatus();
    }
  }
  FinishFree(ptr, allocation, tag);
  if (!pending_.empty()) ProcessPendingFrees();
  return OkStatus();
}

void Allocator::FinishFree(DevicePtr ptr, const Allocation& allocation,
                           const FreeTag& tag) {
  stats_.active_bytes.Decrease(allocation.size);
  if (allocation.in_pool) {
    auto it = pool_allocations_.find(ptr);
    LOOM_CHECK(it != pool_allocations_.end(), "pool allocation {:#x} unknown",
               ptr);
    const PoolAllocation p = it->second;
    pool_allocations_.erase(it);
    stats_.dynamic_bytes.Decrease(allocation.size);
    --p.pool->live;
    if (!p.pool->released) {
      // The graph replays on this memory: it stays the pool's.
      p.pool->free_blocks.emplace_back(ptr, p.block);
      stats_.graph_pool_bytes += p.block;
    } else {
      ReturnPoolBlock(ptr, p.block);
      ForgetPoolIfDone(p.pool);
    }
    return;
  }
  referee_.OnFree(allocation.shadow);
  if (allocation.in_module) module_live_ -= allocation.size;
  if (allocation.where == Where::kStatic) {
    region_->Release(ptr - region_->base(), allocation.size, tag);
    if (idle_region_.has_value()) [[unlikely]]
      idle_region_->Give(ptr - region_->base(), allocation.size, "idle region");
    stats_.static_bytes.Decrease(allocation.size);
  } else {
    arena_->Free(ptr, allocation.size, tag);
    stats_.dynamic_bytes.Decrease(allocation.size);
  }
}

void Allocator::ProcessPendingFrees() {
  for (size_t i = 0; i < pending_.size();) {
    PendingFree& pending = pending_[i];
    bool all_done = true;
    for (Event e : pending.events) {
      StatusOr<bool> done = driver_.QueryEvent(e);
      if (!done.ok() || !*done) {
        all_done = false;
        break;
      }
    }
    if (!all_done) {
      ++i;
      continue;
    }
    for (Event e : pending.events) ReturnEvent(e);
    FinishFree(pending.ptr, pending.allocation, pending.tag);
    pending_[i] = std::move(pending_.back());
    pending_.pop_back();
  }
}

Status Allocator::RecordStream(DevicePtr ptr, Stream stream) {
  std::lock_guard<FutexMutex> lock(mu_);
  const Allocation* found = live_.Find(ptr);
  if (found == nullptr) {
    return InvalidArgumentError(
        "record_stream on {:#x}, which is not a live loom allocation", ptr);
  }
  if (stream == found->stream) return OkStatus();
  UseStream(stream);
  std::vector<Stream>& streams = extra_streams_[ptr];
  if (std::find(streams.begin(), streams.end(), stream) == streams.end()) {
    streams.push_back(stream);
  }
  return OkStatus();
}

Status Allocator::EmptyCache() {
  std::lock_guard<FutexMutex> lock(mu_);
  tracker_.NewCall();
  return EmptyCacheLocked();
}

Status Allocator::EmptyCacheLocked() {
  ProcessPendingFrees();
  // Every page about to be unmapped or released: the idle arena granules'
  // and the spare ones. Work queued before their frees may still touch
  // them: wait for it first (PyTorch synchronises before it frees too).
  // A stitched chunk's places that serve nothing while it serves at
  // another are unmapped too: they hold address space only, which a
  // request that found no place needs.
  std::vector<PageId> pages = arena_->IdlePages();
  const std::vector<PageId> elsewhere = arena_->BusyElsewherePages();
  pages.insert(pages.end(), elsewhere.begin(), elsewhere.end());
  for (PageId id = 0; id < pool_.slots(); ++id) {
    if (pool_.page(id).spare()) pages.push_back(id);
  }
  LOOM_RETURN_IF_ERROR(DrainPages(pages, WaitSite::kEmptyCache));
  LOOM_ASSIGN_OR_RETURN(std::vector<PageId> unmapped, arena_->UnmapIdle());
  (void)unmapped;
  LOOM_RETURN_IF_ERROR(arena_->UnmapBusyElsewhere());
  // Whole spare chunks go back; a chunk with a page still mapped stays.
  Status result = pool_.ReleaseSpareChunks();
  UpdateReserved();
  return result;
}

}  // namespace loom::vmm
