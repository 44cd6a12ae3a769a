// Plans shared by the tests of plan files and their fuzzing (testonly).
//
//  - ReadmePlanFile(): MiniMalloc's README example planned at capacity 12
//    (plan/solver/testing: ReadmeInstance() at ReadmeOffsets()), with a
//    dynamic window "moe" over [10, 20) whose idle bytes are [8, 12): the
//    smallest plan with every section of version 1.
//  - PlanSeeds(): the seed plans of the plan-file reader's fuzzing: the
//    README plan, a cyclic aligned plan with an extra section, and an empty
//    plan. Used by the Bazel mutation test (plan/planfile/plan_file_fuzz_test)
//    and written to disk for the libFuzzer target (bench/fuzz/plan_file_fuzzer
//    built with -DLOOM_FUZZ_SEEDS).
#ifndef LOOM_PLAN_TESTING_PLAN_CORPUS_H_
#define LOOM_PLAN_TESTING_PLAN_CORPUS_H_

#include <vector>

#include "plan/planfile/plan_file.h"

namespace loom::plan::testing {

PlanFile ReadmePlanFile();
std::vector<PlanFile> PlanSeeds();

}  // namespace loom::plan::testing

#endif  // LOOM_PLAN_TESTING_PLAN_CORPUS_H_
