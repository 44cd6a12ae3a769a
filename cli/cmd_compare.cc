// `loom compare`: replays one workload through the simulated baseline
// allocators (PyTorch's caching allocator, expandable segments, a
// GMLake-style stitcher) and reports peak allocated/reserved memory,
// efficiency, fragmentation, driver calls and the driver time they stand
// for (whatif/compare/compare.h).
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "base/flags.h"
#include "cli/commands.h"
#include "plan/analysis/workload.h"
#include "whatif/compare/compare.h"
#include "whatif/loom/loom_factory.h"
#include "whatif/loom/plan_source.h"
#include "whatif/sim/caching_config.h"
#include "whatif/workloads/load.h"
#include "whatif/workloads/perturb.h"
#include "whatif/workloads/repeat.h"

namespace loom::cli {
namespace {

std::vector<std::string> SplitList(const std::string& text) {
  std::vector<std::string> items;
  size_t begin = 0;
  while (begin <= text.size()) {
    size_t comma = text.find(',', begin);
    if (comma == std::string::npos) comma = text.size();
    if (comma > begin) items.push_back(text.substr(begin, comma - begin));
    begin = comma + 1;
  }
  return items;
}

}  // namespace

int RunCompare(const Args& args) {
  std::string input;
  bool json = false;
  std::string series;
  uint64_t capacity = 0;
  std::string alloc_conf;
  std::string address_order = "descending";
  std::string driver_costs;
  std::string torch_version = "2.11";
  std::string allocators;
  uint64_t frag_limit = 512 * whatif::kMiB;
  double reuse_limit = 10.0;
  int64_t samples = 4000;
  bool check = false, stitch = true;
  double loom_time_limit = 10;
  std::string loom_plan_csv;
  std::string rows_json;
  std::string plan_from, perturb_text;
  int64_t then_repeat = 0;
  std::string builtins;
  for (const std::string& name : whatif::BuiltinWorkloadNames()) {
    builtins += (builtins.empty() ? "builtin:" : ", builtin:") + name;
  }
  FlagParser flags(
      "compare", "<input> [options]",
      "Replays a workload through simulated baseline allocators (PyTorch's "
      "CUDA caching allocator as of 2.11, the same with "
      "expandable_segments:True, a GMLake-style stitcher) and through loom's "
      "own run-time allocator (on the fake driver; `loom` plans the trace "
      "first, `loom_unplanned` serves everything from its dynamic space), and "
      "compares peak allocated and reserved memory, efficiency (peak "
      "allocated / peak reserved), fragmentation, driver calls and the "
      "driver time they stand for at per-call costs measured on a GPU "
      "(warm-up and steady state).\n<input> "
      "is a loom trace, a PyTorch snapshot (converted by the front end), a "
      "MiniMalloc CSV or one of " +
          builtins + " (options: builtin:moe:layers=4,seed=7).");
  flags.AddPositional("input", &input,
                      "workload: trace, snapshot, CSV path or builtin:<name>");
  flags.AddBool("json", &json, "print a JSON list of rows instead of a table");
  flags.AddString("series", &series,
                  "write memory-over-time samples of every allocator (CSV)");
  flags.AddSize("capacity", &capacity,
                "device memory, e.g. 80GiB (default: unlimited)");
  flags.AddString("alloc-conf", &alloc_conf,
                  "PyTorch allocator settings for the pytorch rows, e.g. "
                  "max_split_size_mb:128");
  flags.AddString(
      "address-order", &address_order,
      "where the simulated driver puts new segments: descending (default: "
      "below the earlier ones, which reproduces the H200's peaks) or "
      "ascending; PyTorch breaks best-fit ties by address");
  flags.AddString(
      "driver-costs", &driver_costs,
      "price driver calls with these per-call costs: the JSON of "
      "bench/gpu/driver_costs --json (default: the H200's, embedded)");
  flags.AddString("torch-version", &torch_version,
                  "PyTorch rules to follow: 2.4, 2.5, 2.6 .. 2.11 (default)");
  flags.AddString("allocators", &allocators,
                  "comma-separated subset of pytorch,pytorch_expandable,"
                  "gmlake,loom,loom_unplanned (default: all)");
  flags.AddBool("stitch", &stitch,
                "loom's arena stitches idle chunks instead of growing past "
                "its peak (from the second iteration; default on); "
                "--no-stitch: the arena as the H200 measured it on "
                "2026-11-26");
  flags.AddDouble("loom-time-limit", &loom_time_limit,
                  "seconds loom's planner may search (default 10)");
  flags.AddString("rows-json", &rows_json,
                  "also write the JSON list of rows to this file (what "
                  "--plot's captions read)");
  flags.AddString("loom-plan-csv", &loom_plan_csv,
                  "write loom's plan (id,lower,upper,size,offset) here");
  flags.AddString(
      "plan-from", &plan_from,
      "where loom's plan comes from: self (the measured trace: an oracle), "
      "first:K (the input's first K iterations), or another workload (a "
      "trace, CSV or builtin spec). Default: first:min(3, iterations-1) for "
      "a multi-iteration input, the unperturbed input with --perturb, else "
      "self");
  flags.AddString(
      "perturb", &perturb_text,
      "replay a perturbed input: drop=P,add=P,resize=P,seed=S"
      "[,max_add=BYTES] (P a fraction or a percentage; an added request's "
      "size up to BYTES, default 8MiB); every allocator replays "
      "the same perturbed trace");
  flags.AddInt("then-repeat", &then_repeat,
               "every allocator replays the input (perturbed, with "
               "--perturb) followed by N stationary copies of its last "
               "complete iteration (loom plans from the input as without "
               "them): the steady state is then the last copy's, whether "
               "each allocator settles once the work repeats");
  flags.AddSize("frag-limit", &frag_limit,
                "gmlake: stitch requests of at least this size (512MiB)");
  flags.AddDouble("reuse-limit", &reuse_limit,
                  "gmlake: reuse a stitched block up to this many times the "
                  "request (10)");
  flags.AddInt("samples", &samples,
               "memory-over-time points per allocator (default 4000)");
  flags.AddBool("check", &check,
                "check every simulator invariant after every event (slow)");
  if (auto exit = flags.Parse(args)) return *exit;
  if (samples < 1 || samples > 1000000) {
    std::fprintf(stderr, "loom compare: --samples must be in 1..1000000\n");
    return 2;
  }
  if (!(reuse_limit >= 1.0 && reuse_limit <= 1e6)) {
    std::fprintf(stderr, "loom compare: --reuse-limit must be in [1, 1e6]\n");
    return 2;
  }

  StatusOr<whatif::CachingConfig> base =
      whatif::ConfigForTorchVersion(torch_version);
  if (!base.ok()) {
    std::fprintf(stderr, "loom compare: --torch-version: %s\n",
                 base.status().message().c_str());
    return 2;
  }
  StatusOr<whatif::CachingConfig> config =
      whatif::ParseAllocConf(alloc_conf, *base);
  if (!config.ok()) {
    std::fprintf(stderr, "loom compare: --alloc-conf: %s\n",
                 config.status().message().c_str());
    return 2;
  }
  StatusOr<whatif::AddressOrder> order =
      whatif::ParseAddressOrder(address_order);
  if (!order.ok()) {
    std::fprintf(stderr, "loom compare: --address-order: %s\n",
                 order.status().message().c_str());
    return 2;
  }
  whatif::CompareOptions options;
  options.capacity = capacity;
  options.address_order = *order;
  if (!driver_costs.empty()) {
    StatusOr<whatif::DriverCostTable> table =
        whatif::ReadDriverCosts(driver_costs);
    if (!table.ok()) {
      std::fprintf(stderr, "loom compare: %s\n",
                   table.status().message().c_str());
      return 1;
    }
    options.driver_costs = *std::move(table);
  }
  options.pytorch = *config;
  options.gmlake.frag_limit = frag_limit;
  options.gmlake.reuse_limit = reuse_limit;
  options.gmlake.max_split_size = config->max_split_size;
  options.max_samples = static_cast<size_t>(samples);
  options.check_invariants = check;

  whatif::PerturbOptions perturb;
  if (!perturb_text.empty()) {
    StatusOr<whatif::PerturbOptions> parsed =
        whatif::ParsePerturbOptions(perturb_text);
    if (!parsed.ok()) {
      std::fprintf(stderr, "loom compare: %s\n",
                   parsed.status().message().c_str());
      return 2;
    }
    perturb = *parsed;
  }
  std::optional<whatif::PlanSource> named_source;
  if (!plan_from.empty()) {
    StatusOr<whatif::PlanSource> parsed = whatif::ParsePlanSource(plan_from);
    if (!parsed.ok()) {
      std::fprintf(stderr, "loom compare: %s\n",
                   parsed.status().message().c_str());
      return 2;
    }
    named_source = *parsed;
  }
  StatusOr<whatif::Workload> workload = whatif::LoadWorkload(input);
  if (!workload.ok()) {
    std::fprintf(stderr, "loom compare: %s\n",
                 workload.status().message().c_str());
    return 1;
  }
  // What loom plans from, and what every allocator replays.
  const bool perturbed = perturb.any();
  const whatif::PlanSource source =
      named_source.has_value() ? *named_source
      : perturbed
          ? whatif::PlanSource{}
          : whatif::DefaultPlanSource(whatif::CountIterations(workload->trace));
  std::shared_ptr<const plan::Trace> plan_trace;
  if (!whatif::IsOracle(source, perturbed)) {
    StatusOr<plan::Trace> planning =
        whatif::PlanningTrace(source, workload->trace);
    if (!planning.ok()) {
      std::fprintf(stderr, "loom compare: %s\n",
                   planning.status().message().c_str());
      return 1;
    }
    plan_trace = std::make_shared<const plan::Trace>(*std::move(planning));
  }
  if (perturbed) workload->trace = whatif::Perturb(workload->trace, perturb);
  if (then_repeat != 0) {
    StatusOr<plan::Trace> repeated =
        whatif::ThenRepeatLastIteration(workload->trace, then_repeat);
    if (!repeated.ok()) {
      std::fprintf(stderr, "loom compare: --then-repeat: %s\n",
                   repeated.status().message().c_str());
      return 1;
    }
    workload->trace = *std::move(repeated);
  }

  std::vector<whatif::AllocatorFactory> factories =
      whatif::BaselineAllocators(options);
  whatif::LoomRowOptions loom_row;
  loom_row.planning.time_limit_seconds = loom_time_limit;
  loom_row.plan_csv = loom_plan_csv;
  loom_row.plan_trace = plan_trace;
  loom_row.plan_from = whatif::DescribePlanSource(source, perturbed);
  loom_row.stitch = stitch;
  factories.push_back(whatif::LoomAllocatorFactory(loom_row));
  loom_row.plan = false;
  factories.push_back(whatif::LoomAllocatorFactory(loom_row));
  if (!allocators.empty()) {
    std::vector<std::string> wanted = SplitList(allocators);
    std::vector<whatif::AllocatorFactory> chosen;
    for (const std::string& name : wanted) {
      auto it = std::find_if(factories.begin(), factories.end(),
                             [&](const auto& f) { return f.name == name; });
      if (it == factories.end()) {
        std::fprintf(stderr,
                     "loom compare: unknown allocator '%s' (pytorch, "
                     "pytorch_expandable, gmlake, loom, loom_unplanned)\n",
                     name.c_str());
        return 2;
      }
      chosen.push_back(*it);
    }
    factories = std::move(chosen);
  }

  StatusOr<whatif::Comparison> comparison =
      whatif::Compare(workload->trace, input, factories, options);
  if (!comparison.ok()) {
    std::fprintf(stderr, "loom compare: %s: %s\n", input.c_str(),
                 comparison.status().message().c_str());
    return 1;
  }
  if (perturbed)
    comparison->perturbation = whatif::FormatPerturbOptions(perturb);
  // A trace without markers: its iterations as `loom analyze` finds them,
  // so that both commands give one count.
  if (comparison->summary.iterations == 0) {
    const plan::Workload analysed = plan::BuildWorkload(workload->trace);
    if (analysed.iteration_source == plan::IterationSource::kPeriod) {
      comparison->summary.detected_iterations = analysed.iterations.size();
    }
  }
  if (!series.empty()) {
    std::ofstream out(series);
    out << whatif::FormatSeriesCsv(*comparison);
    out.close();
    if (!out) {
      std::fprintf(stderr, "loom compare: cannot write the series to '%s'\n",
                   series.c_str());
      return 1;
    }
  }
  if (!rows_json.empty()) {
    std::ofstream out(rows_json);
    out << whatif::FormatJson(*comparison);
    out.close();
    if (!out) {
      std::fprintf(stderr, "loom compare: cannot write the rows to '%s'\n",
                   rows_json.c_str());
      return 1;
    }
  }
  std::string text =
      json ? whatif::FormatJson(*comparison) : whatif::FormatTable(*comparison);
  std::fwrite(text.data(), 1, text.size(), stdout);
  return 0;
}

}  // namespace loom::cli
