// Replanner: re-planning at run time, when the workload changes shape.
//
// A plan is made for one shape of iteration. When iterations of another
// shape come (a new sequence length, evaluation steps, a new batch size),
// the allocator's FitMonitor suspends the plan for them (vmm/fit_monitor.h)
// and they are served by the dynamic space. The Replanner, driven at every
// iteration boundary, turns such an iteration into a plan of its own: the
// allocator records every iteration while a Replanner watches it (the
// buffer is cleared at each boundary, so it holds the current iteration);
// an iteration that ended suspended is planned (plan::MakePlan: that
// iteration, from its begin marker to the next, no persistent buffers): at
// once when nothing of this workload lives past an iteration's end (the
// iteration freed nothing made before it, loom.trace_earlier_frees, and no
// plan installed has such a request), else once the next iteration was
// recorded too (its frees end the lifetimes that cross over). A request it made that is still live when
// the recording ends is state made once (an optimizer's first step) and is
// left out: it stays where it is and will not come again. The result is
// installed at an iteration boundary
// as a new variant next to the plans already there (unless its layout
// would hold more than loom ever held, that iteration served dynamically
// included: then it is refused and the plans that did not fit
// lose, vmm/allocator.h's AddPlanVariant), so
// each shape gets its layout in the same static region and the allocator
// picks the layout per iteration (vmm/allocator.h). Planning runs on a
// background thread at run time (libloom) or in the caller (replays: the
// same result every time).
//
// One Replanner per allocator; its methods are called from the thread that
// emits the allocator's markers. It watches only once a plan is installed,
// and stops after `max_replans` attempts (a workload that never repeats has
// nothing to plan).
#ifndef LOOM_AUTOPLAN_REPLANNER_H_
#define LOOM_AUTOPLAN_REPLANNER_H_

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "base/status.h"
#include "plan/make_plan.h"
#include "vmm/allocator.h"
#include "vmm/runtime_plan.h"

namespace loom::autoplan {

struct ReplanOptions {
  // Events an iteration's recording may hold (an iteration that overflows
  // it is not planned).
  size_t record_capacity = size_t{1} << 20;
  // Planner settings (include_persistent is forced off: what lives across
  // iterations stays where it is).
  plan::MakePlanOptions plan_options;
  // Plan on a background thread (run time); false: in the caller.
  bool background = false;
  int max_replans = 16;
};

struct ReplanStats {
  uint64_t attempts = 0;    // suspended iterations sent to the planner
  uint64_t replans = 0;     // plans installed
  uint64_t duplicates = 0;  // plans a variant already had
  uint64_t failures = 0;    // attempts that gave no plan
  // (Plans refused at installation, their layout holding more than loom
  // ever held: the allocator's plan_variants_refused; not failures.)
  std::string last_error;  // why the last one failed
  std::string state;  // "waiting", "watching", "extending", "planning", "done"
};

class Replanner {
 public:
  // REQUIRES: `allocator` outlives the Replanner; nothing else records on
  // it meanwhile.
  Replanner(vmm::Allocator& allocator, ReplanOptions options);
  // Waits for a plan being made (it is then dropped) and stops recording.
  ~Replanner();
  Replanner(const Replanner&) = delete;
  Replanner& operator=(const Replanner&) = delete;

  // An iteration is about to begin: call before the allocator's own
  // IterationBegin (so the next recording starts with its marker).
  void BeforeIterationBegin();

  ReplanStats stats() const;

 private:
  enum class State { kWaiting, kWatching, kExtending, kPlanning, kDone };
  // Plans one recorded iteration into a runtime plan.
  static StatusOr<vmm::RuntimePlan> PlanIteration(
      const plan::Trace& trace, const plan::MakePlanOptions& options,
      uint64_t granularity);
  // Plans the recording (on the planner's thread with `background`) and
  // installs the result (now, or at a later boundary).
  void PlanRecording();
  void Install(StatusOr<vmm::RuntimePlan> plan);
  void SetState(State state);

  vmm::Allocator& allocator_;
  const ReplanOptions options_;
  State state_ = State::kWaiting;
  std::thread planner_;
  mutable std::mutex mu_;  // guards result_ and stats_
  std::optional<StatusOr<vmm::RuntimePlan>> result_;
  ReplanStats stats_;
};

}  // namespace loom::autoplan

#endif  // LOOM_AUTOPLAN_REPLANNER_H_
