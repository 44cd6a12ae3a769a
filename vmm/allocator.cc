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
      pool_(driver, options.device, granularity, cap_bytes) {}

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
  if (!live_.empty()) {
    fmt::print(
        stderr,
        "loom: allocator for device {} destroyed with {} live allocations; "
        "their memory is leaked\n",
        options_.device, live_.size());
    return;  // unmapping would pull memory from under live tensors
  }
  for (Event e : idle_events_) driver_.DestroyEvent(e).IgnoreError();
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

bool Allocator::StreamSafeSlow(Page& page, Stream) {
  for (const auto& [s, done] : stream_checks_) {
    if (s == page.last_stream) {
      if (done) page.stream_dirty = false;
      return done;
    }
  }
  // Ask the driver whether the other stream has finished what it had queued.
  bool done = false;
  StatusOr<Event> event = TakeEvent();
  if (event.ok()) {
    if (driver_.RecordEvent(*event, page.last_stream).ok()) {
      StatusOr<bool> query = driver_.QueryEvent(*event);
      done = query.ok() && *query;
    }
    ReturnEvent(*event);
  }
  stream_checks_.emplace_back(page.last_stream, done);
  if (done) page.stream_dirty = false;
  return done;
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

bool Allocator::Usable(PageId id, Stream stream, int64_t until) {
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
  return StreamSafe(page, stream);
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

StatusOr<PageId> Allocator::Acquire(Stream stream, int64_t until) {
  // 0. The pages the plan reserved for the request being served.
  while (!preferred_pages_.empty()) {
    PageId id = preferred_pages_.back();
    preferred_pages_.pop_back();
    Page& p = pool_.page(id);
    if (p.arena_granule == kNoGranule && p.static_users == 0 &&
        StreamSafe(p, stream)) {
      return id;
    }
  }
  // 1. A spare page: in the pool, mapped nowhere.
  for (PageId id = 0; id < pool_.slots(); ++id) {
    Page& p = pool_.page(id);
    if (p.live && p.static_granule == kNoGranule &&
        p.arena_granule == kNoGranule && StreamSafe(p, stream)) {
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
      if (distance <= best_distance || !StreamSafe(p, stream)) continue;
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
  StatusOr<PageId> reclaimed = arena_->ReclaimIdle([&](PageId id) {
    Page& p = pool_.page(id);
    return p.static_granule == kNoGranule && StreamSafe(p, stream);
  });
  if (reclaimed.ok()) return reclaimed;
  // 5. Any idle static page: its planned owner may have to go elsewhere.
  if (best != kNoPage) return best;
  return grown.status();
}

StatusOr<DevicePtr> Allocator::Allocate(uint64_t size, Stream stream) {
  std::lock_guard<FutexMutex> lock(mu_);
  StatusOr<DevicePtr> ptr = AllocateLocked(size, stream);
  stream_checks_.clear();
  return ptr;
}

StatusOr<DevicePtr> Allocator::AllocateLocked(uint64_t size, Stream stream) {
  if (size == 0) return InvalidArgumentError("allocation of 0 bytes");
  if (size > kMaxRequest) {
    ++stats_.num_ooms;
    return OutOfMemoryError("allocation of {} bytes is absurd", size);
  }
  if (!pending_.empty()) ProcessPendingFrees();
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
        ++stats_.plan_hits;
        ++iteration_hits_;
        ptr = *planned;
        where = Where::kStatic;
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
  live_.Insert(*ptr, Allocation{size, stream, where, request_id});
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
  if (!region_->TryOccupy(offset, size, [&](Page& page) {
        return page.arena_users == 0 && StreamSafe(page, stream);
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
  if (recording_) {
    Record(plan::Event::Free(allocation.request_id, allocation.stream,
                             static_cast<int16_t>(options_.device)));
  }
  stats_.allocated_bytes.Decrease(allocation.size);
  stats_.allocation.Decrease(1);
  auto extra =
      extra_streams_.empty() ? extra_streams_.end() : extra_streams_.find(ptr);
  if (extra != extra_streams_.end()) {
    // Other streams use this memory: it stays active until they are done.
    PendingFree pending{ptr, allocation, {}};
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
      stream_checks_.clear();
      return OkStatus();
    }
  }
  FinishFree(ptr, allocation);
  stream_checks_.clear();
  if (!pending_.empty()) ProcessPendingFrees();
  return OkStatus();
}

void Allocator::FinishFree(DevicePtr ptr, const Allocation& allocation) {
  stats_.active_bytes.Decrease(allocation.size);
  if (allocation.where == Where::kStatic) {
    region_->Release(ptr - region_->base(), allocation.size, allocation.stream);
    stats_.static_bytes.Decrease(allocation.size);
  } else {
    arena_->Free(ptr, allocation.size, allocation.stream);
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
    FinishFree(pending.ptr, pending.allocation);
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
  Status status = EmptyCacheLocked();
  stream_checks_.clear();
  return status;
}

Status Allocator::EmptyCacheLocked() {
  ProcessPendingFrees();
  LOOM_ASSIGN_OR_RETURN(std::vector<PageId> unmapped, arena_->UnmapIdle());
  (void)unmapped;
  Status result;
  for (PageId id = 0; id < pool_.slots(); ++id) {
    Page& p = pool_.page(id);
    if (!p.live || p.static_granule != kNoGranule ||
        p.arena_granule != kNoGranule)
      continue;
    if (p.stream_dirty) {
      // Work on the last stream may still read this memory.
      Status sync = driver_.SynchronizeStream(p.last_stream);
      if (!sync.ok()) {
        result = sync;
        continue;
      }
    }
    Status status = pool_.ReleasePage(id);
    if (!status.ok()) result = status;
  }
  UpdateReserved();
  stats_.arena_mapped_bytes = arena_->mapped_granules() * granularity_;
  return result;
}

Status Allocator::BeginAllocateToPool(PoolId, std::function<bool(Stream)>) {
  return OkStatus();
}

Status Allocator::EndAllocateToPool(PoolId) { return OkStatus(); }

Status Allocator::ReleasePool(PoolId) { return OkStatus(); }

AllocatorStats Allocator::stats() const {
  std::lock_guard<FutexMutex> lock(mu_);
  AllocatorStats out = stats_;
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
