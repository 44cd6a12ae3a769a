// Memory statistics of the simulated allocators, with the semantics of
// `torch.cuda.memory_stats()` (PyTorch's DeviceStats,
// c10/core/CachingDeviceAllocator.h and THCPModule_memoryStats in
// torch/csrc/cuda/Module.cpp).
//
// Every array stat has three entries: all, small_pool, large_pool, and each
// entry has current / peak / allocated / freed:
//   Increase(n): current += n; peak = max(peak, current); allocated += n
//   Decrease(n): current -= n; freed += n
// Invariant: current >= 0 always (a negative value is a simulator bug and
// aborts through LOOM_CHECK).
//
// The simulated driver calls live here too (DriverCalls): they are what the
// comparison reports as "driver calls", split by kind.
#ifndef LOOM_WHATIF_SIM_STATS_H_
#define LOOM_WHATIF_SIM_STATS_H_

#include <array>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom::whatif {

struct Stat {
  int64_t current = 0;
  int64_t peak = 0;
  int64_t allocated = 0;
  int64_t freed = 0;

  void Increase(uint64_t amount);
  // REQUIRES: amount <= current.
  void Decrease(uint64_t amount);
  void ResetPeak() { peak = current; }
};

// Index into a StatArray, in PyTorch's StatType order.
enum class StatType : int { kAll = 0, kSmallPool = 1, kLargePool = 2 };

struct StatArray {
  std::array<Stat, 3> entries;

  Stat& operator[](StatType type) { return entries[static_cast<int>(type)]; }
  const Stat& operator[](StatType type) const {
    return entries[static_cast<int>(type)];
  }
  const Stat& all() const { return (*this)[StatType::kAll]; }
  // Updates "all" and the entry of the pool (small or large).
  void Increase(bool small_pool, uint64_t amount);
  // REQUIRES: amount <= current of both entries.
  void Decrease(bool small_pool, uint64_t amount);
  void ResetPeak();
};

inline constexpr uint64_t kNoMaxSplitSize =
    std::numeric_limits<uint64_t>::max();

// DeviceStats of the caching allocator.
struct MemoryStats {
  StatArray allocation;       // number of allocated blocks
  StatArray segment;          // cudaMalloc segments (never expandable)
  StatArray active;           // allocated or awaiting free
  StatArray inactive_split;   // free blocks that are part of a split segment
  StatArray allocated_bytes;  // block sizes of allocated blocks
  StatArray reserved_bytes;   // physical memory held
  StatArray active_bytes;
  StatArray inactive_split_bytes;
  StatArray requested_bytes;  // original request sizes
  Stat oversize_allocations;  // blocks >= max_split_size
  Stat oversize_segments;
  uint64_t num_alloc_retries = 0;  // malloc calls that freed the cache first
  uint64_t num_ooms = 0;
  uint64_t num_sync_all_streams = 0;
  uint64_t num_device_alloc = 0;  // cudaMalloc + map_block calls
  uint64_t num_device_free = 0;   // cudaFree + unmap_block calls
  uint64_t max_split_size = kNoMaxSplitSize;

  // The flattened `torch.cuda.memory_stats()` dictionary, e.g.
  // ("allocated_bytes.all.peak", 123), in PyTorch's key order.
  // max_split_size is -1 when unlimited, as PyTorch reports it.
  std::vector<std::pair<std::string, int64_t>> Flatten() const;

  // torch.cuda.reset_peak_memory_stats().
  void ResetPeaks();
};

// The CUDA calls DriverCalls counts (synchronisations aside), in the order
// Named() lists them.
enum class DriverCallKind : uint8_t {
  kMalloc,          // cudaMalloc
  kFree,            // cudaFree
  kMemCreate,       // cuMemCreate
  kMemRelease,      // cuMemRelease
  kMemMap,          // cuMemMap
  kMemUnmap,        // cuMemUnmap
  kSetAccess,       // cuMemSetAccess
  kAddressReserve,  // cuMemAddressReserve
  kAddressFree,     // cuMemAddressFree
};
inline constexpr size_t kDriverCallKinds = 9;
inline constexpr std::array<DriverCallKind, kDriverCallKinds>
    kAllDriverCallKinds = {
        DriverCallKind::kMalloc,     DriverCallKind::kFree,
        DriverCallKind::kMemCreate,  DriverCallKind::kMemRelease,
        DriverCallKind::kMemMap,     DriverCallKind::kMemUnmap,
        DriverCallKind::kSetAccess,  DriverCallKind::kAddressReserve,
        DriverCallKind::kAddressFree};
// The CUDA API name: "cudaMalloc", "cuMemCreate", ...
std::string_view DriverCallName(DriverCallKind kind);

// Calls a simulated allocator made to the (simulated) CUDA driver/runtime.
struct DriverCalls {
  uint64_t malloc = 0;           // cudaMalloc
  uint64_t free = 0;             // cudaFree
  uint64_t mem_create = 0;       // cuMemCreate (one physical handle)
  uint64_t mem_release = 0;      // cuMemRelease
  uint64_t mem_map = 0;          // cuMemMap
  uint64_t mem_unmap = 0;        // cuMemUnmap
  uint64_t set_access = 0;       // cuMemSetAccess
  uint64_t address_reserve = 0;  // cuMemAddressReserve
  uint64_t address_free = 0;     // cuMemAddressFree
  uint64_t synchronize = 0;      // stream/device synchronisations forced
  // The same calls by (kind, bytes one call covered), what driver time is
  // priced from (whatif/compare/driver_costs.h). Bytes 0: not known (every
  // row records sizes today; loom's from vmm::Driver::sized_calls). Add()
  // keeps both views equal.
  std::map<std::pair<DriverCallKind, uint64_t>, uint64_t> sized;

  // Records `calls` calls of `kind`, each covering `bytes` (0 = unknown).
  void Add(DriverCallKind kind, uint64_t calls, uint64_t bytes);
  uint64_t count(DriverCallKind kind) const;
  // Every call above except synchronize.
  uint64_t total() const;
  // (name, count) in a fixed order; names are the CUDA API names.
  std::vector<std::pair<std::string, uint64_t>> Named() const;
  // The calls made since `earlier`, a snapshot of the same counters.
  // REQUIRES: every count of `earlier` <= this one's.
  DriverCalls Since(const DriverCalls& earlier) const;
};

}  // namespace loom::whatif

#endif  // LOOM_WHATIF_SIM_STATS_H_
