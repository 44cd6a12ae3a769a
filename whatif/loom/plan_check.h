// PlanCheck: does a plan earn its place on the recording it was made from?
//
// A plan is made from a recorded run. Before it is served, loom replays that
// recording through its own run-time allocator twice, on the fake driver
// (bookkeeping only: no memory, no device): once serving the plan (the
// referee on, no re-planning) and once without a plan (everything in the
// dynamic space, as record mode serves it). If the plan holds more physical
// memory at its peak than the dynamic space alone, by more than the slack
// (max(one granule, 1/1000 of the dynamic space's peak): issue 23's
// tolerance of 0.1 point), it does not earn its place: on the very run it
// was made from it would cost memory, and a later run of the same shape
// cannot expect better. Such a plan is not served: auto mode declines it
// (torch_plugin/loom/session.py), `loom compare`'s loom row and `loom
// replay --self-plan/--plan-from` run without it, `loom plan` says so.
//
// Two ways a plan is served, two replays:
//  - from the start (a plan with persistent buffers, as plan mode loads it
//    before the first request): the recording, with the plan installed
//    first;
//  - mid-run (a plan without persistent buffers: auto mode installs it
//    after the K iterations it recorded, everything allocated before still
//    live in the dynamic space): the recording served without it, the plan
//    installed at its end, then kMidRunCopies copies of its last iteration
//    (whatif/workloads/repeat.h) served with it; the run without a plan is
//    the same extended recording. A recording without iteration markers is
//    checked from the start.
//
// The typical loser is a design limit, not a bad layout: requests of modules
// marked dynamic (MoE experts) live in the dynamic space beside the static
// region, and where their live peak does not coincide with the region's the
// two together hold more than one space serving both
// (bench/results/misses.md: qwen3_moe_interleaved, the plan of its own
// trace 93.4%, no plan 96.5%).
#ifndef LOOM_WHATIF_LOOM_PLAN_CHECK_H_
#define LOOM_WHATIF_LOOM_PLAN_CHECK_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "base/status.h"
#include "plan/planfile/plan_file.h"
#include "plan/trace/trace.h"
#include "vmm/runtime_plan.h"

namespace loom::whatif {

// Copies of the last recorded iteration served with a plan installed
// mid-run.
inline constexpr int64_t kMidRunCopies = 2;

struct PlanCheck {
  bool mid_run = false;                  // checked as installed mid-run
  uint64_t planned_peak_reserved = 0;    // bytes, serving the plan
  uint64_t unplanned_peak_reserved = 0;  // bytes, without a plan
  uint64_t peak_allocated = 0;           // bytes (the same in both)
  uint64_t slack = 0;                    // bytes
  // FiguresEarn(): the verdict, kept with the figures it came from.
  bool earns_its_place = true;
  // planned_peak_reserved <= unplanned_peak_reserved + slack.
  bool FiguresEarn() const {
    return planned_peak_reserved <= unplanned_peak_reserved + slack;
  }
  // One line for a report: both peaks and the verdict.
  std::string Summary() const;
  // {"mid_run", "planned_peak_reserved_bytes",
  //  "unplanned_peak_reserved_bytes", "peak_allocated_bytes", "slack_bytes",
  //  "earns_its_place"}.
  std::string Json() const;
};

// Replays `recording` (the trace the plan was made from) with and without
// `plan` on the fake driver of `granularity`; mid-run when the plan has no
// persistent buffer (see above). REQUIRES: `plan` was made from
// `recording` (or a part of it) for that granularity. Errors: the replay's
// (an invalid trace, a plan the allocator refuses).
// `stitch`: vmm::AllocatorOptions::stitch_idle_chunks in both replays.
StatusOr<PlanCheck> CheckPlanOnRecording(const plan::Trace& recording,
                                         const vmm::RuntimePlan& plan,
                                         uint64_t granularity,
                                         bool stitch = true);
// The same for a plan file (as `loom plan` writes it), loaded as the run
// time loads it, at the recorded device's granularity (the run time's) if
// the recording has one, else `granularity` (the planner's).
StatusOr<PlanCheck> CheckPlanOnRecording(const plan::Trace& recording,
                                         const plan::PlanFile& plan,
                                         uint64_t granularity);

// `report` (a JSON object) with the check first: "check" (PlanCheck::Json),
// or "check_error" when it could not run (a check that cannot run costs
// the plan nothing: libloom's loom_plan_trace and `loom plan` report it).
std::string WithPlanCheck(std::string_view report,
                          const StatusOr<PlanCheck>& check);

// The check travels with the plan: an optional plan file section CHEK
// (docs/formats.md), written by `loom plan` and libloom's loom_plan_trace
// when the check ran, so that whoever serves the file later (plan mode:
// torch_plugin/loom/control.py; `loom replay --plan`) knows whether it
// earns its place without the recording. A reader that does not know the
// section ignores it (it is optional).
inline constexpr uint32_t kPlanCheckTag = plan::PlanTag("CHEK");
// Puts `check` in `file` (replacing a CHEK section already there).
void RecordPlanCheck(const PlanCheck& check, plan::PlanFile& file);
// The check recorded in `file`; nullopt when it has none (made with
// --no-check, by another planner, or before checks were recorded). Errors
// (DATA_LOSS, naming `source`): a payload that is truncated, too long, of
// another version, with unknown flags, absurd sizes (above 2^50), fewer
// bytes reserved than allocated, or a verdict its own figures contradict.
StatusOr<std::optional<PlanCheck>> RecordedPlanCheck(const plan::PlanFile& file,
                                                     std::string_view source);

}  // namespace loom::whatif

#endif  // LOOM_WHATIF_LOOM_PLAN_CHECK_H_
