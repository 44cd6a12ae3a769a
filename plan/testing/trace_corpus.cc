#include "plan/testing/trace_corpus.h"

#include "plan/trace/synthetic_trace.h"

namespace loom::plan::testing {

Trace SmallSeedTrace() {
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
  return small;
}

std::vector<Trace> TraceSeeds() {
  std::vector<Trace> seeds = {SmallSeedTrace()};
  for (uint64_t events : {40, 300, 3000}) {
    SyntheticTraceOptions options;
    options.events = events;
    options.layers = 3;
    options.moe_every = 2;
    options.seed = events;
    seeds.push_back(MakeSyntheticTrace(options));
  }
  return seeds;
}

}  // namespace loom::plan::testing
