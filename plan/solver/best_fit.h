// Greedy placement in a fixed order: best fit / first fit (pure C++).
//
// The production heuristic of TFLite, XLA and PyTorch Inductor: sort the
// buffers, then put each one into the smallest free gap (best fit) or the
// lowest one (first fit) among the buffers already placed that share a time
// slot with it, or on top when no gap fits. Several orders are provided
// because none wins everywhere; BestOfOrders runs a list of them and keeps
// the lowest peak, as XLA's ChooseBestHeapAlgorithm does.
//
// Cost: O(n log n) for the order plus one GapIndex insert and query per
// buffer; 300,000 buffers take about a second.
#ifndef LOOM_PLAN_SOLVER_BEST_FIT_H_
#define LOOM_PLAN_SOLVER_BEST_FIT_H_

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "plan/solver/gap_index.h"
#include "plan/solver/problem.h"

namespace loom::plan {

enum class Order {
  kSize,      // size descending, then longer lifetime (TFLite, XLA spatial)
  kDuration,  // lifetime descending, then size (XLA temporal)
  kArea,      // size x lifetime descending
  kStart,     // start time ascending, then size: what an online allocator sees
  kLoad,      // max live bytes over the lifetime descending, then size
              // (MiniMalloc's "T"): crowded buffers first
};

inline constexpr Order kAllOrders[] = {
    Order::kSize, Order::kDuration, Order::kArea, Order::kStart, Order::kLoad};

// "size", "duration", "area", "start", "load".
std::string_view OrderName(Order order);

// The buffers of `problem` sorted by `order` (ties: buffer index).
std::vector<uint32_t> MakeOrder(const Problem& problem, Order order);

// Places the buffers one by one in `order` (a permutation of all buffer
// indices) with `rule`.
// REQUIRES: order is a permutation of [0, problem.num_buffers()).
Placement PlaceInOrder(const Problem& problem, std::span<const uint32_t> order,
                       FitRule rule = FitRule::kBestFit);

struct GreedyResult {
  Placement placement;
  Order order = Order::kSize;
  FitRule rule = FitRule::kBestFit;
};

// Runs every (order, rule) pair and returns the lowest peak (the first
// pair listed wins ties).
GreedyResult BestOfOrders(const Problem& problem,
                          std::span<const Order> orders = kAllOrders,
                          std::span<const FitRule> rules = {});

}  // namespace loom::plan

#endif  // LOOM_PLAN_SOLVER_BEST_FIT_H_
