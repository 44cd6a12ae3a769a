#include "plan/testing/plan_corpus.h"

namespace loom::plan::testing {

std::vector<PlanFile> PlanSeeds() {
  std::vector<PlanFile> seeds;
  PlanFile plan;
  plan.source = "input.12.csv";
  plan.algorithm = "exact@12";
  plan.requested = "auto";
  plan.granule_bytes = 4;
  plan.peak_bytes = 12;
  plan.lower_bound_bytes = 12;
  plan.peak_granules = 3;
  plan.region_size = 12;
  plan.buffers = {{0, 8, 4, 0, 3, 1},
                  {1, 8, 4, 3, 9, 1},
                  {2, 4, 4, 0, 9, 1},
                  {3, 4, 4, 9, 21, 1},
                  {4, 0, 4, 0, 21, 1}};
  ReusableSpace space;
  space.window = {10, 20, "moe"};
  space.ranges = {{8, 12}};
  space.granules = {{8, 12}};
  plan.dynamic_spaces = {space};
  seeds.push_back(plan);
  // Cyclic, aligned, with an extra section.
  PlanFile cyclic;
  cyclic.source = "cyclic";
  cyclic.algorithm = "best-fit/size";
  cyclic.requested = "best-fit";
  cyclic.size_round = 512;
  cyclic.min_alignment = 512;
  cyclic.period = 10;
  cyclic.peak_bytes = 2048;
  cyclic.lower_bound_bytes = 1024;
  cyclic.peak_granules = 1;
  cyclic.region_size = 4096;
  cyclic.buffers = {{7, 0, 1024, 8, 13, 512}, {9, 1024, 1024, 1, 9, 512}};
  cyclic.extra = {{PlanTag("MTCH"), false, "table"}};
  seeds.push_back(cyclic);
  // No buffers at all.
  seeds.push_back(PlanFile{});
  return seeds;
}

}  // namespace loom::plan::testing
