// Granule accounting and dynamic reusable space of a plan (pure C++).
//
// With CUDA virtual memory, physical memory is mapped in granules (2 MiB on
// current GPUs), so what a plan costs is the number of granules touched by
// live buffers, not its highest address:
//   PeakGranules: max over time of |{granules intersecting a live buffer}|.
//
// Dynamic reusable space (STAlloc section 5.2, A_i = A \ A_o): for a time
// window in which some dynamic requests (e.g. MoE token buffers) live, the
// address ranges of the static region [0, region_size) that no planned
// buffer uses at any moment of the window. A dynamic block placed there can
// never meet a planned one. Windows are half-open [start, end) in the
// instance's time units; on a cyclic instance (period > 0) a window may run
// past the period and wraps, like buffer lifetimes.
//
// Both take the instance whose `size`s are the reserved (rounded) sizes, and
// one offset per buffer. Both are O(n log n) (plus the output).
#ifndef LOOM_PLAN_SOLVER_GRANULES_H_
#define LOOM_PLAN_SOLVER_GRANULES_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "plan/solver/gap_index.h"
#include "plan/solver/instance.h"

namespace loom::plan {

inline constexpr uint64_t kDefaultGranule = uint64_t{2} << 20;  // 2 MiB

// REQUIRES: offsets.size() == buffers.size(); granule > 0.
uint64_t PeakGranules(const Instance& instance,
                      std::span<const uint64_t> offsets, uint64_t granule);

struct TimeWindow {
  int64_t start = 0;
  int64_t end = 0;
  std::string name;  // the group of dynamic requests, e.g. a module name
  friend bool operator==(const TimeWindow&, const TimeWindow&) = default;
};

struct ReusableSpace {
  TimeWindow window;
  std::vector<AddressRange> ranges;    // idle byte ranges, sorted, disjoint
  std::vector<AddressRange> granules;  // the whole granules inside them
  uint64_t bytes() const;
  uint64_t granule_count(uint64_t granule) const;
  friend bool operator==(const ReusableSpace&, const ReusableSpace&) = default;
};

// One ReusableSpace per window, in the same order. Fails on a window with
// start >= end, a negative start, or (cyclic) start >= period or a window
// longer than the period.
// REQUIRES: offsets.size() == buffers.size(); granule > 0; every buffer
// ends at or below region_size.
StatusOr<std::vector<ReusableSpace>> DynamicReusableSpace(
    const Instance& instance, std::span<const uint64_t> offsets,
    uint64_t region_size, std::span<const TimeWindow> windows,
    uint64_t granule);

}  // namespace loom::plan

#endif  // LOOM_PLAN_SOLVER_GRANULES_H_
