// The allocator comparison behind `loom_tool compare`: one trace replayed
// through every registered allocator, reported side by side.
//
// Metrics (STAlloc's, research/stalloc.md §1.9), per allocator:
//  - peak allocated: the peak of live requested bytes, i.e. what the
//    program holds; the same for every allocator, so efficiencies compare;
//  - allocator's own allocated_bytes peak (its rounding and unsplit
//    remainders included);
//  - peak reserved: the peak of physical memory held;
//  - efficiency E = peak allocated / peak reserved; fragmentation = 1 - E;
//  - driver calls, total and by kind, and the driver time they stand for
//    at per-call costs measured on a GPU (driver_costs.h), warm-up (before
//    the last complete iteration) and steady state (that iteration) apart;
//  - OOM (the replay stops there).
//
// Allocators are registered as factories that receive the trace, so an
// allocator that plans ahead (loom's own runtime) can be added next to the
// baselines: Compare(trace, ..., {BaselineAllocators(o)..., loom}, o).
#ifndef LOOM_WHATIF_COMPARE_COMPARE_H_
#define LOOM_WHATIF_COMPARE_COMPARE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/json.h"
#include "base/status.h"
#include "plan/trace/trace.h"
#include "whatif/compare/driver_costs.h"
#include "whatif/sim/caching_config.h"
#include "whatif/sim/gmlake_allocator.h"
#include "whatif/sim/replay.h"
#include "whatif/sim/sim_allocator.h"

namespace loom::whatif {

struct AllocatorFactory {
  std::string name;  // the row's "allocator" value
  std::function<StatusOr<std::unique_ptr<SimAllocator>>(
      const plan::Trace& trace, const SimOptions& options)>
      make;
  // An allocator that plans: where its plan comes from ("own trace
  // (oracle)" when it is the measured trace itself). Empty otherwise.
  std::string plan_from;
};

struct CompareOptions {
  uint64_t capacity = 0;  // device memory in bytes, 0 = unlimited
  // Where the simulated driver puts new address ranges (sim/device.h).
  AddressOrder address_order = AddressOrder::kDescending;
  // Settings of both PyTorch rows (expandable_segments is forced off for
  // "pytorch" and on for "pytorch_expandable").
  CachingConfig pytorch;
  GmlakeOptions gmlake;
  // What the rows' driver calls are priced with (driver_costs.h).
  DriverCostTable driver_costs = H200DriverCosts();
  size_t max_samples = 4000;      // memory-over-time points per allocator
  bool check_invariants = false;  // slow; for debugging the simulators
};

// pytorch, pytorch_expandable and gmlake, in that order.
std::vector<AllocatorFactory> BaselineAllocators(const CompareOptions& options);

struct TraceSummary {
  uint64_t events = 0;
  uint64_t allocs = 0;
  uint64_t iterations = 0;  // iteration-begin markers
  // With no markers: the iterations `loom analyze` detects (the period of
  // the (action, size) sequence; plan/analysis/workload.h), 0 when none
  // repeat. Set by the caller (the analysis is not this library's).
  uint64_t detected_iterations = 0;
  uint64_t streams = 0;     // distinct streams of allocations
  uint64_t max_request = 0;
};

TraceSummary Summarize(const plan::Trace& trace);

struct Comparison {
  std::string input;       // the workload spec
  std::string provenance;  // the trace header's
  TraceSummary summary;
  uint64_t capacity = 0;
  AddressOrder address_order = AddressOrder::kDescending;
  DriverCostTable driver_costs;
  std::vector<ReplayResult> rows;      // one per allocator, in factory order
  std::vector<std::string> plan_from;  // per row: its factory's plan_from
  std::string perturbation;            // how the input was perturbed, if it was
};

// Replays `trace` through each allocator. Errors: the trace's (replay.h) or
// a factory's, naming the allocator.
StatusOr<Comparison> Compare(const plan::Trace& trace, std::string input,
                             const std::vector<AllocatorFactory>& allocators,
                             const CompareOptions& options);

// A readable table with units, then driver calls by kind, driver time
// (warm-up and steady state) and notes.
std::string FormatTable(const Comparison& comparison);

// A JSON list with one object per allocator: allocator,
// peak_allocated_bytes, allocator_peak_allocated_bytes, peak_reserved_bytes,
// efficiency, fragmentation, fragmentation_bytes, driver_calls (object:
// total and one key per call kind), warmup_driver_calls_by_kind and
// steady_driver_calls_by_kind (the same objects; steady is null without a
// complete iteration), driver_time (DriverTimeJson), num_alloc_retries,
// num_ooms, oom, oom_event (null unless oom), final_reserved_bytes,
// counters (object).
std::string FormatJson(const Comparison& comparison);

// A row's driver time under `costs`, as the JSON object both `compare` and
// `replay` write: {"costs": source, "total_us", "warmup_us", "steady_us"
// (per iteration, null without a complete iteration), "complete" (every
// call priced), "unpriced_calls", "unpriced_kinds", "unsized_calls"}.
void DriverTimeJson(JsonWriter& w, const ReplayResult& row,
                    const DriverCostTable& costs);
// The same calls object as driver_calls: {"total", one key per kind}.
void DriverCallsJson(JsonWriter& w, const DriverCalls& calls);
// One line: "warm-up 4,444 calls 52.1 ms; steady 0 calls 0 us per
// iteration", with what could not be priced.
std::string DriverTimeLine(const ReplayResult& row,
                           const DriverCostTable& costs);

// CSV with header
// allocator,time,iteration,requested_bytes,allocated_bytes,reserved_bytes
// and the downsampled series of every allocator.
std::string FormatSeriesCsv(const Comparison& comparison);

}  // namespace loom::whatif

#endif  // LOOM_WHATIF_COMPARE_COMPARE_H_
