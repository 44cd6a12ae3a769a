#include "whatif/loom/plan_check.h"

#include <fmt/core.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <utility>

#include "base/byte_stream.h"
#include "base/json.h"
#include "vmm/plan_loader.h"
#include "whatif/loom/loom_sim_allocator.h"
#include "whatif/sim/replay.h"
#include "whatif/workloads/repeat.h"

namespace loom::whatif {
namespace {

// Serves `run` with `plan` installed from the start (switch_at < 0) or
// before iteration `switch_at` begins, or without a plan; its peak
// reserved and requested bytes. `stitch`: LoomSimOptions::stitch.
StatusOr<ReplayResult> ReplayWith(const plan::Trace& run,
                                  std::optional<vmm::RuntimePlan> plan,
                                  int64_t switch_at, uint64_t granularity,
                                  bool stitch) {
  LoomSimOptions options;
  options.stitch = stitch;
  options.backend = "fake";
  options.granularity = granularity;
  options.names = run.names;
  options.log_plan_loss = false;  // a replay on the side, not the run's plan
  if (switch_at >= 0 && plan.has_value()) {
    options.switch_plan = std::move(plan);
    options.switch_at = switch_at;
    options.record_capacity = run.events.size();
  } else {
    options.plan = std::move(plan);
  }
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<LoomSimAllocator> allocator,
                        LoomSimAllocator::Create(std::move(options)));
  ReplayOptions replay;
  replay.max_samples = 0;
  LOOM_ASSIGN_OR_RETURN(ReplayResult result, Replay(run, *allocator, replay));
  if (result.oom) {
    return InternalError("replaying the recording ran out of memory: {}",
                         result.oom_message);
  }
  if (switch_at >= 0) {
    const SwitchReport report = allocator->switch_report();
    if (!report.error.empty()) {
      return InternalError("installing the plan before iteration {}: {}",
                           switch_at, report.error);
    }
  }
  return result;
}

double GiB(uint64_t bytes) { return static_cast<double>(bytes) / (1 << 30); }

bool HasPersistent(const vmm::RuntimePlan& plan) {
  return std::any_of(
      plan.prologue.begin(), plan.prologue.end(),
      [&](const vmm::PlannedRequest& r) { return vmm::Persistent(r, plan); });
}

int64_t IterationsRecorded(const plan::Trace& trace) {
  return std::count_if(trace.events.begin(), trace.events.end(),
                       [](const plan::Event& e) {
                         return e.kind == plan::EventKind::kIterationBegin;
                       });
}

}  // namespace

std::string PlanCheck::Summary() const {
  return fmt::format(
      "on its recording{} the plan holds {:.2f} GiB at its peak, loom without "
      "a plan {:.2f} GiB ({:.2f} GiB allocated): {}",
      mid_run ? " (installed at its end, as auto mode does, then its last "
                "iteration twice)"
              : "",
      GiB(planned_peak_reserved), GiB(unplanned_peak_reserved),
      GiB(peak_allocated),
      earns_its_place ? "it earns its place"
                      : "it does not earn its place (not served)");
}

std::string PlanCheck::Json() const {
  JsonWriter w;
  w.BeginObject();
  w.Key("mid_run").Bool(mid_run);
  w.Key("planned_peak_reserved_bytes").Uint(planned_peak_reserved);
  w.Key("unplanned_peak_reserved_bytes").Uint(unplanned_peak_reserved);
  w.Key("peak_allocated_bytes").Uint(peak_allocated);
  w.Key("slack_bytes").Uint(slack);
  w.Key("earns_its_place").Bool(earns_its_place);
  w.EndObject();
  return w.str();
}

StatusOr<PlanCheck> CheckPlanOnRecording(const plan::Trace& recording,
                                         const plan::PlanFile& plan,
                                         uint64_t granularity) {
  if (recording.header.granularity != 0)
    granularity = recording.header.granularity;
  LOOM_ASSIGN_OR_RETURN(vmm::RuntimePlan runtime,
                        vmm::ToRuntimePlan(plan, "plan check", granularity));
  return CheckPlanOnRecording(recording, runtime, granularity);
}

std::string WithPlanCheck(std::string_view report,
                          const StatusOr<PlanCheck>& check) {
  const std::string field =
      check.ok() ? fmt::format("\"check\": {}", check->Json())
                 : fmt::format("\"check_error\": {}",
                               JsonWriter::Quote(check.status().ToString()));
  // After the object's opening brace, before its first key.
  return fmt::format("{{{},{}", field, report.substr(1));
}

