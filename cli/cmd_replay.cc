// `loom replay`: runs a trace through loom's run-time allocator.
#include <cstdio>
#include <optional>

#include "base/flags.h"
#include "base/json.h"
#include "base/text.h"
#include "cli/commands.h"
#include "cli/replay_auto.h"
#include "cli/replay_iterations.h"
#include "plan/make_plan.h"
#include "vmm/plan_loader.h"
#include "whatif/compare/compare.h"
#include "whatif/loom/loom_sim_allocator.h"
#include "whatif/loom/plan_check.h"
#include "whatif/loom/plan_source.h"
#include "whatif/loom/self_plan.h"
#include "whatif/sim/replay.h"
#include "whatif/workloads/load.h"
#include "whatif/workloads/perturb.h"
#include "whatif/workloads/repeat.h"

namespace loom::cli {

int RunReplay(const Args& args) {
  std::string input, plan_path, backend = "fake", scope = "auto";
  std::string plan_from, perturb_text, driver_costs;
  bool self_plan = false, check_data = false, check_invariants = false,
       json = false, per_iteration = false, replan = false, stitch = true;
  uint64_t granularity = 0;  // 0: the trace's (plan::ResolveGranule)
  uint64_t capacity = 0;
  double time_limit = -1;  // default: 10 s (--self-plan), 20 s (--auto)
  int64_t auto_iterations = 0, switch_at = -1, repeat = 5, then_repeat = 0;
  bool check_plan = true;
  FlagParser flags(
      "replay",
      "<trace|snapshot|csv|builtin:NAME> [--plan P | --self-plan] [options]",
      "Replays a trace through loom's run-time allocator (the real one, on the "
      "fake or host driver backend): with a plan (--plan, from `loom plan`; or "
      "--self-plan to plan the trace first), planned requests are served from "
      "the static region and the rest from the dynamic space; without one, "
      "everything is served from the dynamic space (record mode). Reports "
      "peak allocated/reserved bytes, efficiency, plan hits and misses, "
      "driver calls and the driver time they stand for (warm-up and steady "
      "state, at the H200's per-call costs or --driver-costs); --check-data "
      "(host backend) stamps every allocation with "
      "a pattern of its own and verifies it at its free. --auto K replays "
      "auto mode: the first K iterations served without a plan and "
      "planned, the plan installed at a later boundary (--switch-at) with "
      "everything allocated before still live, the trace's later "
      "iterations, then copies of its last one up to --repeat iterations "
      "after the switch; peaks per phase. --replan re-plans, as "
      "auto mode does at run time and `loom compare` does, each shape of "
      "iteration the plan does not fit (a variant per shape).");
  flags.AddPositional("input", &input, "the workload");
  flags.AddString("plan", &plan_path, "plan file to serve");
  flags.AddBool("self-plan", &self_plan,
                "plan the trace first, in memory (an oracle: the plan of the "
                "very trace replayed)");
  flags.AddString("plan-from", &plan_from,
                  "plan first, in memory, from: self, first:K (the input's "
                  "first K iterations) or another workload");
  flags.AddBool("replan", &replan,
                "with a plan: record each iteration the plan does not fit, "
                "plan it and add it as a variant (autoplan::Replanner, in the "
                "replay's thread: the same result every time), as auto mode "
                "does at run time and `loom compare`'s loom row does");
  flags.AddString("perturb", &perturb_text,
                  "replay a perturbed input "
                  "(drop=P,add=P,resize=P,seed=S[,max_add=BYTES]); "
                  "with --self-plan the plan is the unperturbed input's");
  flags.AddString("scope", &scope,
                  "with --self-plan: auto, iteration or trace");
  flags.AddDouble("time-limit", &time_limit,
                  "planner seconds (default 10 with --self-plan, 20 with "
                  "--auto: the GPU worker's)");
  flags.AddInt("auto", &auto_iterations,
               "replay auto mode (record_iterations=K): plan from the first "
               "K iterations (no persistent buffers; --time-limit, default "
               "20 here) and switch to the plan mid-run");
  flags.AddInt("switch-at", &switch_at,
               "with --auto: install the plan before iteration M begins "
               "(M >= K; default K + 1, as with planning in the background)");
  flags.AddInt("repeat", &repeat,
               "with --auto: iterations served after the switch (the "
               "trace's own, then copies of its last one; default 5)");
  flags.AddInt("then-repeat", &then_repeat,
               "replay the input (perturbed, with --perturb) followed by N "
               "copies of its last complete iteration: does the allocator "
               "settle once the work repeats (with --per-iteration, calls per "
               "copy)");
  flags.AddString("backend", &backend, "fake (default) or host (real memory)");
  flags.AddBool("check-data", &check_data,
                "stamp and verify data (host backend)");
  flags.AddBool("check-invariants", &check_invariants,
                "check every invariant after every event (slow)");
  flags.AddBool("per-iteration", &per_iteration,
                "also report each iteration: live and reserved peaks, memory "
                "held at its end, driver calls, plan hits and misses, "
                "suspensions, variant switches, re-plans");
  flags.AddSize("granularity", &granularity,
                "device granularity (default: the one the trace was recorded "
                "at, else 2MiB, as `loom plan` plans it)");
  flags.AddSize("capacity", &capacity,
                "device memory (default: 1 TiB fake, 80 GiB host)");
  flags.AddString(
      "driver-costs", &driver_costs,
      "price driver calls with these per-call costs: the JSON of "
      "bench/gpu/driver_costs --json (default: the H200's, embedded)");
  flags.AddBool("check", &check_plan,
                "with --self-plan, --plan-from or --auto: serve the plan only "
                "if it earns its place on the trace it was made from (replayed "
                "with and without it, as the product does before serving a "
                "plan it made; default on); with --plan: only if the check "
                "recorded in the file (loom plan writes it) says so, as plan "
                "mode does; --no-check serves it anyway");
  flags.AddBool("stitch", &stitch,
                "stitch idle arena chunks instead of growing past the peak "
                "(from the second iteration; default on); --no-stitch: the "
                "arena as the H200 measured it on 2026-11-26");
  flags.AddBool("json", &json, "print JSON");
  if (auto exit = flags.Parse(args)) return *exit;
  auto fail = [](const Status& status) {
    std::fprintf(stderr, "loom replay: %s\n", status.message().c_str());
    return 1;
  };
  whatif::DriverCostTable costs = whatif::H200DriverCosts();
  if (!driver_costs.empty()) {
    StatusOr<whatif::DriverCostTable> table =
        whatif::ReadDriverCosts(driver_costs);
    if (!table.ok()) return fail(table.status());
    costs = *std::move(table);
  }
  if (check_data && backend == "fake") backend = "host";
  if (auto_iterations != 0) {
    if (!plan_path.empty() || self_plan || !plan_from.empty() ||
        !perturb_text.empty()) {
      return fail(InvalidArgumentError(
          "--auto makes its own plan: no --plan, --self-plan, --plan-from or "
          "--perturb with it"));
    }
    whatif::AutoReplayOptions auto_options;
    auto_options.record_iterations = auto_iterations;
    auto_options.switch_at = switch_at;
    auto_options.planned_iterations = repeat;
    if (time_limit > 0) auto_options.time_limit_seconds = time_limit;
    auto_options.backend = backend;
    auto_options.granularity = granularity;
    auto_options.capacity =
        capacity != 0 ? capacity : (backend == "host" ? uint64_t{80} << 30 : 0);
    auto_options.check_data = check_data;
    auto_options.check_invariants = check_invariants;
    auto_options.check_plan = check_plan;
    auto_options.stitch = stitch;
    return ReplayAuto(input, auto_options, json, costs);
  }
  if (static_cast<int>(!plan_path.empty()) + static_cast<int>(self_plan) +
          static_cast<int>(!plan_from.empty()) >
      1) {
    return fail(InvalidArgumentError(
        "give one of --plan, --self-plan and --plan-from"));
  }
  if (replan && plan_path.empty() && !self_plan && plan_from.empty()) {
    return fail(InvalidArgumentError(
        "--replan re-plans around a plan: give --plan, --self-plan or "
        "--plan-from"));
  }
  whatif::PlanSource source;  // self
  if (!plan_from.empty()) {
    StatusOr<whatif::PlanSource> parsed = whatif::ParsePlanSource(plan_from);
    if (!parsed.ok()) return fail(parsed.status());
    source = *parsed;
    self_plan = true;
  }
  whatif::PerturbOptions perturb;
  if (!perturb_text.empty()) {
    StatusOr<whatif::PerturbOptions> parsed =
        whatif::ParsePerturbOptions(perturb_text);
    if (!parsed.ok()) return fail(parsed.status());
    perturb = *parsed;
  }
  StatusOr<whatif::Workload> workload = whatif::LoadWorkload(input);
  if (!workload.ok()) return fail(workload.status());
  // The trace to plan from, before the replayed one is perturbed.
  StatusOr<plan::Trace> planning_trace =
      self_plan ? whatif::PlanningTrace(source, workload->trace)
                : StatusOr<plan::Trace>(plan::Trace{});
  if (!planning_trace.ok()) return fail(planning_trace.status());
  if (perturb.any()) {
    workload->trace = whatif::Perturb(workload->trace, perturb);
  }
  if (then_repeat != 0) {
    StatusOr<plan::Trace> repeated =
        whatif::ThenRepeatLastIteration(workload->trace, then_repeat);
    if (!repeated.ok())
      return fail(repeated.status().WithContext("--then-repeat"));
    workload->trace = *std::move(repeated);
  }
  // The device the plan is made for, as `loom plan` makes it.
  granularity =
      plan::ResolveGranule(granularity, workload->trace.header.granularity);

  whatif::LoomSimOptions options;
  options.backend = backend;
  options.granularity = granularity;
  options.capacity =
      capacity != 0 ? capacity : (backend == "host" ? uint64_t{80} << 30 : 0);
  options.check_data = check_data;
  options.names = workload->trace.names;
  options.stitch = stitch;
  std::string plan_note =
      "none (record mode: everything from the dynamic space)";
  double plan_seconds = 0;
  // --self-plan, --plan-from; --plan: the check recorded in the file.
  std::optional<whatif::PlanCheck> check;
  // The planner's settings: --self-plan's (and --plan-from's), --replan's.
  whatif::SelfPlanOptions plan_options;
  plan_options.time_limit_seconds = time_limit > 0 ? time_limit : 10;
  plan_options.granularity = granularity;
  if (self_plan || replan) {
    StatusOr<plan::PlanScope> parsed = plan::ParsePlanScope(scope);
    if (!parsed.ok()) return fail(parsed.status());
    plan_options.scope = *parsed;
  }
  if (!plan_path.empty()) {
    StatusOr<plan::PlanFile> file = plan::ReadPlanFile(plan_path);
    if (!file.ok()) return fail(file.status());
    StatusOr<vmm::RuntimePlan> plan =
        vmm::ToRuntimePlan(*file, plan_path, granularity);
    if (!plan.ok()) return fail(plan.status());
    plan_note = plan_path;
    // As plan mode: a plan whose recorded check says it loses on its own
    // recording is not served (control.py).
    if (check_plan) {
      StatusOr<std::optional<whatif::PlanCheck>> recorded =
          whatif::RecordedPlanCheck(*file, plan_path);
      if (!recorded.ok()) return fail(recorded.status());
      check = *recorded;
      if (check.has_value()) plan_note += "; " + check->Summary();
    }
    if (!check.has_value() || check->earns_its_place)
      options.plan = std::move(plan).value();
  } else if (self_plan) {
    StatusOr<whatif::SelfPlan> planned =
        whatif::PlanTraceForRuntime(*planning_trace, plan_options);
    if (!planned.ok()) return fail(planned.status().WithContext("planning"));
    plan_note = fmt::format(
        "planned from {}: the {} ({}, peak {} = {:.4f} x lower "
        "bound)",
        whatif::DescribePlanSource(source, perturb.any()), planned->note,
        planned->result.algorithm, FormatBytes(planned->result.peak_bytes),
        planned->result.lower_bound_bytes == 0
            ? 1.0
            : static_cast<double>(planned->result.peak_bytes) /
                  planned->result.lower_bound_bytes);
    plan_seconds = planned->result.seconds;
    // As the product does before serving a plan it made: replayed on the
    // recording it was made from, with and without it (plan_check.h).
    if (check_plan) {
      StatusOr<whatif::PlanCheck> checked = whatif::CheckPlanOnRecording(
          *planning_trace, planned->runtime, granularity, stitch);
      if (!checked.ok()) return fail(checked.status());
      check = *checked;
      plan_note += "; " + check->Summary();
    }
    if (!check.has_value() || check->earns_its_place)
      options.plan = std::move(planned->runtime);
  }
  // As loom compare's loom row.
  if (replan) options.replan = whatif::ReplanOptionsFor(plan_options);
  StatusOr<std::unique_ptr<whatif::LoomSimAllocator>> loom =
      whatif::LoomSimAllocator::Create(options);
  if (!loom.ok()) return fail(loom.status());
  whatif::ReplayOptions replay_options;
  replay_options.check_invariants = check_invariants;
  replay_options.max_samples = 0;
  StatusOr<whatif::ReplayResult> result =
      whatif::Replay(workload->trace, **loom, replay_options);
  if (!result.ok()) return fail(result.status());
  const vmm::AllocatorStats stats = (*loom)->loom_stats();
  uint64_t steady = 0;
  bool has_steady = false;
  uint64_t replans = 0, replan_failures = 0;
  for (const auto& [name, value] : result->counters) {
    if (name == "steady_driver_calls") {
      steady = value;
      has_steady = true;
    }
    if (name == "replans") replans = value;
    if (name == "replan_failures") replan_failures = value;
  }
  const uint64_t planned_requests = stats.plan_hits + stats.plan_misses;
  const double hit_rate =
      planned_requests == 0
          ? 0.0
          : static_cast<double>(stats.plan_hits) / planned_requests;
  // A plan file none of whose requests came: most likely another workload's
  // plan. The replay itself is valid (what the plan did not foresee is
  // served outside it), so only a warning, and exit status 0.
  const bool declined = check.has_value() && !check->earns_its_place;
  if (!plan_path.empty() && !declined && result->allocs > 0 &&
      stats.plan_hits == 0) {
    std::fprintf(stderr,
                 "loom replay: warning: no request matched the plan (hit "
                 "rate 0.00%%): was %s planned for another workload? (to "
                 "plan this trace: loom plan %s -o PLAN)\n",
                 plan_path.c_str(), input.c_str());
  }
  if (json) {
    JsonWriter w(2);
    w.BeginObject();
    w.Key("input").String(input);
    w.Key("plan").String(plan_note);
    if (check.has_value()) w.Key("plan_check").Raw(check->Json());
    if (self_plan) {
      w.Key("plan_from")
          .String(whatif::DescribePlanSource(source, perturb.any()));
    }
    if (perturb.any()) {
      w.Key("perturbation").String(whatif::FormatPerturbOptions(perturb));
    }
    w.Key("backend").String(backend);
    w.Key("events").Uint(result->events);
    w.Key("allocs").Uint(result->allocs);
    w.Key("peak_allocated_bytes").Uint(result->peak_requested);
    w.Key("peak_reserved_bytes").Uint(result->peak_reserved);
    w.Key("efficiency").Double(result->efficiency());
    w.Key("fragmentation").Double(result->fragmentation());
    w.Key("plan_hits").Uint(stats.plan_hits);
    w.Key("plan_misses").Uint(stats.plan_misses);
    w.Key("hit_rate").Double(hit_rate);
    w.Key("unplanned").Uint(stats.unplanned);
    w.Key("dynamic_requests").Uint(stats.dynamic_requests);
    if (replan) {
      w.Key("replans").Uint(replans);
      w.Key("replan_failures").Uint(replan_failures);
      w.Key("replans_refused").Uint(stats.plan_variants_refused);
      w.Key("plan_variants").Uint(stats.plan_variants);
    }
    w.Key("driver_calls").Uint(result->driver_calls.total());
    w.Key("driver_calls_by_kind").BeginObject();
    for (const auto& [name, count] : result->driver_calls.Named())
      w.Key(name).Uint(count);
    w.EndObject();
    if (has_steady) w.Key("steady_driver_calls").Uint(steady);
    w.Key("warmup_driver_calls_by_kind");
    whatif::DriverCallsJson(w, result->warmup_driver_calls);
    w.Key("steady_driver_calls_by_kind");
    if (result->has_steady) {
      whatif::DriverCallsJson(w, result->steady_driver_calls);
    } else {
      w.Null();
    }
    w.Key("driver_time");
    whatif::DriverTimeJson(w, *result, costs);
    w.Key("corrupted").Uint((*loom)->corrupted());
    w.Key("data_checked").Bool(check_data);
    w.Key("oom").Bool(result->oom);
    if (result->oom) w.Key("oom_message").String(result->oom_message);
    w.Key("planning_seconds").Double(plan_seconds);
    if (per_iteration) WriteIterationsJson(w, *result);
    w.EndObject();
    std::printf("%s\n", w.str().c_str());
  } else {
    std::printf("input          %s (%llu events, %llu allocations)\n",
                input.c_str(), static_cast<unsigned long long>(result->events),
                static_cast<unsigned long long>(result->allocs));
    std::printf("plan           %s\n", plan_note.c_str());
    if (perturb.any()) {
      std::printf("perturbed      %s\n",
                  whatif::FormatPerturbOptions(perturb).c_str());
    }
    std::printf("peak allocated %s\npeak reserved  %s\nefficiency     %.4f%%\n",
                FormatBytes(result->peak_requested).c_str(),
                FormatBytes(result->peak_reserved).c_str(),
                100 * result->efficiency());
    std::printf(
        "plan hits      %llu, misses %llu (hit rate %.2f%%), unplanned %llu, "
        "dynamic %llu\n",
        static_cast<unsigned long long>(stats.plan_hits),
        static_cast<unsigned long long>(stats.plan_misses), 100 * hit_rate,
        static_cast<unsigned long long>(stats.unplanned),
        static_cast<unsigned long long>(stats.dynamic_requests));
    if (replan) {
      std::printf(
          "re-plans       %llu installed, %llu failed, %llu refused (they "
          "would raise the peak); %llu plan variants\n",
          static_cast<unsigned long long>(replans),
          static_cast<unsigned long long>(replan_failures),
          static_cast<unsigned long long>(stats.plan_variants_refused),
          static_cast<unsigned long long>(stats.plan_variants));
    }
    std::printf("driver calls   %llu",
                static_cast<unsigned long long>(result->driver_calls.total()));
    if (has_steady) {
      std::printf(" (%llu in the last complete iteration)",
                  static_cast<unsigned long long>(steady));
    }
    std::printf("\n");
    std::printf(
        "driver time    %s\n               at the per-call medians of %s\n",
        whatif::DriverTimeLine(*result, costs).c_str(), costs.source.c_str());
    if (check_data) {
      std::printf("corrupted      %llu allocations\n",
                  static_cast<unsigned long long>((*loom)->corrupted()));
    }
    if (result->oom)
      std::printf("OUT OF MEMORY  %s\n", result->oom_message.c_str());
    if (per_iteration) PrintIterations(*result);
  }
  return (*loom)->corrupted() == 0 && !result->oom ? 0 : 1;
}

}  // namespace loom::cli
