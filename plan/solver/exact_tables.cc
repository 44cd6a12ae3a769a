#include "plan/solver/exact_tables.h"

#include <algorithm>
#include <numeric>

namespace loom::plan::exact_internal {

SearchTables BuildSearchTables(const Problem& p) {
  SearchTables t;
  const size_t n = p.num_buffers();
  const int32_t slots = p.num_slots();
  std::vector<uint8_t> is_section(slots, 0);
  for (size_t i = 0; i < n; ++i) {
    for (const SlotSpan& s : p.spans(i)) is_section[s.hi - 1] = 1;
  }
  // first_at[j]: index of the first section slot >= j.
  std::vector<int32_t> first_at(slots + 1, 0);
  int32_t count = 0;
  for (int32_t j = 0; j < slots; ++j) {
    first_at[j] = count;
    count += is_section[j];
  }
  first_at[slots] = count;
  t.num_sections = count;
  t.members.assign(count, {});
  t.ranges.resize(n);
  t.num_ranges.assign(n, 0);
  t.env.resize(n);
  for (size_t i = 0; i < n; ++i) {
    SectionRange env{INT32_MAX, INT32_MIN};
    for (const SlotSpan& s : p.spans(i)) {
      SectionRange r{first_at[s.lo], first_at[s.hi]};
      t.ranges[i][t.num_ranges[i]++] = r;
      env.lo = std::min(env.lo, r.lo);
      env.hi = std::max(env.hi, r.hi);
      for (int32_t k = r.lo; k < r.hi; ++k)
        t.members[k].push_back(static_cast<uint32_t>(i));
    }
    t.env[i] = env;
  }
  // Conflicts, by a sweep over span starts and ends: O(n log n + pairs).
  t.overlaps.assign(n, {});
  struct Event {
    int32_t slot;
    int32_t kind;  // 0 = end, 1 = start
    uint32_t buffer;
  };
  std::vector<Event> events;
  for (size_t i = 0; i < n; ++i) {
    for (const SlotSpan& s : p.spans(i)) {
      events.push_back({s.lo, 1, static_cast<uint32_t>(i)});
      events.push_back({s.hi, 0, static_cast<uint32_t>(i)});
    }
  }
  std::sort(events.begin(), events.end(), [](const Event& a, const Event& b) {
    return a.slot != b.slot ? a.slot < b.slot : a.kind < b.kind;
  });
  std::vector<uint32_t> active;
  std::vector<uint32_t> where(n, 0);
  for (const Event& ev : events) {
    if (ev.kind == 0) {
      const uint32_t at = where[ev.buffer];
      active[at] = active.back();
      where[active[at]] = at;
      active.pop_back();
      continue;
    }
    for (uint32_t j : active) {
      if (j == ev.buffer) continue;
      t.overlaps[ev.buffer].push_back(j);
      t.overlaps[j].push_back(ev.buffer);
    }
    where[ev.buffer] = static_cast<uint32_t>(active.size());
    active.push_back(ev.buffer);
  }
  if (p.period() > 0) {  // two spans can meet the same buffer twice
    for (std::vector<uint32_t>& list : t.overlaps) {
      std::sort(list.begin(), list.end());
      list.erase(std::unique(list.begin(), list.end()), list.end());
    }
  }
  t.section_total.assign(count, 0);
  for (int32_t k = 0; k < count; ++k) {
    for (uint32_t j : t.members[k]) t.section_total[k] += p.size(j);
  }
  t.by_env_lo.resize(n);
  std::iota(t.by_env_lo.begin(), t.by_env_lo.end(), 0u);
  std::stable_sort(
      t.by_env_lo.begin(), t.by_env_lo.end(),
      [&](uint32_t a, uint32_t b) { return t.env[a].lo < t.env[b].lo; });
  t.env_lo_sorted.resize(n);
  for (size_t k = 0; k < n; ++k) t.env_lo_sorted[k] = t.env[t.by_env_lo[k]].lo;
  t.initial_cuts.assign(std::max(count - 1, 0), 0);
  for (size_t i = 0; i < n; ++i) {
    for (int32_t k = t.env[i].lo; k + 1 < t.env[i].hi; ++k) ++t.initial_cuts[k];
  }
  for (std::vector<uint32_t>& list : t.overlaps) list.shrink_to_fit();
  for (std::vector<uint32_t>& list : t.members) list.shrink_to_fit();
  return t;
}

// Upper bound on the number of conflicting pairs (exact for non-cyclic
// instances): for each span, the spans that start before it ends minus
// those that end before it starts.
uint64_t CountConflicts(const Problem& p) {
  std::vector<int32_t> starts, ends;
  for (size_t i = 0; i < p.num_buffers(); ++i) {
    for (const SlotSpan& s : p.spans(i)) {
      starts.push_back(s.lo);
      ends.push_back(s.hi);
    }
  }
  std::sort(starts.begin(), starts.end());
  std::sort(ends.begin(), ends.end());
  uint64_t pairs = 0;
  for (size_t i = 0; i < p.num_buffers(); ++i) {
    for (const SlotSpan& s : p.spans(i)) {
      const auto before_end =
          std::lower_bound(starts.begin(), starts.end(), s.hi) - starts.begin();
      const auto ended =
          std::upper_bound(ends.begin(), ends.end(), s.lo) - ends.begin();
      pairs += static_cast<uint64_t>(before_end - ended - 1);
    }
  }
  return pairs / 2;
}

}  // namespace loom::plan::exact_internal
