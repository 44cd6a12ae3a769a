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

}  // namespace

std::string FormatTable(const Comparison& c) {
  std::string out;
  const TraceSummary& s = c.summary;
  out += fmt::format("input: {}\n", c.input);
  if (!c.provenance.empty()) out += fmt::format("trace: {}\n", c.provenance);
  out += fmt::format(
      "{} events, {} allocations, {} iteration{}, {} stream{}, largest "
      "request {}\n",
      s.events, s.allocs, s.iterations, s.iterations == 1 ? "" : "s", s.streams,
      s.streams == 1 ? "" : "s", FormatBytes(s.max_request));
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
      fmt::format("{:<20} {:>14} {:>14} {:>14} {:>11} {:>14} {:>8}\n",
                  "allocator", "peak alloc", "own alloc peak", "peak reserved",
                  "efficiency", "fragmentation", "driver");
  out += header;
  out += std::string(header.size() - 1, '-') + "\n";
  for (const ReplayResult& r : c.rows) {
    out += fmt::format(
        "{:<20} {:>14} {:>14} {:>14} {:>11} {:>14} {:>8}{}\n", r.allocator,
        FormatBytes(r.peak_requested), FormatBytes(r.peak_allocated),
        FormatBytes(r.peak_reserved), Percent(r.efficiency()),
        Percent(r.fragmentation()), r.driver_calls.total(),
        r.oom ? fmt::format("  OOM at event {}", r.oom_event) : "");
  }
  out +=
      "\npeak alloc = peak of live requested bytes (the same trace for "
      "all);\nefficiency = peak alloc / peak reserved; driver = driver "
      "calls made.\n\ndriver calls by kind:\n";
  for (const ReplayResult& r : c.rows) {
    out +=
        fmt::format("  {:<20} {}\n", r.allocator, CallsByKind(r.driver_calls));
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
    w.Key("driver_calls").BeginObject();
    w.Key("total").Uint(r.driver_calls.total());
    for (const auto& [name, count] : r.driver_calls.Named()) {
      w.Key(name).Uint(count);
    }
    w.EndObject();
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
