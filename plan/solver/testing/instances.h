// Small planning instances shared by the solver's tests (testonly).
//
//  - ReadmeInstance(): MiniMalloc's README example (5 buffers of 4 bytes,
//    live bytes peak at 12); ReadmeOffsets() is its published solution.
//  - GapInstance(): found by brute force: live bytes never exceed 6, but no
//    placement fits in 6 bytes; 7 is optimal.
#ifndef LOOM_PLAN_SOLVER_TESTING_INSTANCES_H_
#define LOOM_PLAN_SOLVER_TESTING_INSTANCES_H_

#include <cstdint>
#include <vector>

#include "plan/solver/instance.h"

namespace loom::plan::testing {

Instance ReadmeInstance();
std::vector<uint64_t> ReadmeOffsets();
Instance GapInstance();

}  // namespace loom::plan::testing

#endif  // LOOM_PLAN_SOLVER_TESTING_INSTANCES_H_
