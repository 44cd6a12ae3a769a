// Reading a plan file (plan/planfile/plan_file.h) into the allocator's
// RuntimePlan.
//
// The plan must carry a request table (section REQS,
// plan/planfile/request_table.h): plans made from traces do; plans made from
// bare CSV instances do not, and are refused with a message saying so. The
// static region is the plan's region rounded up to the device's granularity;
// each dynamic window's idle granules are the whole granules (of the device's
// granularity) inside the idle ranges the planner stored.
#ifndef LOOM_VMM_PLAN_LOADER_H_
#define LOOM_VMM_PLAN_LOADER_H_

#include <string>

#include "base/status.h"
#include "plan/planfile/plan_file.h"
#include "vmm/runtime_plan.h"

namespace loom::vmm {

// REQUIRES: granularity is a power of two.
StatusOr<RuntimePlan> ToRuntimePlan(const plan::PlanFile& plan,
                                    std::string_view source,
                                    uint64_t granularity);

StatusOr<RuntimePlan> ReadRuntimePlan(const std::string& path,
                                      uint64_t granularity);

}  // namespace loom::vmm

#endif  // LOOM_VMM_PLAN_LOADER_H_
