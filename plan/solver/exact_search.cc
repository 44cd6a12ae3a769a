#include "plan/solver/exact_search.h"

#include <pthread.h>

#include <algorithm>
#include <array>
#include <bit>
#include <memory>
#include <numeric>

#include "plan/solver/exact_tables.h"

namespace loom::plan {
namespace {

using exact_internal::BuildSearchTables;
using exact_internal::RangeMax;
using exact_internal::SearchTables;
using exact_internal::SectionRange;

constexpr uint64_t kUnplaced = UINT64_MAX;
// Work allowed per placement for the unallocated-floor strengthening.
constexpr int64_t kFloorBudget = 1 << 13;

// kPrune: not found, and the caller may skip the remaining siblings.
enum class Step { kFound, kNotFound, kNodeLimit, kTimeout, kPrune };

// A set of sections [lo, hi) solved independently of the others.
struct Partition {
  int32_t lo = 0;
  int32_t hi = 0;
};

struct Entry {
  uint64_t offset;
  uint32_t rank;
  uint32_t buffer;
  bool operator<(const Entry& o) const {
    return offset != o.offset ? offset < o.offset : rank < o.rank;
  }
};

}  // namespace

class ExactSearch::Solver {
 public:
  Solver(const Problem& problem, std::vector<uint64_t> fixed)
      : p_(problem), fixed_(std::move(fixed)), t_(BuildSearchTables(problem)) {}

  ExactResult Run(uint64_t capacity, const std::vector<std::string>& preorders,
                  const Deadline& deadline) {
    capacity_ = capacity;
    deadline_ = deadline;
    nodes_ = 0;
    timed_out_ = false;
    ExactResult result;
    const size_t n = p_.num_buffers();
    if (p_.lower_bound() > capacity_) {
      result.outcome = SearchOutcome::kInfeasible;
      return result;
    }
    if (!Reset()) {
      result.outcome = SearchOutcome::kInfeasible;
      return result;
    }
    const std::vector<Partition> partitions = InitialPartitions();
    int64_t node_limit = std::max<int64_t>(static_cast<int64_t>(n), 64);
    const bool round_robin = preorders.size() > 1;
    while (true) {
      node_limit = round_robin ? node_limit * 2 : INT64_MAX;
      for (const std::string& preorder : preorders) {
        preorder_ = preorder;
        nodes_left_ = node_limit;
        Step step = Step::kFound;
        for (const Partition& part : partitions) {
          step = SubSolve(part, 0);
          if (step != Step::kFound) break;
        }
        result.nodes = nodes_;
        if (step == Step::kFound) {
          result.outcome = SearchOutcome::kFound;
          result.placement.offsets = solution_;
          result.placement.peak = p_.PeakOf(solution_);
          return result;
        }
        if (step == Step::kNotFound) {
          result.outcome = SearchOutcome::kInfeasible;
          return result;
        }
        if (step == Step::kTimeout) {
          result.outcome = SearchOutcome::kTimeout;
          return result;
        }
      }
    }
  }

 private:
  bool IsFixed(uint32_t b) const {
    return !fixed_.empty() && fixed_[b] != ExactOptions::kFree;
  }

  std::span<const SectionRange> Ranges(size_t i) const { return t_.Ranges(i); }

  // Returns false when fixed buffers already make the instance infeasible.
  bool Reset() {
    const size_t n = p_.num_buffers();
    offset_.assign(n, kUnplaced);
    rank_.assign(n, 0);
    min_offset_.assign(n, 0);
    solution_.assign(n, kUnplaced);
    floor_.assign(t_.num_sections, 0);
    total_ = t_.section_total;
    max_total_.Init(t_.section_total);
    cuts_ = t_.initial_cuts;
    stamp_.assign(t_.num_sections, 0);
    stamp_counter_ = 0;
    moved_.assign(n, 0);
    move_stamp_ = 0;
    if (fixed_.empty()) return true;
    for (size_t i = 0; i < n; ++i) {
      if (IsFixed(i)) min_offset_[i] = fixed_[i];
    }
    for (int32_t k = 0; k < t_.num_sections; ++k) {
      uint64_t lowest = UINT64_MAX;
      for (uint32_t m : t_.members[k])
        lowest = std::min(lowest, min_offset_[m]);
      if (lowest != UINT64_MAX) floor_[k] = lowest;
      if (floor_[k] + total_[k] > capacity_) return false;
    }
    return true;
  }

