#include "plan/analysis/analysis.h"

#include <algorithm>
#include <unordered_set>

#include "base/json.h"

namespace loom::plan {
namespace {

uint64_t RoundUp(uint64_t size, uint64_t to) {
  return to <= 1 ? size : (size + to - 1) / to * to;
}

// Live bytes after each event.
std::vector<int64_t> LiveCurve(const Workload& w, uint64_t round_to) {
  std::vector<int64_t> live(w.events, 0);
  for (const Allocation& a : w.allocations) {
    int64_t size = static_cast<int64_t>(RoundUp(a.size, round_to));
    live[a.alloc_time] += size;
    if (a.freed()) live[a.free_time] -= size;
  }
  for (size_t t = 1; t < live.size(); ++t) live[t] += live[t - 1];
  return live;
}

std::string Bytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) return fmt::format("{} B", bytes);
  double value = static_cast<double>(bytes);
  int unit = -1;
  while (value >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  return fmt::format("{:.2f} {}", value, kUnits[unit]);
}

}  // namespace

std::string_view LifetimeClassName(LifetimeClass c) {
  switch (c) {
    case LifetimeClass::kPersistent:
      return "persistent";
    case LifetimeClass::kScoped:
      return "scoped";
    case LifetimeClass::kTransient:
      return "transient";
    case LifetimeClass::kDynamic:
      return "dynamic";
    case LifetimeClass::kCrossIteration:
      return "cross_iteration";
  }
  return "unknown";
}

uint64_t PeakLiveBytes(const Workload& workload, uint64_t round_to,
                       int64_t* peak_time) {
  std::vector<int64_t> live = LiveCurve(workload, round_to);
  int64_t best = 0, when = -1;
  for (size_t t = 0; t < live.size(); ++t) {
    if (live[t] > best) {
      best = live[t];
      when = static_cast<int64_t>(t);
    }
  }
  if (peak_time != nullptr) *peak_time = when;
  return static_cast<uint64_t>(best);
}

WorkloadAnalysis AnalyzeWorkload(const Workload& w) {
  WorkloadAnalysis r;
  const size_t n = w.allocations.size();
  r.allocs = n;
  std::unordered_set<uint64_t> sizes;
  for (const Allocation& a : w.allocations) {
    sizes.insert(a.size);
    if (a.freed()) {
      ++r.frees;
    } else {
      ++r.never_freed;
    }
  }
  r.distinct_sizes = sizes.size();
  r.peak_live_bytes = PeakLiveBytes(w, 1, &r.peak_time);
  r.peak_live_bytes_512 = PeakLiveBytes(w, 512);
  r.peak_live_bytes_2mib = PeakLiveBytes(w, uint64_t{2} << 20);

  // Per iteration: its allocations in order, and its peak.
  const size_t iterations = w.iterations.size();
  r.iterations.resize(iterations);
  std::vector<std::vector<size_t>> members(iterations);
  for (size_t i = 0; i < n; ++i) {
    int32_t k = w.allocations[i].alloc_iteration;
    if (k >= 0) members[k].push_back(i);
  }
  std::vector<int64_t> live = LiveCurve(w, 1);
  for (size_t k = 0; k < iterations; ++k) {
    r.iterations[k].allocs = members[k].size();
    int64_t peak = 0;
    for (int64_t t = w.iterations[k].begin; t < w.iterations[k].end; ++t) {
      peak = std::max(peak, live[t]);
    }
    r.iterations[k].peak_live_bytes = static_cast<uint64_t>(peak);
  }

  // Align consecutive complete iterations by allocation size.
  std::vector<bool> varies(n, false);
  for (size_t k = 1; k < iterations; ++k) {
    if (!w.iterations[k].complete || !w.iterations[k - 1].complete) continue;
    std::vector<uint64_t> a, b;
    for (size_t i : members[k - 1]) a.push_back(w.allocations[i].size);
    for (size_t i : members[k]) b.push_back(w.allocations[i].size);
    Alignment alignment = AlignSequences(a, b);
    r.iterations[k].matched_previous = alignment.matched;
    for (size_t i = 0; i < a.size(); ++i) {
      if (alignment.a_to_b[i] < 0) varies[members[k - 1][i]] = true;
    }
    for (size_t j = 0; j < b.size(); ++j) {
      if (alignment.b_to_a[j] < 0) varies[members[k][j]] = true;
    }
  }

  // Steady state: best regularity, latest on ties.
  double best = -1;
  for (size_t k = 0; k < iterations; ++k) {
    const IterationStats& s = r.iterations[k];
    if (!s.matched_previous.has_value() || s.allocs == 0) continue;
    double regularity =
        s.allocs == 0 ? 1.0
                      : static_cast<double>(*s.matched_previous) / s.allocs;
    if (regularity >= best) {
      best = regularity;
      r.steady_state = static_cast<int32_t>(k);
      r.regularity = regularity;
    }
  }
  if (r.steady_state < 0) {
    for (size_t k = iterations; k-- > 0;) {
      if (w.iterations[k].complete) {
        r.steady_state = static_cast<int32_t>(k);
        break;
      }
    }
  }

  // Classes.
  r.classes.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const Allocation& a = w.allocations[i];
    LifetimeClass c;
    if (a.dynamic) {
      c = LifetimeClass::kDynamic;
    } else if (!a.freed()) {
      c = LifetimeClass::kPersistent;
    } else {
      // The first iteration beginning at or after the allocation.
      auto it = std::lower_bound(
          w.iterations.begin(), w.iterations.end(), a.alloc_time,
          [](const Iteration& x, int64_t t) { return x.begin < t; });
      bool covers = it != w.iterations.end() && it->end <= a.free_time;
      if (covers) {
        c = LifetimeClass::kPersistent;
      } else if (varies[i]) {
        c = LifetimeClass::kDynamic;
      } else if (a.alloc_iteration != a.free_iteration) {
        c = LifetimeClass::kCrossIteration;
      } else if (a.alloc_phase != a.free_phase) {
        c = LifetimeClass::kScoped;
      } else {
        c = LifetimeClass::kTransient;
      }
    }
    r.classes[i] = c;
    ClassTotals& totals = r.totals[static_cast<size_t>(c)];
    ++totals.count;
    totals.bytes += a.size;
  }
  return r;
}

