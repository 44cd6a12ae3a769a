#include "plan/solver/problem.h"

#include <algorithm>
#include <bit>

namespace loom::plan {

StatusOr<Problem> Problem::Make(const Instance& instance, uint64_t size_round,
                                uint64_t min_alignment) {
  LOOM_RETURN_IF_ERROR(ValidateInstance(instance));
  if (size_round == 0 || size_round > kMaxBytes) {
    return InvalidArgumentError("size rounding {} must be in [1, 2^56]",
                                size_round);
  }
  if (min_alignment == 0 || !std::has_single_bit(min_alignment) ||
      min_alignment > kMaxBytes) {
    return InvalidArgumentError(
        "minimum alignment {} must be a power of two in [1, 2^56]",
        min_alignment);
  }
  Problem p;
  p.period_ = instance.period;
  const size_t n = instance.buffers.size();
  p.items_.resize(n);
  std::vector<int64_t> times;
  times.reserve(2 * n + 2);
  uint64_t stacked = 0;
  for (size_t i = 0; i < n; ++i) {
    const Buffer& b = instance.buffers[i];
    Item& item = p.items_[i];
    if (b.size > kMaxBytes || b.alignment > kMaxBytes) {
      return InvalidArgumentError(
          "buffer {} (id {}): size {} or alignment {} above 2^56", i, b.id,
          b.size, b.alignment);
    }
    item.size = (b.size + size_round - 1) / size_round * size_round;
    if (item.size > kMaxBytes) {
      return InvalidArgumentError("buffer {} (id {}): rounded size above 2^56",
                                  i, b.id);
    }
    item.alignment = std::max(b.alignment, min_alignment);
    item.start = b.start;
    p.total_bytes_ += item.size;
    // Stacking every buffer, each aligned, stays below this: no placement
    // can overflow an offset.
    stacked += item.size + item.alignment - 1;
    if (stacked > (uint64_t{1} << 62)) {
      return InvalidArgumentError(
          "total size of the buffers (with alignment padding) above 2^62");
    }
    for (const auto& [s, e] : LiveIntervals(b, instance.period)) {
      times.push_back(s);
      times.push_back(e);
      item.duration += e - s;
    }
  }
  std::sort(times.begin(), times.end());
  times.erase(std::unique(times.begin(), times.end()), times.end());
  p.slot_times_ = times;
  p.num_slots_ = times.empty() ? 0 : static_cast<int32_t>(times.size()) - 1;
  auto slot_of = [&](int64_t t) {
    return static_cast<int32_t>(
        std::lower_bound(times.begin(), times.end(), t) - times.begin());
  };
  std::vector<int64_t> delta(p.num_slots_ + 1, 0);
  for (size_t i = 0; i < n; ++i) {
    Item& item = p.items_[i];
    for (const auto& [s, e] :
         LiveIntervals(instance.buffers[i], instance.period)) {
      SlotSpan span{slot_of(s), slot_of(e)};
      item.spans[item.num_spans++] = span;
      delta[span.lo] += static_cast<int64_t>(item.size);
      delta[span.hi] -= static_cast<int64_t>(item.size);
    }
  }
  p.slot_load_.resize(p.num_slots_);
  int64_t live = 0;
  for (int32_t j = 0; j < p.num_slots_; ++j) {
    live += delta[j];
    p.slot_load_[j] = static_cast<uint64_t>(live);
    p.lower_bound_ = std::max(p.lower_bound_, p.slot_load_[j]);
  }
  return p;
}

std::vector<uint64_t> Problem::MaxLoadOverLifetime() const {
  // Range max over slot_load_ with an iterative segment tree.
  const size_t leaves = std::bit_ceil(std::max<size_t>(slot_load_.size(), 1));
  std::vector<uint64_t> tree(2 * leaves, 0);
  std::copy(slot_load_.begin(), slot_load_.end(), tree.begin() + leaves);
  for (size_t v = leaves - 1; v > 0; --v) {
    tree[v] = std::max(tree[2 * v], tree[2 * v + 1]);
  }
  std::vector<uint64_t> out(items_.size(), 0);
  for (size_t i = 0; i < items_.size(); ++i) {
    for (const SlotSpan& span : spans(i)) {
      for (size_t a = span.lo + leaves, b = span.hi + leaves; a < b;
           a >>= 1, b >>= 1) {
        if (a & 1) out[i] = std::max(out[i], tree[a++]);
        if (b & 1) out[i] = std::max(out[i], tree[--b]);
      }
    }
  }
  return out;
}

uint64_t Problem::PeakOf(std::span<const uint64_t> offsets) const {
  LOOM_CHECK_EQ(offsets.size(), items_.size());
  uint64_t peak = 0;
  for (size_t i = 0; i < items_.size(); ++i) {
    peak = std::max(peak, offsets[i] + items_[i].size);
  }
  return peak;
}

}  // namespace loom::plan