  std::vector<Partition> InitialPartitions() const {
    std::vector<Partition> out;
    int32_t lo = 0;
    for (int32_t k = 0; k < t_.num_sections; ++k) {
      if (k + 1 == t_.num_sections || t_.initial_cuts[k] == 0) {
        Partition part{lo, k + 1};
        bool any = false;
        ForEachUnplaced(part, [&](uint32_t) { any = true; });
        if (any) out.push_back(part);
        lo = k + 1;
      }
    }
    return out;
  }

  // Static preorder of a partition's unplaced buffers (recomputed for each
  // partition, with the section totals still to place): rank_[i] is
  // buffer i's position.
  void Rank(std::span<const uint32_t> buffers) {
    using U128 = unsigned __int128;
    struct Key {
      uint32_t buffer;
      uint64_t total;
    };
    std::vector<Key> keys;
    keys.reserve(buffers.size());
    const bool need_total = preorder_.find('T') != std::string::npos;
    for (uint32_t i : buffers) {
      uint64_t total = 0;
      if (need_total) {
        for (const SectionRange& r : Ranges(i)) {
          total = std::max<uint64_t>(
              total, static_cast<uint64_t>(max_total_.Max(r.lo, r.hi)));
        }
      }
      keys.push_back({i, total});
    }
    std::stable_sort(
        keys.begin(), keys.end(), [&](const Key& ka, const Key& kb) {
          const uint32_t a = ka.buffer;
          const uint32_t b = kb.buffer;
          for (char c : preorder_) {
            switch (c) {
              case 'W':
                if (p_.duration(a) != p_.duration(b))
                  return p_.duration(a) > p_.duration(b);
                break;
              case 'A': {
                U128 aa =
                    U128{p_.size(a)} * static_cast<uint64_t>(p_.duration(a));
                U128 ab =
                    U128{p_.size(b)} * static_cast<uint64_t>(p_.duration(b));
                if (aa != ab) return aa > ab;
                break;
              }
              case 'T':
                if (ka.total != kb.total) return ka.total > kb.total;
                break;
              case 'Z':
                if (p_.size(a) != p_.size(b)) return p_.size(a) > p_.size(b);
                break;
              case 'S':
                if (p_.start(a) != p_.start(b))
                  return p_.start(a) < p_.start(b);
                break;
              default:
                LOOM_CHECK(false, "unknown preorder key '{}'", c);
            }
          }
          return a < b;
        });
    for (size_t r = 0; r < keys.size(); ++r)
      rank_[keys[r].buffer] = static_cast<uint32_t>(r);
  }

  // The unplaced buffers of a partition: those whose envelope starts in
  // it (no unplaced envelope straddles a partition boundary).
  template <typename Fn>
  void ForEachUnplaced(const Partition& part, Fn fn) const {
    auto first = std::lower_bound(t_.env_lo_sorted.begin(),
                                  t_.env_lo_sorted.end(), part.lo);
    auto last = std::lower_bound(first, t_.env_lo_sorted.end(), part.hi);
    for (auto it = first; it != last; ++it) {
      const uint32_t b = t_.by_env_lo[it - t_.env_lo_sorted.begin()];
      if (offset_[b] == kUnplaced) fn(b);
    }
  }

  // current_ = the unplaced buffers of `part` sorted by (min offset, rank).
  void BuildOrder(const Partition& part) {
    current_.clear();
    ForEachUnplaced(part, [&](uint32_t b) {
      current_.push_back({min_offset_[b], rank_[b], b});
    });
    std::sort(current_.begin(), current_.end());
  }

  Step SubSolve(const Partition& part, int depth) {
    std::vector<uint32_t> unplaced;
    ForEachUnplaced(part, [&](uint32_t b) { unplaced.push_back(b); });
    std::vector<uint32_t> saved_ranks(unplaced.size());
    for (size_t k = 0; k < unplaced.size(); ++k)
      saved_ranks[k] = rank_[unplaced[k]];
    Rank(unplaced);
    BuildOrder(part);
    Step step = Search(part, 0, 0, depth + 1);
    for (size_t k = 0; k < unplaced.size(); ++k)
      rank_[unplaced[k]] = saved_ranks[k];
    return step;
  }

