// The plan file's human-readable form and helpers (plan_file.h).
#include <algorithm>
#include <iterator>

#include "base/text.h"
#include "plan/planfile/plan_file.h"

namespace loom::plan {

uint64_t InstanceFingerprint(const Instance& instance) {
  uint64_t hash = 0xcbf29ce484222325ull;
  auto mix = [&](uint64_t v) {
    for (int k = 0; k < 8; ++k) {
      hash ^= (v >> (8 * k)) & 0xff;
      hash *= 0x100000001b3ull;
    }
  };
  mix(static_cast<uint64_t>(instance.period));
  mix(instance.buffers.size());
  for (const Buffer& b : instance.buffers) {
    mix(b.id);
    mix(static_cast<uint64_t>(b.start));
    mix(static_cast<uint64_t>(b.end));
    mix(b.size);
    mix(b.alignment);
  }
  return hash;
}

Instance PlanAsInstance(const PlanFile& plan) {
  Instance out;
  out.period = plan.period;
  out.capacity = plan.region_size;
  out.buffers.reserve(plan.buffers.size());
  for (const PlannedBuffer& b : plan.buffers) {
    out.buffers.push_back({b.id, b.start, b.end, b.size, b.alignment});
  }
  return out;
}

std::vector<uint64_t> PlanOffsets(const PlanFile& plan) {
  std::vector<uint64_t> out;
  out.reserve(plan.buffers.size());
  for (const PlannedBuffer& b : plan.buffers) out.push_back(b.offset);
  return out;
}

std::string FormatPlanText(const PlanFile& plan, size_t max_buffers) {
  std::string out;
  auto line = [&]<typename... Args>(fmt::format_string<Args...> format,
                                    Args&&... args) {
    fmt::format_to(std::back_inserter(out), format,
                   std::forward<Args>(args)...);
    out += '\n';
  };
  line("loom plan, version {}", kPlanVersion);
  line("source        {}", plan.source);
  line("fingerprint   0x{:016x}", plan.fingerprint);
  line("algorithm     {} (requested {})", plan.algorithm, plan.requested);
  line(
      "options       size_round={} min_alignment={} granule={} capacity={} "
      "time_limit={}s",
      plan.size_round, plan.min_alignment, plan.granule_bytes, plan.capacity,
      plan.time_limit_seconds);
  const double ratio = plan.lower_bound_bytes == 0
                           ? 1.0
                           : static_cast<double>(plan.peak_bytes) /
                                 static_cast<double>(plan.lower_bound_bytes);
  line("peak          {} bytes = {:.6f} x lower bound {}{}", plan.peak_bytes,
       ratio, plan.lower_bound_bytes, plan.optimal ? " (optimal)" : "");
  line("granules      {} x {} bytes touched at the peak", plan.peak_granules,
       plan.granule_bytes);
  line("seconds       {:.3f}", plan.seconds);
  line("period        {}{}", plan.period,
       plan.period == 0 ? " (not cyclic)" : "");
  line("region        {} bytes", plan.region_size);
  line("buffers       {}", plan.buffers.size());
  const size_t shown = max_buffers == 0
                           ? plan.buffers.size()
                           : std::min(max_buffers, plan.buffers.size());
  if (shown > 0)
    line("  {:>10} {:>14} {:>14} {:>12} {:>12} {:>9}", "id", "offset", "size",
         "start", "end", "align");
  for (size_t i = 0; i < shown; ++i) {
    const PlannedBuffer& b = plan.buffers[i];
    line("  {:>10} {:>14} {:>14} {:>12} {:>12} {:>9}", b.id, b.offset, b.size,
         b.start, b.end, b.alignment);
  }
  if (shown < plan.buffers.size())
    line("  ... {} more", plan.buffers.size() - shown);
  line("dynamic spaces {}", plan.dynamic_spaces.size());
  for (const ReusableSpace& space : plan.dynamic_spaces) {
    line("  window [{}, {}) {}: {} bytes idle in {} ranges, {} whole granules",
         space.window.start, space.window.end,
         space.window.name.empty() ? "-" : space.window.name, space.bytes(),
         space.ranges.size(), space.granule_count(plan.granule_bytes));
    for (const AddressRange& r : space.ranges) line("    [{}, {})", r.lo, r.hi);
  }
  for (const PlanSection& section : plan.extra) {
    line("section       '{}' {} ({} bytes)", TagName(section.tag),
         section.required ? "required" : "optional", section.payload.size());
  }
  return out;
}

}  // namespace loom::plan
