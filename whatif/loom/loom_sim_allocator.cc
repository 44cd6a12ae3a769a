#include "whatif/loom/loom_sim_allocator.h"

#include <algorithm>
#include <cstring>
#include <iterator>

#include "vmm/driver_factory.h"

namespace loom::whatif {
namespace {

constexpr uint64_t kFullCheckLimit = 64
                                     << 10;  // patterned completely below this
constexpr uint64_t kStampStride = 64 << 10;

// The pattern word at byte `offset` of the allocation tagged `tag`.
uint64_t Word(uint64_t tag, uint64_t offset) {
  return (tag * 0x9E3779B97F4A7C15ull) ^ (offset * 0xC2B2AE3D27D4EB4Full) ^
         0x5bd1e995;
}

// The bytes of the pattern for [offset, offset + n).
void Pattern(uint64_t tag, uint64_t offset, uint64_t n, uint8_t* out) {
  for (uint64_t i = 0; i < n; ++i) {
    uint64_t at = offset + i;
    out[i] = static_cast<uint8_t>(Word(tag, at / 8) >> (8 * (at % 8)));
  }
}

// The ranges of an allocation that carry the pattern.
std::vector<std::pair<uint64_t, uint64_t>> CheckedRanges(uint64_t size) {
  if (size <= kFullCheckLimit) return {{0, size}};
  std::vector<std::pair<uint64_t, uint64_t>> out;
  for (uint64_t at = 0; at + 16 <= size; at += kStampStride)
    out.emplace_back(at, 16);
  out.emplace_back(size - 16, 16);
  return out;
}

}  // namespace

StatusOr<std::unique_ptr<LoomSimAllocator>> LoomSimAllocator::Create(
    LoomSimOptions options) {
  if (options.backend != "fake" && options.backend != "host") {
    return InvalidArgumentError("loom replay backend '{}' is not fake or host",
                                options.backend);
  }
  if (options.check_data && options.backend != "host") {
    return InvalidArgumentError(
        "checking data needs the host backend (real memory)");
  }
  if (options.driver_failure_percent < 0 ||
      options.driver_failure_percent > 100) {
    return InvalidArgumentError("driver failure chance {}% is not 0-100",
                                options.driver_failure_percent);
  }
  std::unique_ptr<LoomSimAllocator> a(new LoomSimAllocator());
  a->options_ = std::move(options);
  a->failure_rng_.seed(a->options_.driver_failure_seed);
  vmm::DriverOptions driver_options;
  driver_options.granularity = a->options_.granularity;
  driver_options.capacity_per_device =
      a->options_.capacity == 0 ? (uint64_t{1} << 40) : a->options_.capacity;
  LOOM_ASSIGN_OR_RETURN(a->driver_,
                        vmm::OpenDriver(a->options_.backend, driver_options));
  vmm::AllocatorOptions allocator_options;
  allocator_options.log_plan_loss = a->options_.log_plan_loss;
  allocator_options.stitch_idle_chunks = a->options_.stitch;
  if (a->options_.switch_plan.has_value()) {
    if (a->options_.plan.has_value()) {
      return InvalidArgumentError(
          "a replay serves a plan from the start or switches to one, not "
          "both");
    }
    allocator_options.record_capacity = a->options_.record_capacity;
  }
  LOOM_ASSIGN_OR_RETURN(a->allocator_,
                        vmm::Allocator::Create(*a->driver_, allocator_options));
  if (a->options_.plan.has_value()) {
    LOOM_RETURN_IF_ERROR(a->allocator_->LoadPlan(*a->options_.plan));
  }
  if (a->options_.replan.has_value()) {
    a->replanner_ = std::make_unique<autoplan::Replanner>(*a->allocator_,
                                                          *a->options_.replan);
  }
  return a;
}

LoomSimAllocator::~LoomSimAllocator() {
  replanner_.reset();
  // Give everything back so the driver sees no leak.
  for (const auto& [address, live] : live_) {
    (void)live;
    allocator_->Free(address).IgnoreError();
  }
  allocator_.reset();
}

uint64_t LoomSimAllocator::DriverCallTotal() const {
  uint64_t total = 0;
  for (vmm::DriverOp op :
       {vmm::DriverOp::kCreate, vmm::DriverOp::kRelease,
        vmm::DriverOp::kReserve, vmm::DriverOp::kUnreserve, vmm::DriverOp::kMap,
        vmm::DriverOp::kUnmap, vmm::DriverOp::kSetAccess}) {
    total += driver_->calls(op);
  }
  return total;
}

void LoomSimAllocator::Stamp(uint64_t address, uint64_t size, uint64_t tag) {
  std::vector<uint8_t> bytes;
  for (const auto& [offset, n] : CheckedRanges(size)) {
    bytes.resize(n);
    Pattern(tag, offset, n, bytes.data());
    Status status = driver_->CopyToDevice(address + offset, bytes.data(), n);
    LOOM_CHECK(status.ok(), "stamping {:#x}: {}", address, status.ToString());
  }
}

bool LoomSimAllocator::Verify(uint64_t address, uint64_t size, uint64_t tag) {
  std::vector<uint8_t> expected, actual;
  for (const auto& [offset, n] : CheckedRanges(size)) {
    expected.resize(n);
    actual.resize(n);
    Pattern(tag, offset, n, expected.data());
    if (!driver_->CopyToHost(actual.data(), address + offset, n).ok())
      return false;
    if (std::memcmp(expected.data(), actual.data(), n) != 0) return false;
  }
  return true;
}

void LoomSimAllocator::Arm() {
  if (options_.driver_failure_percent == 0 ||
      static_cast<int>(failure_rng_() % 100) >=
          options_.driver_failure_percent) {
    return;
  }
  static constexpr vmm::DriverOp kOps[] = {
      vmm::DriverOp::kCreate, vmm::DriverOp::kMap, vmm::DriverOp::kSetAccess,
      vmm::DriverOp::kUnmap, vmm::DriverOp::kRelease};
  armed_ = kOps[failure_rng_() % std::size(kOps)];
  armed_calls_ = driver_->calls(*armed_);
  driver_->InjectFailure(*armed_, 1,
                         failure_rng_() % 3 == 0
                             ? OutOfMemoryError("injected driver failure")
                             : InternalError("injected driver failure"));
  // Sometimes the unmap that would undo what the failed call mapped fails
  // too.
  if (*armed_ != vmm::DriverOp::kUnmap && failure_rng_() % 4 == 0) {
    driver_->InjectFailure(vmm::DriverOp::kUnmap, 1,
                           InternalError("injected driver failure"));
  }
}

void LoomSimAllocator::Disarm() {
  if (!armed_.has_value()) return;
  driver_->ClearFailures();
  if (driver_->calls(*armed_) > armed_calls_) ++driver_failures_;
  armed_.reset();
}

StatusOr<uint64_t> LoomSimAllocator::Malloc(uint64_t size, uint64_t stream) {
  if (size == 0) return InvalidArgumentError("malloc of 0 bytes");
  Arm();
  StatusOr<vmm::DevicePtr> allocated = allocator_->Allocate(size, stream);
  Disarm();
  LOOM_ASSIGN_OR_RETURN(vmm::DevicePtr ptr, std::move(allocated));
  uint64_t tag = next_tag_++;
  if (options_.check_data) Stamp(ptr, size, tag);
  live_[ptr] = Live{size, tag};
  if (options_.switch_plan.has_value()) NotePeak();
  return ptr;
}

Status LoomSimAllocator::Free(uint64_t address) {
  auto it = live_.find(address);
  if (it == live_.end()) {
    return InvalidArgumentError("free of {:#x}, which is not live", address);
  }
  if (options_.check_data &&
      !Verify(address, it->second.size, it->second.tag)) {
    ++corrupted_;
  }
  live_.erase(it);
  Arm();
  Status status = allocator_->Free(address);
  Disarm();
  return status;
}

void LoomSimAllocator::OnReplayEnd() {
  if (!options_.check_data || verified_live_) return;
  verified_live_ = true;
  for (const auto& [address, live] : live_) {
    if (!Verify(address, live.size, live.tag)) ++corrupted_;
  }
}

void LoomSimAllocator::EmptyCache() { allocator_->EmptyCache().IgnoreError(); }

void LoomSimAllocator::OnMarker(const plan::Event& event) {
  auto name = [&]() -> std::string_view {
    return event.name < options_.names.size()
               ? std::string_view(options_.names[event.name])
               : std::string_view("?");
  };
  switch (event.kind) {
    case plan::EventKind::kIterationBegin:
      if (options_.switch_plan.has_value() && !switch_.switched &&
          switch_.error.empty() &&
          event.id == static_cast<uint64_t>(options_.switch_at)) {
        Switch();
      }
      calls_at_iteration_begin_ = DriverCallTotal();
      in_iteration_ = true;
      if (replanner_ != nullptr) replanner_->BeforeIterationBegin();
      allocator_->IterationBegin(event.id);
      break;
    case plan::EventKind::kIterationEnd:
      allocator_->IterationEnd(event.id);
      if (in_iteration_) {
        steady_driver_calls_ =
            static_cast<int64_t>(DriverCallTotal() - calls_at_iteration_begin_);
        in_iteration_ = false;
      }
      break;
    case plan::EventKind::kPhase:
      allocator_->Phase(name());
      break;
    case plan::EventKind::kModuleEnter:
      allocator_->ModuleEnter(name(),
                              (event.flags & plan::kDynamicModule) != 0);
      break;
    case plan::EventKind::kModuleExit:
      allocator_->ModuleExit(name());
      break;
    default:
      break;
  }
}

void LoomSimAllocator::NotePeak() {
  const uint64_t reserved = allocator_->stats().reserved_bytes.current;
  if (reserved <= phase_peak_) return;
  phase_peak_ = reserved;
  (switch_.switched ? switch_.at_planned_peak : switch_.at_unplanned_peak) =
      allocator_->Breakdown();
}

void LoomSimAllocator::Switch() {
  switch_.before = allocator_->stats();
  Status loaded = allocator_->LoadPlan(*options_.switch_plan);
  if (!loaded.ok()) {
    switch_.error = loaded.ToString();
    return;
  }
  // The trace has served its purpose (session.py: stop_recording).
  allocator_->StopRecording();
  switch_.after = allocator_->stats();

  switch_.switched = true;
  phase_peak_ = 0;
  NotePeak();
  // From here on the allocator's peaks are the planned phase's; stats()
  // folds the earlier ones in.
  allocator_->ResetPeakStats();
}

SwitchReport LoomSimAllocator::switch_report() const {
  SwitchReport out = switch_;
  const vmm::AllocatorStats now = allocator_->stats();
  out.now = allocator_->Breakdown();
  if (switch_.switched) {
    out.unplanned_peak_reserved = switch_.before.reserved_bytes.peak;
    out.unplanned_peak_allocated = switch_.before.allocated_bytes.peak;
    out.planned_peak_reserved = now.reserved_bytes.peak;
    out.planned_peak_allocated = now.allocated_bytes.peak;
  } else {
    out.unplanned_peak_reserved = now.reserved_bytes.peak;
    out.unplanned_peak_allocated = now.allocated_bytes.peak;
  }
  return out;
}

const MemoryStats& LoomSimAllocator::stats() const {
  vmm::AllocatorStats s = allocator_->stats();
  // Whole-run peaks: the phase before a switch counts too.
  auto copy = [&](StatArray& to, vmm::Stat vmm::AllocatorStats::* field) {
    const vmm::Stat& from = s.*field;
    Stat& all = to[StatType::kAll];
    all.current = static_cast<int64_t>(from.current);
    uint64_t peak = from.peak;
    if (switch_.switched) peak = std::max(peak, (switch_.before.*field).peak);
    all.peak = static_cast<int64_t>(peak);
    all.allocated = static_cast<int64_t>(from.allocated);
    all.freed = static_cast<int64_t>(from.freed);
  };
  using S = vmm::AllocatorStats;
  copy(stats_.allocation, &S::allocation);
  copy(stats_.segment, &S::segment);
  copy(stats_.allocated_bytes, &S::allocated_bytes);
  copy(stats_.requested_bytes, &S::allocated_bytes);
  copy(stats_.active_bytes, &S::active_bytes);
  copy(stats_.reserved_bytes, &S::reserved_bytes);
  stats_.num_alloc_retries = s.num_alloc_retries;
  stats_.num_ooms = s.num_ooms;
  stats_.num_device_alloc = s.num_device_alloc;
  stats_.num_device_free = s.num_device_free;
  return stats_;
}

const DriverCalls& LoomSimAllocator::driver_calls() const {
  // vmm records each memory call's size (Driver::sized_calls).
  calls_ = DriverCalls();
  for (const auto& [kind, op] :
       {std::pair{DriverCallKind::kMemCreate, vmm::DriverOp::kCreate},
        std::pair{DriverCallKind::kMemRelease, vmm::DriverOp::kRelease},
        std::pair{DriverCallKind::kMemMap, vmm::DriverOp::kMap},
        std::pair{DriverCallKind::kMemUnmap, vmm::DriverOp::kUnmap},
        std::pair{DriverCallKind::kSetAccess, vmm::DriverOp::kSetAccess},
        std::pair{DriverCallKind::kAddressReserve, vmm::DriverOp::kReserve},
        std::pair{DriverCallKind::kAddressFree, vmm::DriverOp::kUnreserve}}) {
    for (const auto& [bytes, count] : driver_->sized_calls(op)) {
      calls_.Add(kind, count, bytes);
    }
  }
  calls_.synchronize = driver_->calls(vmm::DriverOp::kSynchronizeStream);
  return calls_;
}

std::vector<std::pair<std::string, uint64_t>> LoomSimAllocator::Counters()
    const {
  vmm::AllocatorStats s = allocator_->stats();
  std::vector<std::pair<std::string, uint64_t>> out = {
      {"plan_hits", s.plan_hits},
      {"plan_misses", s.plan_misses},
      {"unplanned", s.unplanned},
      {"dynamic_requests", s.dynamic_requests},
      {"dynamic_hits", s.dynamic_hits},
      {"idle_static_placements", s.idle_static_placements},
      {"region_reuses", s.region_reuses},
      {"persistent_placements", s.persistent_placements},
      {"persistent_pushes", s.persistent_pushes},
      {"arena_maps", s.arena_maps},
      {"stitched_pages", s.stitched_pages},
      {"stitched_static_pages", s.stitched_static_pages},
      {"static_region_bytes", s.static_region_bytes},
      {"static_backed_bytes", s.static_backed_bytes},
      {"iterations", s.iterations},
      {"plan_suspensions", s.plan_suspensions},
      {"suspended_iterations", s.suspended_iterations},
      {"plan_variants", s.plan_variants},
      {"variant_switches", s.variant_switches},
      {"plan_losses", s.plan_losses},
      {"referee_plan_bytes", s.referee_plan_bytes},
      {"referee_dynamic_bytes", s.referee_dynamic_bytes},
      {"lost_plan_bytes", s.lost_plan_bytes},
      {"lost_dynamic_bytes", s.lost_dynamic_bytes},
  };
  if (replanner_ != nullptr) {
    autoplan::ReplanStats r = replanner_->stats();
    out.emplace_back("replans", r.replans);
    out.emplace_back("replan_failures", r.failures);
    out.emplace_back("replans_refused", s.plan_variants_refused);
  }
  if (options_.check_data) out.emplace_back("corrupted", corrupted_);
  if (steady_driver_calls_ >= 0) {
    out.emplace_back("steady_driver_calls",
                     static_cast<uint64_t>(steady_driver_calls_));
  }
  return out;
}

std::vector<AddressRange> LoomSimAllocator::MappedRanges() const {
  std::vector<AddressRange> out;
  for (const auto& [address, size] : allocator_->MappedRanges()) {
    out.push_back(AddressRange{address, size});
  }
  return out;
}

Status LoomSimAllocator::CheckInvariants() const {
  allocator_->CheckInvariants();  // aborts on a broken invariant
  return OkStatus();
}

}  // namespace loom::whatif
