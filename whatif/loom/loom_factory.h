// loom's row of `loom compare`: plans a trace (self_plan.h: the measured
// one, or the one PlanSource names), then replays the measured trace
// through loom's real run-time allocator on the fake driver
// (loom_sim_allocator.h). Planning time, plan hits and misses come back as
// the row's counters; where the plan came from as its plan_from.
#ifndef LOOM_WHATIF_LOOM_LOOM_FACTORY_H_
#define LOOM_WHATIF_LOOM_LOOM_FACTORY_H_

#include <memory>
#include <string>

#include "whatif/compare/compare.h"
#include "whatif/loom/self_plan.h"

namespace loom::whatif {

struct LoomRowOptions {
  SelfPlanOptions planning;
  // False: loom without a plan (record mode: everything from the dynamic
  // space), the "loom_unplanned" row.
  bool plan = true;
  // Non-empty: the plan's buffers and offsets are written there
  // (id,lower,upper,size,offset) for the plan picture.
  std::string plan_csv;
  // The trace to plan from; null: the measured trace itself.
  std::shared_ptr<const plan::Trace> plan_trace;
  std::string plan_from;  // how reports name the plan's source
  bool stitch = true;     // LoomSimOptions::stitch (the plan check's too)
};

AllocatorFactory LoomAllocatorFactory(const LoomRowOptions& options);

}  // namespace loom::whatif

#endif  // LOOM_WHATIF_LOOM_LOOM_FACTORY_H_
