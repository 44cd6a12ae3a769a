// Workload inputs of the comparison: one function turns what the user
// names on the command line into a plan::Trace.
//
//   builtin:<name>[:key=value,...]  a generated workload (transformer.h):
//                                   "moe", "dense", "moe_comm" (MoE with
//                                   dispatch/combine buffers on stream 1);
//                                   options as in SetTransformerOption,
//                                   e.g. builtin:moe:layers=4,seed=7
//   <path>.csv                      a MiniMalloc CSV planning instance:
//                                   each buffer is allocated at `lower` and
//                                   freed at `upper`; at equal times frees
//                                   come first, then allocations, each in
//                                   file order (request id = buffer index)
// Anything else is UNIMPLEMENTED for now: loom trace files plug in here
// (LoadWorkload is the single place that maps a path to a trace).
#ifndef LOOM_BENCH_WORKLOADS_LOAD_H_
#define LOOM_BENCH_WORKLOADS_LOAD_H_

#include <string>
#include <string_view>
#include <vector>

#include "plan/base/status.h"
#include "plan/instance.h"
#include "plan/trace.h"

namespace loom::bench {

struct Workload {
  plan::Trace trace;
  std::string name;  // the spec as given, for reports
};

// Loads `spec` (see above). Errors name the spec and what is wrong; file
// errors come from the readers (NOT_FOUND, DATA_LOSS, ...).
StatusOr<Workload> LoadWorkload(std::string_view spec);

// The names accepted after "builtin:".
std::vector<std::string> BuiltinWorkloadNames();

// The alloc/free trace of a planning instance (rules above). Alignment is
// ignored (allocators align on their own). REQUIRES: ValidateInstance ok.
plan::Trace TraceFromInstance(const plan::Instance& instance,
                              std::string provenance);

}  // namespace loom::bench

#endif  // LOOM_BENCH_WORKLOADS_LOAD_H_