StatusOr<PlanCheck> CheckPlanOnRecording(const plan::Trace& recording,
                                         const vmm::RuntimePlan& plan,
                                         uint64_t granularity, bool stitch) {
  PlanCheck check;
  const int64_t recorded = IterationsRecorded(recording);
  check.mid_run = !HasPersistent(plan) && recorded > 0;
  std::optional<RepeatedTrace> extended;
  if (check.mid_run) {
    StatusOr<RepeatedTrace> repeated = RepeatSteadyIteration(
        recording, RepeatOptions{recorded, kMidRunCopies});
    // A last iteration that did not end in the recording: from the start.
    if (repeated.ok()) {
      extended = std::move(*repeated);
    } else {
      check.mid_run = false;
    }
  }
  const plan::Trace& run = extended.has_value() ? extended->trace : recording;
  const int64_t switch_at = check.mid_run ? recorded : -1;
  StatusOr<ReplayResult> planned =
      ReplayWith(run, plan, switch_at, granularity, stitch);
  if (!planned.ok())
    return planned.status().WithContext("checking the plan (serving it)");
  StatusOr<ReplayResult> unplanned =
      ReplayWith(run, std::nullopt, -1, granularity, stitch);
  if (!unplanned.ok())
    return unplanned.status().WithContext("checking the plan (without it)");
  check.planned_peak_reserved = planned->peak_reserved;
  check.unplanned_peak_reserved = unplanned->peak_reserved;
  check.peak_allocated = planned->peak_requested;
  check.slack = std::max(granularity, check.unplanned_peak_reserved / 1000);
  check.earns_its_place = check.FiguresEarn();
  return check;
}

namespace {

// CHEK payload: varints version, flags (bit 0 mid_run, bit 1 earns its
// place), planned, unplanned, allocated peak, slack (bytes).
constexpr uint64_t kCheckVersion = 1;
constexpr uint64_t kMidRunFlag = 1;
constexpr uint64_t kEarnsFlag = 2;
constexpr uint64_t kMaxCheckBytes = uint64_t{1} << 50;

}  // namespace

void RecordPlanCheck(const PlanCheck& check, plan::PlanFile& file) {
  std::string payload;
  plan::AppendVarint(&payload, kCheckVersion);
  plan::AppendVarint(&payload, (check.mid_run ? kMidRunFlag : 0) |
                                   (check.earns_its_place ? kEarnsFlag : 0));
  plan::AppendVarint(&payload, check.planned_peak_reserved);
  plan::AppendVarint(&payload, check.unplanned_peak_reserved);
  plan::AppendVarint(&payload, check.peak_allocated);
  plan::AppendVarint(&payload, check.slack);
  std::erase_if(file.extra, [](const plan::PlanSection& section) {
    return section.tag == kPlanCheckTag;
  });
  file.extra.push_back(plan::PlanSection{kPlanCheckTag, false, payload});
}

StatusOr<std::optional<PlanCheck>> RecordedPlanCheck(const plan::PlanFile& file,
                                                     std::string_view source) {
  const plan::PlanSection* section = nullptr;
  for (const plan::PlanSection& s : file.extra) {
    if (s.tag == kPlanCheckTag) section = &s;
  }
  if (section == nullptr) return std::optional<PlanCheck>();
  const std::string_view payload = section->payload;
  size_t pos = 0;
  uint64_t fields[6] = {};
  constexpr const char* kNames[6] = {"version",        "flags",
                                     "planned peak",   "unplanned peak",
                                     "allocated peak", "slack"};
  for (int i = 0; i < 6; ++i) {
    const size_t at = pos;
    Status read = plan::ReadVarint(payload, &pos, &fields[i]);
    if (!read.ok()) {
      return DataLossError("{}: CHEK: bad {} at payload byte {}: {}", source,
                           kNames[i], at, read.message());
    }
    if (i == 0 && fields[0] != kCheckVersion) {
      return DataLossError("{}: CHEK: version {} (this reader knows {})",
                           source, fields[0], kCheckVersion);
    }
    if (i >= 2 && fields[i] > kMaxCheckBytes) {
      return DataLossError("{}: CHEK: {} of {} bytes is absurd", source,
                           kNames[i], fields[i]);
    }
  }
  if (pos != payload.size()) {
    return DataLossError("{}: CHEK: {} bytes after the payload", source,
                         payload.size() - pos);
  }
  if ((fields[1] & ~(kMidRunFlag | kEarnsFlag)) != 0) {
    return DataLossError("{}: CHEK: unknown flags {:#x}", source, fields[1]);
  }
  PlanCheck check;
  check.mid_run = (fields[1] & kMidRunFlag) != 0;
  check.earns_its_place = (fields[1] & kEarnsFlag) != 0;
  check.planned_peak_reserved = fields[2];
  check.unplanned_peak_reserved = fields[3];
  check.peak_allocated = fields[4];
  check.slack = fields[5];
  if (check.peak_allocated > check.planned_peak_reserved ||
      check.peak_allocated > check.unplanned_peak_reserved) {
    return DataLossError(
        "{}: CHEK: {} bytes allocated at the peak, more than reserved ({} "
        "with the plan, {} without)",
        source, check.peak_allocated, check.planned_peak_reserved,
        check.unplanned_peak_reserved);
  }
  if (check.FiguresEarn() != check.earns_its_place) {
    return DataLossError(
        "{}: CHEK: the verdict ({}) contradicts its figures ({} bytes with "
        "the plan, {} without, slack {})",
        source, check.earns_its_place ? "earns its place" : "does not",
        check.planned_peak_reserved, check.unplanned_peak_reserved,
        check.slack);
  }
  return std::optional<PlanCheck>(check);
}

}  // namespace loom::whatif
