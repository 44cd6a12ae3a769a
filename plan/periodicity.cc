#include "plan/periodicity.h"

#include <algorithm>
#include <unordered_map>

#include "plan/base/check.h"

namespace loom::plan {
namespace {

constexpr size_t kResyncWindow = 32;  // tokens skipped at most to resync
constexpr size_t kResyncRun = 4;      // tokens that must agree after a skip

bool RangeEqual(std::span<const uint64_t> t, size_t a, size_t b, size_t n) {
  if (a + n > t.size() || b + n > t.size()) return false;
  return std::equal(t.begin() + a, t.begin() + a + n, t.begin() + b);
}

// First index i such that tokens[i + j] == tokens[i + j + period] for every j
// in [0, run); tokens.size() if none.
size_t FindHead(std::span<const uint64_t> t, size_t period, size_t run) {
  size_t streak = 0;
  for (size_t i = 0; i + period < t.size(); ++i) {
    streak = t[i] == t[i + period] ? streak + 1 : 0;
    if (streak == run) return i + 1 - run;
  }
  return t.size();
}

}  // namespace

double AlignedMatchFraction(std::span<const uint64_t> t, size_t head,
                            size_t period) {
  size_t a = head, b = head + period;
  uint64_t matched = 0, steps = 0;
  // Skips may shift the alignment by at most this much from `period`, so
  // that a wrong period cannot drift onto a right one.
  const int64_t max_drift = static_cast<int64_t>(
      std::min<size_t>(kResyncWindow, std::max<size_t>(1, period / 4)));
  auto drift_ok = [&](size_t x, size_t y) {
    int64_t drift = static_cast<int64_t>(y - x) - static_cast<int64_t>(period);
    return drift <= max_drift && drift >= -max_drift;
  };
  while (b < t.size()) {
    if (t[a] == t[b]) {
      ++matched;
      ++steps;
      ++a;
      ++b;
      continue;
    }
    bool synced = false;
    for (size_t k = 1; k <= kResyncWindow && !synced; ++k) {
      if (drift_ok(a, b + k) && RangeEqual(t, a, b + k, kResyncRun)) {
        b += k;  // the later repetition has k extra tokens
        steps += k;
        synced = true;
      } else if (a + k < b && drift_ok(a + k, b) &&
                 RangeEqual(t, a + k, b, kResyncRun)) {
        a += k;  // the later repetition lacks k tokens
        steps += k;
        synced = true;
      }
    }
    if (!synced) {  // a substitution
      ++steps;
      ++a;
      ++b;
    }
  }
  return steps == 0 ? 0.0 : static_cast<double>(matched) / steps;
}

PeriodResult DetectPeriod(std::span<const uint64_t> t,
                          const PeriodOptions& options) {
  PeriodResult result;
  const size_t n = t.size();
  const size_t g = std::max<size_t>(options.gram, 1);
  if (n < 2 * g + 2) return result;

  // Candidate periods: distance from each n-gram to its previous occurrence.
  constexpr uint64_t kBase = 0x9E3779B97F4A7C15ull;
  uint64_t power = 1;  // kBase^(g-1)
  for (size_t j = 1; j < g; ++j) power *= kBase;
  uint64_t hash = 0;
  std::unordered_map<uint64_t, size_t> last;
  std::unordered_map<size_t, uint64_t> histogram;
  last.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    if (i >= g) hash -= t[i - g] * power;
    hash = hash * kBase + t[i];
    if (i + 1 < g) continue;
    size_t start = i + 1 - g;
    auto [it, inserted] = last.try_emplace(hash, start);
    if (!inserted) {
      size_t distance = start - it->second;
      if (2 * distance <= n) ++histogram[distance];
      it->second = start;
    }
  }
  std::vector<std::pair<uint64_t, size_t>> ranked;  // (count, distance)
  for (auto [distance, count] : histogram) {
    if (count >= 2) ranked.emplace_back(count, distance);
  }
  std::sort(ranked.begin(), ranked.end(), [](auto x, auto y) {
    return x.first != y.first ? x.first > y.first : x.second < y.second;
  });
  if (ranked.size() > options.max_candidates) {
    ranked.resize(options.max_candidates);
  }

  struct Scored {
    size_t period, head;
    double match;
  };
  std::vector<Scored> passing;
  double best = 0;
  for (auto [count, period] : ranked) {
    size_t head = FindHead(t, period, std::min<size_t>(period, 16));
    if (head >= n || n - head < 2 * period) continue;
    double match = AlignedMatchFraction(t, head, period);
    if (match < 1.0 - options.tolerance) continue;
    passing.push_back({period, head, match});
    best = std::max(best, match);
  }
  if (passing.empty()) return result;
  const Scored* chosen = nullptr;
  for (const Scored& s : passing) {
    if (s.match + options.tie < best) continue;
    if (chosen == nullptr || s.period < chosen->period) chosen = &s;
  }
  result.found = true;
  result.period = chosen->period;
  result.head = chosen->head;
  result.match = chosen->match;

