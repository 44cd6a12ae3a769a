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

bool Allocator::BytesReadySlow(Page& page, uint32_t lo, uint32_t hi,
                               Stream stream) {
  std::vector<Fence>& fences = page.fences;
  for (size_t i = 0; i < fences.size();) {
    const Fence& f = fences[i];
    // The stream's own frees are safe for it (stream order); bytes outside
    // [lo, hi) do not matter to this request.
    if (f.tag.stream == stream || f.hi <= lo || hi <= f.lo) {
      ++i;
      continue;
    }
    if (!tracker_.Complete(f.tag)) return false;
    fences[i] = fences.back();
    fences.pop_back();
  }
  return true;
}

void Allocator::FenceEveryPage(const std::vector<FreeTag>& tags) {
  const uint32_t g = static_cast<uint32_t>(granularity_);
  for (PageId id = 0; id < pool_.slots(); ++id) {
    Page& page = pool_.page(id);
    if (!page.live) continue;
    for (const FreeTag& tag : tags) AddFence(page, 0, g, tag);
  }
}

Status Allocator::DrainPages(const std::vector<PageId>& pages) {
  bool pending = tracker_.NeedsWaitForUnmap();
  for (PageId id : pages) {
    for (const Fence& f : pool_.page(id).fences) {
      pending |= !tracker_.Complete(f.tag);
    }
  }
  if (pending) LOOM_RETURN_IF_ERROR(tracker_.WaitForAll());
  for (PageId id : pages) pool_.page(id).fences.clear();
  return OkStatus();
}

int64_t Allocator::Needed(int64_t until) const {
  // Unknown lifetime (an extra request): it may live for ever, and a static
  // page lent for ever would make its planned owner miss every iteration.
  // Only granules the plan never uses qualify.
  if (until < 0) return StaticRegion::kNever;
  return std::max<int64_t>(until - matcher_->now(), 0);
}

bool Allocator::Lendable(uint32_t k, int64_t needed) const {
  return region_->TimeToNextUse(k, matcher_->now(), matcher_->in_setup()) >=
         needed;
}

bool Allocator::Usable(PageId id, uint32_t lo, uint32_t hi, Stream stream,
                       int64_t until) {
  Page& page = pool_.page(id);
  if (page.static_users != 0) return false;
  // A static page cached in the arena: only as long as its schedule allows,
  // or its planned owner would find it taken. The pages reserved for the
  // request being served are always fine.
  if (page.static_granule != kNoGranule && region_ != nullptr &&
      std::find(preferred_pages_.begin(), preferred_pages_.end(), id) ==
          preferred_pages_.end() &&
      !Lendable(page.static_granule, Needed(until))) {
    return false;
  }
  return BytesReady(page, lo, hi, stream);
}

void Allocator::PreferPagesOf(const PlannedRequest& entry) {
  preferred_pages_.clear();
  const uint64_t g = granularity_;
  const uint64_t begin = static_cast<uint64_t>(entry.offset);
  const uint64_t end = begin + entry.size;
  // Only granules the entry covers whole: its edges may be shared.
  for (uint64_t k = (begin + g - 1) / g; (k + 1) * g <= end; ++k) {
    if (k < region_->granule_count()) {
      preferred_pages_.push_back(region_->page(static_cast<uint32_t>(k)));
    }
  }
}

