// A seeded generator of planning instances shaped like one iteration of a
// large transformer training run (pure C++).
//
// Time is the event index, as in a recorded trace: every allocation and
// every free takes one step. The iteration runs a 1F1B pipeline schedule
// over `micro_batches` micro-batches with `in_flight` of them live at once:
// forwards of the first `in_flight`, then alternately one backward (oldest)
// and one forward, then the remaining backwards. Per layer and micro-batch:
//  - forward: a few short-lived temporaries, and the saved activations
//    (qkv, attention scores and output, MLP up/activation, dropout masks,
//    norm statistics). A layer with recomputation saves only its input;
//  - backward: a recomputed layer first re-allocates its activations; then
//    gradient temporaries, the activation gradient handed to the layer
//    below (live until that layer's backward), and the saved activations
//    are freed in reverse order (nested lifetimes);
//  - weight gradients are allocated by the first backward of each layer and
//    live until the optimizer step at the end of the iteration.
// Weights and optimizer state live for the whole iteration. Sizes come from
// a small set derived from (tokens, hidden) with a little per-layer
// variation, so many sizes repeat, as in real traces.
//
// Cyclic variant: the same iteration with its boundary moved to a random
// point of the schedule (period = iteration length). Buffers live across
// that point wrap around; whole-iteration buffers span the full period.
#ifndef LOOM_BENCH_PLANNER_SYNTHETIC_H_
#define LOOM_BENCH_PLANNER_SYNTHETIC_H_

#include <cstdint>

#include "plan/solver/instance.h"

namespace loom::bench {

struct SyntheticOptions {
  uint64_t seed = 1;
  int layers = 96;
  int micro_batches = 96;
  int in_flight = 4;                // pipeline depth (1F1B)
  double recompute_fraction = 0.5;  // layers whose activations are recomputed
  uint64_t tokens = 2048;           // per micro-batch
  uint64_t hidden = 4096;
  uint64_t heads = 32;
  bool cyclic = false;
};

// About 33 buffers per layer and micro-batch (about 300,000 with the
// defaults).
// REQUIRES: layers, micro_batches, in_flight >= 1.
plan::Instance SyntheticTrainingIteration(const SyntheticOptions& options);

}  // namespace loom::bench

#endif  // LOOM_BENCH_PLANNER_SYNTHETIC_H_
