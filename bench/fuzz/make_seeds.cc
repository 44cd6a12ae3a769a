// Writes the seed corpus of the trace fuzzers: small valid traces (every
// event kind, quoted names, several chunks) in the text and binary forms.
//   make_seeds <text_dir> <binary_dir>
#include <cstdio>
#include <string>

#include "plan/trace/synthetic_trace.h"
#include "plan/trace/trace_io.h"

namespace loom::plan {
namespace {

int Main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: make_seeds <text_dir> <binary_dir>\n");
    return 2;
  }
  std::vector<Trace> seeds;
  Trace small;
  small.header.device = -1;
  small.header.granularity = 2097152;
  small.header.provenance = "seed \"quoted\"\n";
  small.AddIterationBegin(0);
  small.AddPhase(kPhaseForward);
  small.AddModuleEnter("layers.0 moe", true);
  small.events.push_back(Event::Alloc(1, 4096, 7, 1));
  small.AddAlloc(2, 512);
  small.AddModuleExit("layers.0 moe");
  small.AddPhase(kPhaseBackward);
  small.events.push_back(Event::Free(1, 7, 1));
  small.AddIterationEnd(0);
  small.names.push_back("unused");
  seeds.push_back(small);
  for (uint64_t events : {40, 300, 3000}) {
    SyntheticTraceOptions options;
    options.events = events;
    options.layers = 3;
    options.moe_every = 2;
    options.seed = events;
    seeds.push_back(MakeSyntheticTrace(options));
  }
  for (size_t i = 0; i < seeds.size(); ++i) {
    for (TraceFormat format : {TraceFormat::kText, TraceFormat::kBinary}) {
      std::string path =
          std::string(argv[format == TraceFormat::kText ? 1 : 2]) + "/seed" +
          std::to_string(i) + (format == TraceFormat::kText ? ".ltt" : ".ltb");
      Status status = WriteTrace(path, seeds[i], format);
      if (!status.ok()) {
        std::fprintf(stderr, "%s\n", status.ToString().c_str());
        return 1;
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace loom::plan

int main(int argc, char** argv) { return loom::plan::Main(argc, argv); }
