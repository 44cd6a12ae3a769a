// Test helper: the simplest plan, a stack of equal buffers.
//
// StackPlan(unit, n, granularity) plans n buffers of `unit` bytes laid one
// after the other at offsets 0, unit, 2 unit, ...; buffer i is live during
// [i, 2n - i) of a 2n-event iteration, so all n are live together at the
// middle. The region is n * unit rounded up to the granularity. Used by the
// allocator's tests (plans, instruments, referee); test-only.
#ifndef LOOM_VMM_STACK_PLAN_TESTING_H_
#define LOOM_VMM_STACK_PLAN_TESTING_H_

#include <cstdint>

#include "vmm/runtime_plan.h"

namespace loom::vmm::test_plans {

// REQUIRES: n >= 1, unit >= 1, granularity >= 1.
inline RuntimePlan StackPlan(uint64_t unit, int n, uint64_t granularity) {
  RuntimePlan plan;
  plan.period = 2 * n;
  for (int i = 0; i < n; ++i) {
    plan.iteration.push_back(
        {unit, static_cast<int64_t>(i * unit), i, 2 * n - i});
  }
  plan.region_bytes = (n * unit + granularity - 1) / granularity * granularity;
  return plan;
}

}  // namespace loom::vmm::test_plans

#endif  // LOOM_VMM_STACK_PLAN_TESTING_H_