std::string FormatAnalysisText(const Workload& w, const WorkloadAnalysis& r) {
  std::string out;
  auto line = [&](std::string_view label, const std::string& value) {
    out += fmt::format("{:<18}{}\n", label, value);
  };
  line("trace",
       fmt::format("\"{}\" (device {}, granularity {})", w.header.provenance,
                   w.header.device,
                   w.header.granularity == 0 ? std::string("unknown")
                                             : Bytes(w.header.granularity)));
  std::string kinds;
  for (size_t k = 1; k < w.events_by_kind.size(); ++k) {
    if (w.events_by_kind[k] == 0) continue;
    if (!kinds.empty()) kinds += ", ";
    kinds += fmt::format("{} {}", EventKindName(static_cast<EventKind>(k)),
                         w.events_by_kind[k]);
  }
  line("events", fmt::format("{} ({})", w.events, kinds));
  line("allocations",
       fmt::format("{} ({} freed, {} never freed), {} distinct sizes", r.allocs,
                   r.frees, r.never_freed, r.distinct_sizes));
  line("peak live",
       fmt::format("{} ({} B) at event {}: the lower bound for "
                   "any allocator",
                   Bytes(r.peak_live_bytes), r.peak_live_bytes, r.peak_time));
  line("  512 B rounded", fmt::format("{} ({} B)", Bytes(r.peak_live_bytes_512),
                                      r.peak_live_bytes_512));
  line("  2 MiB granules",
       fmt::format("{} ({} B)", Bytes(r.peak_live_bytes_2mib),
                   r.peak_live_bytes_2mib));
  std::string source;
  switch (w.iteration_source) {
    case IterationSource::kMarkers:
      source = "from iteration markers";
      break;
    case IterationSource::kPeriod:
      source = fmt::format(
          "detected: the (action, size) sequence repeats every {} alloc/free "
          "events after a head of {} ({:.1f}% aligned match)",
          w.period.period, w.period.head, 100 * w.period.match);
      break;
    case IterationSource::kWholeTrace:
      source = "no markers and no repetition: the whole trace is one iteration";
      break;
  }
  line("iterations", fmt::format("{}, {}", w.iterations.size(), source));
  for (size_t k = 0; k < w.iterations.size(); ++k) {
    if (k == 8 && w.iterations.size() > 10) {
      out += fmt::format("{:<18}... {} more\n", "", w.iterations.size() - 9);
      k = w.iterations.size() - 1;
    }
    const Iteration& it = w.iterations[k];
    const IterationStats& s = r.iterations[k];
    std::string match =
        s.matched_previous.has_value()
            ? fmt::format(", {} match the previous", *s.matched_previous)
            : "";
    out += fmt::format("{:<18}#{} events [{}, {}){}: {} allocs{}, peak {}\n",
                       "", it.number, it.begin, it.end,
                       it.complete ? "" : " (incomplete)", s.allocs, match,
                       Bytes(s.peak_live_bytes));
  }
  if (r.steady_state >= 0) {
    std::string regularity =
        r.regularity.has_value()
            ? fmt::format(
                  "regularity {:.2f}% ({} of {} allocations match the "
                  "previous iteration after alignment)",
                  100 * *r.regularity,
                  *r.iterations[r.steady_state].matched_previous,
                  r.iterations[r.steady_state].allocs)
            : std::string("regularity unknown (no previous iteration)");
    line("steady state",
         fmt::format("iteration #{}, {}", w.iterations[r.steady_state].number,
                     regularity));
  }
  if (w.phases_inferred) {
    line("phases",
         "inferred (no phase markers): per iteration, up to the peak of live "
         "bytes = forward, after it = backward");
  } else {
    line("phases",
         fmt::format("from markers: {}", fmt::join(w.phase_names, ", ")));
  }
  out += fmt::format("\n{:<18}{:>10}{:>16}{:>10}\n", "class", "count", "bytes",
                     "count %");
  for (size_t c = 0; c < kNumLifetimeClasses; ++c) {
    const ClassTotals& t = r.totals[c];
    double share = r.allocs == 0 ? 0.0 : 100.0 * t.count / r.allocs;
    out += fmt::format("{:<18}{:>10}{:>16}{:>9.1f}%\n",
                       LifetimeClassName(static_cast<LifetimeClass>(c)),
                       t.count, Bytes(t.bytes), share);
  }
  return out;
}

