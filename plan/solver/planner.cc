#include "plan/solver/planner.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <numeric>
#include <optional>

#include "plan/solver/best_fit.h"
#include "plan/solver/deadline.h"
#include "plan/solver/exact_search.h"
#include "plan/solver/layers.h"
#include "plan/solver/local_search.h"
#include "plan/solver/lowest_first.h"
#include "plan/solver/problem.h"
#include "plan/solver/verifier.h"

namespace loom::plan {
namespace {

constexpr const char* kLowestFirstPreorders[] = {"TAW", "AWT", "TWA"};

class Driver {
 public:
  Driver(const Instance& instance, const PlannerOptions& options,
         Problem problem)
      : instance_(instance),
        options_(options),
        problem_(std::move(problem)),
        start_(Deadline::Clock::now()),
        deadline_(Deadline::In(options.time_limit_seconds)),
        progress_(options.progress && isatty(STDERR_FILENO)) {}

  StatusOr<PlanResult> Run() {
    result_.lower_bound_bytes = problem_.lower_bound();
    if (options_.capacity != 0 && problem_.lower_bound() > options_.capacity) {
      result_.capacity_infeasible = true;
    }
    switch (options_.algorithm) {
      case Algorithm::kAuto:
        Auto();
        break;
      case Algorithm::kBestFit:
        BestFitAll();
        break;
      case Algorithm::kLowestFirst:
        for (const char* keys : kLowestFirstPreorders) {
          LowestFirst(keys, deadline_);
          if (Done()) break;
        }
        if (!best_) BestFit(Order::kSize, FitRule::kBestFit);  // timed out
        break;
      case Algorithm::kLayers:
        Layers();
        break;
      case Algorithm::kExact:
        BestFit(Order::kSize, FitRule::kBestFit);
        Exact();
        break;
      case Algorithm::kLocalSearch:
        BestFit(Order::kSize, FitRule::kBestFit);
        LocalSearch();
        break;
    }
    return Finish();
  }

 private:
  double Elapsed() const { return SecondsSince(start_); }

  // True when nothing more is worth doing.
  bool Done() const {
    if (!best_) return false;
    if (deadline_.Expired()) return true;
    if (best_->peak <= std::max(problem_.lower_bound(), proven_floor_)) {
      return true;  // optimal
    }
    if (!options_.minimize) {
      return options_.capacity == 0 || best_->peak <= options_.capacity;
    }
    return false;
  }

  void Record(std::string name, const Placement* placement, double seconds,
              std::string note = "") {
    Attempt attempt;
    attempt.algorithm = name;
    attempt.peak_bytes = placement ? placement->peak : 0;
    attempt.seconds = seconds;
    attempt.note = note;
    result_.attempts.push_back(attempt);
    if (placement && (!best_ || placement->peak < best_->peak)) {
      best_ = *placement;
      result_.algorithm = std::move(name);
      seconds_to_best_ = Elapsed();
      if (progress_) {
        std::fprintf(stderr,
                     "loom plan: %7.2f s  %-24s peak %llu (%.5f x LB)\n",
                     Elapsed(), result_.algorithm.c_str(),
                     static_cast<unsigned long long>(best_->peak),
                     problem_.lower_bound() == 0
                         ? 1.0
                         : static_cast<double>(best_->peak) /
                               static_cast<double>(problem_.lower_bound()));
      }
    }
  }

  void BestFit(Order order, FitRule rule) {
    const double t0 = Elapsed();
    std::vector<uint32_t> sequence = MakeOrder(problem_, order);
    Placement placement = PlaceInOrder(problem_, sequence, rule);
    const std::string name = fmt::format(
        "{}/{}", rule == FitRule::kBestFit ? "best-fit" : "first-fit",
        OrderName(order));
    if (!best_order_ || placement.peak < best_order_peak_) {
      best_order_ = sequence;
      best_order_peak_ = placement.peak;
      best_order_rule_ = rule;
    }
    Record(name, &placement, Elapsed() - t0);
    last_best_fit_seconds_ = Elapsed() - t0;
  }