  // Boundaries: resynchronise each expected start on the signature (the
  // first tokens of the first repetition), searching near the expectation.
  const size_t p = result.period;
  const size_t signature = std::min<size_t>(p, 16);
  const size_t window = std::max<size_t>(2, std::min<size_t>(p / 8, 64));
  result.starts.push_back(result.head);
  while (true) {
    size_t expected = result.starts.back() + p;
    if (expected >= n) break;
    size_t next = expected;
    for (size_t delta = 0; delta <= window; ++delta) {
      if (RangeEqual(t, expected + delta, result.head, signature)) {
        next = expected + delta;
        break;
      }
      if (delta > 0 && expected - delta > result.starts.back() &&
          RangeEqual(t, expected - delta, result.head, signature)) {
        next = expected - delta;
        break;
      }
    }
    if (next >= n) break;
    result.starts.push_back(next);
  }
  return result;
}

Alignment AlignSequences(std::span<const uint64_t> a,
                         std::span<const uint64_t> b, size_t max_edits) {
  Alignment out;
  out.a_to_b.assign(a.size(), -1);
  out.b_to_a.assign(b.size(), -1);
  auto match = [&](size_t i, size_t j) {
    out.a_to_b[i] = static_cast<int64_t>(j);
    out.b_to_a[j] = static_cast<int64_t>(i);
    ++out.matched;
  };
  size_t prefix = 0;
  while (prefix < a.size() && prefix < b.size() && a[prefix] == b[prefix]) {
    match(prefix, prefix);
    ++prefix;
  }
  size_t suffix = 0;
  while (suffix < a.size() - prefix && suffix < b.size() - prefix &&
         a[a.size() - 1 - suffix] == b[b.size() - 1 - suffix]) {
    match(a.size() - 1 - suffix, b.size() - 1 - suffix);
    ++suffix;
  }
  std::span<const uint64_t> x = a.subspan(prefix, a.size() - prefix - suffix);
  std::span<const uint64_t> y = b.subspan(prefix, b.size() - prefix - suffix);
  const int64_t n = static_cast<int64_t>(x.size());
  const int64_t m = static_cast<int64_t>(y.size());
  if (n == 0 || m == 0) return out;

  // Myers: v[k] = furthest x on diagonal k; snapshots[d] holds v[-d-1..d+1]
  // as it was before round d, for the backtrack.
  const int64_t limit =
      std::min<int64_t>(n + m, static_cast<int64_t>(max_edits));
  const int64_t offset = limit + 1;
  std::vector<int64_t> v(2 * offset + 1, 0);
  std::vector<std::vector<int64_t>> snapshots;
  int64_t found = -1;
  for (int64_t d = 0; d <= limit && found < 0; ++d) {
    snapshots.emplace_back(v.begin() + offset - d - 1,
                           v.begin() + offset + d + 2);
    for (int64_t k = -d; k <= d; k += 2) {
      int64_t px;
      if (k == -d || (k != d && v[offset + k - 1] < v[offset + k + 1])) {
        px = v[offset + k + 1];
      } else {
        px = v[offset + k - 1] + 1;
      }
      int64_t py = px - k;
      while (px < n && py < m && x[px] == y[py]) {
        ++px;
        ++py;
      }
      v[offset + k] = px;
      if (px >= n && py >= m) {
        found = d;
        break;
      }
    }
  }
  if (found < 0) {
    // Too different: match position by position (a lower bound).
    out.exact = false;
    for (int64_t i = 0; i < std::min(n, m); ++i) {
      if (x[i] == y[i]) match(prefix + i, prefix + i);
    }
    return out;
  }
  int64_t px = n, py = m;
  for (int64_t d = found; d >= 0; --d) {
    const std::vector<int64_t>& snap = snapshots[d];
    auto at = [&](int64_t k) { return snap[k + d + 1]; };
    int64_t k = px - py;
    int64_t prev_k;
    if (k == -d || (k != d && at(k - 1) < at(k + 1))) {
      prev_k = k + 1;
    } else {
      prev_k = k - 1;
    }
    int64_t prev_x = d == 0 ? 0 : at(prev_k);
    int64_t prev_y = d == 0 ? 0 : prev_x - prev_k;
    // The snake: diagonal moves after the edit.
    int64_t start_x = d == 0 ? 0 : (prev_k == k + 1 ? prev_x : prev_x + 1);
    while (px > start_x && py > 0 && px - py == k) {
      --px;
      --py;
      match(prefix + px, prefix + py);
    }
    px = prev_x;
    py = prev_y;
  }
  return out;
}

}  // namespace loom::plan