  bool OutOfTime() {
    if (!timed_out_ && deadline_.Expired()) timed_out_ = true;
    return timed_out_;
  }

  // Merges the sorted `extra` into current_ after dropping the entries of
  // buffers stamped in moved_: O(|current_| + |extra| log |extra|).
  void Reorder(std::vector<Entry>& extra, uint64_t stamp) {
    std::sort(extra.begin(), extra.end());
    merged_.clear();
    merged_.reserve(current_.size() + extra.size());
    auto x = extra.begin();
    for (const Entry& e : current_) {
      if (moved_[e.buffer] == stamp) continue;
      while (x != extra.end() && *x < e) merged_.push_back(*x++);
      merged_.push_back(e);
    }
    merged_.insert(merged_.end(), x, extra.end());
    current_.swap(merged_);
  }

  // current_ after placing `placed`: it leaves, the buffers raised since
  // offset_log_[log_mark] move to their new keys.
  void OrderAfterPlace(uint32_t placed, size_t log_mark) {
    const uint64_t stamp = ++move_stamp_;
    moved_[placed] = stamp;
    extra_.clear();
    for (size_t k = log_mark; k < offset_log_.size(); ++k) {
      const uint32_t o = offset_log_[k].first;
      moved_[o] = stamp;
      extra_.push_back({min_offset_[o], rank_[o], o});
    }
    Reorder(extra_, stamp);
  }

  // The inverse of OrderAfterPlace (before the min offsets are restored).
  void OrderBeforePlace(const Entry& placed, size_t log_mark) {
    const uint64_t stamp = ++move_stamp_;
    extra_.clear();
    extra_.push_back(placed);
    for (size_t k = log_mark; k < offset_log_.size(); ++k) {
      const uint32_t o = offset_log_[k].first;
      moved_[o] = stamp;
      extra_.push_back({offset_log_[k].second, rank_[o], o});
    }
    Reorder(extra_, stamp);
  }

  // A node: current_ holds the partition's unplaced buffers, sorted. Each
  // child leaves current_ exactly as it found it, so siblings are found by
  // index and a node needs O(1) memory.
  Step Search(const Partition& part, uint64_t last_offset, uint32_t last_rank,
              int depth) {
    if (--nodes_left_ < 0) return Step::kNodeLimit;
    ++nodes_;
    if (OutOfTime()) return Step::kTimeout;
    if (current_.empty()) return Step::kFound;
    // The lowest top any unplaced buffer can reach. Entries are sorted by
    // offset, so once an offset reaches the running minimum no later entry
    // can lower it.
    uint64_t min_height = UINT64_MAX;
    for (const Entry& e : current_) {
      if (e.offset >= min_height) break;
      min_height = std::min(min_height, e.offset + p_.size(e.buffer));
    }
    // Canonical: only (offset, rank) after the last placement.
    size_t index = std::lower_bound(current_.begin(), current_.end(),
                                    Entry{last_offset, last_rank, 0}) -
                   current_.begin();
    int tried = 0;
    for (; index < current_.size(); ++index) {
      const Entry e = current_[index];
      if (e.offset >= min_height) break;  // dominated (sorted by offset)
      if (IsFixed(e.buffer) && e.offset != fixed_[e.buffer]) continue;
      if ((++tried & 63) == 0 && OutOfTime()) return Step::kTimeout;
      Step step = Place(part, e, depth);
      if (step == Step::kPrune) break;
      if (step != Step::kNotFound) return step;
    }
    return Step::kNotFound;
  }