std::string FormatAnalysisJson(const Workload& w, const WorkloadAnalysis& r,
                               int indent) {
  JsonWriter j(indent);
  j.BeginObject();
  j.Key("provenance").String(w.header.provenance);
  j.Key("events").Uint(w.events);
  j.Key("events_by_kind").BeginObject();
  for (size_t k = 1; k < w.events_by_kind.size(); ++k) {
    j.Key(EventKindName(static_cast<EventKind>(k))).Uint(w.events_by_kind[k]);
  }
  j.EndObject();
  j.Key("allocs").Uint(r.allocs);
  j.Key("frees").Uint(r.frees);
  j.Key("never_freed").Uint(r.never_freed);
  j.Key("distinct_sizes").Uint(r.distinct_sizes);
  j.Key("peak_live_bytes").Uint(r.peak_live_bytes);
  j.Key("peak_time").Int(r.peak_time);
  j.Key("peak_live_bytes_512").Uint(r.peak_live_bytes_512);
  j.Key("peak_live_bytes_2mib").Uint(r.peak_live_bytes_2mib);
  j.Key("iterations").Uint(w.iterations.size());
  j.Key("iteration_source").String(IterationSourceName(w.iteration_source));
  if (w.iteration_source == IterationSource::kPeriod) {
    j.Key("period").Uint(w.period.period);
    j.Key("head").Uint(w.period.head);
  } else {
    j.Key("period").Null();
    j.Key("head").Null();
  }
  j.Key("iteration_boundaries").BeginArray();
  for (size_t k = 0; k < w.iterations.size(); ++k) {
    const Iteration& it = w.iterations[k];
    const IterationStats& s = r.iterations[k];
    j.BeginObject();
    j.Key("number").Uint(it.number);
    j.Key("begin").Int(it.begin);
    j.Key("end").Int(it.end);
    j.Key("complete").Bool(it.complete);
    j.Key("allocs").Uint(s.allocs);
    if (s.matched_previous.has_value()) {
      j.Key("matched_previous").Uint(*s.matched_previous);
    } else {
      j.Key("matched_previous").Null();
    }
    j.Key("peak_live_bytes").Uint(s.peak_live_bytes);
    j.EndObject();
  }
  j.EndArray();
  if (r.steady_state >= 0) {
    j.Key("steady_state").Int(r.steady_state);
  } else {
    j.Key("steady_state").Null();
  }
  if (r.regularity.has_value()) {
    j.Key("regularity").Double(*r.regularity);
  } else {
    j.Key("regularity").Null();
  }
  j.Key("phases_inferred").Bool(w.phases_inferred);
  j.Key("classes").BeginObject();
  for (size_t c = 0; c < kNumLifetimeClasses; ++c) {
    j.Key(LifetimeClassName(static_cast<LifetimeClass>(c))).BeginObject();
    j.Key("count").Uint(r.totals[c].count);
    j.Key("bytes").Uint(r.totals[c].bytes);
    j.EndObject();
  }
  j.EndObject();
  j.EndObject();
  return j.str() + "\n";
}

}  // namespace loom::plan
