#include "plan/solver/gap_index.h"

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

void GapIndex::CollectSets(std::span<const SlotSpan> spans) const {
  // The sets to combine: sub() of the canonical nodes, cover() of their
  // ancestors.
  sets_.clear();
  auto take = [this](const RangeSet& set) {
    if (!set.empty()) sets_.push_back({set.data(), set.data() + set.size()});
  };
  for (const SlotSpan& span : spans) {
    const int32_t first = span.lo + leaves_;
    const int32_t last = span.hi - 1 + leaves_;
    for (int32_t a = first, b = last + 1; a < b; a >>= 1, b >>= 1) {
      if (a & 1) take(sub_[a++]);
      if (b & 1) take(sub_[--b]);
    }
    int32_t u = first >> 1;
    int32_t w = last >> 1;
    for (; u != w; u >>= 1, w >>= 1) {
      take(cover_[u]);
      take(cover_[w]);
    }
    for (; u > 0; u >>= 1) take(cover_[u]);
  }
}

void GapIndex::Gather(std::span<const SlotSpan> spans,
                      std::vector<AddressRange>* out) const {
  CollectSets(spans);
  out->clear();
  for (const Cursor& c : sets_) out->insert(out->end(), c.next, c.end);
  std::sort(
      out->begin(), out->end(),
      [](const AddressRange& a, const AddressRange& b) { return a.lo < b.lo; });
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
  CollectSets(spans);
  // The free intervals that can still hold `size` aligned bytes: start
  // with everything below the limit and subtract one set at a time. A hole
  // too small in one set stays too small, so it is dropped at once, and
  // later sets are only searched inside the holes that survive. Sets with
  // few ranges (densely packed regions) go first: they remove the most.
  const uint64_t end = limit == 0 ? UINT64_MAX : limit;
  auto fits = [&](uint64_t lo, uint64_t hi) {
    const uint64_t at = AlignUp(lo, alignment);
    return at < hi && hi - at >= size;
  };
  free_.clear();
  if (fits(0, end)) free_.push_back({0, end});
  std::sort(sets_.begin(), sets_.end(), [](const Cursor& x, const Cursor& y) {
    return x.end - x.next < y.end - y.next;
  });
  for (const Cursor& set : sets_) {
    if (free_.empty()) break;
    next_free_.clear();
    const AddressRange* it = set.next;
    for (const AddressRange& f : free_) {
      // First range of the set ending after f.lo (ranges are sorted):
      // galloping from the previous position, which is usually close.
      size_t step = 1;
      const AddressRange* probe = it;
      while (probe < set.end && probe->hi <= f.lo) {
        it = probe + 1;
        probe = it + step;
        step *= 2;
      }
      it = std::lower_bound(
          it, std::min(probe, set.end), f.lo,
          [](const AddressRange& r, uint64_t v) { return r.hi <= v; });
      uint64_t cur = f.lo;
      for (; it != set.end && it->lo < f.hi; ++it) {
        if (it->lo > cur && fits(cur, it->lo))
          next_free_.push_back({cur, it->lo});
        cur = std::max(cur, it->hi);
        if (cur >= f.hi) break;
      }
      if (cur < f.hi && fits(cur, f.hi)) next_free_.push_back({cur, f.hi});
    }
    free_.swap(next_free_);
  }
  if (free_.empty()) return UINT64_MAX;  // only with a limit
  if (rule == FitRule::kFirstFit) return AlignUp(free_.front().lo, alignment);
  // Best fit: the smallest gap (lowest on ties); without a limit the last
  // interval is the open top, used only when no gap fits.
  const size_t candidates = limit == 0 ? free_.size() - 1 : free_.size();
  uint64_t best = UINT64_MAX;
  uint64_t best_gap = UINT64_MAX;
  for (size_t k = 0; k < candidates; ++k) {
    if (free_[k].hi - free_[k].lo < best_gap) {
      best_gap = free_[k].hi - free_[k].lo;
      best = AlignUp(free_[k].lo, alignment);
    }
  }
  if (best != UINT64_MAX) return best;
  return AlignUp(free_.back().lo, alignment);
}

}  // namespace loom::plan
