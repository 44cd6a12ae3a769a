#include "cli/replay_auto.h"

#include <fmt/format.h>

#include <cstdio>

#include "base/json.h"
#include "base/text.h"
#include "whatif/workloads/load.h"

namespace loom::cli {
namespace {

void PhaseJson(JsonWriter& w, std::string_view name, uint64_t reserved,
               uint64_t allocated) {
  w.Key(name).BeginObject();
  w.Key("peak_reserved_bytes").Uint(reserved);
  w.Key("peak_allocated_bytes").Uint(allocated);
  w.EndObject();
}

void SwitchJson(JsonWriter& w, std::string_view name,
                const vmm::AllocatorStats& s) {
  w.Key(name).BeginObject();
  w.Key("reserved_bytes").Uint(s.reserved_bytes.current);
  w.Key("allocated_bytes").Uint(s.allocated_bytes.current);
  w.Key("dynamic_bytes").Uint(s.dynamic_bytes.current);
  w.Key("arena_mapped_bytes").Uint(s.arena_mapped_bytes);
  w.EndObject();
}

void BreakdownJson(JsonWriter& w, std::string_view name,
                   const vmm::MemoryBreakdown& b) {
  w.Key(name).BeginObject();
  w.Key("static_live").Uint(b.static_live);
  w.Key("arena_live").Uint(b.arena_live);
  w.Key("arena_idle_pinned").Uint(b.arena_idle_pinned);
  w.Key("arena_idle").Uint(b.arena_idle);
  w.Key("static_idle").Uint(b.static_idle);
  w.Key("spare").Uint(b.spare);
  w.EndObject();
}

std::string BreakdownText(const vmm::MemoryBreakdown& b) {
  return fmt::format(
      "static live {}, arena live {}, arena idle pinned {}, arena idle {}, "
      "static idle {}, spare {}",
      FormatBytes(b.static_live), FormatBytes(b.arena_live),
      FormatBytes(b.arena_idle_pinned), FormatBytes(b.arena_idle),
      FormatBytes(b.static_idle), FormatBytes(b.spare));
}

}  // namespace

int ReplayAuto(const std::string& input,
               const whatif::AutoReplayOptions& options, bool json,
               const whatif::DriverCostTable& costs) {
  auto fail = [](const Status& status) {
    std::fprintf(stderr, "loom replay: %s\n", status.message().c_str());
    return 1;
  };
  StatusOr<whatif::Workload> workload = whatif::LoadWorkload(input);
  if (!workload.ok()) return fail(workload.status());
  StatusOr<whatif::AutoReplayResult> result =
      whatif::ReplayAutoMode(workload->trace, options);
  if (!result.ok()) return fail(result.status());
  const whatif::ReplayResult& run = result->replay;
  const whatif::SwitchReport& phases = result->phases;
  const vmm::AllocatorStats& stats = result->stats;
  const uint64_t planned = stats.plan_hits + stats.plan_misses;
  const double hit_rate =
      planned == 0 ? 0.0 : static_cast<double>(stats.plan_hits) / planned;
  if (json) {
    JsonWriter w(2);
    w.BeginObject();
    w.Key("input").String(input);
    w.Key("mode").String("auto");
    w.Key("plan").String(result->plan_note);
    w.Key("plan_check");
    if (result->check.has_value()) {
      w.Raw(result->check->Json());
    } else {
      w.Null();
    }
    w.Key("declined").Bool(result->declined);
    w.Key("record_iterations").Int(options.record_iterations);
    w.Key("switch_at").Int(result->switch_at);
    w.Key("planned_iterations").Int(options.planned_iterations);
    w.Key("backend").String(options.backend);
    w.Key("events").Uint(run.events);
    w.Key("allocs").Uint(run.allocs);
    w.Key("carried_frees_per_copy").Uint(result->extension.carried_frees);
    w.Key("dropped_frees_per_copy").Uint(result->extension.dropped_frees);
    w.Key("lasting_allocs_per_copy").Uint(result->extension.lasting_allocs);
    w.Key("peak_allocated_bytes").Uint(run.peak_requested);
    w.Key("peak_reserved_bytes").Uint(run.peak_reserved);
    w.Key("efficiency").Double(run.efficiency());
    PhaseJson(w, "unplanned", phases.unplanned_peak_reserved,
              phases.unplanned_peak_allocated);
    PhaseJson(w, "planned", phases.planned_peak_reserved,
              phases.planned_peak_allocated);
    SwitchJson(w, "before_switch", phases.before);
    SwitchJson(w, "after_switch", phases.after);
    BreakdownJson(w, "at_unplanned_peak", phases.at_unplanned_peak);
    BreakdownJson(w, "at_planned_peak", phases.at_planned_peak);
    BreakdownJson(w, "at_end", phases.now);
    w.Key("plan_peak_bytes").Uint(result->plan_peak_bytes);
    w.Key("plan_hits").Uint(stats.plan_hits);
    w.Key("plan_misses").Uint(stats.plan_misses);
    w.Key("hit_rate").Double(hit_rate);
    w.Key("unplanned_requests").Uint(stats.unplanned);
    w.Key("driver_calls").Uint(run.driver_calls.total());
    w.Key("steady_driver_calls_by_kind");
    if (run.has_steady) {
      whatif::DriverCallsJson(w, run.steady_driver_calls);
    } else {
      w.Null();
    }
    w.Key("driver_time");
    whatif::DriverTimeJson(w, run, costs);
    w.Key("corrupted").Uint(result->corrupted);
    w.Key("oom").Bool(run.oom);
    if (run.oom) w.Key("oom_message").String(run.oom_message);
    w.Key("planning_seconds").Double(result->planning_seconds);
    w.EndObject();
    std::printf("%s\n", w.str().c_str());
  } else {
    std::printf("input          %s (%llu events, %llu allocations)\n",
                input.c_str(), static_cast<unsigned long long>(run.events),
                static_cast<unsigned long long>(run.allocs));
    std::printf("mode           auto: %s; %lld iterations after it\n",
                result->plan_note.c_str(),
                static_cast<long long>(options.planned_iterations));
    std::printf(
        "peak allocated %s\npeak reserved  %s (whole run)\nefficiency     "
        "%.4f%%\n",
        FormatBytes(run.peak_requested).c_str(),
        FormatBytes(run.peak_reserved).c_str(), 100 * run.efficiency());
    std::printf("unplanned      peak reserved %s, allocated %s\n",
                FormatBytes(phases.unplanned_peak_reserved).c_str(),
                FormatBytes(phases.unplanned_peak_allocated).c_str());
    std::printf("planned        peak reserved %s, allocated %s\n",
                FormatBytes(phases.planned_peak_reserved).c_str(),
                FormatBytes(phases.planned_peak_allocated).c_str());
    std::printf(
        "at the switch  reserved %s -> %s, arena mapped %s -> %s, live in "
        "the arena %s\n",
        FormatBytes(phases.before.reserved_bytes.current).c_str(),
        FormatBytes(phases.after.reserved_bytes.current).c_str(),
        FormatBytes(phases.before.arena_mapped_bytes).c_str(),
        FormatBytes(phases.after.arena_mapped_bytes).c_str(),
        FormatBytes(phases.after.dynamic_bytes.current).c_str());
    std::printf(
        "pages at peak  unplanned: %s\n               planned:   %s\n"
        "pages at end   %s\n",
        BreakdownText(phases.at_unplanned_peak).c_str(),
        BreakdownText(phases.at_planned_peak).c_str(),
        BreakdownText(phases.now).c_str());
    std::printf("plan hits      %llu, misses %llu (hit rate %.2f%%)\n",
                static_cast<unsigned long long>(stats.plan_hits),
                static_cast<unsigned long long>(stats.plan_misses),
                100 * hit_rate);
    std::printf("driver calls   %llu",
                static_cast<unsigned long long>(run.driver_calls.total()));
    if (run.has_steady) {
      std::printf(
          " (%llu in the last complete iteration)",
          static_cast<unsigned long long>(run.steady_driver_calls.total()));
    }
    std::printf("\n");
    if (run.oom) std::printf("OUT OF MEMORY  %s\n", run.oom_message.c_str());
  }
  return result->corrupted == 0 && !run.oom ? 0 : 1;
}

}  // namespace loom::cli
