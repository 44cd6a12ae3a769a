#include "whatif/sim/replay.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <set>
#include <unordered_map>

#include "base/check.h"

namespace loom::whatif {

double ReplayResult::efficiency() const {
  if (peak_reserved == 0) return 1.0;
  return static_cast<double>(peak_requested) /
         static_cast<double>(peak_reserved);
}

namespace {

// Collects samples in buckets of `bucket` events, keeping maxima.
class Sampler {
 public:
  Sampler(size_t max_samples, size_t total_events)
      : enabled_(max_samples > 0),
        bucket_(max_samples == 0
                    ? 1
                    : std::max<size_t>(
                          1, (total_events + max_samples - 1) / max_samples)) {}

  void Add(uint64_t time, int64_t iteration, uint64_t requested,
           uint64_t allocated, uint64_t reserved) {
    if (!enabled_) return;
    current_.time = time;
    current_.iteration = iteration;
    current_.requested = std::max(current_.requested, requested);
    current_.allocated = std::max(current_.allocated, allocated);
    current_.reserved = std::max(current_.reserved, reserved);
    if (++in_bucket_ == bucket_) Flush();
  }

  void Flush() {
    if (in_bucket_ == 0) return;
    samples_.push_back(current_);
    current_ = MemorySample();
    in_bucket_ = 0;
  }

  std::vector<MemorySample> Take() {
    Flush();
    return std::move(samples_);
  }

 private:
  bool enabled_;
  size_t bucket_;
  size_t in_bucket_ = 0;
  MemorySample current_;
  std::vector<MemorySample> samples_;
};

// The harness's own view of live allocations: [address, end) by address.
class LiveRanges {
 public:
  Status Add(uint64_t address, uint64_t size, size_t event) {
    auto next = ranges_.lower_bound(address);
    if (next != ranges_.end() && next->first < address + size) {
      return InternalError(
          "event {}: allocation [{:#x}, +{}) overlaps the live one at {:#x}",
          event, address, size, next->first);
    }
    if (next != ranges_.begin() && std::prev(next)->second > address) {
      return InternalError(
          "event {}: allocation [{:#x}, +{}) overlaps the live one at {:#x}",
          event, address, size, std::prev(next)->first);
    }
    ranges_[address] = address + size;
    return OkStatus();
  }
  void Remove(uint64_t address) { ranges_.erase(address); }

  // Every live range lies inside one of `mapped` (sorted, may touch).
  Status CheckInside(const std::vector<AddressRange>& mapped,
                     size_t event) const {
    // Merge touching mapped ranges first.
    std::vector<AddressRange> merged;
    for (const AddressRange& r : mapped) {
      if (!merged.empty() && merged.back().end() == r.address) {
        merged.back().size += r.size;
      } else {
        merged.push_back(r);
      }
    }
    for (const auto& [address, end] : ranges_) {
      auto it = std::upper_bound(
          merged.begin(), merged.end(), address,
          [](uint64_t a, const AddressRange& r) { return a < r.address; });
      if (it == merged.begin() || std::prev(it)->end() < end) {
        return InternalError(
            "event {}: live allocation [{:#x}, {:#x}) is not in mapped memory",
            event, address, end);
      }
    }
    return OkStatus();
  }

