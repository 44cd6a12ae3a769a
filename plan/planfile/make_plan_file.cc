#include "plan/planfile/make_plan_file.h"

#include <string>

namespace loom::plan {

StatusOr<PlanFile> MakePlanFile(const Instance& instance,
                                const PlanResult& result,
                                const PlannerOptions& options,
                                std::string_view source,
                                std::span<const TimeWindow> windows) {
  LOOM_CHECK_EQ(result.offsets.size(), instance.buffers.size());
  LOOM_CHECK_EQ(result.sizes.size(), instance.buffers.size());
  const uint64_t granule = options.granule_bytes;
  PlanFile file;
  file.source = std::string(source);
  file.fingerprint = InstanceFingerprint(instance);
  file.algorithm = result.algorithm;
  file.requested = std::string(AlgorithmName(options.algorithm));
  file.size_round = options.size_round;
  file.min_alignment = options.min_alignment;
  file.granule_bytes = granule;
  file.capacity = options.capacity;
  file.time_limit_seconds = options.time_limit_seconds;
  file.peak_bytes = result.peak_bytes;
  file.lower_bound_bytes = result.lower_bound_bytes;
  file.peak_granules = result.peak_granules;
  file.seconds = result.seconds;
  file.optimal = result.optimal;
  file.period = instance.period;
  file.region_size = (result.peak_bytes + granule - 1) / granule * granule;
  Instance reserved = instance;
  file.buffers.reserve(instance.buffers.size());
  for (size_t i = 0; i < instance.buffers.size(); ++i) {
    const Buffer& b = instance.buffers[i];
    reserved.buffers[i].size = result.sizes[i];
    file.buffers.push_back({b.id, result.offsets[i], result.sizes[i], b.start,
                            b.end, b.alignment});
  }
  if (!windows.empty()) {
    LOOM_ASSIGN_OR_RETURN(
        file.dynamic_spaces,
        DynamicReusableSpace(reserved, result.offsets, file.region_size,
                             windows, granule));
  }
  return file;
}

}  // namespace loom::plan
