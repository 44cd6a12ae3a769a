#include "plan/solver/granules.h"

#include <algorithm>
#include <bit>

namespace loom::plan {
namespace {

// Counts covered leaves under range additions (the classic union-length
// segment tree) over compressed coordinates xs[0..m).
class UnionLength {
 public:
  explicit UnionLength(std::vector<uint64_t> xs) : xs_(std::move(xs)) {
    const size_t segments = xs_.size() > 1 ? xs_.size() - 1 : 1;
    count_.assign(4 * segments, 0);
    length_.assign(4 * segments, 0);
    segments_ = segments;
  }
  // Adds `delta` to the cover count of [lo, hi) (values present in xs).
  void Add(uint64_t lo, uint64_t hi, int delta) {
    const size_t a = std::lower_bound(xs_.begin(), xs_.end(), lo) - xs_.begin();
    const size_t b = std::lower_bound(xs_.begin(), xs_.end(), hi) - xs_.begin();
    if (a < b) Add(1, 0, segments_, a, b, delta);
  }
  uint64_t Covered() const { return length_[1]; }

 private:
  void Add(size_t v, size_t l, size_t r, size_t a, size_t b, int delta) {
    if (b <= l || r <= a) return;
    if (a <= l && r <= b) {
      count_[v] += delta;
    } else {
      const size_t m = (l + r) / 2;
      Add(2 * v, l, m, a, b, delta);
      Add(2 * v + 1, m, r, a, b, delta);
    }
    if (count_[v] > 0) {
      length_[v] = xs_[r] - xs_[l];
    } else if (r - l == 1) {
      length_[v] = 0;
    } else {
      length_[v] = length_[2 * v] + length_[2 * v + 1];
    }
  }
  std::vector<uint64_t> xs_;
  size_t segments_ = 1;
  std::vector<int64_t> count_;
  std::vector<uint64_t> length_;
};

struct Piece {
  int64_t start;
  int64_t end;
  uint32_t buffer;
};

std::vector<Piece> Pieces(const Instance& instance) {
  std::vector<Piece> out;
  out.reserve(instance.buffers.size() + 8);
  for (size_t i = 0; i < instance.buffers.size(); ++i) {
    for (const auto& [s, e] :
         LiveIntervals(instance.buffers[i], instance.period)) {
      out.push_back({s, e, static_cast<uint32_t>(i)});
    }
  }
  return out;
}

}  // namespace

uint64_t ReusableSpace::bytes() const {
  uint64_t total = 0;
  for (const AddressRange& r : ranges) total += r.hi - r.lo;
  return total;
}

uint64_t ReusableSpace::granule_count(uint64_t granule) const {
  uint64_t total = 0;
  for (const AddressRange& r : granules) total += (r.hi - r.lo) / granule;
  return total;
}

uint64_t PeakGranules(const Instance& instance,
                      std::span<const uint64_t> offsets, uint64_t granule) {
  LOOM_CHECK_EQ(offsets.size(), instance.buffers.size());
  LOOM_CHECK_GT(granule, 0u);
  auto first = [&](size_t i) { return offsets[i] / granule; };
  auto last = [&](size_t i) {  // one past the last granule touched
    const uint64_t end = offsets[i] + instance.buffers[i].size;
    return end / granule + (end % granule != 0 ? 1 : 0);
  };
  std::vector<uint64_t> xs;
  xs.reserve(2 * offsets.size());
  for (size_t i = 0; i < offsets.size(); ++i) {
    xs.push_back(first(i));
    xs.push_back(last(i));
  }
  std::sort(xs.begin(), xs.end());
  xs.erase(std::unique(xs.begin(), xs.end()), xs.end());
  UnionLength touched(std::move(xs));
  std::vector<Piece> pieces = Pieces(instance);
  struct Event {
    int64_t time;
    int delta;  // -1 end, +1 start: ends first
    uint32_t buffer;
  };
  std::vector<Event> events;
  events.reserve(2 * pieces.size());
  for (const Piece& p : pieces) {
    events.push_back({p.start, +1, p.buffer});
    events.push_back({p.end, -1, p.buffer});
  }
  std::sort(events.begin(), events.end(), [](const Event& a, const Event& b) {
    return a.time != b.time ? a.time < b.time : a.delta < b.delta;
  });
  uint64_t peak = 0;
  for (size_t k = 0; k < events.size(); ++k) {
    const Event& e = events[k];
    touched.Add(first(e.buffer), last(e.buffer), e.delta);
    if (k + 1 == events.size() || events[k + 1].time != e.time) {
      peak = std::max(peak, touched.Covered());
    }
  }
  return peak;
}

StatusOr<std::vector<ReusableSpace>> DynamicReusableSpace(
    const Instance& instance, std::span<const uint64_t> offsets,
    uint64_t region_size, std::span<const TimeWindow> windows,
    uint64_t granule) {
  LOOM_CHECK_EQ(offsets.size(), instance.buffers.size());
  LOOM_CHECK_GT(granule, 0u);
  const int64_t period = instance.period;
  for (size_t w = 0; w < windows.size(); ++w) {
    const TimeWindow& win = windows[w];
    if (win.start < 0 || win.start >= win.end) {
      return InvalidArgumentError("window {}: [{}, {}) is empty or negative", w,
                                  win.start, win.end);
    }
    if (period > 0 && (win.start >= period || win.end - win.start > period)) {
      return InvalidArgumentError(
          "window {}: [{}, {}) must start inside the period {} and last at "
          "most one period",
          w, win.start, win.end, period);
    }
  }
  // Pieces sorted by start, with a max-end tree over that order: the
  // pieces meeting [ws, we) are those starting before we whose end > ws.
  std::vector<Piece> pieces = Pieces(instance);
  std::sort(pieces.begin(), pieces.end(),
            [](const Piece& a, const Piece& b) { return a.start < b.start; });
  const size_t leaves = std::bit_ceil(std::max<size_t>(pieces.size(), 1));
  std::vector<int64_t> max_end(2 * leaves, INT64_MIN);
  for (size_t k = 0; k < pieces.size(); ++k)
    max_end[leaves + k] = pieces[k].end;
  for (size_t v = leaves - 1; v > 0; --v) {
    max_end[v] = std::max(max_end[2 * v], max_end[2 * v + 1]);
  }
  std::vector<AddressRange> used;
  auto collect = [&](int64_t ws, int64_t we) {
    const size_t prefix = std::lower_bound(pieces.begin(), pieces.end(), we,
                                           [](const Piece& p, int64_t t) {
                                             return p.start < t;
                                           }) -
                          pieces.begin();
    // Depth-first over nodes fully inside [0, prefix) with max_end > ws.
    std::vector<std::pair<size_t, std::pair<size_t, size_t>>> stack = {
        {1, {0, leaves}}};
    while (!stack.empty()) {
      auto [v, range] = stack.back();
      stack.pop_back();
      const auto [l, r] = range;
      if (l >= prefix || max_end[v] <= ws) continue;
      if (r - l == 1) {
        const uint32_t b = pieces[l].buffer;
        used.push_back({offsets[b], offsets[b] + instance.buffers[b].size});
        continue;
      }
      const size_t m = (l + r) / 2;
      stack.push_back({2 * v + 1, {m, r}});
      stack.push_back({2 * v, {l, m}});
    }
  };
  std::vector<ReusableSpace> out;
  out.reserve(windows.size());
  for (const TimeWindow& win : windows) {
    used.clear();
    if (period > 0 && win.end > period) {
      collect(win.start, period);
      collect(0, win.end - period);
    } else {
      collect(win.start, win.end);
    }
    std::sort(used.begin(), used.end(),
              [](const AddressRange& a, const AddressRange& b) {
                return a.lo < b.lo;
              });
    ReusableSpace space;
    space.window = win;
    uint64_t free_from = 0;
    auto add_free = [&](uint64_t lo, uint64_t hi) {
      if (lo >= hi) return;
      space.ranges.push_back({lo, hi});
      const uint64_t glo = (lo + granule - 1) / granule * granule;
      const uint64_t ghi = hi / granule * granule;
      if (glo < ghi) space.granules.push_back({glo, ghi});
    };
    for (const AddressRange& r : used) {
      if (r.lo > free_from) add_free(free_from, std::min(r.lo, region_size));
      free_from = std::max(free_from, r.hi);
    }
    add_free(free_from, region_size);
    out.push_back(std::move(space));
  }
  return out;
}

}  // namespace loom::plan
