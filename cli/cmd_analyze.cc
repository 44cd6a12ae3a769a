// `loom analyze`: event counts, lifetime classes, peaks, iterations and
// regularity of a trace (text or binary) or a MiniMalloc CSV instance.
#include <cstdio>

#include "base/flags.h"
#include "cli/commands.h"
#include "plan/analysis/analysis.h"
#include "plan/analysis/workload.h"

namespace loom::cli {

int RunAnalyze(const Args& args) {
  std::string input;
  bool json = false;
  FlagParser flags(
      "analyze", "<trace|csv> [--json]",
      "Summarises a workload: events by kind, allocations, distinct sizes, "
      "peak live bytes (exact, 512 B rounded, 2 MiB granules), iterations "
      "(from markers, else detected from the period of the allocation "
      "sequence), the steady-state iteration and its regularity, and the "
      "lifetime classes (persistent, scoped, transient, dynamic, "
      "cross_iteration; see docs/design.md).\nThe input is a loom trace "
      "(.ltt text or .ltb binary) or a MiniMalloc CSV (each buffer becomes an "
      "alloc at `lower` and a free at `upper`).");
  flags.AddPositional("input", &input, "trace file or MiniMalloc CSV");
  flags.AddBool("json", &json, "print JSON");
  if (auto exit = flags.Parse(args)) return *exit;

  StatusOr<plan::Workload> workload = plan::LoadWorkloadFile(input);
  if (!workload.ok()) {
    std::fprintf(stderr, "loom analyze: %s\n",
                 workload.status().message().c_str());
    return 1;
  }
  plan::WorkloadAnalysis analysis = plan::AnalyzeWorkload(*workload);
  std::string out = json ? plan::FormatAnalysisJson(*workload, analysis)
                         : plan::FormatAnalysisText(*workload, analysis);
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

}  // namespace loom::cli
