// AllocatorStats: the allocator's counters, in torch.cuda.memory_stats() terms.
//
// Where the meaning matches, keys are PyTorch's: "allocated_bytes.all.peak",
// "reserved_bytes.all.current", "num_ooms", ... (reserved = physical memory
// held: the pages loom created and has not released, not address space).
// loom's own figures are under "loom.": plan hits and misses, the hit rate of
// the last complete iteration, static and dynamic bytes, driver calls by
// kind.
#ifndef LOOM_VMM_ALLOCATOR_STATS_H_
#define LOOM_VMM_ALLOCATOR_STATS_H_

#include <array>
#include <cstdint>
#include <string>

#include "vmm/driver.h"
#include "vmm/stream_tracker.h"

namespace loom::vmm {

// One torch-style statistic: current, peak, and the running totals.
struct Stat {
  uint64_t current = 0;
  uint64_t peak = 0;
  uint64_t allocated = 0;  // total ever added
  uint64_t freed = 0;      // total ever removed

  void Increase(uint64_t n) {
    current += n;
    allocated += n;
    if (current > peak) peak = current;
  }
  void Decrease(uint64_t n) {
    current -= n;
    freed += n;
  }
  void ResetPeak() { peak = current; }
};

// "2MiB", "1GiB", "3KiB", "1000B": exact, in the largest unit that divides.
std::string SizeName(uint64_t bytes);

struct AllocatorStats {
  Stat allocated_bytes;  // live requested bytes
  Stat active_bytes;     // allocated + freed but awaiting other streams
  Stat reserved_bytes;   // physical pages held
  Stat allocation;       // live allocation count
  Stat segment;          // physical pages held (count)
  Stat static_bytes;     // live bytes served from the plan
  Stat dynamic_bytes;    // live bytes served from the arena
  uint64_t num_alloc_retries = 0;
  uint64_t num_ooms = 0;
  uint64_t num_device_alloc = 0;  // pages created
  uint64_t num_device_free = 0;   // pages released

  uint64_t plan_hits = 0;         // requests served at their planned offset
  uint64_t plan_misses = 0;       // planned requests served elsewhere
  uint64_t unplanned = 0;         // requests the plan does not place
  uint64_t dynamic_requests = 0;  // requests inside dynamic modules
  // Dynamic requests served at their window's planned slot.
  uint64_t dynamic_hits = 0;
  // Requests the plan did not place served from static bytes the plan
  // leaves idle while they live (plan_schedule.h).
  uint64_t idle_static_placements = 0;
  // Requests served, while no plan serves (suspended or lost), from the
  // static region's backed bytes that no live allocation occupies.
  uint64_t region_reuses = 0;
  // Persistent requests (weights, optimizer state) of an early iteration
  // the plan did not fit, served at their planned place all the same
  // (Allocator::PlacePersistent).
  uint64_t persistent_placements = 0;
  // Persistent requests a little larger than their entry, served at their
  // planned offset all the same, and the later persistent requests they
  // pushed up (Allocator::TryPersistent).
  uint64_t persistent_pushes = 0;
  uint64_t iterations = 0;  // iteration-begin markers seen
  // Hits / (hits + misses) of the last complete iteration; 0 when a plan
  // was installed but routed none of its requests (lost, or suspended from
  // the start); -1 until an iteration completes.
  double last_iteration_hit_rate = -1;
  // Plans: variants installed, plans unloaded, how often the plan did not
  // fit (suspensions), iterations that ended suspended (and whether the
  // last one did), requests served while suspended, variant switches.
  uint64_t plan_variants = 0;
  uint64_t plans_unloaded = 0;
  uint64_t plan_suspensions = 0;
  uint64_t suspended_iterations = 0;
  bool last_iteration_suspended = false;
  uint64_t suspended_requests = 0;
  uint64_t variant_switches = 0;
  // Re-plans refused because their layout would raise the most memory
  // loom has held (AddPlanVariant's never_raise_peak).
  uint64_t plan_variants_refused = 0;
  // The plan referee (plan_referee.h): its verdict ("none", "watching",
  // "confirmed", "lost"), how often a plan lost, the plan's cost and the
  // dynamic space's (the shadow's high-water mark) at the last judgement,
  // and both when the plan last lost.
  std::string plan_verdict = "none";
  uint64_t plan_losses = 0;
  uint64_t referee_plan_bytes = 0;
  uint64_t referee_dynamic_bytes = 0;
  uint64_t lost_plan_bytes = 0;
  uint64_t lost_dynamic_bytes = 0;
  uint64_t static_region_bytes = 0;
  uint64_t static_backed_bytes = 0;  // granules of the region backed so far
  uint64_t arena_mapped_bytes = 0;
  uint64_t arena_maps = 0;  // granules mapped into the arena
  // Pages mapped at one more place in the arena (stitched: an idle chunk
  // mapped where a new one would raise the memory held above its peak),
  // and of those, pages of the static region (idle static memory lent).
  uint64_t stitched_pages = 0;
  uint64_t stitched_static_pages = 0;
  uint64_t graph_pool_bytes = 0;  // freed by graph allocations, kept for them
  uint64_t stream_events = 0;     // events recorded at frees (several streams)
  uint64_t device_syncs = 0;      // waits for the device before an unmap
  // Every event recorded and stream or device synchronisation, by call site
  // ("loom.waits.<site>.<kind>").
  WaitCounters waits;
  // This device's handles and mappings ("loom.layout.*").
  MappingLayout layout;
  uint64_t trace_events = 0;  // events recorded (record mode)
  // Frees left out of the recording: of requests made before it began
  // (or was cleared), e.g. the previous iteration's.
  uint64_t trace_earlier_frees = 0;
  bool trace_truncated = false;  // the record buffer filled up
  std::array<uint64_t, kDriverOpCount> driver_calls{};

  // Flat JSON object with torch-style keys.
  std::string ToJson() const;
};

// What the physical memory held serves right now, page by page (each page
// in the first class that applies; the classes sum to reserved_bytes).
struct MemoryBreakdown {
  uint64_t static_live = 0;  // pages serving live static allocations
  uint64_t arena_live = 0;   // pages serving live arena allocations
  // Arena pages serving nothing, in a mapping (a whole chunk) another page
  // of which serves a live allocation: held until that one is freed.
  uint64_t arena_idle_pinned = 0;
  uint64_t arena_idle = 0;   // pages of arena mappings serving nothing
  uint64_t static_idle = 0;  // backed static pages serving nothing now
  uint64_t spare = 0;        // held, mapped nowhere
};

}  // namespace loom::vmm

#endif  // LOOM_VMM_ALLOCATOR_STATS_H_
