// Traces shared by the trace readers' tests and their fuzzing (testonly).
//
//  - SmallSeedTrace(): one small trace with every event kind, a dynamic
//    module, a second stream and device, a request never freed, a quoted
//    provenance and an unused name. The file whose every truncation and bit
//    flip plan/trace/trace_errors_test damages.
//  - TraceSeeds(): the seed traces of the fuzzing: the small trace, then
//    synthetic training traces of a few sizes. Used by the Bazel mutation
//    test (plan/trace/trace_mutation_test) and written to disk for the
//    libFuzzer targets (bench/fuzz/make_seeds).
#ifndef LOOM_PLAN_TESTING_TRACE_CORPUS_H_
#define LOOM_PLAN_TESTING_TRACE_CORPUS_H_

#include <vector>

#include "plan/trace/trace.h"

namespace loom::plan::testing {

Trace SmallSeedTrace();
std::vector<Trace> TraceSeeds();

}  // namespace loom::plan::testing

#endif  // LOOM_PLAN_TESTING_TRACE_CORPUS_H_
