#include "plan/analysis/workload.h"

#include <algorithm>
#include <map>
#include <tuple>
#include <unordered_map>

#include "plan/solver/minimalloc_csv.h"
#include "plan/trace/trace_binary.h"

namespace loom::plan {
namespace {

// Builds a Workload from events in time order.
class WorkloadBuilder {
 public:
  WorkloadBuilder() = default;

  // REQUIRES: `event` is valid after the events before it (TraceChecker).
  void Add(const Event& event, const std::vector<std::string>& names);
  Workload Finish(const TraceHeader& header, std::vector<std::string> names);

 private:
  int32_t PhaseIndex(uint32_t name, const std::vector<std::string>& names);
  int32_t InnermostModule() const {
    return modules_.empty() ? kNone
                            : static_cast<int32_t>(modules_.back().first);
  }
  int32_t InnermostDynamicModule() const {
    if (dynamic_open_ == 0) return kNone;
    for (auto it = modules_.rbegin(); it != modules_.rend(); ++it) {
      if (it->second) return static_cast<int32_t>(it->first);
    }
    return kNone;
  }
  void DetectIterations();
  void InferPhases();

  Workload w_;
  std::unordered_map<uint64_t, size_t> live_;       // request id -> allocation
  std::vector<std::pair<uint32_t, bool>> modules_;  // (name, dynamic)
  int dynamic_open_ = 0;
  // Enters of each dynamic module, by phase, in the current iteration.
  std::map<std::pair<uint32_t, int32_t>, uint32_t> enters_;
  std::unordered_map<uint32_t, int32_t> phase_of_name_;
  int32_t phase_ = kNone;
  int32_t iteration_ = kNoIteration;
  bool iteration_open_ = false;
  std::vector<uint64_t> tokens_;      // per alloc/free event
  std::vector<int64_t> token_times_;  // its time
  std::vector<int64_t> deltas_;       // its bytes: + allocated, - freed
};

void WorkloadBuilder::Add(const Event& e,
                          const std::vector<std::string>& names) {
  const int64_t t = static_cast<int64_t>(w_.events++);
  ++w_.events_by_kind[static_cast<size_t>(e.kind) & 7];
  switch (e.kind) {
    case EventKind::kAlloc: {
      Allocation a;
      a.request_id = e.id;
      a.alloc_time = t;
      a.size = e.size;
      a.stream = e.stream;
      a.device = e.device;
      a.alloc_iteration = iteration_;
      a.alloc_phase = phase_;
      a.alloc_module = InnermostModule();
      a.dynamic = dynamic_open_ > 0;
      a.alloc_dynamic_module = InnermostDynamicModule();
      if (a.alloc_dynamic_module != kNone) {
        auto it = enters_.find(
            {static_cast<uint32_t>(a.alloc_dynamic_module), phase_});
        a.dynamic_call = it != enters_.end() ? it->second : 0;
      }
      live_[e.id] = w_.allocations.size();
      w_.allocations.push_back(a);
      tokens_.push_back(AllocationToken(true, e.size));
      token_times_.push_back(t);
      deltas_.push_back(static_cast<int64_t>(e.size));
      break;
    }
    case EventKind::kFree: {
      auto it = live_.find(e.id);
      LOOM_CHECK(it != live_.end(), "free of request {} which is not live",
                 e.id);
      Allocation& a = w_.allocations[it->second];
      live_.erase(it);
      a.free_time = t;
      a.free_iteration = iteration_;
      a.free_phase = phase_;
      a.free_module = InnermostModule();
      tokens_.push_back(AllocationToken(false, a.size));
      token_times_.push_back(t);
      deltas_.push_back(-static_cast<int64_t>(a.size));
      break;
    }
    case EventKind::kIterationBegin:
      if (iteration_open_) {  // a begin-only iteration, closed by this one
        w_.iterations.back().end = t;
        w_.iterations.back().complete = true;
      }
      w_.iterations.push_back({t, t, e.id, false});
      enters_.clear();
      iteration_ = static_cast<int32_t>(w_.iterations.size() - 1);
      iteration_open_ = true;
      break;
    case EventKind::kIterationEnd:
      if (!w_.iterations.empty()) {
        w_.iterations.back().end = t + 1;
        w_.iterations.back().complete = true;
      }
      iteration_open_ = false;
      break;
    case EventKind::kPhase:
      phase_ = PhaseIndex(e.name, names);
      break;
    case EventKind::kModuleEnter: {
      bool dynamic = (e.flags & kDynamicModule) != 0;
      modules_.emplace_back(e.name, dynamic);
      dynamic_open_ += dynamic;
      if (dynamic) ++enters_[{e.name, phase_}];
      break;
    }
    case EventKind::kModuleExit:
      if (!modules_.empty()) {
        dynamic_open_ -= modules_.back().second;
        modules_.pop_back();
      }
      break;
  }
}

int32_t WorkloadBuilder::PhaseIndex(uint32_t name,
                                    const std::vector<std::string>& names) {
  auto [it, inserted] = phase_of_name_.try_emplace(
      name, static_cast<int32_t>(w_.phase_names.size()));
  if (inserted) w_.phase_names.push_back(names[name]);
  return it->second;
}

void WorkloadBuilder::DetectIterations() {
  const int64_t events = static_cast<int64_t>(w_.events);
  w_.period = DetectPeriod(tokens_, deltas_);
  if (!w_.period.found) {
    w_.iteration_source = IterationSource::kWholeTrace;
    w_.iterations = {{0, events, 0, true}};
  } else {
    w_.iteration_source = IterationSource::kPeriod;
    const std::vector<size_t>& starts = w_.period.starts;
    for (size_t k = 0; k < starts.size(); ++k) {
      Iteration it;
      it.begin = token_times_[starts[k]];
      it.end = k + 1 < starts.size() ? token_times_[starts[k + 1]] : events;
      it.number = k;
      size_t tokens =
          (k + 1 < starts.size() ? starts[k + 1] : tokens_.size()) - starts[k];
      it.complete = tokens >= w_.period.period ||
                    (k + 1 < starts.size());  // resynchronised boundaries
      w_.iterations.push_back(it);
    }
  }
  // Places a time in the last iteration begun at or before it.
  auto iteration_at = [&](int64_t time) -> int32_t {
    auto it = std::upper_bound(
        w_.iterations.begin(), w_.iterations.end(), time,
        [](int64_t t, const Iteration& i) { return t < i.begin; });
    return static_cast<int32_t>(it - w_.iterations.begin()) - 1;
  };
  for (Allocation& a : w_.allocations) {
    a.alloc_iteration = iteration_at(a.alloc_time);
    a.free_iteration = a.freed() ? iteration_at(a.free_time) : kNoIteration;
  }
}

void WorkloadBuilder::InferPhases() {
  // Live bytes after each event.
  std::vector<int64_t> live(w_.events, 0);
  for (const Allocation& a : w_.allocations) {
    live[a.alloc_time] += static_cast<int64_t>(a.size);
    if (a.freed()) live[a.free_time] -= static_cast<int64_t>(a.size);
  }
  for (size_t t = 1; t < live.size(); ++t) live[t] += live[t - 1];
  std::vector<int64_t> peak_time(w_.iterations.size());
  for (size_t k = 0; k < w_.iterations.size(); ++k) {
    const Iteration& it = w_.iterations[k];
    int64_t best = it.begin;
    for (int64_t t = it.begin; t < it.end; ++t) {
      if (live[t] > live[best]) best = t;
    }
    peak_time[k] = best;
  }
  w_.phase_names = {std::string(kPhaseForward), std::string(kPhaseBackward)};
  w_.phases_inferred = true;
  auto phase = [&](int32_t iteration, int64_t time) -> int32_t {
    if (iteration < 0) return kNone;
    return time <= peak_time[iteration] ? 0 : 1;
  };
  for (Allocation& a : w_.allocations) {
    a.alloc_phase = phase(a.alloc_iteration, a.alloc_time);
    a.free_phase = a.freed() ? phase(a.free_iteration, a.free_time) : kNone;
  }
}

Workload WorkloadBuilder::Finish(const TraceHeader& header,
                                 std::vector<std::string> names) {
  w_.header = header;
  w_.names = std::move(names);
  if (!w_.iterations.empty()) {
    w_.iteration_source = IterationSource::kMarkers;
    if (iteration_open_) {
      w_.iterations.back().end = static_cast<int64_t>(w_.events);
    }
  } else {
    DetectIterations();
  }
  if (w_.phase_names.empty() && w_.events > 0) InferPhases();
  tokens_.clear();
  token_times_.clear();
  deltas_.clear();
  return std::move(w_);
}

}  // namespace

std::string_view IterationSourceName(IterationSource source) {
  switch (source) {
    case IterationSource::kMarkers:
      return "markers";
    case IterationSource::kPeriod:
      return "period";
    case IterationSource::kWholeTrace:
      return "whole_trace";
  }
  return "unknown";
}

uint64_t AllocationToken(bool alloc, uint64_t size) {
  // splitmix64 of (size, action).
  uint64_t z = size * 2 + (alloc ? 1 : 0) + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

StatusOr<Workload> LoadWorkload(TraceReader& reader) {
  WorkloadBuilder builder;
  Event event;
  while (true) {
    LOOM_ASSIGN_OR_RETURN(bool more, reader.Next(&event));
    if (!more) break;
    builder.Add(event, reader.names());
  }
  return builder.Finish(reader.header(), reader.names());
}

StatusOr<Workload> LoadWorkloadFile(const std::string& path) {
  // Sniff the first line: a CSV header has commas and no trace magic.
  bool csv = false;
  {
    LOOM_ASSIGN_OR_RETURN(std::unique_ptr<ByteSource> source,
                          OpenFileSource(path));
    ByteReader in(std::move(source));
    LOOM_ASSIGN_OR_RETURN(std::string_view head, in.Peek(4096));
    if (!head.starts_with(kBinaryTraceMagic)) {
      // The first line that is neither blank nor a comment.
      while (!head.empty()) {
        size_t newline = head.find('\n');
        std::string_view line = head.substr(0, newline);
        head = newline == std::string_view::npos ? std::string_view()
                                                 : head.substr(newline + 1);
        size_t first = line.find_first_not_of(" \t\r");
        if (first == std::string_view::npos || line[first] == '#') continue;
        csv = line.find(',') != std::string_view::npos &&
              line.find("loom-trace") == std::string_view::npos;
        break;
      }
    }
  }
  if (csv) {
    LOOM_ASSIGN_OR_RETURN(CsvInstance csv_instance, ReadMinimallocCsv(path));
    Status valid = ValidateInstance(csv_instance.instance);
    if (!valid.ok()) {
      return Status(valid.code(), fmt::format("{}: {}", path, valid.message()));
    }
    if (csv_instance.instance.period != 0) {
      return InvalidArgumentError("{}: cyclic instances are not supported",
                                  path);
    }
    Trace trace = TraceFromInstance(csv_instance.instance);
    trace.header.provenance = "MiniMalloc CSV " + path;
    return BuildWorkload(trace);
  }
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<TraceReader> reader,
                        OpenTraceReader(path));
  return LoadWorkload(*reader);
}

Workload BuildWorkload(const Trace& trace) {
  WorkloadBuilder builder;
  for (const Event& event : trace.events) builder.Add(event, trace.names);
  return builder.Finish(trace.header, trace.names);
}

Trace TraceFromInstance(const Instance& instance) {
  // (time, 0 = free / 1 = alloc, buffer index)
  std::vector<std::tuple<int64_t, int, size_t>> order;
  order.reserve(2 * instance.buffers.size());
  for (size_t i = 0; i < instance.buffers.size(); ++i) {
    order.emplace_back(instance.buffers[i].start, 1, i);
    order.emplace_back(instance.buffers[i].end, 0, i);
  }
  std::sort(order.begin(), order.end());
  Trace trace;
  trace.header.provenance = "MiniMalloc CSV instance";
  trace.events.reserve(order.size());
  for (auto [time, alloc, i] : order) {
    if (alloc) {
      trace.AddAlloc(i, instance.buffers[i].size);
    } else {
      trace.AddFree(i);
    }
  }
  return trace;
}

}  // namespace loom::plan
