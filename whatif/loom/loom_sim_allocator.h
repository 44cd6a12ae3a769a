// LoomSimAllocator: loom's real run-time allocator behind the simulators'
// replay interface (whatif/sim/sim_allocator.h).
//
// Not a simulation: it drives vmm::Allocator itself, on the fake driver
// (bookkeeping only, any size) or the host driver (real memory, so data can
// be checked). This is how `loom compare` puts loom next to the baselines and
// how `loom replay` runs a trace. Options add what the baselines do not have:
// a plan to serve, and data checking: with check_data (host backend), every
// allocation gets a pattern unique to it at allocation (the whole
// allocation up to 64 KiB, then 16-byte stamps every 64 KiB and at the end)
// that is verified at its free, or at the end of the replay for those still
// live then (OnReplayEnd: weights, optimizer state); allocations whose
// pattern changed are counted as corrupted.
//
// Counters(): plan_hits, plan_misses, unplanned, dynamic_requests,
// dynamic_hits, where the plan's region and the arena served (placements,
// reuses, arena_maps, stitched_pages, stitched_static_pages), the plan's
// variants and the referee's numbers, corrupted, iterations, and
// steady_driver_calls (driver calls
// during the last complete iteration, from its iteration-begin marker to its
// iteration-end marker, re-planning at the boundary included: 0 for a
// repeating workload once warm; the replay harness's steady state).
//
// Auto mode's switch (switch_plan): no plan at first, then, at the boundary
// before the begin marker of iteration `switch_at`, the plan is installed
// as auto mode installs the plan it made in the background
// (torch_plugin/loom/session.py: LoadPlan after the allocator's
// IterationEnd, then the recording stops, then the re-planner and the
// allocator see the IterationBegin), with everything allocated before still
// live in the arena. The allocator records from its start until then (auto
// mode's trace buffer). switch_report() has the peaks of the two phases;
// stats() keeps whole-run peaks.
#ifndef LOOM_WHATIF_LOOM_LOOM_SIM_ALLOCATOR_H_
#define LOOM_WHATIF_LOOM_LOOM_SIM_ALLOCATOR_H_

#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "autoplan/replanner.h"
#include "vmm/allocator.h"
#include "vmm/driver.h"
#include "whatif/sim/sim_allocator.h"

namespace loom::whatif {

struct LoomSimOptions {
  std::string backend = "fake";  // "fake" or "host"
  uint64_t granularity = uint64_t{2} << 20;
  uint64_t capacity = 0;    // device memory; 0 = 1 TiB (no OOM in practice)
  bool check_data = false;  // host backend only
  std::optional<vmm::RuntimePlan> plan;
  std::vector<std::string> names;  // the trace's name table, for markers
  // Re-planning (autoplan/replanner.h), as auto mode does at run time: a
  // shape of iteration the plan does not fit is recorded, planned (in the
  // replay's thread: the same result every time) and added as a variant.
  std::optional<autoplan::ReplanOptions> replan;
  // Auto mode's switch (above): installed before iteration `switch_at`
  // begins; the allocator records up to `record_capacity` events before.
  std::optional<vmm::RuntimePlan> switch_plan;
  int64_t switch_at = -1;
  size_t record_capacity = 0;
  // vmm::AllocatorOptions::log_plan_loss.
  bool log_plan_loss = true;
  // vmm::AllocatorOptions::stitch_idle_chunks.
  bool stitch = true;
  // Driver failures (tests): before each Malloc and each Free, with this
  // chance in percent, the next create, map, set-access, unmap or release
  // the allocator makes during that call fails, as a driver would
  // (OUT_OF_MEMORY or INTERNAL; vmm::Driver::InjectFailure), sometimes
  // with the next unmap too (an undo that fails), drawn from
  // driver_failure_seed. The allocator must lose nothing: a Malloc fails
  // or is served elsewhere, a Free still frees.
  int driver_failure_percent = 0;
  uint64_t driver_failure_seed = 1;
};

// The two phases of a replay with a switch: before it (unplanned, served by
// the arena) and after it (served by the plan). Peaks in bytes.
struct SwitchReport {
  bool switched = false;
  std::string error;  // why LoadPlan failed (then nothing switched)
  uint64_t unplanned_peak_reserved = 0;
  uint64_t unplanned_peak_allocated = 0;
  uint64_t planned_peak_reserved = 0;
  uint64_t planned_peak_allocated = 0;
  // At the switch, right before and right after LoadPlan.
  vmm::AllocatorStats before;
  vmm::AllocatorStats after;
  // What the memory served when each phase reached its peak reserved.
  vmm::MemoryBreakdown at_unplanned_peak;
  vmm::MemoryBreakdown at_planned_peak;
  vmm::MemoryBreakdown now;  // when switch_report() is called
};

class LoomSimAllocator final : public SimAllocator {
 public:
  static StatusOr<std::unique_ptr<LoomSimAllocator>> Create(
      LoomSimOptions options);
  ~LoomSimAllocator() override;

