#include "plan/analysis/periodicity.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "base/check.h"

namespace loom::plan {
namespace {

constexpr size_t kResyncWindow = 32;  // tokens skipped at most to resync
constexpr size_t kResyncRun = 4;      // tokens that must agree after a skip

bool RangeEqual(std::span<const uint64_t> t, size_t a, size_t b, size_t n) {
  if (a + n > t.size() || b + n > t.size()) return false;
  return std::equal(t.begin() + a, t.begin() + a + n, t.begin() + b);
}

// How many of tokens[a, a + n) equal tokens[b, b + n) (0 past the end).
size_t Agreement(std::span<const uint64_t> t, size_t a, size_t b, size_t n) {
  if (a + n > t.size() || b + n > t.size()) return 0;
  size_t equal = 0;
  for (size_t j = 0; j < n; ++j) equal += t[a + j] == t[b + j];
  return equal;
}

// First index i with tokens[i] == tokens[i + period] such that at least 3/4
// of the `run` positions from i match at that distance (changing MoE sizes
// break exact runs); tokens.size() if none.
size_t FindHead(std::span<const uint64_t> t, size_t period, size_t run) {
  if (t.size() < period + run) return t.size();
  const size_t need = run - run / 4;
  size_t window = 0;  // matches among positions [i, i + run)
  for (size_t j = 0; j < run; ++j) window += t[j] == t[j + period];
  for (size_t i = 0;; ++i) {
    if (window >= need && t[i] == t[i + period]) return i;
    if (i + run + period >= t.size()) return t.size();
    window -= t[i] == t[i + period];
    window += t[i + run] == t[i + run + period];
  }
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
    // A substitution (a changed size) when the tokens after it agree;
    // otherwise look for the shortest skip that resynchronises.
    bool synced = false;
    bool substitution = RangeEqual(t, a + 1, b + 1, kResyncRun);
    for (size_t k = 1; k <= kResyncWindow && !synced && !substitution; ++k) {
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
                          std::span<const int64_t> deltas,
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

  // Score: the match fraction weighted by the part of the trace the
  // repetition covers, so a period that only fits late in the trace loses.
  struct Scored {
    size_t period, head;
    double match, score;
  };
  // Prefix sums of the net and of the allocated bytes, for the balance test.
  const bool balance = deltas.size() == n;
  std::vector<int64_t> net(balance ? n + 1 : 0), allocated(balance ? n + 1 : 0);
  for (size_t i = 0; balance && i < n; ++i) {
    net[i + 1] = net[i] + deltas[i];
    allocated[i + 1] = allocated[i] + std::max<int64_t>(deltas[i], 0);
  }
  // suffix_peak[i] = max live bytes after any token at or after i.
  std::vector<int64_t> suffix_peak(balance ? n + 1 : 0);
  if (balance) {
    suffix_peak[n] = net[n];
    for (size_t i = n; i-- > 0;) {
      suffix_peak[i] = std::max(suffix_peak[i + 1], net[i + 1]);
    }
  }
  auto balanced = [&](size_t head, size_t period) {
    if (static_cast<double>(suffix_peak[head]) <
        options.min_peak_share * static_cast<double>(suffix_peak[0])) {
      return false;
    }
    std::vector<double> imbalance, peaks;
    for (size_t b = head; b + period <= n; b += period) {
      double in = static_cast<double>(allocated[b + period] - allocated[b]);
      double out = static_cast<double>(net[b + period] - net[b]);
      imbalance.push_back(in > 0 ? std::abs(out) / in : 0.0);
      int64_t peak = net[b + 1];
      for (size_t i = b + 1; i <= b + period; ++i)
        peak = std::max(peak, net[i]);
      peaks.push_back(static_cast<double>(peak));
    }
    auto median = [](std::vector<double>& v) {
      auto middle = v.begin() + v.size() / 2;
      std::nth_element(v.begin(), middle, v.end());
      return *middle;
    };
    double top = *std::max_element(peaks.begin(), peaks.end());
    return median(imbalance) <= options.max_imbalance &&
           median(peaks) >= options.min_peak_share * top;
  };

  std::vector<Scored> passing;
  double best = 0;
  for (auto [count, period] : ranked) {
    size_t head = FindHead(t, period, std::min<size_t>(period, 16));
    if (head >= n || n - head < 2 * period) continue;
    double match = AlignedMatchFraction(t, head, period);
    if (match < 1.0 - options.tolerance) continue;
    if (balance && !balanced(head, period)) continue;
    double score = match * static_cast<double>(n - head) / n;
    passing.push_back({period, head, match, score});
    best = std::max(best, score);
  }
  if (passing.empty()) return result;
  // The best score; then the smallest divisor of it that scores nearly as
  // well (2p scores like p; the layer period of a model does not divide the
  // iteration and loses at the phase transitions anyway).
  const Scored* chosen = &passing[0];
  for (const Scored& s : passing) {
    if (s.score > chosen->score ||
        (s.score == chosen->score && s.period < chosen->period)) {
      chosen = &s;
    }
  }
  const size_t best_period = chosen->period;
  for (const Scored& s : passing) {
    if (s.period < chosen->period && best_period % s.period == 0 &&
        s.score >= best * (1.0 - options.tie)) {
      chosen = &s;
    }
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
    // The closest position where at least 3/4 of the signature agrees (MoE
    // token buffers change size every iteration), preferring more agreement.
    size_t next = expected;
    size_t best_agree = signature - signature / 4;  // threshold
    bool found_signature = false;
    for (size_t delta = 0; delta <= window; ++delta) {
      for (int side = 0; side < (delta == 0 ? 1 : 2); ++side) {
        if (side == 1 && expected - delta <= result.starts.back()) continue;
        size_t at = side == 0 ? expected + delta : expected - delta;
        size_t agree = Agreement(t, at, result.head, signature);
        if (agree > best_agree || (!found_signature && agree == best_agree)) {
          best_agree = agree;
          next = at;
          found_signature = true;
        }
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