  Step Place(const Partition& part, const Entry& e, int depth) {
    const uint32_t b = e.buffer;
    const uint64_t size = p_.size(b);
    const uint64_t height = e.offset + size;
    const size_t offset_mark = offset_log_.size();
    const size_t floor_mark = floor_log_.size();
    offset_[b] = e.offset;
    solution_[b] = e.offset;
    bool ok = true;
    // Raise the min offsets of unplaced neighbours.
    const uint64_t stamp = ++stamp_counter_;
    const size_t affected_mark = affected_.size();
    bool hatless = true;  // no unplaced buffer conflicts with b
    // The unallocated floor below is a strengthening, not needed for
    // soundness: on huge instances it is bounded to keep nodes cheap.
    int64_t budget = kFloorBudget;
    for (uint32_t o : t_.overlaps[b]) {
      if (offset_[o] != kUnplaced) continue;
      hatless = false;
      if (min_offset_[o] >= height) continue;
      offset_log_.push_back({o, min_offset_[o]});
      min_offset_[o] = AlignUp(height, p_.alignment(o));
      if (IsFixed(o)) ok = false;  // pushed off its fixed offset
      if (budget <= 0) continue;
      for (const SectionRange& r : Ranges(o)) {
        budget -= r.hi - r.lo;
        for (int32_t k = r.lo; k < r.hi; ++k) {
          if (stamp_[k] != stamp) {
            stamp_[k] = stamp;
            affected_.push_back(k);
          }
        }
      }
    }
    // The sections of b: floor = its top, one size less to place.
    for (const SectionRange& r : Ranges(b)) {
      max_total_.Add(r.lo, r.hi, -static_cast<int64_t>(size));
      for (int32_t k = r.lo; k < r.hi; ++k) {
        floor_log_.push_back({k, floor_[k]});
        floor_[k] = std::max(floor_[k], height);
        total_[k] -= size;
        if (floor_[k] + total_[k] > capacity_) ok = false;
      }
    }
    // Unallocated floor: a section's unplaced buffers all sit at or above
    // their min offsets, so the floor rises to the lowest of them.
    for (size_t a = affected_mark; a < affected_.size() && ok; ++a) {
      const int32_t k = affected_[a];
      const uint64_t floor = floor_[k];
      uint64_t lowest = UINT64_MAX;
      if (budget <= -kFloorBudget) break;
      for (uint32_t m : t_.members[k]) {
        --budget;
        if (offset_[m] != kUnplaced) continue;
        lowest = std::min(lowest, min_offset_[m]);
        if (lowest <= floor) break;
      }
      if (lowest != UINT64_MAX && lowest > floor) {
        floor_log_.push_back({k, floor});
        floor_[k] = lowest;
        if (lowest + total_[k] > capacity_) ok = false;
      }
    }
    affected_.resize(affected_mark);
    // Offsets only grow from here on in this partition: every section must
    // fit its remaining buffers above the current offset.
    if (ok && e.offset + static_cast<uint64_t>(std::max<int64_t>(
                             max_total_.Max(part.lo, part.hi), 0)) >
                  capacity_) {
      ok = false;
    }
    Step step = Step::kNotFound;
    if (ok) {
      OrderAfterPlace(b, offset_mark);
      step = Decompose(part, e, depth);
      // Undo in reverse. After kFound, kTimeout or kNodeLimit the search
      // is over and current_ is rebuilt before any further use.
      if (step == Step::kNotFound) OrderBeforePlace(e, offset_mark);
    }
    for (const SectionRange& r : Ranges(b)) {
      max_total_.Add(r.lo, r.hi, static_cast<int64_t>(size));
      for (int32_t k = r.lo; k < r.hi; ++k) total_[k] += size;
    }
    while (floor_log_.size() > floor_mark) {
      floor_[floor_log_.back().first] = floor_log_.back().second;
      floor_log_.pop_back();
    }
    while (offset_log_.size() > offset_mark) {
      min_offset_[offset_log_.back().first] = offset_log_.back().second;
      offset_log_.pop_back();
    }
    offset_[b] = kUnplaced;
    // Hatless pruning: b constrains no unplaced buffer, so if the rest
    // cannot be placed with b at its lowest offset, no sibling helps.
    if (step == Step::kNotFound && hatless) step = Step::kPrune;
    return step;
  }

  Step Decompose(const Partition& part, const Entry& e, int depth) {
    const uint32_t b = e.buffer;
    const SectionRange env = t_.env[b];
    std::vector<int32_t> cutpoints;
    for (int32_t k = env.lo; k + 1 < env.hi; ++k) {
      if (--cuts_[k] == 0 && k >= part.lo && k + 1 < part.hi)
        cutpoints.push_back(k + 1);
    }
    Step step = Step::kFound;
    if (cutpoints.empty()) {
      step = Search(part, e.offset, e.rank, depth + 1);
    } else {
      cutpoints.insert(cutpoints.begin(), part.lo);
      cutpoints.push_back(part.hi);
      for (size_t c = 1; c < cutpoints.size() && step == Step::kFound; ++c) {
        Partition sub{cutpoints[c - 1], cutpoints[c]};
        bool any = false;
        ForEachUnplaced(sub, [&](uint32_t) { any = true; });
        if (!any) continue;
        step = SubSolve(sub, depth + 1);
      }
      // The sub-partitions replaced current_: rebuild this partition's.
      if (step == Step::kNotFound) BuildOrder(part);
    }
    for (int32_t k = env.lo; k + 1 < env.hi; ++k) ++cuts_[k];
    return step;
  }

