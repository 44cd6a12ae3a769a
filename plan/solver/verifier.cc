#include "plan/solver/verifier.h"

#include <algorithm>
#include <map>
#include <vector>

namespace loom::plan {
namespace {

// Size after rounding up to `round`; false on overflow.
bool RoundedSize(uint64_t size, uint64_t round, uint64_t* out) {
  if (round <= 1) {
    *out = size;
    return true;
  }
  uint64_t units = size / round + (size % round != 0 ? 1 : 0);
  if (units > UINT64_MAX / round) return false;
  *out = units * round;
  return true;
}

std::string Describe(const Instance& instance, size_t i) {
  const Buffer& b = instance.buffers[i];
  if (!instance.labels.empty()) {
    return fmt::format("buffer {} (id {}, '{}')", i, b.id, instance.labels[i]);
  }
  return fmt::format("buffer {} (id {})", i, b.id);
}

struct SweepEvent {
  int64_t time;
  int kind;  // 0 = end, 1 = start: ends first (half-open lifetimes)
  size_t buffer;
  bool operator<(const SweepEvent& o) const {
    if (time != o.time) return time < o.time;
    if (kind != o.kind) return kind < o.kind;
    return buffer < o.buffer;
  }
};

}  // namespace

Verdict VerifyPlacement(const Instance& instance,
                        std::span<const uint64_t> offsets,
                        const VerifyOptions& options) {
  LOOM_CHECK(options.size_round >= 1 && options.min_alignment >= 1);
  Verdict verdict;
  const size_t n = instance.buffers.size();
  if (offsets.size() != n) {
    verdict.kind = ViolationKind::kCount;
    verdict.message =
        fmt::format("{} offsets for {} buffers", offsets.size(), n);
    return verdict;
  }
  std::vector<uint64_t> sizes(n);
  for (size_t i = 0; i < n; ++i) {
    const Buffer& b = instance.buffers[i];
    const uint64_t offset = offsets[i];
    if (offset % b.alignment != 0 || offset % options.min_alignment != 0) {
      verdict.kind = ViolationKind::kAlignment;
      verdict.buffer = i;
      verdict.message = fmt::format(
          "{}: offset {} is not a multiple of its alignment {}",
          Describe(instance, i), offset,
          offset % b.alignment != 0 ? b.alignment : options.min_alignment);
      return verdict;
    }
    uint64_t size = 0;
    if (!RoundedSize(b.size, options.size_round, &size) ||
        offset > UINT64_MAX - size) {
      verdict.kind = ViolationKind::kCapacity;
      verdict.buffer = i;
      verdict.message = fmt::format("{}: offset {} + size {} overflows",
                                    Describe(instance, i), offset, b.size);
      return verdict;
    }
    if (options.capacity != 0 && offset + size > options.capacity) {
      verdict.kind = ViolationKind::kCapacity;
      verdict.buffer = i;
      verdict.message = fmt::format("{}: [{}, {}) ends beyond the capacity {}",
                                    Describe(instance, i), offset,
                                    offset + size, options.capacity);
      return verdict;
    }
    sizes[i] = size;
    verdict.peak_bytes = std::max(verdict.peak_bytes, offset + size);
  }

  std::vector<SweepEvent> events;
  events.reserve(2 * n + 16);
  for (size_t i = 0; i < n; ++i) {
    for (const auto& [start, end] :
         LiveIntervals(instance.buffers[i], instance.period)) {
      events.push_back({start, 1, i});
      events.push_back({end, 0, i});
    }
  }
  std::sort(events.begin(), events.end());
  // Live address ranges, disjoint while the plan is valid: offset -> buffer.
  std::map<uint64_t, size_t> live;
  auto report = [&](size_t i, size_t j, int64_t time) {
    const uint64_t lo = std::max(offsets[i], offsets[j]);
    const uint64_t hi = std::min(offsets[i] + sizes[i], offsets[j] + sizes[j]);
    verdict.kind = ViolationKind::kOverlap;
    verdict.buffer = i;
    verdict.other = j;
    verdict.time = time;
    verdict.message = fmt::format(
        "{} at [{}, {}) and {} at [{}, {}) share bytes [{}, {}) at time {}",
        Describe(instance, i), offsets[i], offsets[i] + sizes[i],
        Describe(instance, j), offsets[j], offsets[j] + sizes[j], lo, hi, time);
  };
  for (const SweepEvent& e : events) {
    const uint64_t lo = offsets[e.buffer];
    if (e.kind == 0) {
      auto it = live.find(lo);
      LOOM_CHECK(it != live.end() && it->second == e.buffer);
      live.erase(it);
      continue;
    }
    // Disjoint ranges sorted by offset also have sorted ends, so the new
    // range meets some live range iff it meets its neighbour on either side.
    auto next = live.lower_bound(lo);
    if (next != live.end() && next->first < lo + sizes[e.buffer]) {
      report(e.buffer, next->second, e.time);
      return verdict;
    }
    if (next != live.begin()) {
      auto prev = std::prev(next);
      if (prev->first + sizes[prev->second] > lo) {
        report(e.buffer, prev->second, e.time);
        return verdict;
      }
    }
    live.emplace_hint(next, lo, e.buffer);
  }
  return verdict;
}

Status CheckSameBuffers(const Instance& planned, const Instance& instance) {
  if (planned.buffers.size() != instance.buffers.size()) {
    return InvalidArgumentError("the plan has {} buffers, the instance {}",
                                planned.buffers.size(),
                                instance.buffers.size());
  }
  if (planned.period != instance.period) {
    return InvalidArgumentError("the plan has period {}, the instance {}",
                                planned.period, instance.period);
  }
  for (size_t i = 0; i < planned.buffers.size(); ++i) {
    const Buffer& p = planned.buffers[i];
    const Buffer& b = instance.buffers[i];
    if (p.id != b.id || p.start != b.start || p.end != b.end ||
        p.alignment != b.alignment || p.size < b.size) {
      return InvalidArgumentError(
          "buffer {}: the plan has id {} [{}, {}) size {} alignment {}, the "
          "instance id {} [{}, {}) size {} alignment {}",
          i, p.id, p.start, p.end, p.size, p.alignment, b.id, b.start, b.end,
          b.size, b.alignment);
    }
  }
  return OkStatus();
}

}  // namespace loom::plan