  void BestFitAll() {
    for (Order order : kAllOrders) {
      for (FitRule rule : {FitRule::kBestFit, FitRule::kFirstFit}) {
        if (best_ && (Done() || !Affordable(last_best_fit_seconds_))) return;
        BestFit(order, rule);
      }
    }
  }

  // Whether a step expected to take `seconds` fits in the time left.
  bool Affordable(double seconds) const {
    return deadline_.SecondsLeft() > 1.5 * seconds;
  }

  void LowestFirst(const char* keys, const Deadline& deadline) {
    const double t0 = Elapsed();
    std::vector<uint32_t> rank = PreorderRanks(problem_, keys);
    std::optional<Placement> placement =
        PlaceLowestFirst(problem_, rank, deadline);
    const std::string name = fmt::format("lowest-first/{}", keys);
    if (placement) {
      if (!best_lf_order_ || placement->peak < best_lf_peak_) {
        std::vector<uint32_t> order(rank.size());
        for (size_t i = 0; i < rank.size(); ++i) order[rank[i]] = i;
        best_lf_order_ = std::move(order);
        best_lf_peak_ = placement->peak;
        best_lf_seconds_ = Elapsed() - t0;
      }
      Record(name, &*placement, Elapsed() - t0);
    } else {
      Record(name, nullptr, Elapsed() - t0, "timeout");
    }
  }

  void Layers() {
    const double t0 = Elapsed();
    LayersOptions layers;
    layers.group = options_.group;
    Placement placement = PlaceByLayers(problem_, layers);
    Record(options_.group.empty() ? "layers" : "layers+groups", &placement,
           Elapsed() - t0);
  }

  void Auto() {
    // Memory layers first: cheap, and on regular training iterations (many
    // repeated sizes) often at the lower bound already.
    Layers();
    if (Done()) return;
    BestFit(Order::kSize, FitRule::kBestFit);
    if (Done()) return;
    // Lowest first can be slow on some traces: each run gets a share of
    // the time that is left.
    for (const char* keys : kLowestFirstPreorders) {
      if (Done()) return;
      LowestFirst(keys, deadline_.Within(deadline_.SecondsLeft() / 4));
    }
    BestFitAll();
    if (Done()) return;
    Exact();
    if (Done()) return;
    LocalSearch();
  }

  // Solves at `capacity` within `slice` seconds; records the attempt.
  SearchOutcome ExactAt(uint64_t capacity, double slice) {
    const double t0 = Elapsed();
    if (!exact_) {
      // Building the tables costs about 40 ns per conflicting pair (S_1:
      // 43M pairs, 1.5 s); skip the search when that would not leave time.
      const uint64_t conflicts = ExactSearch::CountConflicts(problem_);
      if (conflicts <= ExactOptions{}.max_conflicts &&
          static_cast<double>(conflicts) * 40e-9 >
              deadline_.SecondsLeft() / 2) {
        Record(
            fmt::format("exact@{}", capacity), nullptr, Elapsed() - t0,
            fmt::format("skipped: no time to build tables for {} conflicting "
                        "pairs",
                        conflicts));
        return SearchOutcome::kTooLarge;
      }
      exact_ = std::make_unique<ExactSearch>(problem_);
    }
    ExactResult r = exact_->Solve(capacity, ExactOptions{}.preorders,
                                  deadline_.Within(std::max(slice, 0.0)));
    const std::string name = fmt::format("exact@{}", capacity);
    switch (r.outcome) {
      case SearchOutcome::kFound:
        Record(name, &r.placement, Elapsed() - t0);
        break;
      case SearchOutcome::kInfeasible:
        Record(name, nullptr, Elapsed() - t0, "infeasible");
        break;
      case SearchOutcome::kTimeout:
        Record(name, nullptr, Elapsed() - t0, "timeout");
        break;
      case SearchOutcome::kTooLarge:
        Record(name, nullptr, Elapsed() - t0,
               fmt::format("declined: {} conflicting pairs", r.conflicts));
        break;
    }
    return r.outcome;
  }