StatusOr<PageId> Allocator::Acquire(uint32_t lo, uint32_t hi, Stream stream,
                                    int64_t until) {
  // 0. The pages the plan reserved for the request being served.
  while (!preferred_pages_.empty()) {
    PageId id = preferred_pages_.back();
    preferred_pages_.pop_back();
    Page& p = pool_.page(id);
    if (p.arena_granule == kNoGranule && p.static_users == 0 &&
        BytesReady(p, lo, hi, stream)) {
      return id;
    }
  }
  // 1. A spare page: in the pool, mapped nowhere.
  for (PageId id = 0; id < pool_.slots(); ++id) {
    Page& p = pool_.page(id);
    if (p.live && p.static_granule == kNoGranule &&
        p.arena_granule == kNoGranule && BytesReady(p, lo, hi, stream)) {
      return id;
    }
  }
  // 2. An idle static page whose next planned use is far enough away.
  PageId best = kNoPage;
  int64_t best_distance = -1;
  if (region_ != nullptr) {
    const int64_t now = matcher_->now();
    const int64_t needed = Needed(until);
    for (uint32_t k = 0; k < region_->granule_count(); ++k) {
      PageId id = region_->page(k);
      Page& p = pool_.page(id);
      if (p.arena_granule != kNoGranule || p.static_users != 0) continue;
      int64_t distance = region_->TimeToNextUse(k, now, matcher_->in_setup());
      if (distance <= best_distance || !BytesReady(p, lo, hi, stream)) {
        continue;
      }
      best = id;
      best_distance = distance;
    }
    if (best != kNoPage && best_distance >= needed) return best;
  }
  // 3. A new page.
  StatusOr<PageId> grown = pool_.Grow();
  if (grown.ok()) {
    UpdateReserved();
    return grown;
  }
  // Out of memory (cap or device). 4. A spare page cached idle in another
  // arena granule: remapping costs driver calls (so it comes after growing,
  // which a repeating workload stops needing once warm).
  // The page moves to another address: every fence on it, the stream's own
  // included, must be complete first (waited for if need be).
  StatusOr<PageId> reclaimed = arena_->ReclaimIdle(
      [&](PageId id) { return pool_.page(id).static_granule == kNoGranule; },
      [&](PageId id) { return DrainPages({id}); });
  if (reclaimed.ok()) return reclaimed;
  // 5. Any idle static page: its planned owner may have to go elsewhere.
  if (best != kNoPage) return best;
  return grown.status();
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
  if (!dynamic_modules_.empty()) {
    ++stats_.dynamic_requests;
    int64_t until = window_ != nullptr ? window_->end : -1;
    ptr = AllocateInArena(size, stream, until);
  } else if (matcher_ != nullptr) {
    Matcher::Match match = matcher_->Next(size);
    if (match.entry == nullptr) {
      ++stats_.plan_misses;
      ++iteration_misses_;
      ptr = AllocateInArena(size, stream, -1);
    } else if (match.entry->offset == kUnplanned) {
      ++stats_.unplanned;
      ptr =
          AllocateInArena(size, stream, match.prologue ? -1 : match.entry->end);
    } else {
      std::optional<DevicePtr> planned = TryStatic(*match.entry, size, stream);
      if (planned.has_value()) {
        // The hot path: a hit, recorded without going through a StatusOr.
        ++stats_.plan_hits;
        ++iteration_hits_;
        live_.Insert(*planned,
                     Allocation{size, stream, Where::kStatic, false, request_id});
        stats_.allocated_bytes.Increase(size);
        stats_.active_bytes.Increase(size);
        stats_.allocation.Increase(1);
        stats_.static_bytes.Increase(size);
        return *planned;
      } else {
        ++stats_.plan_misses;
        ++iteration_misses_;
        // The entry's own pages are idle for the lifetime this request takes
        // over (the plan reserved them for it): map them first.
        PreferPagesOf(*match.entry);
        ptr = AllocateInArena(size, stream,
                              match.prologue ? -1 : match.entry->end);
        preferred_pages_.clear();
      }
    }
  } else {
    ptr = AllocateInArena(size, stream, -1);
  }
  if (!ptr.ok()) return ptr.status();
  live_.Insert(*ptr, Allocation{size, stream, where, false, request_id});
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

std::optional<DevicePtr> Allocator::TryStatic(const PlannedRequest& entry,
                                              uint64_t size, Stream stream) {
  // The safety check: the planned bytes must be free right now, and their
  // pages neither lent to the arena nor awaiting another stream's work.
  const uint64_t offset = static_cast<uint64_t>(entry.offset);
  if (!region_->TryOccupy(offset, size,
                          [&](Page& page, uint32_t lo, uint32_t hi) {
                            return page.arena_users == 0 &&
                                   BytesReady(page, lo, hi, stream);
                          })) {
    return std::nullopt;
  }
  return region_->base() + offset;
}

StatusOr<DevicePtr> Allocator::AllocateInArena(uint64_t size, Stream stream,
                                               int64_t until) {
  StatusOr<DevicePtr> ptr = arena_->Allocate(size, stream, until, *this);
  if (!ptr.ok() && ptr.status().code() == StatusCode::kOutOfMemory) {
    // Release what is cached and try once more (PyTorch's OOM retry).
    ++stats_.num_alloc_retries;
    Status released = EmptyCacheLocked();
    if (released.ok()) ptr = arena_->Allocate(size, stream, until, *this);
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

void Allocator::IterationBegin(uint64_t number) {
  std::lock_guard<FutexMutex> lock(mu_);
  Record(plan::Event::IterationBegin(number));
  if (stats_.iterations > 0 && iteration_hits_ + iteration_misses_ > 0) {
    stats_.last_iteration_hit_rate = static_cast<double>(iteration_hits_) /
                                     (iteration_hits_ + iteration_misses_);
  }
  iteration_hits_ = 0;
  iteration_misses_ = 0;
  ++stats_.iterations;
  if (matcher_ != nullptr) matcher_->IterationBegin();
}

void Allocator::IterationEnd(uint64_t number) {
  std::lock_guard<FutexMutex> lock(mu_);
  Record(plan::Event::IterationEnd(number));
}

void Allocator::Phase(std::string_view name) {
  std::lock_guard<FutexMutex> lock(mu_);
  if (recording_) Record(plan::Event::Phase(trace_.InternName(name)));
}

void Allocator::ModuleEnter(std::string_view name, bool dynamic) {
  std::lock_guard<FutexMutex> lock(mu_);
  if (recording_)
    Record(plan::Event::ModuleEnter(trace_.InternName(name), dynamic));
  if (!dynamic) return;
  dynamic_modules_.emplace_back(name);
  window_ = nullptr;
  if (plan_ != nullptr) {
    for (const DynamicWindow& w : plan_->windows) {
      if (w.module == name) window_ = &w;
    }
  }
}

void Allocator::ModuleExit(std::string_view name) {
  std::lock_guard<FutexMutex> lock(mu_);
  if (recording_) Record(plan::Event::ModuleExit(trace_.InternName(name)));
  auto it = std::find(dynamic_modules_.rbegin(), dynamic_modules_.rend(), name);
  if (it == dynamic_modules_.rend()) return;
  dynamic_modules_.erase(std::next(it).base());
  window_ = nullptr;
  if (plan_ != nullptr && !dynamic_modules_.empty()) {
    for (const DynamicWindow& w : plan_->windows) {
      if (w.module == dynamic_modules_.back()) window_ = &w;
    }
  }
}

void Allocator::Record(const plan::Event& event) {
  if (!recording_) return;
  if (trace_.events.size() >= options_.record_capacity) {
    stats_.trace_truncated = true;
    return;
  }
  trace_.events.push_back(event);
  stats_.trace_events = trace_.events.size();
}

plan::Trace Allocator::TakeTrace() {
  std::lock_guard<FutexMutex> lock(mu_);
  plan::Trace out = std::move(trace_);
  trace_ = plan::Trace();
  trace_.header = out.header;
  trace_.names = out.names;  // later events keep using the same name ids
  if (recording_) trace_.events.reserve(options_.record_capacity);
  return out;
}

plan::Trace Allocator::RecordedTrace() const {
  std::lock_guard<FutexMutex> lock(mu_);
  return trace_;
}

void Allocator::StopRecording() {
  std::lock_guard<FutexMutex> lock(mu_);
  recording_ = false;
  plan::Trace empty;
  empty.header = trace_.header;
  trace_ = std::move(empty);
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

Allocator::GraphPool* Allocator::PoolFor(Stream stream) const {
  for (const std::unique_ptr<GraphPool>& pool : pools_) {
    if (pool->open && pool->filter(stream)) return pool.get();
  }
  return nullptr;
}

StatusOr<DevicePtr> Allocator::AllocatePooled(GraphPool& pool, uint64_t size,
                                              Stream stream) {
  uint64_t block = 0;
  LOOM_ASSIGN_OR_RETURN(DevicePtr ptr,
                        AllocateInPool(pool, size, stream, &block));
  live_.Insert(ptr, Allocation{size, stream, Where::kArena, true, 0});
  pool_allocations_[ptr] = PoolAllocation{&pool, block};
  ++pool.live;
  stats_.allocated_bytes.Increase(size);
  stats_.active_bytes.Increase(size);
  stats_.allocation.Increase(1);
  stats_.dynamic_bytes.Increase(size);
  return ptr;
}

StatusOr<DevicePtr> Allocator::AllocateInPool(GraphPool& pool, uint64_t size,
                                              Stream stream, uint64_t* block) {
  // The smallest free block of the pool that fits (its kernels follow the
  // graph's order, so the pool's own memory is reused without a fence).
  size_t best = pool.free_blocks.size();
  for (size_t i = 0; i < pool.free_blocks.size(); ++i) {
    const uint64_t b = pool.free_blocks[i].second;
    if (b >= size && (best == pool.free_blocks.size() ||
                      b < pool.free_blocks[best].second)) {
      best = i;
    }
  }
  if (best != pool.free_blocks.size()) {
    const auto [ptr, b] = pool.free_blocks[best];
    pool.free_blocks[best] = pool.free_blocks.back();
    pool.free_blocks.pop_back();
    stats_.graph_pool_bytes -= b;
    *block = b;
    // The arena still counts the block live; it serves this request now.
    return ptr;
  }
  LOOM_ASSIGN_OR_RETURN(DevicePtr ptr, AllocateInArena(size, stream, -1));
  *block = RoundUp(size, kArenaAlignment);
  return ptr;
}

void Allocator::ReturnPoolBlock(DevicePtr ptr, uint64_t block) {
  // A replay of the graph may still be queued on any stream it ran on: every
  // stream's work before now must be done before another stream reuses the
  // block (each stream's own later work is ordered after it anyway).
  std::vector<FreeTag> tags = tracker_.ReleasedEverywhere();
  arena_->Free(ptr, block, tags);
}

void Allocator::ForgetPoolIfDone(GraphPool* pool) {
  if (!pool->released || pool->live != 0) return;
  for (size_t i = 0; i < pools_.size(); ++i) {
    if (pools_[i].get() == pool) {
      pools_.erase(pools_.begin() + i);
      return;
    }
  }
}

Status Allocator::BeginAllocateToPool(PoolId id,
                                      std::function<bool(Stream)> filter) {
  std::lock_guard<FutexMutex> lock(mu_);
  if (!filter) return InvalidArgumentError("pool ({}, {}): no stream filter",
                                           id.first, id.second);
  GraphPool* pool = nullptr;
  for (const std::unique_ptr<GraphPool>& p : pools_) {
    if (p->id == id && !p->released) pool = p.get();
  }
  if (pool == nullptr) {
    pools_.push_back(std::make_unique<GraphPool>());
    pool = pools_.back().get();
    pool->id = id;
  }
  if (!pool->open) ++open_pools_;
  pool->open = true;
  pool->filter = std::move(filter);
  return OkStatus();
}

Status Allocator::EndAllocateToPool(PoolId id) {
  std::lock_guard<FutexMutex> lock(mu_);
  for (const std::unique_ptr<GraphPool>& p : pools_) {
    if (p->id == id && !p->released) {
      if (p->open) --open_pools_;
      p->open = false;
      return OkStatus();
    }
  }
  return InvalidArgumentError("end of allocation to unknown pool ({}, {})",
                              id.first, id.second);
}

Status Allocator::ReleasePool(PoolId id) {
  std::lock_guard<FutexMutex> lock(mu_);
  tracker_.NewCall();
  for (const std::unique_ptr<GraphPool>& p : pools_) {
    if (p->id != id || p->released) continue;
    if (p->open) --open_pools_;
    p->open = false;
    p->released = true;
    for (const auto& [ptr, block] : p->free_blocks) {
      ReturnPoolBlock(ptr, block);
      stats_.graph_pool_bytes -= block;
    }
    p->free_blocks.clear();
    ForgetPoolIfDone(p.get());
    return OkStatus();
  }
  return InvalidArgumentError("release of unknown pool ({}, {})", id.first,
                              id.second);
}

AllocatorStats Allocator::stats() const {
  std::lock_guard<FutexMutex> lock(mu_);
  AllocatorStats out = stats_;
  out.stream_events = tracker_.events_recorded();
  out.device_syncs = tracker_.device_syncs();
  out.driver_calls = driver_.all_calls();
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

std::vector<std::pair<DevicePtr, uint64_t>> Allocator::MappedRanges() const {
  std::lock_guard<FutexMutex> lock(mu_);
  std::vector<std::pair<DevicePtr, uint64_t>> out = arena_->MappedRanges();
  if (region_ != nullptr) out.emplace_back(region_->base(), region_->bytes());
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
}

}  // namespace loom::vmm
