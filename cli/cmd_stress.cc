// `loom_tool stress`: seeded random multi-stream programs against the
// run-time allocator (stress/stress.h). Exit 0 when no fault, corruption or
// broken invariant was found, 1 otherwise.
#include <cstdio>
#include <string>

#include "base/flags.h"
#include "cli/commands.h"
#include "stress/stress.h"

namespace loom::cli {

int RunStress(const Args& args) {
  stress::StressOptions o;
  int64_t seed = 1, streams = o.streams, threads = o.threads,
          devices = o.devices, ops = 0, delay = o.max_delay_us,
          driver_failures = 0;
  uint64_t cap = o.cap_bytes, granularity = o.granularity,
           max_request = o.max_request;
  bool json = false, plan = o.plan, graphs = o.graphs;
  FlagParser flags(
      "stress", "[--backend async] [--seconds N] [--seed S] [options]",
      "Runs a seeded random program against loom's run-time allocator: "
      "allocations and frees on several streams and threads, kernels that "
      "stamp and check their memory (queued for later on the async backend), "
      "cross-stream use with record_stream and event waits, empty_cache, out "
      "of memory under a cap, a plan installed mid-run, graph-capture "
      "regions and markers. Reports faults (memory unmapped or handed out "
      "while a queued kernel still touches it), corrupted buffers and broken "
      "invariants; all must be 0. On --backend cuda a kernel is a memset and "
      "a copy back queued on the stream, checked when the GPU gets there; "
      "the GPU's page size replaces --granularity and scales --cap and "
      "--max-request with it.");
  flags.AddString("backend", &o.backend, "async (default), host, fake or cuda");
  flags.AddDouble("seconds", &o.seconds, "how long to run (default 10)");
  flags.AddInt("ops", &ops, "stop after this many operations (0: time only)");
  flags.AddInt("seed", &seed, "random seed (default 1)");
  flags.AddInt("streams", &streams, "streams per device (default 3)");
  flags.AddInt("threads", &threads, "harness threads (default 2)");
  flags.AddInt("devices", &devices, "devices (default 1)");
  flags.AddSize("cap", &cap, "physical memory cap per device (default 12MiB)");
  flags.AddSize("granularity", &granularity,
                "page size (default 64KiB; cuda: the GPU's)");
  flags.AddSize("max-request", &max_request, "largest request (default 1MiB)");
  flags.AddInt("max-delay-us", &delay,
               "longest kernel delay, async backend (default 300)");
  flags.AddBool("plan", &plan, "install a plan mid-run (default on)");
  flags.AddBool("graphs", &graphs, "graph-capture regions (default on)");
  flags.AddInt("driver-failures", &driver_failures,
               "percent of allocations before which one of the next memory "
               "calls fails, as a driver would (default 0)");
  flags.AddBool("json", &json, "print JSON");
  if (std::optional<int> exit = flags.Parse(args)) return *exit;
  o.seed = static_cast<uint64_t>(seed);
  o.streams = static_cast<int>(streams);
  o.threads = static_cast<int>(threads);
  o.devices = static_cast<int>(devices);
  o.max_ops = static_cast<uint64_t>(ops);
  o.max_delay_us = static_cast<int>(delay);
  o.cap_bytes = cap;
  o.granularity = granularity;
  o.max_request = max_request;
  o.plan = plan;
  o.graphs = graphs;
  if (driver_failures < 0 || driver_failures > 100) {
    std::fprintf(stderr, "loom stress: --driver-failures %lld is not 0-100\n",
                 static_cast<long long>(driver_failures));
    return 2;
  }
  o.driver_failure_percent = static_cast<int>(driver_failures);
  StatusOr<stress::StressReport> report = stress::RunStress(o);
  if (!report.ok()) {
    std::fprintf(stderr, "loom stress: %s\n",
                 report.status().ToString().c_str());
    return 2;
  }
  if (json) {
    std::printf("%s\n", report->ToJson(o).c_str());
  } else {
    const stress::StressReport& r = *report;
    std::printf(
        "%s backend, seed %llu, %.1f s, pages of %llu KiB, cap %llu MiB: "
        "%llu ops, %llu kernels, %llu cross-stream uses, %llu empty_cache, "
        "%llu OOM, %llu plans (%llu hits), %llu graphs (%llu replays), "
        "%llu driver failures\n",
        o.backend.c_str(), static_cast<unsigned long long>(o.seed), r.seconds,
        static_cast<unsigned long long>(r.granularity >> 10),
        static_cast<unsigned long long>(r.cap_bytes >> 20),
        static_cast<unsigned long long>(r.ops),
        static_cast<unsigned long long>(r.kernels),
        static_cast<unsigned long long>(r.cross_stream_uses),
        static_cast<unsigned long long>(r.empty_caches),
        static_cast<unsigned long long>(r.ooms),
        static_cast<unsigned long long>(r.plans_installed),
        static_cast<unsigned long long>(r.plan_hits),
        static_cast<unsigned long long>(r.graph_captures),
        static_cast<unsigned long long>(r.graph_replays),
        static_cast<unsigned long long>(r.driver_failures));
    std::printf("faults %llu, corrupted %llu, invariant failures %llu: %s\n",
                static_cast<unsigned long long>(r.faults),
                static_cast<unsigned long long>(r.corrupted),
                static_cast<unsigned long long>(r.invariant_failures),
                r.ok() ? "ok" : "FAILED");
    for (const std::string& f : r.failures) std::printf("  %s\n", f.c_str());
  }
  return report->ok() ? 0 : 1;
}

}  // namespace loom::cli
