#include "plan/solver/instance.h"

#include <algorithm>
#include <bit>

namespace loom::plan {

std::vector<std::pair<int64_t, int64_t>> LiveIntervals(const Buffer& buffer,
                                                       int64_t period) {
  if (period <= 0 || buffer.end <= period) {
    return {{buffer.start, buffer.end}};
  }
  std::vector<std::pair<int64_t, int64_t>> out;
  out.emplace_back(buffer.start, period);
  if (buffer.end - period > 0) out.emplace_back(0, buffer.end - period);
  return out;
}

bool Conflict(const Buffer& a, const Buffer& b, int64_t period) {
  for (const auto& [as, ae] : LiveIntervals(a, period)) {
    for (const auto& [bs, be] : LiveIntervals(b, period)) {
      if (as < be && bs < ae) return true;
    }
  }
  return false;
}

uint64_t LowerBound(const Instance& instance, uint64_t round_to) {
  // Sweep over interval endpoints: +size at start, -size at end. Ends sort
  // before starts at the same time because intervals are half-open.
  std::vector<std::pair<int64_t, int64_t>> deltas;  // (time, signed size)
  deltas.reserve(instance.buffers.size() * 2);
  for (const Buffer& b : instance.buffers) {
    uint64_t size =
        round_to <= 1 ? b.size : (b.size + round_to - 1) / round_to * round_to;
    for (const auto& [s, e] : LiveIntervals(b, instance.period)) {
      deltas.emplace_back(s, static_cast<int64_t>(size));
      deltas.emplace_back(e, -static_cast<int64_t>(size));
    }
  }
  std::sort(deltas.begin(), deltas.end());
  int64_t live = 0;
  int64_t peak = 0;
  for (const auto& [t, d] : deltas) {
    live += d;
    peak = std::max(peak, live);
  }
  return static_cast<uint64_t>(peak);
}

Status ValidateInstance(const Instance& instance) {
  if (instance.period < 0) {
    return InvalidArgumentError("negative period {}", instance.period);
  }
  if (!instance.labels.empty() &&
      instance.labels.size() != instance.buffers.size()) {
    return InvalidArgumentError("{} labels for {} buffers",
                                instance.labels.size(),
                                instance.buffers.size());
  }
  for (size_t i = 0; i < instance.buffers.size(); ++i) {
    const Buffer& b = instance.buffers[i];
    if (b.start >= b.end) {
      return InvalidArgumentError("buffer {} (id {}): empty lifetime [{}, {})",
                                  i, b.id, b.start, b.end);
    }
    if (b.size == 0) {
      return InvalidArgumentError("buffer {} (id {}): size 0", i, b.id);
    }
    if (b.alignment == 0 || !std::has_single_bit(b.alignment)) {
      return InvalidArgumentError(
          "buffer {} (id {}): alignment {} is not a power of two", i, b.id,
          b.alignment);
    }
    if (instance.period > 0) {
      if (b.start < 0 || b.start >= instance.period) {
        return InvalidArgumentError(
            "buffer {} (id {}): start {} outside the period [0, {})", i, b.id,
            b.start, instance.period);
      }
      if (b.end - b.start > instance.period) {
        return InvalidArgumentError(
            "buffer {} (id {}): lifetime {} longer than the period {}", i, b.id,
            b.end - b.start, instance.period);
      }
    }
  }
  return OkStatus();
}

}  // namespace loom::plan
