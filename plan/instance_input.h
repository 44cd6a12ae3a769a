// Turning a path named on the command line into a planning Instance.
//
// The single place that maps inputs to instances, for `loom_tool plan`,
// `loom_tool verify` and the planner benchmark. Today it reads MiniMalloc
// CSVs (plan/minimalloc_csv.h), including their optional `offset` column.
// Trace files and PyTorch snapshots (converted by the Python front end) plug
// in here once the trace readers and the analysis that extracts the steady
// iteration exist: the function will dispatch on the file's content.
#ifndef LOOM_PLAN_INSTANCE_INPUT_H_
#define LOOM_PLAN_INSTANCE_INPUT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "plan/base/status.h"
#include "plan/instance.h"

namespace loom::plan {

struct InstanceInput {
  Instance instance;
  std::vector<uint64_t> offsets;  // a solution given with the input, if any
  // Optional phase-group key per buffer (layers.h); empty when the input
  // format has no phase information.
  std::vector<uint32_t> group;
};

// Reads `path`. Errors name the file and the line or offset.
StatusOr<InstanceInput> ReadInstanceInput(const std::string& path);

}  // namespace loom::plan

#endif  // LOOM_PLAN_INSTANCE_INPUT_H_
