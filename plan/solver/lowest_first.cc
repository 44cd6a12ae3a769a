#include "plan/solver/lowest_first.h"

#include <algorithm>
#include <bit>
#include <numeric>
#include <queue>

namespace loom::plan {
namespace {

// Skyline over time slots: range max, and range "chmax" (raise every slot
// of a range to at least a value). Chmax tags compose by max, so no lazy
// push is needed: a slot's value is the max of the tags on its root path,
// and a node's max_ covers its subtree including its own tag.
class Skyline {
 public:
  explicit Skyline(int32_t slots)
      : leaves_(static_cast<int32_t>(
            std::bit_ceil(static_cast<uint32_t>(std::max(slots, 1))))),
        max_(2 * static_cast<size_t>(leaves_), 0),
        tag_(2 * static_cast<size_t>(leaves_), 0) {}

  uint64_t Max(int32_t lo, int32_t hi) const {
    uint64_t out = 0;
    const int32_t first = lo + leaves_;
    const int32_t last = hi - 1 + leaves_;
    for (int32_t a = first, b = last + 1; a < b; a >>= 1, b >>= 1) {
      if (a & 1) out = std::max(out, max_[a++]);
      if (b & 1) out = std::max(out, max_[--b]);
    }
    // Tags of proper ancestors apply to the whole range below them.
    for (int32_t u = first >> 1, w = last >> 1; u > 0; u >>= 1, w >>= 1) {
      out = std::max(out, std::max(tag_[u], tag_[w]));
    }
    return out;
  }

  void Raise(int32_t lo, int32_t hi, uint64_t value) {
    const int32_t first = lo + leaves_;
    const int32_t last = hi - 1 + leaves_;
    for (int32_t a = first, b = last + 1; a < b; a >>= 1, b >>= 1) {
      if (a & 1) {
        tag_[a] = std::max(tag_[a], value);
        max_[a] = std::max(max_[a], value);
        ++a;
      }
      if (b & 1) {
        --b;
        tag_[b] = std::max(tag_[b], value);
        max_[b] = std::max(max_[b], value);
      }
    }
    for (int32_t u = first >> 1, w = last >> 1; u > 0; u >>= 1, w >>= 1) {
      max_[u] = std::max(max_[u], value);
      max_[w] = std::max(max_[w], value);
    }
  }

 private:
  int32_t leaves_;
  std::vector<uint64_t> max_;
  std::vector<uint64_t> tag_;
};

}  // namespace

std::vector<uint32_t> PreorderRanks(const Problem& problem,
                                    std::string_view keys) {
  const size_t n = problem.num_buffers();
  std::vector<uint64_t> load;
  if (keys.find('T') != std::string_view::npos) {
    load = problem.MaxLoadOverLifetime();
  }
  std::vector<uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  using U128 = unsigned __int128;
  auto area = [&](uint32_t i) {
    return U128{problem.size(i)} * static_cast<uint64_t>(problem.duration(i));
  };
  std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    for (char c : keys) {
      switch (c) {
        case 'T':
          if (load[a] != load[b]) return load[a] > load[b];
          break;
        case 'A':
          if (area(a) != area(b)) return area(a) > area(b);
          break;
        case 'W':
          if (problem.duration(a) != problem.duration(b)) {
            return problem.duration(a) > problem.duration(b);
          }
          break;
        case 'Z':
          if (problem.size(a) != problem.size(b)) {
            return problem.size(a) > problem.size(b);
          }
          break;
        case 'S':
          if (problem.start(a) != problem.start(b)) {
            return problem.start(a) < problem.start(b);
          }
          break;
        default:
          LOOM_CHECK(false, "unknown preorder key '{}'", c);
      }
    }
    return false;
  });
  std::vector<uint32_t> rank(n);
  for (size_t r = 0; r < n; ++r) rank[order[r]] = static_cast<uint32_t>(r);
  return rank;
}

std::optional<Placement> PlaceLowestFirst(const Problem& problem,
                                          std::span<const uint32_t> rank,
                                          const Deadline& deadline) {
  const size_t n = problem.num_buffers();
  LOOM_CHECK_EQ(rank.size(), n);
  Skyline skyline(problem.num_slots());
  auto lowest = [&](uint32_t i) {
    uint64_t top = 0;
    for (const SlotSpan& s : problem.spans(i)) {
      top = std::max(top, skyline.Max(s.lo, s.hi));
    }
    return AlignUp(top, problem.alignment(i));
  };
  struct Item {
    uint64_t offset;
    uint32_t rank;
    uint32_t buffer;
    // Min-heap on (offset, rank).
    bool operator<(const Item& o) const {
      return offset != o.offset ? offset > o.offset : rank > o.rank;
    }
  };
  std::vector<Item> items(n);
  for (uint32_t i = 0; i < n; ++i) items[i] = {0, rank[i], i};
  std::priority_queue<Item> queue(std::less<Item>(), std::move(items));
  Placement out;
  out.offsets.assign(n, UINT64_MAX);
  uint64_t pops = 0;
  while (!queue.empty()) {
    if ((++pops & 0xffff) == 0 && deadline.Expired()) return std::nullopt;
    Item item = queue.top();
    queue.pop();
    // Keys only grow: a stale key is a lower bound, so re-queue it.
    const uint64_t now = lowest(item.buffer);
    if (now > item.offset) {
      item.offset = now;
      queue.push(item);
      continue;
    }
    const uint64_t top = now + problem.size(item.buffer);
    out.offsets[item.buffer] = now;
    out.peak = std::max(out.peak, top);
    for (const SlotSpan& s : problem.spans(item.buffer)) {
      skyline.Raise(s.lo, s.hi, top);
    }
  }
  return out;
}

}  // namespace loom::plan
