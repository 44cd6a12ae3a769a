// Workload: the allocation records of a trace, placed in iterations and
// phases (pure C++). The input of workload analysis (analysis.h) and of the
// planner's instance builder.
//
// One Allocation per alloc event: when and on which stream/device it was
// allocated and freed, its size, and the context at both ends: iteration,
// phase, innermost module, and whether a module marked dynamic was open at
// allocation. Times are event indices in the trace (markers count).
//
// Iterations come from the trace's iteration markers when it has any: each
// `iter_begin` starts one, ending at its `iter_end` (or at the next begin, or
// at the end of the trace). Without markers they are detected from the
// period of the (action, size) sequence (periodicity.h): the first iteration
// starts where the repetition starts (allocations before it are in
// iteration -1, the head), and a trace that does not repeat is one iteration.
// An event belongs to the last iteration begun at or before it, so events
// between an `iter_end` and the next `iter_begin` belong to the earlier one.
//
// Phases come from phase markers (the phase at time t is the last marker
// before t, or none). Without any phase marker they are inferred per
// iteration from the time of peak live bytes: up to and including the peak is
// "forward", after it "backward" (phases_inferred is then true); the head has
// no phase.
#ifndef LOOM_PLAN_ANALYSIS_WORKLOAD_H_
#define LOOM_PLAN_ANALYSIS_WORKLOAD_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "plan/analysis/periodicity.h"
#include "plan/solver/instance.h"
#include "plan/trace/trace.h"
#include "plan/trace/trace_io.h"

namespace loom::plan {

inline constexpr int64_t kNever = -1;  // free_time of a live-at-end request
inline constexpr int32_t kNoIteration = -1;  // the head, before iteration 0
inline constexpr int32_t kNone = -1;         // no phase / no module

struct Allocation {
  uint64_t request_id = 0;
  int64_t alloc_time = 0;
  int64_t free_time = kNever;
  uint64_t size = 0;
  uint64_t stream = 0;
  int16_t device = 0;
  int32_t alloc_iteration = kNoIteration;
  int32_t free_iteration = kNoIteration;  // also kNoIteration if never freed
  int32_t alloc_phase = kNone;            // index into Workload::phase_names
  int32_t free_phase = kNone;
  int32_t alloc_module = kNone;  // index into Workload::names: innermost
  int32_t free_module = kNone;   // module open at that time
  // The innermost module marked dynamic open at allocation (kNone if none):
  // the module whose window the request belongs to, as the run time names
  // it (it sees only the markers of modules marked dynamic).
  int32_t alloc_dynamic_module = kNone;
  // How many times, in this iteration, that module was entered in the
  // current phase (1 for its first call; 0 if entered in another phase): a
  // pipeline runs an MoE layer once per micro-batch.
  uint32_t dynamic_call = 0;
  bool dynamic = false;  // a module marked dynamic was open at allocation

  bool freed() const { return free_time != kNever; }
};

enum class IterationSource : uint8_t {
  kMarkers,     // iteration markers in the trace
  kPeriod,      // detected from the period of the (action, size) sequence
  kWholeTrace,  // no markers and no repetition: one iteration
};
std::string_view IterationSourceName(IterationSource source);

struct Iteration {
  int64_t begin = 0;    // first event time
  int64_t end = 0;      // one past the last event time
  uint64_t number = 0;  // the marker's number, else the ordinal
  // False for an iteration cut short: opened by a marker but neither ended
  // nor followed by another, or a detected one shorter than the period.
  bool complete = true;
};

struct Workload {
  TraceHeader header;
  std::vector<std::string> names;        // the trace's name table
  std::vector<std::string> phase_names;  // indexed by Allocation::*_phase
  uint64_t events = 0;
  std::array<uint64_t, 8> events_by_kind{};  // indexed by EventKind
  std::vector<Allocation> allocations;       // in allocation order
  std::vector<Iteration> iterations;
  IterationSource iteration_source = IterationSource::kWholeTrace;
  PeriodResult period;  // kPeriod: the detection result (in alloc/free events)
  bool phases_inferred = false;
};

// Streams `reader` to its end. Memory: the allocation records plus one
// token per alloc/free event for iteration detection.
StatusOr<Workload> LoadWorkload(TraceReader& reader);

// Loads a trace file (text or binary) or a MiniMalloc CSV instance (detected
// by content: a first line with a comma and no trace magic), the latter
// converted with TraceFromInstance. Errors name the file.
StatusOr<Workload> LoadWorkloadFile(const std::string& path);

// The same for an in-memory trace. REQUIRES: ValidateTrace(trace).ok().
Workload BuildWorkload(const Trace& trace);

// A MiniMalloc-style instance as a trace: buffer i becomes request i,
// allocated at `start` and freed at `end`; events are ordered by time, frees
// before allocs at equal times, then by buffer index.
// REQUIRES: ValidateInstance(instance).ok() and instance.period == 0.
Trace TraceFromInstance(const Instance& instance);

// The token of an alloc (`alloc` true) or free of `size` bytes.
uint64_t AllocationToken(bool alloc, uint64_t size);

}  // namespace loom::plan

#endif  // LOOM_PLAN_ANALYSIS_WORKLOAD_H_