  void Exact() {
    if (!best_) return;
    if (options_.capacity != 0 && best_->peak > options_.capacity &&
        !result_.capacity_infeasible) {
      const SearchOutcome outcome =
          ExactAt(options_.capacity, deadline_.SecondsLeft());
      if (outcome == SearchOutcome::kInfeasible) {
        result_.capacity_infeasible = true;
        proven_floor_ = options_.capacity + 1;
      }
      if (outcome == SearchOutcome::kTooLarge) return;
    }
    if (!options_.minimize) return;
    // Minimise. Pushing every buffer down as far as it goes never raises a
    // peak, and then each offset is 0, the top of another buffer or an
    // aligned address: the optimum is a multiple of `quantum` (the gcd of
    // the sizes and alignments), so only multiples need probing.
    uint64_t quantum = 0;
    for (size_t i = 0; i < problem_.num_buffers(); ++i) {
      quantum = std::gcd(quantum, problem_.size(i));
      if (problem_.alignment(i) > 1)
        quantum = std::gcd(quantum, problem_.alignment(i));
    }
    quantum = std::max<uint64_t>(quantum, 1);
    // The lower bound first (the plan is optimal if it fits), then "is there
    // anything better than the best?" at best - quantum, until a probe is
    // proved infeasible (the best is then optimal) or two time out in a row.
    const uint64_t lb = std::max(problem_.lower_bound(), proven_floor_);
    if (best_->peak > lb && !deadline_.Expired()) {
      // A quarter of the time: real traces fit at the bound quickly when
      // they fit at all; constructed ones (MiniMalloc D) may never answer.
      const SearchOutcome outcome = ExactAt(lb, deadline_.SecondsLeft() / 4);
      if (outcome == SearchOutcome::kTooLarge) return;
      if (outcome == SearchOutcome::kInfeasible) {
        proven_floor_ = (lb / quantum + 1) * quantum;
      }
    }
    int timeouts = 0;
    while (best_->peak > std::max(lb, proven_floor_) + quantum - 1 &&
           timeouts < 2 && !deadline_.Expired()) {
      const uint64_t capacity = best_->peak - quantum;
      const SearchOutcome outcome =
          ExactAt(capacity, deadline_.SecondsLeft() / 2);
      if (outcome == SearchOutcome::kInfeasible) {
        proven_floor_ = best_->peak;  // nothing below it: optimal
        break;
      }
      timeouts = outcome == SearchOutcome::kTimeout ? timeouts + 1 : 0;
    }
  }

  // The local search around whichever greedy family did better:
  // lowest-first preorders, or best-fit orders.
  void LocalSearch() {
    const double t0 = Elapsed();
    LocalSearchOptions ls;
    ls.seed = options_.seed;
    ls.rule = best_order_rule_;
    ls.target = std::max(problem_.lower_bound(), proven_floor_);
    if (best_lf_order_ && (!best_order_ || best_lf_peak_ <= best_order_peak_) &&
        Affordable(best_lf_seconds_)) {
      LocalSearchResult r =
          ImproveLowestFirst(problem_, *best_lf_order_, ls, deadline_);
      if (!r.best.offsets.empty()) {
        Record(fmt::format("local-search/lowest-first({} steps)", r.steps),
               &r.best, Elapsed() - t0);
      }
      return;
    }
    if (!best_order_ || !Affordable(last_best_fit_seconds_)) return;
    LocalSearchResult r = ImproveOrder(problem_, *best_order_, ls, deadline_);
    Record(fmt::format("local-search/best-fit({} steps)", r.steps), &r.best,
           Elapsed() - t0);
  }

  StatusOr<PlanResult> Finish() {
    if (!best_) return InternalError("no plan was produced");
    result_.offsets = best_->offsets;
    result_.peak_bytes = best_->peak;
    result_.seconds = Elapsed();
    result_.seconds_to_best = seconds_to_best_;
    result_.optimal = best_->peak <= problem_.lower_bound() ||
                      (proven_floor_ > 0 && best_->peak <= proven_floor_);
    result_.fits = options_.capacity == 0 || best_->peak <= options_.capacity;
    result_.granule_bytes = options_.granule_bytes;
    Instance reserved = instance_;
    result_.sizes.resize(problem_.num_buffers());
    for (size_t i = 0; i < problem_.num_buffers(); ++i) {
      result_.sizes[i] = problem_.size(i);
      reserved.buffers[i].size = problem_.size(i);
    }
    result_.peak_granules =
        PeakGranules(reserved, result_.offsets, options_.granule_bytes);
    // Never hand out a plan the independent verifier rejects.
    VerifyOptions verify;
    verify.size_round = options_.size_round;
    verify.min_alignment = options_.min_alignment;
    Verdict verdict = VerifyPlacement(instance_, result_.offsets, verify);
    if (!verdict.valid()) {
      return InternalError("the {} plan failed verification: {}",
                           result_.algorithm, verdict.message);
    }
    if (progress_) {
      std::fprintf(stderr, "loom plan: done in %.2f s (best after %.2f s)\n",
                   result_.seconds, seconds_to_best_);
    }
    return std::move(result_);
  }

