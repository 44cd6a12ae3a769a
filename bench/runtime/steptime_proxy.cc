// steptime_proxy: the CPU proxy of step time (issue 21; results in
// bench/results/runtime.md). Replays a recorded trace through libloom's C
// ABI in auto mode's shape on the fake backend (bench/runtime/
// c_abi_replay.h) and reports, per steady iteration: host ns per request
// (an allocation and its free) inside loom_malloc + loom_free next to the
// caching allocator simulator's on the same requests in the same run, the
// waits loom inserted, its driver calls, plan hits and misses, and its
// physical layout (handles, mappings, mappings per GiB mapped), for each
// layout variant asked for (max_chunk_pages).
//
//   steptime_proxy <trace> [--plan-from first:K] [--repetitions R]
//       [--max-chunk-pages 512,10,1] [--host-sample-every N] [--json]
#include <fmt/format.h>

#include <cstdio>
#include <string>
#include <vector>

#include "base/flags.h"
#include "base/json.h"
#include "bench/runtime/c_abi_replay.h"
#include "whatif/loom/plan_source.h"
#include "whatif/workloads/load.h"

namespace loom::bench {
namespace {

// --plan-from: first:K only (auto mode plans from the first K iterations
// it recorded); the syntax is whatif's (plan_source.h).
StatusOr<int64_t> ParsePlanFrom(const std::string& text) {
  StatusOr<whatif::PlanSource> source = whatif::ParsePlanSource(text);
  if (!source.ok()) return source.status();
  if (source->kind != whatif::PlanSource::Kind::kFirstIterations) {
    return InvalidArgumentError(
        "--plan-from {}: expected first:K (K >= 1): auto mode plans from the "
        "first K iterations it recorded",
        text);
  }
  return source->iterations;
}

StatusOr<std::vector<uint32_t>> ParsePages(const std::string& text) {
  std::vector<uint32_t> out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(start, end - start);
    if (item.empty() || item.size() > 3 ||
        item.find_first_not_of("0123456789") != std::string::npos ||
        std::stoul(item) < 1 || std::stoul(item) > 512) {
      return InvalidArgumentError(
          "--max-chunk-pages {}: expected a list of 1..512", text);
    }
    out.push_back(static_cast<uint32_t>(std::stoul(item)));
    start = end + 1;
  }
  return out;
}

void WriteJson(JsonWriter& w, uint32_t pages, const CAbiReplayResult& r) {
  const double iterations = std::max(1, r.repetitions);
  const double loom_ns = Median(r.loom_pair_ns);
  const double sim_ns = Median(r.sim_pair_ns);
  w.BeginObject();
  w.Key("max_chunk_pages").Uint(pages);
  w.Key("trace_events").Uint(r.trace_events);
  w.Key("recorded_events").Uint(r.recorded_events);
  w.Key("steady_iteration").Uint(r.steady.number);
  w.Key("requests_per_iteration").Uint(r.steady.allocs);
  w.Key("carried_per_iteration").Uint(r.steady.carried);
  w.Key("repetitions").Int(r.repetitions);
  w.Key("loom_ns_per_request").BeginArray();
  for (double ns : r.loom_pair_ns) w.Double(ns);
  w.EndArray();
  w.Key("sim_ns_per_request").BeginArray();
  for (double ns : r.sim_pair_ns) w.Double(ns);
  w.EndArray();
  w.Key("loom_ns_per_request_median").Double(loom_ns);
  w.Key("sim_ns_per_request_median").Double(sim_ns);
  w.Key("loom_vs_sim").Double(sim_ns == 0 ? 0 : loom_ns / sim_ns);
  w.Key("host_malloc_mean_ns").Double(r.host_malloc_mean_ns);
  w.Key("host_malloc_samples").Uint(r.host_malloc_samples);
  w.Key("host_free_mean_ns").Double(r.host_free_mean_ns);
  w.Key("host_free_samples").Uint(r.host_free_samples);
  w.Key("waits_per_iteration").BeginObject();
  for (const auto& [key, n] : r.waits) w.Key(key).Double(n / iterations);
  w.EndObject();
  w.Key("driver_calls_per_iteration").Double(r.driver_calls / iterations);
  w.Key("plan_hits_per_iteration").Double(r.plan_hits / iterations);
  w.Key("plan_misses_per_iteration").Double(r.plan_misses / iterations);
  w.Key("replan_attempts").Uint(r.replan_attempts);
  w.Key("sim_driver_calls_per_iteration")
      .Double(r.sim_driver_calls / iterations);
  w.Key("layout").BeginObject();
  w.Key("handles").Uint(r.layout.handles);
  w.Key("handle_bytes").Uint(r.layout.handle_bytes);
  w.Key("mappings").Uint(r.layout.mappings);
  w.Key("mapped_bytes").Uint(r.layout.mapped_bytes);
  w.Key("mappings_per_gib").Double(r.layout.MappingsPerGiB());
  w.Key("unchanged_over_repetitions").Bool(r.layout == r.layout_first);
  w.Key("by_handle_size").BeginObject();
  for (const LayoutFigures::Bucket& b : r.layout.buckets) {
    w.Key(b.size).BeginObject();
    w.Key("handles").Uint(b.handles);
    w.Key("bytes").Uint(b.bytes);
    w.Key("mappings").Uint(b.mappings);
    w.EndObject();
  }
  w.EndObject();
  w.EndObject();
  w.Key("sim_segments").Uint(r.sim_segments);
  w.Key("sim_reserved_bytes").Uint(r.sim_reserved_bytes);
  w.EndObject();
}

void PrintRow(uint32_t pages, const CAbiReplayResult& r) {
  const double iterations = std::max(1, r.repetitions);
  const double loom_ns = Median(r.loom_pair_ns);
  const double sim_ns = Median(r.sim_pair_ns);
  const double waits =
      (r.wait_events + r.stream_syncs + r.device_syncs) / iterations;
  fmt::print(
      "| {} | {} | {:.0f} ns | {:.0f} ns | {:.2f}x | {:.0f} / {:.0f} ns | "
      "{:g} | {:g} | {:g} / {:g} | {} | {:.1f} |\n",
      pages, r.steady.allocs, loom_ns, sim_ns,
      sim_ns == 0 ? 0 : loom_ns / sim_ns, r.host_malloc_mean_ns,
      r.host_free_mean_ns, waits, r.driver_calls / iterations,
      r.plan_hits / iterations, r.plan_misses / iterations, r.layout.Describe(),
      r.layout.MappingsPerGiB());
}

int Run(int argc, char** argv) {
  std::string input, plan_from = "first:1", pages_text = "512",
                     work_dir = "/tmp";
  int64_t repetitions = 9, sample_every = 256;
  double time_limit = 10;
  bool json = false, replan = true;
  FlagParser flags(
      "steptime_proxy", "<trace> [options]",
      "Replays a trace through libloom's C ABI (fake backend) in auto "
      "mode's shape: the first K iterations recorded, planned with "
      "loom_plan_trace and installed with loom_load_plan, the rest of the "
      "trace, then its steady iteration --repetitions more times. Reports "
      "per steady iteration: host ns per request (loom_malloc + loom_free, "
      "the median over the repetitions) next to the caching allocator "
      "simulator's on the same requests, libloom's sampled host time, the "
      "waits and driver calls loom made, and its layout (handles, mappings "
      "per GiB mapped).");
  flags.AddPositional("trace", &input, "a trace file or builtin:NAME");
  flags.AddString("plan-from", &plan_from,
                  "first:K: plan from the first K iterations (default "
                  "first:1)");
  flags.AddInt("repetitions", &repetitions,
               "steady iterations replayed after the trace (default 9)");
  flags.AddString("max-chunk-pages", &pages_text,
                  "layout variants: libloom's max_chunk_pages, a list "
                  "(default 512)");
  flags.AddInt("host-sample-every", &sample_every,
               "libloom's host_sample_every (default 256; 0: none)");
  flags.AddDouble("time-limit", &time_limit, "planner seconds (default 10)");
  flags.AddBool("replan", &replan,
                "replan=1, as auto mode sets it (default; --no-replan)");
  flags.AddString("work-dir", &work_dir,
                  "where the recorded trace and the plan are written");
  flags.AddBool("json", &json, "print JSON");
  if (auto exit = flags.Parse(std::vector<std::string>(argv + 1, argv + argc)))
    return *exit;
  auto fail = [](const Status& status) {
    std::fprintf(stderr, "steptime_proxy: %s\n", status.ToString().c_str());
    return 1;
  };
  StatusOr<int64_t> k = ParsePlanFrom(plan_from);
  if (!k.ok()) return fail(k.status());
  StatusOr<std::vector<uint32_t>> pages = ParsePages(pages_text);
  if (!pages.ok()) return fail(pages.status());
  if (repetitions < 1 || repetitions > 100000) {
    return fail(InvalidArgumentError("--repetitions: 1..100000"));
  }
  StatusOr<whatif::Workload> workload = whatif::LoadWorkload(input);
  if (!workload.ok()) return fail(workload.status());

  CAbiReplayOptions options;
  options.plan_from = *k;
  options.repetitions = static_cast<int>(repetitions);
  options.host_sample_every = static_cast<uint32_t>(sample_every);
  options.plan_time_limit = time_limit;
  options.work_dir = work_dir;
  options.replan = replan;
  JsonWriter w;
  w.BeginObject();
  w.Key("trace").String(input);
  w.Key("plan_from").String(plan_from);
  w.Key("host_sample_every").Int(sample_every);
  w.Key("runs").BeginArray();
  if (!json) {
    fmt::print(
        "{}: plan from {}, {} steady repetitions\n\n"
        "| max_chunk_pages | requests/iter | loom ns/request | simulator "
        "ns/request | loom/sim | loom sampled malloc / free | waits/iter | "
        "driver calls/iter | hits / misses per iter | layout | mappings/GiB "
        "|\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|\n",
        input, plan_from, repetitions);
    std::fflush(stdout);
  }
  for (uint32_t p : *pages) {
    options.max_chunk_pages = p;
    StatusOr<CAbiReplayResult> r = ReplayThroughCAbi(workload->trace, options);
    if (!r.ok()) return fail(r.status());
    if (json) {
      WriteJson(w, p, *r);
    } else {
      PrintRow(p, *r);
      std::fflush(stdout);
    }
  }
  w.EndArray();
  w.EndObject();
  if (json) fmt::print("{}\n", w.str());
  return 0;
}

}  // namespace
}  // namespace loom::bench

int main(int argc, char** argv) { return loom::bench::Run(argc, argv); }