  std::string_view name() const override { return "loom"; }
  StatusOr<uint64_t> Malloc(uint64_t size, uint64_t stream) override;
  Status Free(uint64_t address) override;
  void EmptyCache() override;
  void OnMarker(const plan::Event& event) override;
  // With check_data: verifies every allocation still live (once).
  void OnReplayEnd() override;
  const MemoryStats& stats() const override;
  const DriverCalls& driver_calls() const override;
  std::vector<std::pair<std::string, uint64_t>> Counters() const override;
  std::vector<AddressRange> MappedRanges() const override;
  Status CheckInvariants() const override;

  uint64_t corrupted() const { return corrupted_; }
  // Injected driver failures that a call of the allocator met.
  uint64_t driver_failures() const { return driver_failures_; }
  vmm::AllocatorStats loom_stats() const { return allocator_->stats(); }
  SwitchReport switch_report() const;

 private:
  LoomSimAllocator() = default;
  void Stamp(uint64_t address, uint64_t size, uint64_t tag);
  bool Verify(uint64_t address, uint64_t size, uint64_t tag);
  uint64_t DriverCallTotal() const;
  // With driver_failure_percent: arms a failure of the next call of one
  // memory operation (drawn) for one allocator call; Disarm clears it and
  // counts it if a call met it.
  void Arm();
  void Disarm();
  // Installs switch_plan (the boundary before iteration switch_at begins).
  void Switch();
  // With a switch: after a request, notes what the memory serves when the
  // phase's reserved bytes reach a new peak.
  void NotePeak();

  LoomSimOptions options_;
  std::unique_ptr<vmm::Driver> driver_;
  std::unique_ptr<vmm::Allocator> allocator_;
  std::unique_ptr<autoplan::Replanner> replanner_;  // after allocator_
  struct Live {
    uint64_t size;
    uint64_t tag;
  };
  std::unordered_map<uint64_t, Live> live_;
  uint64_t next_tag_ = 1;
  uint64_t corrupted_ = 0;
  bool verified_live_ = false;  // OnReplayEnd ran
  std::mt19937_64 failure_rng_;
  std::optional<vmm::DriverOp> armed_;  // the operation Arm made fail
  uint64_t armed_calls_ = 0;            // its calls when armed
  uint64_t driver_failures_ = 0;
  uint64_t calls_at_iteration_begin_ = 0;
  bool in_iteration_ = false;
  int64_t steady_driver_calls_ = -1;  // -1: no complete iteration yet
  SwitchReport switch_;               // its peaks filled in by switch_report()
  uint64_t phase_peak_ = 0;  // reserved bytes at the phase's last NotePeak
  mutable MemoryStats stats_;
  mutable DriverCalls calls_;
};

}  // namespace loom::whatif

#endif  // LOOM_WHATIF_LOOM_LOOM_SIM_ALLOCATOR_H_
