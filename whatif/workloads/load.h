// Workload inputs of the comparison: one function turns what the user
// names on the command line into a plan::Trace.
//
//   builtin:<name>[:key=value,...]  a generated workload (transformer.h,
//                                   shapes in transformer_config.h):
//                                   "moe", "dense", "moe_comm" (MoE with
//                                   dispatch/combine buffers on stream 1),
//                                   "moe_dropless" (moe by its explicit
//                                   name), "moe_capacity" (capacity factor
//                                   1.25: static expert buffers), "varlen"
//                                   (sequence length per iteration),
//                                   "eval" (evaluation steps between
//                                   training iterations); options as in
//                                   SetTransformerOption, e.g.
//                                   builtin:moe:layers=4,seed=7 or
//                                   builtin:varlen:seq_lens=512:1024
//   <path>.csv                      a MiniMalloc CSV planning instance:
//                                   each buffer is allocated at `lower` and
//                                   freed at `upper`; at equal times frees
//                                   come first, then allocations, each in
//                                   file order (request id = buffer index)
// Anything else is read as a loom trace file (text or binary form).
#ifndef LOOM_WHATIF_WORKLOADS_LOAD_H_
#define LOOM_WHATIF_WORKLOADS_LOAD_H_

#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "plan/solver/instance.h"
#include "plan/trace/trace.h"

namespace loom::whatif {

struct Workload {
  plan::Trace trace;
  std::string name;  // the spec as given, for reports
};

// Loads `spec` (see above). Errors name the spec and what is wrong; file
// errors come from the readers (NOT_FOUND, DATA_LOSS, ...).
StatusOr<Workload> LoadWorkload(std::string_view spec);

// The names accepted after "builtin:".
std::vector<std::string> BuiltinWorkloadNames();

}  // namespace loom::whatif

#endif  // LOOM_WHATIF_WORKLOADS_LOAD_H_
