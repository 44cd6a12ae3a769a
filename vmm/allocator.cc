#include "vmm/allocator.h"

#include <algorithm>
#include <bit>

namespace loom::vmm {
namespace {

uint64_t RoundUp(uint64_t value, uint64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

// Requests above this are refused outright: no GPU has 2^50 bytes.
constexpr uint64_t kMaxRequest = uint64_t{1} << 50;

}  // namespace

StatusOr<std::unique_ptr<Allocator>> Allocator::Create(
    Driver& driver, AllocatorOptions options) {
  if (options.memory_fraction < 0 || options.memory_fraction > 1) {
    return InvalidArgumentError("memory fraction {} outside [0, 1]",
                                options.memory_fraction);
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
  std::unique_ptr<Allocator> allocator(new Allocator(driver, options, g, cap));
  LOOM_RETURN_IF_ERROR(allocator->Init(arena));
  return allocator;
}

Allocator::Allocator(Driver& driver, AllocatorOptions options,
                     uint64_t granularity, uint64_t cap_bytes)
    : driver_(driver),
      options_(options),
      granularity_(granularity),
      pool_(driver, options.device, granularity, cap_bytes,
            options.peer_devices),
      tracker_(driver, options.device) {}

Status Allocator::Init(uint64_t arena_va_bytes) {
  LOOM_ASSIGN_OR_RETURN(
      arena_, Arena::Create(driver_, pool_, options_.device, arena_va_bytes));
  if (options_.record_capacity > 0) {
    recording_ = true;
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
  Status drained = tracker_.WaitForAll();
  if (!drained.ok()) {
    fmt::print(stderr, "loom: waiting for device {} before release failed: {}\n",
               options_.device, drained.ToString());
  }
  matcher_.reset();
  schedule_.reset();
  region_.reset();
  arena_.reset();
  for (PageId id = 0; id < pool_.slots(); ++id) {
    if (pool_.page(id).live) {
      Status status = pool_.ReleasePage(id);
      if (!status.ok()) {
        fmt::print(stderr, "loom: releasing a page failed: {}\n",
                   status.ToString());
      }
    }
  }
}

bool Allocator::has_plan() const {
  std::lock_guard<FutexMutex> lock(mu_);
  return region_ != nullptr;
}

Status Allocator::LoadPlan(RuntimePlan plan) {
  std::lock_guard<FutexMutex> lock(mu_);
  if (region_ != nullptr)
    return FailedPreconditionError("a plan is already installed");
  if (plan.region_bytes == 0 || plan.region_bytes % granularity_ != 0) {
    return InvalidArgumentError(
        "plan region of {} bytes is not a positive multiple of the granularity "
        "{}",
        plan.region_bytes, granularity_);
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
  const uint32_t granules =
      static_cast<uint32_t>(plan.region_bytes / granularity_);
  for (const DynamicWindow& w : plan.windows) {
    for (uint32_t k : w.idle_granules) {
      if (k >= granules) {
        return InvalidArgumentError(
            "dynamic window '{}': granule {} outside the region", w.module, k);
      }
    }
  }
  // Pages for the region: spare pages, then idle arena pages, then new ones.
  std::vector<PageId> pages;
  auto take_spare = [&] {
    for (PageId id = 0; id < pool_.slots() && pages.size() < granules; ++id) {
      const Page& p = pool_.page(id);
      if (p.live && p.static_granule == kNoGranule &&
          p.arena_granule == kNoGranule &&
          std::find(pages.begin(), pages.end(), id) == pages.end()) {
        pages.push_back(id);
      }
    }
  };
  take_spare();
  if (pages.size() < granules && arena_->mapped_granules() > 0) {
    // Idle arena pages still fenced by queued work are waited for first.
    LOOM_RETURN_IF_ERROR(DrainPages(arena_->IdlePages()));
    LOOM_RETURN_IF_ERROR(arena_->UnmapIdle().status());
    take_spare();
  }
  std::vector<PageId> created;
  while (pages.size() < granules) {
    StatusOr<PageId> page = pool_.Grow();
    if (!page.ok()) {
      for (PageId id : created) pool_.ReleasePage(id).IgnoreError();
      UpdateReserved();
      return page.status().WithContext("building the static region");
    }
    created.push_back(*page);
    pages.push_back(*page);
  }
  plan_ = std::make_unique<RuntimePlan>(std::move(plan));
  StatusOr<std::unique_ptr<StaticRegion>> region =
      StaticRegion::Create(driver_, pool_, options_.device, *plan_, pages);
  if (!region.ok()) {
    for (PageId id : created) {
      if (pool_.page(id).static_granule == kNoGranule)
        pool_.ReleasePage(id).IgnoreError();
    }
    plan_.reset();
    UpdateReserved();
    return region.status().WithContext("building the static region");
  }
  region_ = std::move(region).value();
  matcher_ = std::make_unique<Matcher>(*plan_);
  schedule_ = std::make_unique<PlanSchedule>(*plan_);
  // Installed mid-run (after record mode): start at the steady state.
  if (next_request_id_ > 1) matcher_->JumpToIteration();
  stats_.static_region_bytes = region_->bytes();
  UpdateReserved();
  return OkStatus();
}

void Allocator::UpdateReserved() {
  uint64_t now = pool_.bytes();
  if (now > stats_.reserved_bytes.current) {
    stats_.reserved_bytes.Increase(now - stats_.reserved_bytes.current);
    stats_.segment.Increase(pool_.live_pages() - stats_.segment.current);
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
  const uint64_t end = begin + entry.size;
  // Only granules the entry covers whole: its edges may be shared.
  for (uint64_t k = (begin + g - 1) / g; (k + 1) * g <= end; ++k) {
    if (k < region_->granule_count()) {
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
    if (GraphPool* pool = PoolFor(stream)) return AllocatePooled(*pool, size, stream);
  }
  const uint64_t request_id = next_request_id_++;
  if (recording_) {
    Record(plan::Event::Alloc(request_id, size, stream,
                              static_cast<int16_t>(options_.device)));
  }

  StatusOr<DevicePtr> ptr = DevicePtr{0};  // every branch below assigns it
  Where where = Where::kArena;
  bool learned = false;
  DynamicBirth birth;
  if (!dynamic_modules_.empty()) {
    ++stats_.dynamic_requests;
    // Expected to live as its counterpart did last iteration, else until
    // its window ends.
    const int64_t until = DynamicUntil(&birth);
    learned = birth.window != nullptr;
    ptr = ServeUnforeseen(size, stream, until, {}, &where);
  } else if (matcher_ != nullptr) {
    Matcher::Match match = matcher_->Next(size);
    if (match.entry == nullptr) {
      ++stats_.plan_misses;
      ++iteration_misses_;
      ptr = ServeUnforeseen(size, stream, ExtraUntil(), {}, &where);
    } else if (match.entry->offset == kUnplanned) {
      ++stats_.unplanned;
      ptr =
          AllocateInArena(size, stream, match.prologue ? -1 : match.entry->end);
    } else {
      // A request that grew past its entry's planned bytes cannot take
      // them (the next bytes are another buffer's); one that shrank can.
      std::optional<DevicePtr> planned =
          match.near && size > RoundUp(match.entry->size, kArenaAlignment)
              ? std::nullopt
              : TryStatic(*match.entry, size, stream);
      if (planned.has_value()) {
        // The hot path: a hit, recorded without going through a StatusOr.
        ++stats_.plan_hits;
        ++iteration_hits_;
        live_.Insert(*planned,
                     Allocation{size, stream, Where::kStatic, false, false,
                                request_id});
        stats_.allocated_bytes.Increase(size);
        stats_.active_bytes.Increase(size);
        stats_.allocation.Increase(1);
        stats_.static_bytes.Increase(size);
        return *planned;
      } else {
        ++stats_.plan_misses;
        ++iteration_misses_;
        // The entry's planned lifetime is this request's expected one; its
        // own pages are idle for it (the plan reserved them for it).
        ptr = ServeUnforeseen(size, stream, ExpectedEnd(*match.entry),
                              PagesOf(*match.entry), &where);
      }
    }
  } else {
    ptr = AllocateInArena(size, stream, -1);
  }
  if (!ptr.ok()) return ptr.status();
  live_.Insert(*ptr, Allocation{size, stream, where, false, learned, request_id});
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

int64_t Allocator::ExpectedEnd(const PlannedRequest& entry) const {
  // The entry's planned end (an early iteration's entry carries its steady
  // twin's times), unless it lives a whole period (a persistent buffer).
  if (plan_ == nullptr || entry.end - entry.start >= plan_->period) return -1;
  return entry.end;
}

int64_t Allocator::ExtraUntil() const {
  if (matcher_ == nullptr || plan_ == nullptr || plan_->period <= 0) return -1;
  // A request the plan did not foresee is expected to live a fraction of an
  // iteration (as a temporary does); if it lives longer, a planned request
  // that finds its bytes taken misses and is placed elsewhere.
  return -1;
}

StatusOr<DevicePtr> Allocator::ServeUnforeseen(uint64_t size, Stream stream,
                                               int64_t until,
                                               std::vector<PageId> preferred,
                                               Where* where) {
  if (region_ != nullptr && schedule_ != nullptr && until >= 0 &&
      matcher_ != nullptr && !matcher_->in_setup()) {
    // Bytes of the static region the plan leaves idle until `until`:
    // checked free now by the same safety check as a planned hand-out.
    for (uint64_t offset :
         schedule_->IdleRanges(size, matcher_->now(), until, 8)) {
      if (region_->TryOccupy(offset, size,
                             [&](Page& page, uint32_t lo, uint32_t hi) {
                               return page.arena_users == 0 &&
                                      FencesAllow(page, lo, hi, stream,
                                                  tracker_);
                             })) {
        ++stats_.idle_static_placements;
        *where = Where::kStatic;
        return region_->base() + offset;
      }
    }
  }
  *where = Where::kArena;
  return AllocateInArena(size, stream, until, std::move(preferred));
}

std::optional<DevicePtr> Allocator::TryStatic(const PlannedRequest& entry,
                                              uint64_t size, Stream stream) {
  // The safety check: the planned bytes must be free right now, and their
  // pages neither lent to the arena nor awaiting another stream's work.
  const uint64_t offset = static_cast<uint64_t>(entry.offset);
  if (!region_->TryOccupy(offset, size,
                          [&](Page& page, uint32_t lo, uint32_t hi) {
                            return page.arena_users == 0 &&
                                   FencesAllow(page, lo, hi, stream, tracker_);
                          })) {
    return std::nullopt;
  }
  return region_->base() + offset;
}

StatusOr<DevicePtr> Allocator::AllocateInArena(uint64_t size, Stream stream,
                                               int64_t until,
                                               std::vector<PageId> preferred) {
  RequestContext context;
  context.stream = stream;
  context.until = until;
  if (matcher_ != nullptr) {
    context.now = matcher_->now();
    context.in_setup = matcher_->in_setup();
  }
  context.preferred = std::move(preferred);
  LendingPolicy policy(pool_, tracker_, *arena_, region_.get(), context,
                       [this] { UpdateReserved(); });
  StatusOr<DevicePtr> ptr = arena_->Allocate(size, stream, until, policy);
  if (!ptr.ok() && ptr.status().code() == StatusCode::kOutOfMemory) {
    // Release what is cached and try once more (PyTorch's OOM retry).
    ++stats_.num_alloc_retries;
    Status released = EmptyCacheLocked();
    if (released.ok()) {
      LendingPolicy retry(pool_, tracker_, *arena_, region_.get(),
                          std::move(context), [this] { UpdateReserved(); });
      ptr = arena_->Allocate(size, stream, until, retry);
    }
  }
  UpdateReserved();
  stats_.arena_mapped_bytes = arena_->mapped_granules() * granularity_;
  stats_.arena_maps = arena_->maps();
  if (!ptr.ok() && ptr.status().code() == StatusCode::kOutOfMemory)
    ++stats_.num_ooms;
  return ptr;
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
        continue;
      }
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
  if (allocation.where == Where::kStatic) {
    region_->Release(ptr - region_->base(), allocation.size, tag);
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
  std::vector<PageId> pages = arena_->IdlePages();
  for (PageId id = 0; id < pool_.slots(); ++id) {
    const Page& p = pool_.page(id);
    if (p.live && p.static_granule == kNoGranule &&
        p.arena_granule == kNoGranule) {
      pages.push_back(id);
    }
  }
  LOOM_RETURN_IF_ERROR(DrainPages(pages));
  LOOM_ASSIGN_OR_RETURN(std::vector<PageId> unmapped, arena_->UnmapIdle());
  (void)unmapped;
  Status result;
  for (PageId id = 0; id < pool_.slots(); ++id) {
    Page& p = pool_.page(id);
    if (!p.live || p.static_granule != kNoGranule ||
        p.arena_granule != kNoGranule)
      continue;
    Status status = pool_.ReleasePage(id);
    if (!status.ok()) result = status;
  }
  UpdateReserved();
  stats_.arena_mapped_bytes = arena_->mapped_granules() * granularity_;
  return result;
}

}  // namespace loom::vmm
