// loom stress: seeded random multi-stream, multi-thread programs against
// loom's real run-time allocator (vmm::Allocator), checking the invariants
// that matter on a GPU.
//
// Each harness thread runs random operations on one allocator per device:
// allocations and frees on several streams, kernels that stamp and check the
// memory they were given (queued for later on the async backend), uses of a
// buffer on another stream (record_stream plus an event wait, as PyTorch
// does), empty_cache, requests under a memory cap (out of memory included),
// iteration and dynamic-module markers, a plan installed mid-run (recorded
// and planned in process, as auto mode does), and CUDA-graph capture regions
// (allocations routed to a private pool, replayed later). It reports:
//  - faults: what the async driver saw (memory unmapped or handed to
//    another stream while a queued kernel still touches it, a kernel that
//    found its memory gone);
//  - corrupted: a kernel that found another buffer's stamp in its memory;
//  - invariant failures: two live buffers (graph-owned memory included)
//    sharing a physical byte, checked at every hand-out, and the
//    allocator's own CheckInvariants every 64 operations (which aborts).
// All three must be 0. With --backend host or fake, kernels run at once
// (fake: no data), so only the invariants are meaningful there. With
// --backend cuda (a GPU, or the stub libcuda in tests) a kernel is a memset
// and a copy back queued on the stream (stress/kernels.h); the device's
// page size replaces `granularity`, and `cap_bytes` and `max_request` are
// scaled with it (the same program in pages: 12 MiB at 64 KiB pages is
// 384 MiB at 2 MiB); max_delay_us does not apply (the device sets the pace).
#ifndef LOOM_STRESS_STRESS_H_
#define LOOM_STRESS_STRESS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace loom::stress {

struct StressOptions {
  std::string backend = "async";  // async, host, fake or cuda
  double seconds = 10;
  uint64_t max_ops = 0;  // stop after this many operations (0: time only)
  uint64_t seed = 1;
  int streams = 3;  // per device, besides one capture stream per thread
  int threads = 2;  // harness threads sharing the allocators
  int devices = 1;
  uint64_t granularity = uint64_t{64} << 10;
  uint64_t cap_bytes = uint64_t{12} << 20;  // per device; 0: none
  uint64_t max_request = uint64_t{1} << 20;
  int max_delay_us = 300;  // a kernel waits up to this long before running
  bool plan = true;        // install a plan mid-run
  bool graphs = true;      // graph-capture regions
  // Driver failures: before this share (percent) of allocations, one of
  // the next few memory calls (create, map, set-access, unmap, release),
  // on whichever thread makes it, fails as a driver would
  // (vmm::Driver::InjectFailure). What it fails must lose nothing.
  int driver_failure_percent = 0;
};

struct StressReport {
  uint64_t ops = 0;
  uint64_t allocs = 0;
  uint64_t frees = 0;
  uint64_t kernels = 0;
  uint64_t kernels_skipped = 0;
  uint64_t cross_stream_uses = 0;
  uint64_t event_waits = 0;
  uint64_t empty_caches = 0;
  uint64_t ooms = 0;             // requests refused for lack of memory
  uint64_t oom_retries = 0;      // requests that emptied the cache and retried
  uint64_t driver_failures = 0;  // requests an injected failure failed
  uint64_t plans_installed = 0;
  uint64_t plan_hits = 0;
  uint64_t plan_misses = 0;       // routed requests not served by the plan
  uint64_t plan_suspensions = 0;  // iterations the plan did not fit
  // Requests served, while the plan did not serve, from its region's idle
  // bytes in place (vmm::Allocator::PlaceInIdleRegion).
  uint64_t region_reuses = 0;
  uint64_t replans = 0;  // variants installed by re-planning
  uint64_t plans_unloaded = 0;
  uint64_t graph_captures = 0;
  uint64_t graph_replays = 0;
  uint64_t faults = 0;
  uint64_t corrupted = 0;
  uint64_t invariant_failures = 0;
  double seconds = 0;
  // The page size, cap and largest request the program ran with (cuda:
  // scaled to the device's page size).
  uint64_t granularity = 0;
  uint64_t cap_bytes = 0;
  uint64_t max_request = 0;
  std::vector<std::string> failures;  // the first few, described

  bool ok() const {
    return faults == 0 && corrupted == 0 && invariant_failures == 0;
  }
  std::string ToJson(const StressOptions& options) const;
  // One line of counts ("N ops, N kernels: faults N, ...") and the
  // failures described, one per line.
  std::string Summary() const;
};

// Runs one stress program. Errors: INVALID_ARGUMENT for bad options, or the
// driver's error if the backend cannot start; problems found are in the
// report, not errors.
StatusOr<StressReport> RunStress(const StressOptions& options);

}  // namespace loom::stress

#endif  // LOOM_STRESS_STRESS_H_
