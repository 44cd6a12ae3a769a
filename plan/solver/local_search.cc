#include "plan/solver/local_search.h"

#include <algorithm>
#include <optional>
#include <random>

#include "plan/solver/best_fit.h"
#include "plan/solver/lowest_first.h"

namespace loom::plan {
namespace {

// The iterated greedy shared by both neighbourhoods: `evaluate` places the
// buffers for an order, or returns nullopt when the deadline passed.
template <typename Evaluate>
LocalSearchResult Improve(const Problem& problem, std::vector<uint32_t> order,
                          const LocalSearchOptions& options,
                          const Deadline& deadline, Evaluate evaluate) {
  const size_t n = problem.num_buffers();
  LOOM_CHECK_EQ(order.size(), n);
  LocalSearchResult result;
  std::optional<Placement> first = evaluate(order);
  if (!first) return result;  // no time for even one placement
  Placement current = std::move(*first);
  result.best = current;
  result.order = order;
  if (n < 2) return result;
  std::mt19937_64 rng(options.seed);
  std::vector<uint32_t> critical;
  std::vector<uint32_t> candidate;
  double step_seconds = 0;
  while (!deadline.Expired() &&
         (options.max_steps == 0 || result.steps < options.max_steps) &&
         result.best.peak > options.target &&
         deadline.SecondsLeft() > step_seconds) {
    const auto step_start = Deadline::Clock::now();
    ++result.steps;
    // The buffers that reach the current peak.
    critical.clear();
    for (uint32_t i = 0; i < n; ++i) {
      if (current.offsets[i] + problem.size(i) == current.peak) {
        critical.push_back(i);
      }
    }
    candidate = order;
    const size_t moves = 1 + rng() % std::min<size_t>(3, critical.size());
    for (size_t m = 0; m < moves; ++m) {
      const uint32_t b = critical[rng() % critical.size()];
      const auto from = std::find(candidate.begin(), candidate.end(), b);
      const size_t p = static_cast<size_t>(from - candidate.begin());
      if (p == 0) continue;
      const size_t to = rng() % p;
      std::rotate(candidate.begin() + to, from, from + 1);
    }
    std::optional<Placement> next = evaluate(candidate);
    step_seconds = SecondsSince(step_start);
    if (!next) break;
    if (next->peak <= current.peak) {
      order.swap(candidate);
      current = std::move(*next);
      if (current.peak < result.best.peak) {
        result.best = current;
        result.order = order;
        ++result.improvements;
      }
    }
  }
  return result;
}

}  // namespace

LocalSearchResult ImproveOrder(const Problem& problem,
                               std::vector<uint32_t> order,
                               const LocalSearchOptions& options,
                               const Deadline& deadline) {
  return Improve(
      problem, std::move(order), options, deadline,
      [&](const std::vector<uint32_t>& o) {
        return std::optional<Placement>(PlaceInOrder(problem, o, options.rule));
      });
}

LocalSearchResult ImproveLowestFirst(const Problem& problem,
                                     std::vector<uint32_t> order,
                                     const LocalSearchOptions& options,
                                     const Deadline& deadline) {
  std::vector<uint32_t> rank(problem.num_buffers());
  return Improve(problem, std::move(order), options, deadline,
                 [&](const std::vector<uint32_t>& o) {
                   for (size_t k = 0; k < o.size(); ++k) {
                     rank[o[k]] = static_cast<uint32_t>(k);
                   }
                   return PlaceLowestFirst(problem, rank, deadline);
                 });
}

}  // namespace loom::plan