 private:
  std::map<uint64_t, uint64_t> ranges_;
};

}  // namespace

StatusOr<ReplayResult> Replay(const plan::Trace& trace, SimAllocator& allocator,
                              const ReplayOptions& options) {
  LOOM_RETURN_IF_ERROR(plan::ValidateTrace(trace));
  if (options.device < 0) {
    std::set<int> devices;
    for (const plan::Event& e : trace.events) {
      if (e.kind == plan::EventKind::kAlloc) devices.insert(e.device);
    }
    if (devices.size() > 1) {
      return InvalidArgumentError(
          "the trace allocates on {} devices ({} and {} ...); replay one "
          "device at a time",
          devices.size(), *devices.begin(), *std::next(devices.begin()));
    }
  }
  ReplayResult result;
  result.allocator = std::string(allocator.name());
  Sampler sampler(options.max_samples, trace.events.size());
  LiveRanges live_ranges;
  struct Live {
    uint64_t address;
    uint64_t size;
  };
  std::unordered_map<uint64_t, Live> live;  // request id -> allocation
  uint64_t requested = 0;
  int64_t iteration = -1;
  DriverCalls calls_at_begin;  // at the last iteration-begin marker
  bool in_iteration = false;
  // Closes the iteration being summarised (if any).
  auto close_iteration = [&] {
    if (result.iterations.empty()) return;
    IterationSummary& last = result.iterations.back();
    last.reserved_at_end = allocator.stats().reserved_bytes.all().current;
    last.driver_calls = allocator.driver_calls().Since(calls_at_begin).total();
    last.counters = allocator.Counters();
  };

  for (size_t t = 0; t < trace.events.size(); ++t) {
    const plan::Event& e = trace.events[t];
    const bool mine = options.device < 0 || e.device == options.device;
    switch (e.kind) {
      case plan::EventKind::kAlloc: {
        if (!mine) break;
        StatusOr<uint64_t> address = allocator.Malloc(e.size, e.stream);
        if (!address.ok()) {
          if (address.status().code() != StatusCode::kOutOfMemory) {
            if (options.skip_failed_allocations) {
              ++result.other_failures;
              break;
            }
            return InternalError("event {}: {} failed to allocate {} bytes: {}",
                                 t, result.allocator, e.size,
                                 address.status().ToString());
          }
          if (!result.oom) {
            result.oom = true;
            result.oom_event = t;
            result.oom_message = address.status().message();
          }
          ++result.ooms;
          break;
        }
        live[e.id] = {*address, e.size};
        requested += e.size;
        ++result.allocs;
        if (options.check_invariants) {
          LOOM_RETURN_IF_ERROR(live_ranges.Add(*address, e.size, t));
        }
        break;
      }
      case plan::EventKind::kFree: {
        auto it = live.find(e.id);
        if (it == live.end()) break;  // another device's request
        Status status = allocator.Free(it->second.address);
        if (!status.ok()) {
          return InternalError(
              "event {}: {} rejected the free of request {}: {}", t,
              result.allocator, e.id, status.ToString());
        }
        requested -= it->second.size;
        if (options.check_invariants) live_ranges.Remove(it->second.address);
        live.erase(it);
        ++result.frees;
        break;
      }
      case plan::EventKind::kIterationBegin:
        close_iteration();
        iteration = static_cast<int64_t>(e.id);
        calls_at_begin = allocator.driver_calls();
        in_iteration = true;
        result.iterations.push_back(IterationSummary{.iteration = iteration});
        allocator.OnMarker(e);
        break;
      case plan::EventKind::kIterationEnd:
        allocator.OnMarker(e);
        if (in_iteration) {
          result.steady_driver_calls =
              allocator.driver_calls().Since(calls_at_begin);
          result.warmup_driver_calls = calls_at_begin;
          result.has_steady = true;
          in_iteration = false;
        }
        break;
      default:
        allocator.OnMarker(e);
        break;
    }
    if (result.oom && !options.skip_failed_allocations) break;
    ++result.events;
    const MemoryStats& stats = allocator.stats();
    uint64_t allocated = stats.allocated_bytes.all().current;
    uint64_t reserved = stats.reserved_bytes.all().current;
    result.peak_requested = std::max(result.peak_requested, requested);
    if (!result.iterations.empty()) {
      IterationSummary& now = result.iterations.back();
      now.peak_requested = std::max(now.peak_requested, requested);
      now.peak_reserved = std::max(now.peak_reserved, reserved);
    }
    sampler.Add(t, iteration, requested, allocated, reserved);
    if (options.check_invariants) {
      Status status = allocator.CheckInvariants();
      if (!status.ok()) {
        return InternalError("event {}: {}: {}", t, result.allocator,
                             status.ToString());
      }
      LOOM_RETURN_IF_ERROR(
          live_ranges.CheckInside(allocator.MappedRanges(), t));
    }
  }
  close_iteration();
  allocator.OnReplayEnd();
  result.stats = allocator.stats();
  result.peak_allocated = result.stats.allocated_bytes.all().peak;
  result.peak_reserved = result.stats.reserved_bytes.all().peak;
  result.driver_calls = allocator.driver_calls();
  if (!result.has_steady) result.warmup_driver_calls = result.driver_calls;
  result.counters = allocator.Counters();
  result.series = sampler.Take();
  return result;
}

}  // namespace loom::whatif
