// Replay harness: runs a plan::Trace through any SimAllocator.
//
// Every alloc event calls Malloc(size, stream) and maps the request id to
// the address returned; every free event calls Free(address); markers go to
// OnMarker. Along the way it records, over time: the live requested bytes
// (what the program holds, identical for every allocator), the allocator's
// allocated_bytes and its reserved_bytes (physical memory held). Samples
// are downsampled to at most `max_samples` buckets, each keeping the maxima
// of its events, so peaks survive downsampling.
//
// An allocation that fails with OUT_OF_MEMORY ends the replay (a training
// run would die there): the result says so and holds the numbers up to that
// event; any other failure is an error of the replay. With
// skip_failed_allocations the replay goes on instead, as a program does
// that catches torch.OutOfMemoryError (or the RuntimeError of a driver
// failure) and moves on (a batch-size search, a skipped batch): the failed
// request is dropped, its free too, and the allocator must serve the rest
// of the trace from the state the failure left.
//
// With check_invariants, after every event the harness also checks on its
// own that live allocations do not overlap and lie inside the allocator's
// mapped ranges, and calls the allocator's CheckInvariants.
#ifndef LOOM_WHATIF_SIM_REPLAY_H_
#define LOOM_WHATIF_SIM_REPLAY_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"
#include "plan/trace/trace.h"
#include "whatif/sim/sim_allocator.h"
#include "whatif/sim/stats.h"

namespace loom::whatif {

struct ReplayOptions {
  size_t max_samples = 4000;      // 0: no series
  bool check_invariants = false;  // expensive: tests and --check
  // Device whose events are replayed; -1 accepts only single-device traces.
  int device = -1;
  // An allocation that fails (out of memory or otherwise): drop the
  // request (and its free) and go on, rather than end the replay.
  bool skip_failed_allocations = false;
};

struct MemorySample {
  uint64_t time = 0;       // index of the last event of the bucket
  int64_t iteration = -1;  // last iteration begun by then, -1 before
  uint64_t requested = 0;  // max live requested bytes in the bucket
  uint64_t allocated = 0;  // max allocated_bytes.all.current
  uint64_t reserved = 0;   // max reserved_bytes.all.current
};

// One iteration of the replay: from its iteration-begin marker to the next
// one (or the end of the trace).
struct IterationSummary {
  int64_t iteration = -1;        // the marker's number
  uint64_t peak_requested = 0;   // max live requested bytes during it
  uint64_t peak_reserved = 0;    // max reserved bytes during it
  uint64_t reserved_at_end = 0;  // reserved bytes when it ended
  uint64_t driver_calls = 0;     // made during it
  // The allocator's Counters() when it ended (cumulative: subtract the
  // previous iteration's for what happened during it).
  std::vector<std::pair<std::string, uint64_t>> counters;
};

struct ReplayResult {
  std::string allocator;
  uint64_t events = 0;  // events replayed (all kinds)
  uint64_t allocs = 0;
  uint64_t frees = 0;
  uint64_t peak_requested = 0;  // max over time of live requested bytes
  uint64_t peak_allocated = 0;  // the allocator's allocated_bytes peak
  uint64_t peak_reserved = 0;   // the allocator's reserved_bytes peak
  bool oom = false;
  uint64_t oom_event = 0;  // index of the first alloc event that failed
  std::string oom_message;
  uint64_t ooms = 0;  // allocations out of memory (1 at most unless skipped)
  uint64_t other_failures = 0;  // failed otherwise (skipped)
  MemoryStats stats;            // at the end of the replay
  DriverCalls driver_calls;
  // The calls made before the last complete iteration (iteration-begin to
  // its iteration-end marker) began, and during it: warm-up and steady
  // state. Without a complete iteration, has_steady is false and every
  // call is warm-up. Calls after the last complete iteration are in
  // neither (driver_calls has them all).
  DriverCalls warmup_driver_calls;
  DriverCalls steady_driver_calls;
  bool has_steady = false;
  std::vector<std::pair<std::string, uint64_t>> counters;  // Counters()
  std::vector<MemorySample> series;
  // Per iteration, in order (empty for a trace without markers).
  std::vector<IterationSummary> iterations;

  // peak_requested / peak_reserved (STAlloc's memory efficiency E); 1 when
  // nothing was reserved.
  double efficiency() const;
  double fragmentation() const { return 1.0 - efficiency(); }
};

// Replays `trace` through `allocator` (which should be fresh).
// Errors: INVALID_ARGUMENT for a malformed trace (ValidateTrace) or one with
// several devices when options.device is -1; INTERNAL when the allocator
// breaks its contract (bad Free, overlap, failed CheckInvariants), naming
// the event index.
StatusOr<ReplayResult> Replay(const plan::Trace& trace, SimAllocator& allocator,
                              const ReplayOptions& options = {});

}  // namespace loom::whatif

#endif  // LOOM_WHATIF_SIM_REPLAY_H_
