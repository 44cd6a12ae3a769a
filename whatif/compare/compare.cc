#include "whatif/compare/compare.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "base/json.h"
#include "base/text.h"
#include "whatif/sim/caching_allocator.h"

namespace loom::whatif {

std::vector<AllocatorFactory> BaselineAllocators(
    const CompareOptions& options) {
  std::vector<AllocatorFactory> factories;
  for (bool expandable : {false, true}) {
    CachingConfig config = options.pytorch;
    config.expandable_segments = expandable;
    factories.push_back({expandable ? "pytorch_expandable" : "pytorch",
                         [config](const plan::Trace&, const SimOptions& sim)
                             -> StatusOr<std::unique_ptr<SimAllocator>> {
                           return std::unique_ptr<SimAllocator>(
                               std::make_unique<CachingAllocator>(config, sim));
                         }});
  }
  GmlakeOptions gmlake = options.gmlake;
  factories.push_back({"gmlake",
                       [gmlake](const plan::Trace&, const SimOptions& sim)
                           -> StatusOr<std::unique_ptr<SimAllocator>> {
                         return std::unique_ptr<SimAllocator>(
                             std::make_unique<GmlakeAllocator>(gmlake, sim));
                       }});
  return factories;
}

TraceSummary Summarize(const plan::Trace& trace) {
  TraceSummary summary;
  std::set<uint64_t> streams;
  summary.events = trace.events.size();
  for (const plan::Event& e : trace.events) {
    if (e.kind == plan::EventKind::kAlloc) {
      ++summary.allocs;
      streams.insert(e.stream);
      summary.max_request = std::max(summary.max_request, e.size);
    } else if (e.kind == plan::EventKind::kIterationBegin) {
      ++summary.iterations;
    }
  }
  summary.streams = streams.size();
  return summary;
}

StatusOr<Comparison> Compare(const plan::Trace& trace, std::string input,
                             const std::vector<AllocatorFactory>& allocators,
                             const CompareOptions& options) {
  Comparison comparison;
  comparison.input = std::move(input);
  comparison.provenance = trace.header.provenance;
  comparison.summary = Summarize(trace);
  comparison.capacity = options.capacity;
  comparison.address_order = options.address_order;
  comparison.driver_costs = options.driver_costs;
  SimOptions sim{options.capacity, options.address_order};
  ReplayOptions replay;
  replay.max_samples = options.max_samples;
  replay.check_invariants = options.check_invariants;
  for (const AllocatorFactory& factory : allocators) {
    StatusOr<std::unique_ptr<SimAllocator>> allocator =
        factory.make(trace, sim);
    if (!allocator.ok()) return allocator.status().WithContext(factory.name);
    StatusOr<ReplayResult> result = Replay(trace, **allocator, replay);
    if (!result.ok()) return result.status().WithContext(factory.name);
    result->allocator = factory.name;
    comparison.rows.push_back(std::move(*result));
    comparison.plan_from.push_back(factory.plan_from);
  }
  return comparison;
}

namespace {

std::string Percent(double fraction) {
  double percent = 100.0 * fraction;
  if (percent > 0.0 && percent < 0.01) return fmt::format("{:.1e}%", percent);
  return fmt::format("{:.2f}%", percent);
}

std::string CallsByKind(const DriverCalls& calls) {
  std::string out;
  for (const auto& [name, count] : calls.Named()) {
    if (count == 0) continue;
    if (!out.empty()) out += ", ";
    out += fmt::format("{} {}", name, count);
  }
  return out.empty() ? "none" : out;
}

// The main table's driver-time cell: ">=" when some calls are unpriced,
// "n/a" when none is priced.
std::string TimeCell(const DriverTime& t) {
  if (t.priced_calls == 0 && t.unpriced_calls > 0) return "n/a";
  return (t.complete() ? "" : ">= ") + FormatMicros(t.us);
}

}  // namespace

void DriverCallsJson(JsonWriter& w, const DriverCalls& calls) {
  w.BeginObject();
  w.Key("total").Uint(calls.total());
  for (const auto& [name, count] : calls.Named()) w.Key(name).Uint(count);
  w.EndObject();
}

void DriverTimeJson(JsonWriter& w, const ReplayResult& row,
                    const DriverCostTable& costs) {
  const DriverTime total = PriceDriverCalls(row.driver_calls, costs);
  const DriverTime warm = PriceDriverCalls(row.warmup_driver_calls, costs);
  w.BeginObject();
  w.Key("costs").String(costs.source);
  w.Key("total_us").Double(total.us);
  w.Key("warmup_us").Double(warm.us);
  // As the table prints them ("12.4 ms", ">= 576.7 ms", "n/a"): what
  // scripts show, so that no other formatter repeats this one.
  w.Key("warmup_text").String(TimeCell(warm));
  if (row.has_steady) {
    const DriverTime steady = PriceDriverCalls(row.steady_driver_calls, costs);
    w.Key("steady_us").Double(steady.us);
    w.Key("steady_text").String(TimeCell(steady));
  } else {
    w.Key("steady_us").Null();
    w.Key("steady_text").Null();
  }
  w.Key("complete").Bool(total.complete());
  w.Key("unpriced_calls").Uint(total.unpriced_calls);
  w.Key("unpriced_kinds").BeginArray();
  for (const std::string& kind : total.unpriced_kinds) w.String(kind);
  w.EndArray();
  w.Key("unsized_calls").Uint(total.unsized_calls);
  w.EndObject();
}

std::string DriverTimeLine(const ReplayResult& row,
                           const DriverCostTable& costs) {
  const DriverTime warm = PriceDriverCalls(row.warmup_driver_calls, costs);
  std::string out = fmt::format(
      "warm-up {} calls {}", row.warmup_driver_calls.total(), TimeCell(warm));
  if (row.has_steady) {
    const DriverTime steady = PriceDriverCalls(row.steady_driver_calls, costs);
    out += fmt::format("; steady {} calls {} per iteration",
                       row.steady_driver_calls.total(), TimeCell(steady));
  } else {
    out += "; steady: no complete iteration";
  }
  const DriverTime total = PriceDriverCalls(row.driver_calls, costs);
  if (!total.complete()) {
    std::string kinds;
    for (const std::string& kind : total.unpriced_kinds) {
      kinds += (kinds.empty() ? "" : ", ") + kind;
    }
    out += fmt::format(" ({} calls unpriced: no cost for {})",
                       total.unpriced_calls, kinds);
  }
  if (total.unsized_calls > 0) {
    out += fmt::format(" (sizes not recorded: priced at {})",
                       FormatBytes(costs.smallest_bytes()));
  }
  return out;
}

std::string FormatTable(const Comparison& c) {
  std::string out;
  const TraceSummary& s = c.summary;
  out += fmt::format("input: {}\n", c.input);
  if (!c.provenance.empty()) out += fmt::format("trace: {}\n", c.provenance);
  // The iterations as `loom analyze` counts them: markers, else detected,
  // else the whole trace.
  const std::string iterations =
      s.iterations > 0
          ? fmt::format("{} iteration{}", s.iterations,
                        s.iterations == 1 ? "" : "s")
      : s.detected_iterations > 0
          ? fmt::format("{} iteration{} detected (no markers)",
                        s.detected_iterations,
                        s.detected_iterations == 1 ? "" : "s")
          : std::string("1 iteration (no markers, no repetition: the "
                        "whole trace)");
  out += fmt::format(
      "{} events, {} allocations, {}, {} stream{}, largest request {}\n",
      s.events, s.allocs, iterations, s.streams, s.streams == 1 ? "" : "s",
      FormatBytes(s.max_request));
  if (!c.perturbation.empty()) {
    out += fmt::format(
        "perturbed: {} (every allocator replays the same "
        "perturbed trace)\n",
        c.perturbation);
  }
  out += fmt::format("device capacity: {}; new address ranges {}\n",
                     c.capacity == 0 ? "unlimited" : FormatBytes(c.capacity),
                     AddressOrderName(c.address_order));
  for (size_t i = 0; i < c.rows.size() && i < c.plan_from.size(); ++i) {
    if (!c.plan_from[i].empty()) {
      out += fmt::format("{} planned from: {}\n", c.rows[i].allocator,
                         c.plan_from[i]);
    }
  }
  out += "\n";
  const std::string header =
      fmt::format("{:<20} {:>14} {:>14} {:>14} {:>11} {:>14} {:>8} {:>12}\n",
                  "allocator", "peak alloc", "own alloc peak", "peak reserved",
                  "efficiency", "fragmentation", "driver", "driver time");
  out += header;
  out += std::string(header.size() - 1, '-') + "\n";
  for (const ReplayResult& r : c.rows) {
    out += fmt::format(
        "{:<20} {:>14} {:>14} {:>14} {:>11} {:>14} {:>8} {:>12}{}\n",
        r.allocator, FormatBytes(r.peak_requested),
        FormatBytes(r.peak_allocated), FormatBytes(r.peak_reserved),
        Percent(r.efficiency()), Percent(r.fragmentation()),
        r.driver_calls.total(),
        TimeCell(PriceDriverCalls(r.driver_calls, c.driver_costs)),
        r.oom ? fmt::format("  OOM at event {}", r.oom_event) : "");
  }
  out +=
      "\npeak alloc = peak of live requested bytes (the same trace for "
      "all);\nown alloc peak = peak of the allocator's own allocated bytes "
      "(the blocks it handed out: its\n  rounding and unsplit remainders "
      "included);\npeak reserved = peak of physical "
      "memory held; efficiency = peak alloc / peak reserved;\n"
      "fragmentation = 1 - efficiency; driver = driver calls made;\n"
      "driver time = what those calls take at the measured per-call costs "
      "below.\n\ndriver calls by kind:\n";
  for (const ReplayResult& r : c.rows) {
    out +=
        fmt::format("  {:<20} {}\n", r.allocator, CallsByKind(r.driver_calls));
  }
  out += fmt::format(
      "\ndriver time, warm-up (before the last complete iteration) and "
      "steady state (that iteration),\nat the per-call medians of {}:\n",
      c.driver_costs.source);
  for (const ReplayResult& r : c.rows) {
    out += fmt::format("  {:<20} {}\n", r.allocator,
                       DriverTimeLine(r, c.driver_costs));
  }
  std::string notes;
  for (const ReplayResult& r : c.rows) {
    std::string line;
    if (r.stats.num_alloc_retries > 0) {
      line += fmt::format("{} alloc retries (cache flushed)",
                          r.stats.num_alloc_retries);
    }
    if (r.oom) {
      line += fmt::format("{}out of memory at event {}: {}",
                          line.empty() ? "" : "; ", r.oom_event, r.oom_message);
    }
    for (const auto& [name, value] : r.counters) {
      line += fmt::format("{}{} {}", line.empty() ? "" : "; ", name, value);
    }
    if (!line.empty()) notes += fmt::format("  {:<20} {}\n", r.allocator, line);
  }
  if (!notes.empty()) out += "\nnotes:\n" + notes;
  return out;
}

std::string FormatJson(const Comparison& c) {
  JsonWriter w(2);
  w.BeginArray();
  for (size_t i = 0; i < c.rows.size(); ++i) {
    const ReplayResult& r = c.rows[i];
    w.BeginObject();
    w.Key("allocator").String(r.allocator);
    if (i < c.plan_from.size() && !c.plan_from[i].empty()) {
      w.Key("plan_from").String(c.plan_from[i]);
    }
    if (!c.perturbation.empty()) w.Key("perturbation").String(c.perturbation);
    w.Key("peak_allocated_bytes").Uint(r.peak_requested);
    w.Key("allocator_peak_allocated_bytes").Uint(r.peak_allocated);
    w.Key("peak_reserved_bytes").Uint(r.peak_reserved);
    w.Key("efficiency").Double(r.efficiency());
    w.Key("fragmentation").Double(r.fragmentation());
    w.Key("fragmentation_bytes")
        .Uint(r.peak_reserved > r.peak_requested
                  ? r.peak_reserved - r.peak_requested
                  : 0);
    w.Key("driver_calls");
    DriverCallsJson(w, r.driver_calls);
    w.Key("warmup_driver_calls_by_kind");
    DriverCallsJson(w, r.warmup_driver_calls);
    w.Key("steady_driver_calls_by_kind");
    if (r.has_steady) {
      DriverCallsJson(w, r.steady_driver_calls);
    } else {
      w.Null();
    }
    w.Key("driver_time");
    DriverTimeJson(w, r, c.driver_costs);
    w.Key("num_alloc_retries").Uint(r.stats.num_alloc_retries);
    w.Key("num_ooms").Uint(r.stats.num_ooms);
    w.Key("oom").Bool(r.oom);
    w.Key("oom_event");
    if (r.oom) {
      w.Uint(r.oom_event);
    } else {
      w.Null();
    }
    w.Key("final_reserved_bytes").Int(r.stats.reserved_bytes.all().current);
    w.Key("events_replayed").Uint(r.events);
    w.Key("counters").BeginObject();
    for (const auto& [name, value] : r.counters) w.Key(name).Uint(value);
    w.EndObject();
    w.EndObject();
  }
  w.EndArray();
  return w.str() + "\n";
}

std::string FormatSeriesCsv(const Comparison& c) {
  std::string out =
      "allocator,time,iteration,requested_bytes,allocated_bytes,"
      "reserved_bytes\n";
  for (const ReplayResult& r : c.rows) {
    for (const MemorySample& s : r.series) {
      out += fmt::format("{},{},{},{},{},{}\n", r.allocator, s.time,
                         s.iteration, s.requested, s.allocated, s.reserved);
    }
  }
  return out;
}

}  // namespace loom::whatif
