// SimAllocator: the one replay interface every simulated allocator
// implements (PyTorch's caching allocator, expandable segments, the
// GMLake-style stitcher, and later loom's own runtime on a fake driver).
//
// The replay harness (replay.h) drives it with the requests of a trace:
// Malloc(size, stream) returns the address handed out, Free(address) gives
// it back, markers (iteration, phase, module events) are passed through
// OnMarker for allocators that use them. The allocator reports
// `torch.cuda.memory_stats()`-style statistics and the driver calls it made.
//
// Contract every implementation keeps (checked by CheckInvariants and by
// the harness):
//  - live allocations never overlap, and each lies inside memory the
//    allocator has mapped (MappedRanges);
//  - stats().reserved_bytes.all.current is the physical memory held, and
//    stats().allocated_bytes.all.current <= it;
//  - Malloc fails only with OUT_OF_MEMORY (device full after every
//    fallback) or INVALID_ARGUMENT (size 0, >= 1 EiB); Free of an address
//    that is not live is INVALID_ARGUMENT and changes nothing.
#ifndef LOOM_WHATIF_SIM_SIM_ALLOCATOR_H_
#define LOOM_WHATIF_SIM_SIM_ALLOCATOR_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"
#include "plan/trace/trace.h"
#include "whatif/sim/device.h"
#include "whatif/sim/stats.h"

namespace loom::whatif {

// Requests of this size or more are refused, as PyTorch's allocate() does.
inline constexpr uint64_t kMaxRequestSize = uint64_t{1} << 60;  // 1 EiB

class SimAllocator {
 public:
  virtual ~SimAllocator() = default;

  // Short identifier used in tables and JSON ("pytorch", "gmlake", ...).
  virtual std::string_view name() const = 0;

  // Allocates `size` bytes for use on `stream`; returns the address.
  virtual StatusOr<uint64_t> Malloc(uint64_t size, uint64_t stream) = 0;

  // Frees the allocation at `address` (a value Malloc returned).
  virtual Status Free(uint64_t address) = 0;

  // torch.cuda.empty_cache(): returns cached memory to the device.
  virtual void EmptyCache() = 0;

  // A non-alloc/free event of the trace (iteration begin/end, phase,
  // module enter/exit), in trace order. Most allocators ignore them.
  virtual void OnMarker(const plan::Event& event) { (void)event; }

  // The replay is over (its last event, or an out-of-memory): what is
  // still live stays live. An allocator that checks data verifies those
  // allocations now (weights, optimizer state: a run never frees them).
  virtual void OnReplayEnd() {}

  virtual const MemoryStats& stats() const = 0;
  virtual const DriverCalls& driver_calls() const = 0;

  // Allocator-specific counters worth reporting (name, value), e.g. the
  // stitches a GMLake-style allocator made. Empty by default.
  virtual std::vector<std::pair<std::string, uint64_t>> Counters() const {
    return {};
  }

  // Address ranges currently backed by physical memory, sorted by address.
  virtual std::vector<AddressRange> MappedRanges() const = 0;

  // Full consistency check of the internal state (expensive: tests and
  // --check runs only). Returns the first violation found.
  virtual Status CheckInvariants() const = 0;
};

// Common options of the simulated allocators.
struct SimOptions {
  // Physical device memory in bytes; 0 = unlimited (no OOM).
  uint64_t capacity = 0;
  // Where the simulated driver puts new address ranges (device.h).
  AddressOrder address_order = AddressOrder::kDescending;
};

}  // namespace loom::whatif

#endif  // LOOM_WHATIF_SIM_SIM_ALLOCATOR_H_
