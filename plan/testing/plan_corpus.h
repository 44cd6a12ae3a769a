// The seed plans of the plan-file reader's fuzzing (testonly): the
// MiniMalloc README solution with a dynamic window, a cyclic aligned plan
// with an extra section, and an empty plan. Used by the Bazel mutation test
// (plan/planfile/plan_file_fuzz_test) and written to disk for the libFuzzer
// target (bench/fuzz/plan_file_fuzzer built with -DLOOM_FUZZ_SEEDS).
#ifndef LOOM_PLAN_TESTING_PLAN_CORPUS_H_
#define LOOM_PLAN_TESTING_PLAN_CORPUS_H_

#include <vector>

#include "plan/planfile/plan_file.h"

namespace loom::plan::testing {

std::vector<PlanFile> PlanSeeds();

}  // namespace loom::plan::testing

#endif  // LOOM_PLAN_TESTING_PLAN_CORPUS_H_
