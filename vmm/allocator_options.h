// AllocatorOptions: how one device's run-time allocator is set up
// (allocator.h); its shadow (allocator_shadow.h) serves with the same rules.
#ifndef LOOM_VMM_ALLOCATOR_OPTIONS_H_
#define LOOM_VMM_ALLOCATOR_OPTIONS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "vmm/lending_policy.h"

namespace loom::vmm {

struct AllocatorOptions {
  int device = 0;
  // Physical memory cap in bytes (0 = none) or as a fraction of the device's
  // total memory (0 = none); the smaller applies.
  uint64_t memory_cap_bytes = 0;
  double memory_fraction = 0;
  // Virtual size of the arena; 0 = twice the device's total memory.
  uint64_t arena_va_bytes = 0;
  // Record every request and marker as a trace, in a buffer preallocated for
  // this many events (0 = do not record).
  size_t record_capacity = 0;
  // Other devices granted access to everything this allocator maps (CUDA
  // peer access; each must be able to access the device).
  std::vector<int> peer_devices;
  // The largest physical handle created, in granules (1..512): the
  // physical-layout setting (docs/design.md, "Physical layout variants").
  uint32_t max_chunk_pages = 512;
  // Say on stderr when the plan loses to the dynamic space (the referee's
  // one line). Off for allocators that replay a recording on the side (the
  // plan check, whatif/loom/plan_check.h): their plans are not the run's.
  bool log_plan_loss = true;
  // Stitch idle arena chunks (arena.h) instead of growing past the peak,
  // from the run's second iteration on (lending_policy.h). Off: the arena
  // as the H200 measured it on 2026-11-26 (`loom_tool compare/replay
  // --no-stitch`).
  bool stitch_idle_chunks = true;
  // With stitching on, a request of at least this many bytes may stitch
  // from the run's first request (lending_policy.h, kStitchEarlyBytes). Tests
  // set it low to drive the early stitching with small requests.
  uint64_t stitch_early_bytes = kStitchEarlyBytes;
};

}  // namespace loom::vmm

#endif  // LOOM_VMM_ALLOCATOR_OPTIONS_H_
