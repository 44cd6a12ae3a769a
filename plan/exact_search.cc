#include "plan/exact_search.h"

#include <algorithm>
#include <array>
#include <deque>
#include <numeric>

namespace loom::plan {
namespace {

constexpr uint64_t kUnplaced = UINT64_MAX;

// kPrune: not found, and the caller may skip the remaining siblings.
enum class Step { kFound, kNotFound, kNodeLimit, kTimeout, kPrune };

struct SectionRange {
  int32_t lo = 0;
  int32_t hi = 0;
};

struct Partition {
  std::vector<uint32_t> buffers;
  int32_t lo = 0;  // sections [lo, hi)
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

class Solver {
 public:
  Solver(const Problem& problem, uint64_t capacity, const Deadline& deadline)
      : p_(problem), capacity_(capacity), deadline_(deadline) {
    BuildSections();
  }

  ExactResult Run(const std::vector<std::string>& preorders) {
    ExactResult result;
    const size_t n = p_.num_buffers();
    if (p_.lower_bound() > capacity_) {
      result.outcome = SearchOutcome::kInfeasible;
      return result;
    }
    Reset();
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
  // Sections are the slots just before some buffer's span ends: every
  // maximal set of simultaneously live buffers is the live set of one.
  void BuildSections() {
    const size_t n = p_.num_buffers();
    const int32_t slots = p_.num_slots();
    std::vector<uint8_t> is_section(slots, 0);
    for (size_t i = 0; i < n; ++i) {
      for (const SlotSpan& s : p_.spans(i)) is_section[s.hi - 1] = 1;
    }
    // first_at[j]: index of the first section slot >= j.
    std::vector<int32_t> first_at(slots + 1, 0);
    int32_t count = 0;
    for (int32_t j = 0; j < slots; ++j) {
      first_at[j] = count;
      count += is_section[j];
    }
    first_at[slots] = count;
    num_sections_ = count;
    members_.assign(count, {});
    ranges_.resize(n);
    num_ranges_.assign(n, 0);
    env_.resize(n);
    for (size_t i = 0; i < n; ++i) {
      SectionRange env{INT32_MAX, INT32_MIN};
      for (const SlotSpan& s : p_.spans(i)) {
        SectionRange r{first_at[s.lo], first_at[s.hi]};
        ranges_[i][num_ranges_[i]++] = r;
        env.lo = std::min(env.lo, r.lo);
        env.hi = std::max(env.hi, r.hi);
        for (int32_t k = r.lo; k < r.hi; ++k) {
          members_[k].push_back(static_cast<uint32_t>(i));
        }
      }
      env_[i] = env;
    }
    // Conflicts: buffers sharing a section.
    overlaps_.assign(n, {});
    std::vector<uint32_t> stamp(n, UINT32_MAX);
    for (size_t i = 0; i < n; ++i) {
      stamp[i] = static_cast<uint32_t>(i);
      for (const SectionRange& r : Ranges(i)) {
        for (int32_t k = r.lo; k < r.hi; ++k) {
          for (uint32_t j : members_[k]) {
            if (stamp[j] != i) {
              stamp[j] = static_cast<uint32_t>(i);
              overlaps_[i].push_back(j);
            }
          }
        }
      }
    }
    // Section totals (for the "T" preorder key) and boundary cuts.
    section_total_.assign(count, 0);
    for (int32_t k = 0; k < count; ++k) {
      for (uint32_t j : members_[k]) section_total_[k] += p_.size(j);
    }
    initial_cuts_.assign(std::max(count - 1, 0), 0);
    for (size_t i = 0; i < n; ++i) {
      for (int32_t k = env_[i].lo; k + 1 < env_[i].hi; ++k) ++initial_cuts_[k];
    }
  }

  std::span<const SectionRange> Ranges(size_t i) const {
    return {ranges_[i].data(), num_ranges_[i]};
  }

  void Reset() {
    const size_t n = p_.num_buffers();
    offset_.assign(n, kUnplaced);
    rank_.assign(n, 0);
    min_offset_.assign(n, 0);
    solution_.assign(n, kUnplaced);
    floor_.assign(num_sections_, 0);
    total_ = section_total_;
    cuts_ = initial_cuts_;
    stamp_.assign(num_sections_, 0);
    stamp_counter_ = 0;
  }

  std::vector<Partition> InitialPartitions() const {
    std::vector<Partition> out;
    int32_t lo = 0;
    for (int32_t k = 0; k < num_sections_; ++k) {
      if (k + 1 == num_sections_ || initial_cuts_[k] == 0) {
        Partition part;
        part.lo = lo;
        part.hi = k + 1;
        out.push_back(std::move(part));
        lo = k + 1;
      }
    }
    for (size_t i = 0; i < p_.num_buffers(); ++i) {
      // Envelopes never straddle a zero cut: find the partition by its lo.
      auto it = std::upper_bound(
          out.begin(), out.end(), env_[i].lo,
          [](int32_t v, const Partition& part) { return v < part.lo; });
      (it - 1)->buffers.push_back(static_cast<uint32_t>(i));
    }
    std::erase_if(out,
                  [](const Partition& part) { return part.buffers.empty(); });
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
    for (uint32_t i : buffers) {
      uint64_t total = 0;
      for (const SectionRange& r : Ranges(i)) {
        for (int32_t k = r.lo; k < r.hi; ++k)
          total = std::max(total, total_[k]);
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
                if (p_.duration(a) != p_.duration(b)) {
                  return p_.duration(a) > p_.duration(b);
                }
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
    for (size_t r = 0; r < keys.size(); ++r) {
      rank_[keys[r].buffer] = static_cast<uint32_t>(r);
    }
  }

  Step SubSolve(const Partition& part, int depth) {
    std::vector<Entry> start;
    std::vector<uint32_t> unplaced;
    std::vector<uint32_t> saved_ranks;
    for (uint32_t b : part.buffers) {
      if (offset_[b] != kUnplaced) continue;
      start.push_back({0, 0, b});
      unplaced.push_back(b);
      saved_ranks.push_back(rank_[b]);
    }
    Rank(unplaced);
    Step step = Search(part, start, 0, 0, depth + 1);
    for (size_t k = 0; k < unplaced.size(); ++k)
      rank_[unplaced[k]] = saved_ranks[k];
    return step;
  }

  // Per-depth scratch lists; a deque so that growing it keeps references
  // held by shallower levels valid.
  std::vector<Entry>& Scratch(int depth) {
    if (static_cast<size_t>(depth) >= scratch_.size()) {
      scratch_.resize(depth + 1);
    }
    return scratch_[depth];
  }

  Step Search(const Partition& part, const std::vector<Entry>& parent,
              uint64_t last_offset, uint32_t last_rank, int depth) {
    if (--nodes_left_ < 0) return Step::kNodeLimit;
    if ((++nodes_ & 1023) == 0 && deadline_.Expired()) timed_out_ = true;
    if (timed_out_) return Step::kTimeout;
    std::vector<Entry>& order = Scratch(depth);
    order.clear();
    for (const Entry& e : parent) {
      if (offset_[e.buffer] == kUnplaced) {
        order.push_back({min_offset_[e.buffer], rank_[e.buffer], e.buffer});
      }
    }
    if (order.empty()) return Step::kFound;
    std::sort(order.begin(), order.end());
    uint64_t min_height = UINT64_MAX;
    for (const Entry& e : order) {
      min_height = std::min(min_height, e.offset + p_.size(e.buffer));
    }
    for (const Entry& e : order) {
      if (e.offset < last_offset ||
          (e.offset == last_offset && e.rank < last_rank)) {
        continue;  // not canonical
      }
      if (e.offset >= min_height) break;  // dominated (sorted by offset)
      Step step = Place(part, order, e, depth);
      if (step == Step::kPrune) break;
      if (step != Step::kNotFound) return step;
    }
    return Step::kNotFound;
  }

  Step Place(const Partition& part, const std::vector<Entry>& order,
             const Entry& e, int depth) {
    const uint32_t b = e.buffer;
    const uint64_t height = e.offset + p_.size(b);
    const size_t offset_mark = offset_log_.size();
    const size_t floor_mark = floor_log_.size();
    offset_[b] = e.offset;
    solution_[b] = e.offset;
    // Raise the min offsets of unplaced neighbours.
    const uint64_t stamp = ++stamp_counter_;
    const size_t affected_mark = affected_.size();
    bool hatless = true;  // no unplaced buffer conflicts with b
    for (uint32_t o : overlaps_[b]) {
      if (offset_[o] != kUnplaced) continue;
      hatless = false;
      if (min_offset_[o] >= height) continue;
      offset_log_.push_back({o, min_offset_[o]});
      min_offset_[o] = AlignUp(height, p_.alignment(o));
      for (const SectionRange& r : Ranges(o)) {
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
      for (int32_t k = r.lo; k < r.hi; ++k) {
        floor_log_.push_back({k, floor_[k]});
        floor_[k] = std::max(floor_[k], height);
        total_[k] -= p_.size(b);
      }
    }
    // Unallocated floor: a section's unplaced buffers all sit at or above
    // their min offsets, so the floor rises to the lowest of them.
    for (size_t a = affected_mark; a < affected_.size(); ++a) {
      const int32_t k = affected_[a];
      const uint64_t floor = floor_[k];
      uint64_t lowest = UINT64_MAX;
      for (uint32_t m : members_[k]) {
        if (offset_[m] != kUnplaced) continue;
        lowest = std::min(lowest, min_offset_[m]);
        if (lowest <= floor) break;
      }
      if (lowest != UINT64_MAX && lowest > floor) {
        floor_log_.push_back({k, floor});
        floor_[k] = lowest;
      }
    }
    affected_.resize(affected_mark);
    Step step = Step::kNotFound;
    if (Check(part, e.offset)) step = Decompose(part, order, e, depth);
    // Undo in reverse.
    for (const SectionRange& r : Ranges(b)) {
      for (int32_t k = r.lo; k < r.hi; ++k) total_[k] += p_.size(b);
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

  // Every section must still fit what remains to be placed in it.
  bool Check(const Partition& part, uint64_t offset) const {
    for (int32_t k = part.lo; k < part.hi; ++k) {
      if (std::max(floor_[k], offset) + total_[k] > capacity_) return false;
    }
    return true;
  }

  Step Decompose(const Partition& part, const std::vector<Entry>& order,
                 const Entry& e, int depth) {
    const uint32_t b = e.buffer;
    const SectionRange env = env_[b];
    std::vector<int32_t> cutpoints;
    for (int32_t k = env.lo; k + 1 < env.hi; ++k) {
      if (--cuts_[k] == 0 && k >= part.lo && k + 1 < part.hi) {
        cutpoints.push_back(k + 1);
      }
    }
    Step step = Step::kFound;
    if (cutpoints.empty()) {
      step = Search(part, order, e.offset, e.rank, depth + 1);
    } else {
      cutpoints.insert(cutpoints.begin(), part.lo);
      cutpoints.push_back(part.hi);
      for (size_t c = 1; c < cutpoints.size() && step == Step::kFound; ++c) {
        Partition sub;
        sub.lo = cutpoints[c - 1];
        sub.hi = cutpoints[c];
        for (uint32_t o : part.buffers) {
          if (offset_[o] != kUnplaced) continue;
          if (env_[o].hi > sub.lo && env_[o].lo < sub.hi)
            sub.buffers.push_back(o);
        }
        if (sub.buffers.empty()) continue;
        step = SubSolve(sub, depth + 1);
      }
    }
    for (int32_t k = env.lo; k + 1 < env.hi; ++k) ++cuts_[k];
    return step;
  }

  const Problem& p_;
  const uint64_t capacity_;
  const Deadline& deadline_;

  int32_t num_sections_ = 0;
  std::vector<std::vector<uint32_t>> members_;
  std::vector<std::array<SectionRange, 2>> ranges_;
  std::vector<uint8_t> num_ranges_;
  std::vector<SectionRange> env_;
  std::vector<std::vector<uint32_t>> overlaps_;
  std::vector<uint64_t> section_total_;
  std::vector<int32_t> initial_cuts_;

  std::string preorder_;
  std::vector<uint32_t> rank_;
  std::vector<uint64_t> offset_, min_offset_, solution_;
  std::vector<uint64_t> floor_, total_;
  std::vector<int32_t> cuts_;
  std::vector<uint64_t> stamp_;
  std::vector<int32_t> affected_;
  uint64_t stamp_counter_ = 0;
  std::vector<std::pair<uint32_t, uint64_t>> offset_log_;
  std::vector<std::pair<int32_t, uint64_t>> floor_log_;
  std::deque<std::vector<Entry>> scratch_;
  int64_t nodes_left_ = 0;
  int64_t nodes_ = 0;
  bool timed_out_ = false;
};

}  // namespace

ExactResult SolveAtCapacity(const Problem& problem, const ExactOptions& options,
                            const Deadline& deadline) {
  LOOM_CHECK_GT(options.capacity, 0u);
  LOOM_CHECK(!options.preorders.empty());
  if (problem.num_buffers() == 0) {
    ExactResult result;
    result.outcome = SearchOutcome::kFound;
    return result;
  }
  Solver solver(problem, options.capacity, deadline);
  return solver.Run(options.preorders);
}

}  // namespace loom::plan
