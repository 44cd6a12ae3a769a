#include "plan/gap_index.h"

#include <algorithm>
#include <bit>

namespace loom::plan {

GapIndex::GapIndex(int32_t num_slots) : num_slots_(num_slots) {
  LOOM_CHECK_GE(num_slots, 0);
  leaves_ = static_cast<int32_t>(
      std::bit_ceil(static_cast<uint32_t>(std::max(num_slots, 1))));
  sub_.resize(2 * static_cast<size_t>(leaves_));
  cover_.resize(leaves_);
}

void GapIndex::Add(RangeSet& set, uint64_t lo, uint64_t hi) {
  // First range that ends at or after lo (it touches or follows [lo, hi)).
  auto first = std::lower_bound(
      set.begin(), set.end(), lo,
      [](const AddressRange& r, uint64_t value) { return r.hi < value; });
  if (first == set.end() || first->lo > hi) {
    set.insert(first, AddressRange{lo, hi});
    return;
  }
  // Merge every range that touches [lo, hi) into *first.
  auto last = first;
  while (last != set.end() && last->lo <= hi) ++last;
  first->lo = std::min(first->lo, lo);
  first->hi = std::max((last - 1)->hi, hi);
  set.erase(first + 1, last);
}

void GapIndex::Insert(std::span<const SlotSpan> spans, uint64_t lo,
                      uint64_t hi) {
  LOOM_DCHECK(lo < hi);
  for (const SlotSpan& span : spans) {
    LOOM_DCHECK(0 <= span.lo && span.lo < span.hi && span.hi <= num_slots_);
    const int32_t first = span.lo + leaves_;
    const int32_t last = span.hi - 1 + leaves_;
    for (int32_t a = first, b = last + 1; a < b; a >>= 1, b >>= 1) {
      if (a & 1) {
        Add(sub_[a], lo, hi);
        if (a < leaves_) Add(cover_[a], lo, hi);
        ++a;
      }
      if (b & 1) {
        --b;
        Add(sub_[b], lo, hi);
        if (b < leaves_) Add(cover_[b], lo, hi);
      }
    }
    // Every proper ancestor of a canonical node is a proper ancestor of
    // the first or the last leaf.
    int32_t u = first >> 1;
    int32_t w = last >> 1;
    for (; u != w; u >>= 1, w >>= 1) {
      Add(sub_[u], lo, hi);
      Add(sub_[w], lo, hi);
    }
    for (; u > 0; u >>= 1) Add(sub_[u], lo, hi);
  }
}

void GapIndex::Gather(std::span<const SlotSpan> spans,
                      std::vector<AddressRange>* out) const {
  out->clear();
  auto append = [out](const RangeSet& set) {
    out->insert(out->end(), set.begin(), set.end());
  };
  for (const SlotSpan& span : spans) {
    const int32_t first = span.lo + leaves_;
    const int32_t last = span.hi - 1 + leaves_;
    for (int32_t a = first, b = last + 1; a < b; a >>= 1, b >>= 1) {
      if (a & 1) append(sub_[a++]);
      if (b & 1) append(sub_[--b]);
    }
    int32_t u = first >> 1;
    int32_t w = last >> 1;
    for (; u != w; u >>= 1, w >>= 1) {
      append(cover_[u]);
      append(cover_[w]);
    }
    for (; u > 0; u >>= 1) append(cover_[u]);
  }
  std::sort(
      out->begin(), out->end(),
      [](const AddressRange& a, const AddressRange& b) { return a.lo < b.lo; });
  // Coalesce in place.
  size_t kept = 0;
  for (size_t i = 0; i < out->size(); ++i) {
    const AddressRange r = (*out)[i];
    if (kept > 0 && r.lo <= (*out)[kept - 1].hi) {
      (*out)[kept - 1].hi = std::max((*out)[kept - 1].hi, r.hi);
    } else {
      (*out)[kept++] = r;
    }
  }
  out->resize(kept);
}

void GapIndex::Occupied(std::span<const SlotSpan> spans,
                        std::vector<AddressRange>* out) const {
  Gather(spans, out);
}

uint64_t GapIndex::Find(std::span<const SlotSpan> spans, uint64_t size,
                        uint64_t alignment, FitRule rule,
                        uint64_t limit) const {
  Gather(spans, &scratch_);
  uint64_t best = UINT64_MAX;
  uint64_t best_gap = UINT64_MAX;
  uint64_t free_from = 0;
  auto consider = [&](uint64_t gap_lo, uint64_t gap_hi) {
    const uint64_t at = AlignUp(gap_lo, alignment);
    if (at >= gap_hi || gap_hi - at < size) return false;
    if (gap_hi - gap_lo < best_gap) {
      best_gap = gap_hi - gap_lo;
      best = at;
    }
    return true;
  };
  for (const AddressRange& r : scratch_) {
    if (r.lo > free_from) {
      const uint64_t gap_hi = limit == 0 ? r.lo : std::min(r.lo, limit);
      if (gap_hi > free_from && consider(free_from, gap_hi) &&
          rule == FitRule::kFirstFit) {
        return best;
      }
    }
    free_from = r.hi;
    if (limit != 0 && free_from >= limit) break;
  }
  if (limit == 0) {
    return best != UINT64_MAX ? best : AlignUp(free_from, alignment);
  }
  if (free_from < limit) consider(free_from, limit);
  return best;
}

}  // namespace loom::plan
