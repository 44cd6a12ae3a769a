#include "plan/solver/layers.h"

#include <algorithm>
#include <array>
#include <map>
#include <numeric>
#include <unordered_map>

#include "plan/solver/gap_index.h"

namespace loom::plan {
namespace {

// A unit of global placement: one buffer, or a phase group whose buffers
// keep offsets relative to the unit's offset.
struct Request {
  uint64_t size = 0;
  uint64_t alignment = 1;
  std::vector<SlotSpan> spans;
  std::vector<uint32_t> members;   // buffers placed with this request
  std::vector<uint64_t> relative;  // their offsets inside it
};

// A phase group's local plan over slots [lo, hi).
struct Group {
  int32_t lo = 0;
  int32_t hi = 0;
  uint64_t height = 0;
  double tmp = 0;
  std::vector<uint32_t> members;
  std::vector<uint64_t> relative;
};

// Best fit of `members` (largest first) into a local plan over [lo, hi)
// that already holds `fixed` at `fixed_offsets`.
Group PackGroup(const Problem& p, int32_t lo, int32_t hi,
                std::span<const uint32_t> fixed,
                std::span<const uint64_t> fixed_offsets,
                std::vector<uint32_t> members) {
  Group g;
  g.lo = lo;
  g.hi = hi;
  GapIndex index(hi - lo);
  auto local = [&](uint32_t b) {
    const SlotSpan s = p.spans(b)[0];
    return std::array<SlotSpan, 1>{SlotSpan{s.lo - lo, s.hi - lo}};
  };
  for (size_t k = 0; k < fixed.size(); ++k) {
    index.Insert(local(fixed[k]), fixed_offsets[k],
                 fixed_offsets[k] + p.size(fixed[k]));
    g.members.push_back(fixed[k]);
    g.relative.push_back(fixed_offsets[k]);
    g.height = std::max(g.height, fixed_offsets[k] + p.size(fixed[k]));
  }
  std::stable_sort(members.begin(), members.end(), [&](uint32_t a, uint32_t b) {
    return p.size(a) > p.size(b);
  });
  for (uint32_t b : members) {
    const uint64_t at =
        index.Find(local(b), p.size(b), p.alignment(b), FitRule::kBestFit);
    index.Insert(local(b), at, at + p.size(b));
    g.members.push_back(b);
    g.relative.push_back(at);
    g.height = std::max(g.height, at + p.size(b));
  }
  double used = 0;
  for (uint32_t b : g.members) {
    used += static_cast<double>(p.size(b)) * static_cast<double>(p.duration(b));
  }
  const double span = static_cast<double>(p.slot_time(hi) - p.slot_time(lo));
  g.tmp = g.height == 0 || span <= 0
              ? 0
              : used / (static_cast<double>(g.height) * span);
  return g;
}

// Step 1: phase groups, fused and filtered. Buffers not in a kept group
// are returned in `singles`.
std::vector<Group> PhaseGroups(const Problem& p, const LayersOptions& options,
                               std::vector<uint32_t>* singles,
                               LayersStats* stats) {
  const size_t n = p.num_buffers();
  std::vector<Group> kept;
  if (options.group.empty()) {
    singles->resize(n);
    std::iota(singles->begin(), singles->end(), 0u);
    return kept;
  }
  LOOM_CHECK_EQ(options.group.size(), n);
  std::unordered_map<uint32_t, std::vector<uint32_t>> by_key;
  for (uint32_t i = 0; i < n; ++i) {
    // Wrapping buffers stay single: a group is one run of slots.
    if (options.group[i] == kNoGroup || p.spans(i).size() != 1) {
      singles->push_back(i);
    } else {
      by_key[options.group[i]].push_back(i);
    }
  }
  std::vector<Group> groups;
  for (auto& [key, members] : by_key) {
    int32_t lo = INT32_MAX, hi = INT32_MIN;
    for (uint32_t b : members) {
      lo = std::min(lo, p.spans(b)[0].lo);
      hi = std::max(hi, p.spans(b)[0].hi);
    }
    groups.push_back(PackGroup(p, lo, hi, {}, {}, std::move(members)));
  }
  std::sort(groups.begin(), groups.end(), [](const Group& a, const Group& b) {
    return a.lo != b.lo ? a.lo < b.lo : a.hi < b.hi;
  });
  // Fuse groups whose spans overlap, the smaller into the larger, when the
  // fused plan wastes less (STAlloc's geometric-mean test).
  std::vector<Group> fused;
  for (Group& g : groups) {
    if (!fused.empty() && fused.back().hi > g.lo) {
      Group& a = fused.back();
      const bool a_larger = a.height * static_cast<uint64_t>(a.hi - a.lo) >=
                            g.height * static_cast<uint64_t>(g.hi - g.lo);
      const Group& big = a_larger ? a : g;
      const Group& small = a_larger ? g : a;
      Group merged = PackGroup(p, std::min(a.lo, g.lo), std::max(a.hi, g.hi),
                               big.members, big.relative, small.members);
      if (merged.tmp * merged.tmp > a.tmp * g.tmp) {
        a = std::move(merged);
        if (stats) ++stats->fusions;
        continue;
      }
    }
    fused.push_back(std::move(g));
  }
  for (Group& g : fused) {
    if (g.members.size() < 2 || g.tmp < options.min_tmp) {
      singles->insert(singles->end(), g.members.begin(), g.members.end());
    } else {
      kept.push_back(std::move(g));
    }
  }
  if (stats) stats->groups = kept.size();
  return kept;
}

// Step 2 for one size: Algorithm 1. Returns layers as lists of request
// indices. `reqs` must all have the same size.
std::vector<std::vector<uint32_t>> BuildLayers(const std::vector<Request>& all,
                                               std::vector<uint32_t> reqs,
                                               int32_t num_slots) {
  auto start = [&](uint32_t r) { return all[r].spans[0].lo; };
  auto end = [&](uint32_t r) {  // unwrapped
    const std::vector<SlotSpan>& s = all[r].spans;
    return s.size() == 2 ? num_slots + s[1].hi : s[0].hi;
  };
  std::stable_sort(reqs.begin(), reqs.end(),
                   [&](uint32_t a, uint32_t b) { return start(a) < start(b); });
  std::vector<std::vector<uint32_t>> layers;
  std::vector<int32_t> first_start;
  std::multimap<int32_t, size_t> by_end;  // last end -> layer
  for (uint32_t r : reqs) {
    const int32_t s = start(r);
    const int32_t e = end(r);
    size_t chosen = SIZE_MAX;
    auto it = by_end.upper_bound(s);
    for (int tries = 0; it != by_end.begin() && tries < 16; ++tries) {
      --it;
      if (e <= num_slots || e - num_slots <= first_start[it->second]) {
        chosen = it->second;
        by_end.erase(it);
        break;
      }
    }
    if (chosen == SIZE_MAX) {
      chosen = layers.size();
      layers.emplace_back();
      first_start.push_back(s);
    }
    layers[chosen].push_back(r);
    by_end.emplace(e, chosen);
  }
  return layers;
}

}  // namespace

Placement PlaceByLayers(const Problem& p, const LayersOptions& options,
                        LayersStats* stats) {
  const size_t n = p.num_buffers();
  std::vector<uint32_t> singles;
  std::vector<Group> groups = PhaseGroups(p, options, &singles, stats);

  std::vector<Request> reqs;
  reqs.reserve(singles.size() + groups.size());
  for (uint32_t b : singles) {
    Request r;
    r.size = p.size(b);
    r.alignment = p.alignment(b);
    r.spans.assign(p.spans(b).begin(), p.spans(b).end());
    r.members = {b};
    r.relative = {0};
    reqs.push_back(std::move(r));
  }
  for (Group& g : groups) {
    Request r;
    r.size = g.height;
    for (uint32_t b : g.members)
      r.alignment = std::max(r.alignment, p.alignment(b));
    r.spans = {SlotSpan{g.lo, g.hi}};
    r.members = std::move(g.members);
    r.relative = std::move(g.relative);
    reqs.push_back(std::move(r));
  }

  // Size classes, largest first.
  std::vector<uint32_t> by_size(reqs.size());
  std::iota(by_size.begin(), by_size.end(), 0u);
  std::stable_sort(by_size.begin(), by_size.end(), [&](uint32_t a, uint32_t b) {
    return reqs[a].size > reqs[b].size;
  });

  GapIndex index(p.num_slots());
  Placement out;
  out.offsets.assign(n, UINT64_MAX);
  auto place = [&](const Request& r, uint64_t at) {
    for (size_t k = 0; k < r.members.size(); ++k) {
      const uint32_t b = r.members[k];
      const uint64_t offset = at + r.relative[k];
      out.offsets[b] = offset;
      index.Insert(p.spans(b), offset, offset + p.size(b));
      out.peak = std::max(out.peak, offset + p.size(b));
    }
  };
  for (size_t begin = 0; begin < by_size.size();) {
    size_t end = begin;
    while (end < by_size.size() &&
           reqs[by_size[end]].size == reqs[by_size[begin]].size) {
      ++end;
    }
    // Gaps below the current peak first.
    std::vector<uint32_t> rest;
    for (size_t k = begin; k < end; ++k) {
      const Request& r = reqs[by_size[k]];
      const uint64_t at = out.peak == 0
                              ? UINT64_MAX
                              : index.Find(r.spans, r.size, r.alignment,
                                           FitRule::kBestFit, out.peak);
      if (at != UINT64_MAX) {
        place(r, at);
        if (stats) ++stats->gap_placed;
      } else {
        rest.push_back(by_size[k]);
      }
    }
    // The rest as memory layers, each placed as a unit.
    for (const std::vector<uint32_t>& layer :
         BuildLayers(reqs, std::move(rest), p.num_slots())) {
      std::vector<SlotSpan> spans;
      uint64_t alignment = 1;
      for (uint32_t r : layer) {
        spans.insert(spans.end(), reqs[r].spans.begin(), reqs[r].spans.end());
        alignment = std::max(alignment, reqs[r].alignment);
      }
      const uint64_t at =
          index.Find(spans, reqs[layer[0]].size, alignment, FitRule::kBestFit);
      for (uint32_t r : layer) place(reqs[r], at);
      if (stats) ++stats->layers;
    }
    begin = end;
  }
  return out;
}

}  // namespace loom::plan
