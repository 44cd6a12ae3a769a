#include "plan/solver/best_fit.h"

#include <algorithm>
#include <numeric>

namespace loom::plan {

std::string_view OrderName(Order order) {
  switch (order) {
    case Order::kSize:
      return "size";
    case Order::kDuration:
      return "duration";
    case Order::kArea:
      return "area";
    case Order::kStart:
      return "start";
    case Order::kLoad:
      return "load";
  }
  return "?";
}

std::vector<uint32_t> MakeOrder(const Problem& problem, Order order) {
  const size_t n = problem.num_buffers();
  std::vector<uint32_t> out(n);
  std::iota(out.begin(), out.end(), 0u);
  auto sort_by = [&](auto key) {
    // Key tuples compare descending by construction (callers negate where
    // they want ascending); ties go to the lower index.
    std::stable_sort(out.begin(), out.end(),
                     [&](uint32_t a, uint32_t b) { return key(a) > key(b); });
  };
  using U128 = unsigned __int128;
  switch (order) {
    case Order::kSize:
      sort_by([&](uint32_t i) {
        return std::pair(problem.size(i), problem.duration(i));
      });
      break;
    case Order::kDuration:
      sort_by([&](uint32_t i) {
        return std::pair(problem.duration(i), problem.size(i));
      });
      break;
    case Order::kArea:
      sort_by([&](uint32_t i) {
        return std::pair(
            U128{problem.size(i)} * static_cast<uint64_t>(problem.duration(i)),
            problem.size(i));
      });
      break;
    case Order::kStart:
      sort_by([&](uint32_t i) {
        return std::pair(-problem.start(i), problem.size(i));
      });
      break;
    case Order::kLoad: {
      std::vector<uint64_t> loads = problem.MaxLoadOverLifetime();
      sort_by([&](uint32_t i) { return std::pair(loads[i], problem.size(i)); });
      break;
    }
  }
  return out;
}

Placement PlaceInOrder(const Problem& problem, std::span<const uint32_t> order,
                       FitRule rule) {
  LOOM_CHECK_EQ(order.size(), problem.num_buffers());
  GapIndex index(problem.num_slots());
  Placement out;
  out.offsets.assign(problem.num_buffers(), UINT64_MAX);
  for (uint32_t i : order) {
    const uint64_t size = problem.size(i);
    const uint64_t at =
        index.Find(problem.spans(i), size, problem.alignment(i), rule);
    LOOM_CHECK(out.offsets[i] == UINT64_MAX, "buffer {} twice in the order", i);
    out.offsets[i] = at;
    index.Insert(problem.spans(i), at, at + size);
    out.peak = std::max(out.peak, at + size);
  }
  return out;
}

GreedyResult BestOfOrders(const Problem& problem, std::span<const Order> orders,
                          std::span<const FitRule> rules) {
  static constexpr FitRule kBoth[] = {FitRule::kBestFit, FitRule::kFirstFit};
  if (rules.empty()) rules = kBoth;
  GreedyResult best;
  bool have = false;
  for (Order order : orders) {
    const std::vector<uint32_t> sequence = MakeOrder(problem, order);
    for (FitRule rule : rules) {
      Placement placement = PlaceInOrder(problem, sequence, rule);
      if (!have || placement.peak < best.placement.peak) {
        best = {std::move(placement), order, rule};
        have = true;
      }
    }
  }
  return best;
}

}  // namespace loom::plan
