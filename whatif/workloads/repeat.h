// Extending a recorded trace with copies of its steady iteration, to replay
// what a run does after the part that was recorded (pure C++). `loom replay
// --auto` uses it: auto mode records a few iterations, plans them and
// serves every later iteration from the plan; the trace it wrote ends where
// recording stopped, so the iterations served by the plan are made here.
//
// Iterations are named by their iteration-begin markers' numbers, as loom's
// session numbers them: iteration n begins once n steps are done (the
// first one, set-up included, may have no begin marker). The kept part is
// every event before the begin marker of iteration `keep` (the whole trace
// when it ends with iteration keep - 1); the template is iteration keep - 1,
// from its begin marker to the end of the kept part. Each copy repeats the
// template's events in order, with new request ids and iteration numbers
// keep, keep + 1, ...; the sizes, streams, phases and modules are the
// template's.
//
// Requests that cross the boundary (gradients made in one iteration and
// freed in the next, by zero_grad) are carried: a free in the template of a
// request made before it (incoming) is matched, by size and in allocation
// order, to a request the template makes and does not free (outgoing); in
// copy c that free frees copy c - 1's counterpart (for the first copy, the
// template's own request in the kept part). Incoming frees without a
// counterpart are left out of the copies (their request is gone after the
// first); outgoing requests without one are never freed (they stay live,
// as persistent state made in the template would), unless carry_any_size
// pairs them with those frees or makes them only once.
//
// Invariant: the result is a well-formed trace (plan/trace/trace.h) whose
// first `kept_events` events are the input's.
#ifndef LOOM_WHATIF_WORKLOADS_REPEAT_H_
#define LOOM_WHATIF_WORKLOADS_REPEAT_H_

#include <cstdint>

#include "base/status.h"
#include "plan/trace/trace.h"

namespace loom::whatif {

struct RepeatOptions {
  int64_t keep = 0;    // iterations kept (>= 1; iteration keep - 1 is copied)
  int64_t copies = 0;  // copies appended (>= 0)
  // A stationary repeat: after matching by size, carry the incoming frees
  // and outgoing requests left unmatched too, pairwise in allocation order
  // whatever their sizes (a perturbed trace resized some and added others),
  // and make the outgoing requests still left only once, in the template
  // (lasting_allocs 0): live memory then peaks alike in every copy.
  bool carry_any_size = false;
};

struct RepeatedTrace {
  plan::Trace trace;
  size_t kept_events = 0;       // events of the input kept, from the start
  size_t template_events = 0;   // events per copy
  uint64_t carried_frees = 0;   // per copy: frees of the previous one's
  uint64_t dropped_frees = 0;   // per copy: incoming frees left out
  uint64_t lasting_allocs = 0;  // per copy: requests never freed
};

// How many iterations a run of `trace` keeps at most, counting up from
// `from` (>= 0) iterations known to be there: the largest keep >= from
// such that iterations from .. keep - 1 all have a begin marker and are
// complete (what RepeatSteadyIteration accepts).
int64_t CompleteIterations(const plan::Trace& trace, int64_t from);

// INVALID_ARGUMENT when the trace has no begin marker of iteration
// keep - 1, or iteration keep - 1 is not complete in it.
StatusOr<RepeatedTrace> RepeatSteadyIteration(const plan::Trace& trace,
                                              const RepeatOptions& options);

// The trace followed by `copies` stationary copies (carry_any_size) of its
// last complete iteration: what `--then-repeat` replays (does an allocator
// settle once the work repeats?). INVALID_ARGUMENT for copies < 0 or a
// trace without a complete iteration with its markers.
StatusOr<plan::Trace> ThenRepeatLastIteration(const plan::Trace& trace,
                                              int64_t copies);

}  // namespace loom::whatif

#endif  // LOOM_WHATIF_WORKLOADS_REPEAT_H_
