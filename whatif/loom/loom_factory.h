// loom's row of `loom compare`: plans the trace (self_plan.h), then replays
// it through loom's real run-time allocator on the fake driver
// (loom_sim_allocator.h). Planning time, plan hits and misses come back as
// the row's counters.
#ifndef LOOM_WHATIF_LOOM_LOOM_FACTORY_H_
#define LOOM_WHATIF_LOOM_LOOM_FACTORY_H_

#include "whatif/compare/compare.h"
#include "whatif/loom/self_plan.h"

namespace loom::whatif {

// The factory of the "loom" row. With plan = false the row is loom without a
// plan (record mode: everything from the dynamic space). With a non-empty
// `plan_csv`, the plan's buffers and offsets are written there
// (id,lower,upper,size,offset) for the plan picture.
AllocatorFactory LoomAllocatorFactory(const SelfPlanOptions& options,
                                      bool plan = true,
                                      std::string plan_csv = "");

}  // namespace loom::whatif

#endif  // LOOM_WHATIF_LOOM_LOOM_FACTORY_H_
