// Turning a path named on the command line into a planning Instance.
//
// The single place that maps inputs to instances, for `loom_tool plan`,
// `loom_tool verify` and the planner benchmark. It reads MiniMalloc CSVs
// (plan/solver/minimalloc_csv.h), including their optional `offset` column, and
// loom traces (text or binary; PyTorch snapshots are converted to traces by
// the Python front end): a trace becomes the cyclic instance of its
// steady-state iteration (plan/planning_problem.h), with the request table
// the runtime matches on and the windows of its dynamic modules.
#ifndef LOOM_PLAN_INSTANCE_INPUT_H_
#define LOOM_PLAN_INSTANCE_INPUT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "plan/solver/granules.h"
#include "plan/solver/instance.h"
#include "plan/planning_problem.h"

namespace loom::plan {

struct InstanceInput {
  Instance instance;
  std::vector<uint64_t> offsets;  // a solution given with the input, if any
  // Optional phase-group key per buffer (layers.h); empty when the input
  // format has no phase information.
  std::vector<uint32_t> group;
  // Traces only: the runtime's request table and the dynamic windows.
  std::optional<RequestTable> requests;
  std::vector<TimeWindow> windows;
  std::string note;  // how the instance was derived, for reports
  int32_t steady_iteration = -1;  // traces: the planned iteration (-1: all)
  // Traces: the recorded device's granularity (0: not recorded).
  uint64_t granularity = 0;
};

struct InstanceInputOptions {
  // Traces: see PlanningProblemOptions.
  PlanScope scope = PlanScope::kAuto;
  int32_t steady_iteration = -1;
  bool include_persistent = true;
};

// Reads `path`. Errors name the file and the line or offset.
StatusOr<InstanceInput> ReadInstanceInput(
    const std::string& path, const InstanceInputOptions& options = {});

}  // namespace loom::plan

#endif  // LOOM_PLAN_INSTANCE_INPUT_H_
