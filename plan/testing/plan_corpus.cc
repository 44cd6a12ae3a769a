#include "plan/testing/plan_corpus.h"

#include "plan/solver/testing/instances.h"

namespace loom::plan::testing {

PlanFile ReadmePlanFile() {
  const Instance instance = ReadmeInstance();
  const std::vector<uint64_t> offsets = ReadmeOffsets();
  PlanFile plan;
  plan.source = "input.12.csv";
  plan.algorithm = "exact@12";
  plan.requested = "auto";
  plan.granule_bytes = 4;
  plan.peak_bytes = 12;
  plan.lower_bound_bytes = 12;
  plan.peak_granules = 3;
  plan.region_size = 12;
  for (size_t i = 0; i < instance.buffers.size(); ++i) {
    const Buffer& b = instance.buffers[i];
    plan.buffers.push_back(
        {b.id, offsets[i], b.size, b.start, b.end, b.alignment});
  }
  ReusableSpace space;
  space.window = {10, 20, "moe"};
  space.ranges = {{8, 12}};
  space.granules = {{8, 12}};
  plan.dynamic_spaces = {space};
  return plan;
}

std::vector<PlanFile> PlanSeeds() {
  std::vector<PlanFile> seeds;
  seeds.push_back(ReadmePlanFile());
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
