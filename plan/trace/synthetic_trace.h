// Synthetic training traces for tests, benchmarks and fuzz seeds (pure C++).
//
// The generator imitates a transformer training run: a head that allocates
// weights (never freed), then iterations of forward (per layer: kept
// activations, short-lived temporaries, every `moe_every`-th layer a dynamic
// module whose token buffers change size from iteration to iteration),
// backward (temporaries, activations freed in reverse order) and an optimizer
// step. It uses every event kind, a side stream, a second device, and module
// names that need quoting in the text form. Output is deterministic for a
// given seed, and it stops after exactly `events` events (possibly with
// requests still live and modules still open, which traces allow).
#ifndef LOOM_PLAN_TRACE_SYNTHETIC_TRACE_H_
#define LOOM_PLAN_TRACE_SYNTHETIC_TRACE_H_

#include <cstdint>

#include "base/status.h"
#include "plan/trace/trace.h"
#include "plan/trace/trace_io.h"

namespace loom::plan {

struct SyntheticTraceOptions {
  uint64_t events = 10000;  // exact number of events
  uint64_t seed = 1;
  int layers = 8;
  int head_weights = 32;  // weight allocations before the first iteration
  int moe_every = 4;      // every n-th layer is dynamic; 0 = none
  bool iteration_markers = true;
  bool phase_markers = true;
  bool module_markers = true;
};

// The trace in memory.
Trace MakeSyntheticTrace(const SyntheticTraceOptions& options);

// Streams the same trace into `writer` (names added as first used) and
// finishes it; memory stays small for any length.
Status WriteSyntheticTrace(const SyntheticTraceOptions& options,
                           TraceWriter& writer);

}  // namespace loom::plan

#endif  // LOOM_PLAN_TRACE_SYNTHETIC_TRACE_H_