  const Instance& instance_;
  const PlannerOptions& options_;
  const Problem problem_;
  const Deadline::Clock::time_point start_;
  const Deadline deadline_;
  const bool progress_;

  PlanResult result_;
  std::optional<Placement> best_;
  double seconds_to_best_ = 0;
  std::optional<std::vector<uint32_t>> best_order_;
  uint64_t best_order_peak_ = 0;
  FitRule best_order_rule_ = FitRule::kBestFit;
  double last_best_fit_seconds_ = 0;
  std::optional<std::vector<uint32_t>> best_lf_order_;  // by rank
  uint64_t best_lf_peak_ = 0;
  double best_lf_seconds_ = 0;
  uint64_t proven_floor_ = 0;  // no plan has a peak below this
  std::unique_ptr<ExactSearch> exact_;
};

}  // namespace

std::string_view AlgorithmName(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::kAuto:
      return "auto";
    case Algorithm::kBestFit:
      return "best-fit";
    case Algorithm::kLowestFirst:
      return "lowest-first";
    case Algorithm::kLayers:
      return "layers";
    case Algorithm::kExact:
      return "exact";
    case Algorithm::kLocalSearch:
      return "local-search";
  }
  return "?";
}

StatusOr<Algorithm> ParseAlgorithm(std::string_view name) {
  for (Algorithm a :
       {Algorithm::kAuto, Algorithm::kBestFit, Algorithm::kLowestFirst,
        Algorithm::kLayers, Algorithm::kExact, Algorithm::kLocalSearch}) {
    if (AlgorithmName(a) == name) return a;
  }
  return InvalidArgumentError(
      "unknown algorithm '{}' (auto, best-fit, lowest-first, layers, exact, "
      "local-search)",
      name);
}

StatusOr<PlanResult> PlanInstance(const Instance& instance,
                                  const PlannerOptions& options) {
  if (!(options.time_limit_seconds > 0)) {
    return InvalidArgumentError("time limit {} s must be positive",
                                options.time_limit_seconds);
  }
  if (options.granule_bytes == 0) {
    return InvalidArgumentError("granule size must be positive");
  }
  if (!options.group.empty() &&
      options.group.size() != instance.buffers.size()) {
    return InvalidArgumentError("{} group keys for {} buffers",
                                options.group.size(), instance.buffers.size());
  }
  LOOM_ASSIGN_OR_RETURN(
      Problem problem,
      Problem::Make(instance, options.size_round, options.min_alignment));
  if (instance.period > 0 && problem.num_slots() > 0) {
    // A cyclic plan may start its iteration anywhere: cut the circle where
    // the fewest bytes are live, so the fewest buffers wrap around. Buffer
    // i stays buffer i and conflicts are unchanged, so offsets carry over.
    const std::vector<uint64_t>& load = problem.slot_load();
    const int32_t cut = static_cast<int32_t>(
        std::min_element(load.begin(), load.end()) - load.begin());
    const int64_t shift = problem.slot_time(cut);
    if (shift != 0) {
      Instance rotated = instance;
      for (Buffer& b : rotated.buffers) {
        const int64_t length = b.end - b.start;
        b.start = ((b.start - shift) % instance.period + instance.period) %
                  instance.period;
        b.end = b.start + length;
      }
      LOOM_ASSIGN_OR_RETURN(problem, Problem::Make(rotated, options.size_round,
                                                   options.min_alignment));
    }
  }
  Driver driver(instance, options, std::move(problem));
  return driver.Run();
}

}  // namespace loom::plan
