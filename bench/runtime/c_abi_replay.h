// CAbiReplay: a recorded trace replayed through libloom's C ABI, the calls
// PyTorch makes (loom_malloc / loom_free with the request's size, device and
// stream; the iteration, phase and module markers), in auto mode's shape, on
// the fake backend: the CPU proxy of step time (issue 21). What of a step's
// time the allocator owns without a GPU: the host time inside the C ABI per
// request, the waits loom inserts (events, stream and device
// synchronisations) and the driver calls it makes per steady iteration, and
// how its physical memory is laid out (handles and mappings by handle size).
//
// The shape of a run (as torch_plugin/loom/session.py's auto mode does it):
//  1. loom_configure("backend=fake;record=N;replan=1;max_chunk_pages=..."),
//     then the trace's first events, up to the end of its first K
//     iterations (the set-up before the first iteration marker included),
//     served unplanned and recorded;
//  2. loom_write_trace, loom_plan_trace (persistent=0, as auto mode),
//     loom_load_plan, loom_stop_recording: the plan installed mid-run;
//  3. the rest of the trace, then its steady iteration (the last complete
//     one) `repetitions` more times, each timed, its figures taken from
//     loom_stats_json before and after.
// The same requests go through PyTorch's caching allocator simulator
// (whatif/sim/caching_allocator.h), one repetition of each in turn, so the
// two are timed in the same run under the same machine state.
//
// The steady iteration is repeated as the program would: an allocation of
// the iteration that outlives it (freed in the next one) is freed by the
// next repetition, matched by its ordinal among the iteration's allocations
// (the previous iteration's allocation of that ordinal must have the same
// size). A trace whose steady iteration frees something older than the
// previous iteration, or keeps an allocation the next one does not free,
// cannot be repeated and is refused.
//
// Uses the process's one libloom runtime: configured at the start and shut
// down at the end (every allocation freed first); not reentrant.
#ifndef LOOM_BENCH_RUNTIME_C_ABI_REPLAY_H_
#define LOOM_BENCH_RUNTIME_C_ABI_REPLAY_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "base/status.h"
#include "plan/trace/trace.h"

namespace loom::bench {

// One event of the steady iteration as a template.
struct SteadyOp {
  enum class Kind : uint8_t { kAlloc, kFree, kMarker };
  Kind kind = Kind::kAlloc;
  // kFree: frees the previous repetition's allocation of ordinal `slot`.
  bool previous = false;
  uint32_t slot = 0;  // kAlloc, kFree: the allocation's ordinal
  int16_t device = 0;
  uint64_t size = 0;    // kAlloc
  uint64_t stream = 0;  // kAlloc, kFree
  plan::Event marker;   // kMarker: the event as recorded
};

struct SteadyIteration {
  uint64_t begin = 0;   // its iteration-begin event's index in the trace
  uint64_t end = 0;     // one past its iteration-end event
  uint64_t number = 0;  // its iteration number
  uint32_t allocs = 0;
  uint32_t carried = 0;  // allocations the next iteration frees
  std::vector<SteadyOp> ops;
};

// The trace's last complete iteration as a repeatable template.
// Errors: no complete iteration; a free the template cannot resolve (see
// the top of this file); an allocation left live forever.
StatusOr<SteadyIteration> ExtractSteadyIteration(const plan::Trace& trace);

struct CAbiReplayOptions {
  int64_t plan_from = 1;           // K: iterations recorded before planning
  int repetitions = 5;             // steady iterations replayed after the trace
  uint32_t max_chunk_pages = 512;  // libloom's layout setting
  // libloom's host_sample_every (0: no sampled host time).
  uint32_t host_sample_every = 256;
  double plan_time_limit = 10;  // loom_plan_trace's time_limit, seconds
  uint64_t device_memory = uint64_t{140} << 30;  // the fake device's
  std::string work_dir = "/tmp";  // the recorded trace and the plan go here
  // replan=1, as the Python package's auto mode sets it: once a plan is
  // installed, the allocator records every iteration for the re-planner.
  bool replan = true;
  bool simulate = true;  // also the caching allocator simulator
};

// loom.layout.* of loom_stats_json.
struct LayoutFigures {
  struct Bucket {
    std::string size;  // "2MiB", "32MiB", ...
    uint64_t handles = 0;
    uint64_t bytes = 0;
    uint64_t mappings = 0;
    friend bool operator==(const Bucket&, const Bucket&) = default;
  };
  uint64_t handles = 0;
  uint64_t handle_bytes = 0;
  uint64_t mappings = 0;
  uint64_t mapped_bytes = 0;
  std::vector<Bucket> buckets;  // by handle size, smallest first

  double MappingsPerGiB() const;
  // "4134 handles, 4134 mappings (2092x2MiB, 1033x8MiB, 421x16MiB)": the
  // three buckets with most handles.
  std::string Describe() const;
  friend bool operator==(const LayoutFigures&, const LayoutFigures&) = default;
};

struct CAbiReplayResult {
  uint64_t trace_events = 0;
  uint64_t recorded_events = 0;  // events before the plan was made
  std::string plan_report;       // loom_plan_trace's JSON
  SteadyIteration steady;
  int repetitions = 0;
  // Per repetition: host ns per request (an allocation and its free) inside
  // loom_malloc + loom_free, and inside the simulator's Malloc + Free.
  std::vector<double> loom_pair_ns;
  std::vector<double> sim_pair_ns;
  // Totals over the repetitions (per iteration: divide by repetitions).
  std::map<std::string, uint64_t> waits;  // "<site>.<kind>" -> count
  uint64_t wait_events = 0;
  uint64_t stream_syncs = 0;
  uint64_t device_syncs = 0;
  uint64_t driver_calls = 0;
  uint64_t plan_hits = 0;
  uint64_t plan_misses = 0;
  uint64_t replan_attempts = 0;
  uint64_t sim_driver_calls = 0;  // the simulator's cudaMalloc/cudaFree
  // libloom's own sampled host time over the repetitions (host_timing.h).
  uint64_t host_malloc_samples = 0;
  double host_malloc_mean_ns = 0;
  uint64_t host_free_samples = 0;
  double host_free_mean_ns = 0;
  // loom's layout after the first and after the last repetition.
  LayoutFigures layout_first;
  LayoutFigures layout;
  uint64_t sim_segments = 0;        // the simulator's cudaMalloc segments
  uint64_t sim_reserved_bytes = 0;  // and their bytes
};

StatusOr<CAbiReplayResult> ReplayThroughCAbi(const plan::Trace& trace,
                                             const CAbiReplayOptions& options);

// The median of `values` (0 when empty).
double Median(std::vector<double> values);

// Numbers of a flat JSON object (loom_stats_json's form): key -> the value's
// text; strings and booleans are left out.
std::map<std::string, std::string> FlatJsonNumbers(const std::string& json);

}  // namespace loom::bench

#endif  // LOOM_BENCH_RUNTIME_C_ABI_REPLAY_H_
