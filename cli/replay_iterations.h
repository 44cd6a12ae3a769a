// `loom replay --per-iteration`: what each iteration of a replay did, as a
// table or JSON (the replay harness's IterationSummary, whatif/sim/replay.h):
// its live and reserved peaks, the memory held when it ended, the driver
// calls it made and, from loom's counters, its plan hits and misses,
// whether the plan was suspended, variant switches, variants installed and
// re-plans. Where a plan costs memory, this says in which iteration.
#ifndef LOOM_CLI_REPLAY_ITERATIONS_H_
#define LOOM_CLI_REPLAY_ITERATIONS_H_

#include "base/json.h"
#include "whatif/sim/replay.h"

namespace loom::cli {

// Prints one line per iteration (nothing for a trace without markers).
void PrintIterations(const whatif::ReplayResult& result);
// Writes the key "iterations": a list with one object per iteration.
void WriteIterationsJson(JsonWriter& w, const whatif::ReplayResult& result);

}  // namespace loom::cli

#endif  // LOOM_CLI_REPLAY_ITERATIONS_H_