  const Problem& p_;
  const std::vector<uint64_t> fixed_;
  uint64_t capacity_ = 0;
  Deadline deadline_ = Deadline::Infinite();

  const SearchTables t_;

  std::string preorder_;
  std::vector<uint32_t> rank_;
  std::vector<uint64_t> offset_, min_offset_, solution_;
  std::vector<uint64_t> floor_, total_;
  RangeMax max_total_;
  std::vector<int32_t> cuts_;
  std::vector<uint64_t> stamp_;
  std::vector<int32_t> affected_;
  uint64_t stamp_counter_ = 0;
  std::vector<std::pair<uint32_t, uint64_t>> offset_log_;
  std::vector<std::pair<int32_t, uint64_t>> floor_log_;
  std::vector<Entry> current_, merged_, extra_;
  std::vector<uint64_t> moved_;
  uint64_t move_stamp_ = 0;
  int64_t nodes_left_ = 0;
  int64_t nodes_ = 0;
  bool timed_out_ = false;
};

namespace {

// Runs `fn` on a new thread with a stack of `bytes` and waits for it.
template <typename Fn>
void RunWithStack(size_t bytes, Fn fn) {
  pthread_attr_t attr;
  LOOM_CHECK_EQ(pthread_attr_init(&attr), 0);
  LOOM_CHECK_EQ(pthread_attr_setstacksize(&attr, bytes), 0);
  pthread_t thread;
  auto trampoline = [](void* arg) -> void* {
    (*static_cast<Fn*>(arg))();
    return nullptr;
  };
  LOOM_CHECK_EQ(pthread_create(&thread, &attr, trampoline, &fn), 0);
  LOOM_CHECK_EQ(pthread_join(thread, nullptr), 0);
  pthread_attr_destroy(&attr);
}

// The search recurses about three frames per placed buffer: it runs on a
// thread whose stack fits the deepest path.
size_t StackBytes(const Problem& problem) {
  return (size_t{8} << 20) + problem.num_buffers() * size_t{2048};
}

}  // namespace

ExactSearch::ExactSearch(const Problem& problem, std::vector<uint64_t> fixed,
                         uint64_t max_conflicts)
    : problem_(problem) {
  LOOM_CHECK(fixed.empty() || fixed.size() == problem.num_buffers());
  conflicts_ = exact_internal::CountConflicts(problem);
  if (conflicts_ > max_conflicts || problem.num_buffers() == 0) return;
  RunWithStack(StackBytes(problem), [&] {
    solver_ = std::make_unique<Solver>(problem, std::move(fixed));
  });
}

ExactSearch::~ExactSearch() = default;

uint64_t ExactSearch::CountConflicts(const Problem& problem) {
  return exact_internal::CountConflicts(problem);
}

ExactResult ExactSearch::Solve(uint64_t capacity,
                               const std::vector<std::string>& preorders,
                               const Deadline& deadline) {
  LOOM_CHECK_GT(capacity, 0u);
  LOOM_CHECK(!preorders.empty());
  ExactResult result;
  result.conflicts = conflicts_;
  if (problem_.num_buffers() == 0) {
    result.outcome = SearchOutcome::kFound;
    return result;
  }
  if (!solver_) {
    result.outcome = SearchOutcome::kTooLarge;
    return result;
  }
  RunWithStack(StackBytes(problem_),
               [&] { result = solver_->Run(capacity, preorders, deadline); });
  result.conflicts = conflicts_;
  return result;
}

ExactResult SolveAtCapacity(const Problem& problem, const ExactOptions& options,
                            const Deadline& deadline) {
  ExactSearch search(problem, options.fixed, options.max_conflicts);
  return search.Solve(options.capacity, options.preorders, deadline);
}

}  // namespace loom::plan
