#include "bench/runtime/c_abi_replay.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <unordered_map>
#include <utility>

#include "base/flags.h"
#include "torch_plugin/loom_c_api.h"
#include "whatif/sim/caching_allocator.h"

namespace loom::bench {
namespace {

using plan::Event;
using plan::EventKind;
using Clock = std::chrono::steady_clock;

constexpr double kGiB = double(uint64_t{1} << 30);

bool IsRequest(EventKind kind) {
  return kind == EventKind::kAlloc || kind == EventKind::kFree;
}

// A completed iteration: [begin, end) in the trace, markers included.
struct Span {
  uint64_t begin = 0;
  uint64_t end = 0;
  uint64_t number = 0;
};

std::vector<Span> CompleteIterations(const plan::Trace& trace) {
  std::vector<Span> out;
  bool open = false;
  Span span;
  for (uint64_t i = 0; i < trace.events.size(); ++i) {
    const Event& e = trace.events[i];
    if (e.kind == EventKind::kIterationBegin) {
      open = true;
      span = {i, 0, e.id};
    } else if (e.kind == EventKind::kIterationEnd && open) {
      open = false;
      span.end = i + 1;
      out.push_back(span);
    }
  }
  return out;
}

Status CallFailed(std::string_view call) {
  return InternalError("{}: {}", call, loom_last_error());
}

// loom_stats_json of device 0, parsed.
class LoomStats {
 public:
  static LoomStats Read() {
    std::string buffer(size_t{1} << 16, '\0');
    long long n = loom_stats_json(0, buffer.data(), buffer.size());
    if (n >= static_cast<long long>(buffer.size())) {
      buffer.assign(static_cast<size_t>(n) + 1, '\0');
      n = loom_stats_json(0, buffer.data(), buffer.size());
    }
    buffer.resize(n < 0 ? 0 : static_cast<size_t>(n));
    return LoomStats(FlatJsonNumbers(buffer));
  }
  uint64_t Get(const std::string& key) const {
    auto it = numbers_.find(key);
    return it == numbers_.end()
               ? 0
               : std::strtoull(it->second.c_str(), nullptr, 10);
  }
  const std::map<std::string, std::string>& numbers() const { return numbers_; }

  LayoutFigures Layout() const {
    LayoutFigures l;
    l.handles = Get("loom.layout.handles");
    l.handle_bytes = Get("loom.layout.handle_bytes");
    l.mappings = Get("loom.layout.mappings");
    l.mapped_bytes = Get("loom.layout.mapped_bytes");
    const std::string prefix = "loom.layout.handle_size.";
    constexpr std::string_view kHandles = ".handles";
    std::vector<std::pair<uint64_t, LayoutFigures::Bucket>> buckets;
    for (const auto& [key, value] : numbers_) {
      if (key.rfind(prefix, 0) != 0 || !key.ends_with(kHandles)) continue;
      const std::string size = key.substr(
          prefix.size(), key.size() - prefix.size() - kHandles.size());
      const std::string base = prefix + size + ".";
      StatusOr<uint64_t> bytes = ParseSize(size);
      buckets.push_back({bytes.ok() ? *bytes : 0,
                         {size, Get(base + "handles"), Get(base + "bytes"),
                          Get(base + "mappings")}});
    }
    std::sort(buckets.begin(), buckets.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    for (auto& [bytes, bucket] : buckets) l.buckets.push_back(bucket);
    return l;
  }

 private:
  explicit LoomStats(std::map<std::string, std::string> numbers)
      : numbers_(std::move(numbers)) {}
  std::map<std::string, std::string> numbers_;
};

void* AsPointer(uint64_t stream) {
  return reinterpret_cast<void*>(static_cast<uintptr_t>(stream));
}

// A marker through the C ABI; iteration markers carry `number`.
void LoomMarker(const Event& e, const plan::Trace& trace, uint64_t number) {
  switch (e.kind) {
    case EventKind::kIterationBegin:
      loom_iteration_begin(static_cast<long long>(number));
      break;
    case EventKind::kIterationEnd:
      loom_iteration_end(static_cast<long long>(number));
      break;
    case EventKind::kPhase:
      loom_phase(trace.names[e.name].c_str());
      break;
    case EventKind::kModuleEnter:
      loom_module_enter(trace.names[e.name].c_str(),
                        (e.flags & plan::kDynamicModule) != 0);
      break;
    case EventKind::kModuleExit:
      loom_module_exit(trace.names[e.name].c_str());
      break;
    default:
      break;
  }
}

struct LoomBlock {
  void* ptr = nullptr;
  uint64_t size = 0;
};

// Records, plans and installs the plan, as auto mode does at its switch.
Status PlanAndInstall(const CAbiReplayOptions& options,
                      CAbiReplayResult& result) {
  const std::string stem =
      fmt::format("{}/steptime_proxy.{}", options.work_dir, ::getpid());
  const std::string trace_path = stem + ".ltb";
  const std::string plan_path = stem + ".lplan";
  if (loom_write_trace(0, trace_path.c_str()) != 0) {
    return CallFailed("loom_write_trace");
  }
  const std::string plan_options =
      fmt::format("persistent=0;time_limit={}", options.plan_time_limit);
  const int planned = loom_plan_trace(trace_path.c_str(), plan_path.c_str(),
                                      plan_options.c_str());
  std::remove(trace_path.c_str());
  if (planned != 0) return CallFailed("loom_plan_trace");
  result.plan_report = loom_last_result();
  const int loaded = loom_load_plan(0, plan_path.c_str());
  std::remove(plan_path.c_str());
  if (loaded != 0) return CallFailed("loom_load_plan");
  if (loom_stop_recording() != 0) return CallFailed("loom_stop_recording");
  return OkStatus();
}

// The index of the event before which the plan is made: the (K+1)-th
// iteration begin.
StatusOr<uint64_t> PlanCut(const plan::Trace& trace, int64_t k) {
  int64_t begins = 0;
  for (uint64_t i = 0; i < trace.events.size(); ++i) {
    if (trace.events[i].kind == EventKind::kIterationBegin && ++begins > k) {
      return i;
    }
  }
  return InvalidArgumentError(
      "plan from the first {} iterations: the trace has only {} (plan from "
      "fewer, so that the plan serves iterations it was not made from)",
      k, begins);
}

// The allocation ordinal within [span.begin, span.end) of each request id
// allocated there.
std::unordered_map<uint64_t, uint32_t> Ordinals(const plan::Trace& trace,
                                                uint64_t begin, uint64_t end) {
  std::unordered_map<uint64_t, uint32_t> out;
  uint32_t n = 0;
  for (uint64_t i = begin; i < end; ++i) {
    if (trace.events[i].kind == EventKind::kAlloc) {
      out[trace.events[i].id] = n++;
    }
  }
  return out;
}

}  // namespace

StatusOr<SteadyIteration> ExtractSteadyIteration(const plan::Trace& trace) {
  const std::vector<Span> spans = CompleteIterations(trace);
  if (spans.empty()) {
    return InvalidArgumentError("the trace has no complete iteration");
  }
  const Span s = spans.back();
  for (uint64_t i = s.end; i < trace.events.size(); ++i) {
    if (IsRequest(trace.events[i].kind)) {
      return InvalidArgumentError(
          "event {}: requests after the last complete iteration (which "
          "ends at event {}); the steady iteration must end the trace",
          i, s.end - 1);
    }
  }
  SteadyIteration out;
  out.begin = s.begin;
  out.end = s.end;
  out.number = s.number;
  std::unordered_map<uint64_t, uint32_t> previous;  // id -> ordinal
  std::vector<uint64_t> previous_sizes;
  if (spans.size() >= 2) {
    const Span p = spans[spans.size() - 2];
    previous = Ordinals(trace, p.begin, p.end);
    previous_sizes.resize(previous.size());
    for (uint64_t i = p.begin; i < p.end; ++i) {
      const Event& e = trace.events[i];
      if (e.kind == EventKind::kAlloc) previous_sizes[previous[e.id]] = e.size;
    }
  }
  std::unordered_map<uint64_t, uint32_t> mine;  // id -> ordinal
  std::vector<uint64_t> sizes;
  std::vector<bool> freed_here;
  std::vector<std::pair<uint32_t, uint64_t>> previous_frees;  // slot, event
  for (uint64_t i = s.begin; i < s.end; ++i) {
    const Event& e = trace.events[i];
    SteadyOp op;
    op.device = e.device;
    op.stream = e.stream;
    if (e.kind == EventKind::kAlloc) {
      op.kind = SteadyOp::Kind::kAlloc;
      op.slot = static_cast<uint32_t>(sizes.size());
      op.size = e.size;
      mine[e.id] = op.slot;
      sizes.push_back(e.size);
      freed_here.push_back(false);
    } else if (e.kind == EventKind::kFree) {
      op.kind = SteadyOp::Kind::kFree;
      if (auto it = mine.find(e.id); it != mine.end()) {
        op.slot = it->second;
        freed_here[op.slot] = true;
      } else if (auto jt = previous.find(e.id); jt != previous.end()) {
        op.slot = jt->second;
        op.previous = true;
        previous_frees.push_back({op.slot, i});
      } else {
        return InvalidArgumentError(
            "event {}: the steady iteration frees request {}, made before "
            "the iteration before it; it cannot be repeated",
            i, e.id);
      }
    } else {
      op.kind = SteadyOp::Kind::kMarker;
      op.marker = e;
    }
    out.ops.push_back(op);
  }
  out.allocs = static_cast<uint32_t>(sizes.size());
  // What the previous iteration left to this one, this one leaves to the
  // next, at the same ordinals and sizes.
  std::vector<bool> freed_next(sizes.size(), false);
  for (const auto& [slot, event] : previous_frees) {
    if (slot >= sizes.size() || previous_sizes[slot] != sizes[slot] ||
        freed_here[slot]) {
      return InvalidArgumentError(
          "event {}: the steady iteration frees allocation {} of the "
          "iteration before it, which this iteration does not repeat (a "
          "live allocation of the same size at the same ordinal)",
          event, slot);
    }
    freed_next[slot] = true;
  }
  for (uint32_t k = 0; k < sizes.size(); ++k) {
    if (freed_here[k]) continue;
    if (!freed_next[k]) {
      return InvalidArgumentError(
          "allocation {} of the steady iteration (iteration {}) is never "
          "freed: repeating the iteration would leak it",
          k, s.number);
    }
    ++out.carried;
  }
  return out;
}

double LayoutFigures::MappingsPerGiB() const {
  return mapped_bytes == 0 ? 0 : mappings / (mapped_bytes / kGiB);
}

std::string LayoutFigures::Describe() const {
  std::vector<Bucket> top = buckets;
  std::stable_sort(
      top.begin(), top.end(),
      [](const Bucket& a, const Bucket& b) { return a.handles > b.handles; });
  std::string sizes;
  for (size_t i = 0; i < top.size() && i < 3; ++i) {
    sizes +=
        fmt::format("{}{}x{}", i == 0 ? "" : ", ", top[i].handles, top[i].size);
  }
  return fmt::format("{} handles, {} mappings ({})", handles, mappings, sizes);
}

double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

std::map<std::string, std::string> FlatJsonNumbers(const std::string& json) {
  std::map<std::string, std::string> out;
  size_t i = json.find('{');
  if (i == std::string::npos) return out;
  ++i;
  auto read_string = [&](std::string* s) {
    ++i;  // '"'
    while (i < json.size() && json[i] != '"') {
      if (json[i] == '\\') ++i;
      if (i < json.size() && s != nullptr) s->push_back(json[i]);
      ++i;
    }
    ++i;  // '"'
  };
  while (i < json.size()) {
    while (i < json.size() && (json[i] == ',' || json[i] == ' ')) ++i;
    if (i >= json.size() || json[i] != '"') break;
    std::string key;
    read_string(&key);
    i = json.find(':', i);
    if (i == std::string::npos) break;
    ++i;
    if (json[i] == '"') {
      read_string(nullptr);
      continue;
    }
    const size_t end = json.find_first_of(",}", i);
    std::string value = json.substr(i, end - i);
    if (value != "true" && value != "false") out[key] = value;
    i = end;
  }
  return out;
}

StatusOr<CAbiReplayResult> ReplayThroughCAbi(const plan::Trace& trace,
                                             const CAbiReplayOptions& options) {
  for (uint64_t i = 0; i < trace.events.size(); ++i) {
    if (IsRequest(trace.events[i].kind) && trace.events[i].device != 0) {
      return InvalidArgumentError(
          "event {}: device {}; only device 0 is "
          "replayed",
          i, trace.events[i].device);
    }
  }
  CAbiReplayResult result;
  LOOM_ASSIGN_OR_RETURN(result.steady, ExtractSteadyIteration(trace));
  const SteadyIteration& steady = result.steady;
  LOOM_ASSIGN_OR_RETURN(const uint64_t cut, PlanCut(trace, options.plan_from));
  result.trace_events = trace.events.size();
  result.recorded_events = cut;
  result.repetitions = options.repetitions;

  const std::string settings = fmt::format(
      "backend=fake;granularity=2MiB;device_memory={};devices=1;cap=0;"
      "record={};plan=;replan={};replan_time_limit={};max_chunk_pages={};"
      "host_sample_every={}",
      options.device_memory, cut + 64, options.replan ? 1 : 0,
      options.plan_time_limit, options.max_chunk_pages,
      options.host_sample_every);
  if (loom_configure(settings.c_str()) != 0) {
    return CallFailed("loom_configure");
  }
  whatif::CachingConfig config;
  whatif::SimOptions sim_options;
  whatif::CachingAllocator sim(config, sim_options);

  // 1-2. The trace, the plan made and installed at the cut.
  std::unordered_map<uint64_t, LoomBlock> live;
  std::unordered_map<uint64_t, uint64_t> sim_live;
  Status status = OkStatus();
  for (uint64_t i = 0; i < trace.events.size() && status.ok(); ++i) {
    if (i == cut) status = PlanAndInstall(options, result);
    if (!status.ok()) break;
    const Event& e = trace.events[i];
    if (e.kind == EventKind::kAlloc) {
      void* p = loom_malloc(static_cast<ssize_t>(e.size), e.device,
                            AsPointer(e.stream));
      if (p == nullptr) {
        status = CallFailed(fmt::format("event {}: loom_malloc", i));
      }
      live[e.id] = {p, e.size};
      if (options.simulate) {
        StatusOr<uint64_t> a = sim.Malloc(e.size, e.stream);
        if (!a.ok()) status = a.status();
        if (a.ok()) sim_live[e.id] = *a;
      }
    } else if (e.kind == EventKind::kFree) {
      auto it = live.find(e.id);
      if (it == live.end()) {
        status = InvalidArgumentError("event {}: free of request {}, not live",
                                      i, e.id);
        break;
      }
      loom_free(it->second.ptr, static_cast<ssize_t>(it->second.size), e.device,
                AsPointer(e.stream));
      live.erase(it);
      if (options.simulate) {
        status = sim.Free(sim_live[e.id]);
        sim_live.erase(e.id);
      }
    } else {
      LoomMarker(e, trace, e.id);
      if (options.simulate) sim.OnMarker(e);
    }
  }

  // The steady iteration's allocations that outlive it: the first
  // repetition frees them.
  std::vector<LoomBlock> prev(steady.allocs), cur(steady.allocs);
  std::vector<uint64_t> sim_prev(steady.allocs), sim_cur(steady.allocs);
  for (const auto& [id, slot] : Ordinals(trace, steady.begin, steady.end)) {
    if (auto it = live.find(id); it != live.end()) {
      prev[slot] = it->second;
      live.erase(it);
      sim_prev[slot] = sim_live[id];
      sim_live.erase(id);
    }
  }

  // 3. The steady iteration, repeated; loom's and the simulator's turns
  // alternate.
  const LoomStats before = LoomStats::Read();
  const uint64_t sim_calls_before = sim.driver_calls().total();
  for (int r = 0; r < options.repetitions && status.ok(); ++r) {
    const uint64_t number = steady.number + 1 + static_cast<uint64_t>(r);
    Clock::duration inside{};
    Clock::time_point start = Clock::now();
    for (const SteadyOp& op : steady.ops) {
      if (op.kind == SteadyOp::Kind::kAlloc) {
        void* p = loom_malloc(static_cast<ssize_t>(op.size), op.device,
                              AsPointer(op.stream));
        if (p == nullptr) {
          status = CallFailed("steady iteration: loom_malloc");
          break;
        }
        cur[op.slot] = {p, op.size};
      } else if (op.kind == SteadyOp::Kind::kFree) {
        LoomBlock& b = op.previous ? prev[op.slot] : cur[op.slot];
        loom_free(b.ptr, static_cast<ssize_t>(b.size), op.device,
                  AsPointer(op.stream));
        b.ptr = nullptr;
      } else {
        inside += Clock::now() - start;
        LoomMarker(op.marker, trace, number);
        start = Clock::now();
      }
    }
    inside += Clock::now() - start;
    std::swap(prev, cur);
    result.loom_pair_ns.push_back(
        std::chrono::duration<double, std::nano>(inside).count() /
        std::max<uint32_t>(1, steady.allocs));
    if (r == 0) result.layout_first = LoomStats::Read().Layout();
    if (!options.simulate || !status.ok()) continue;

    inside = {};
    start = Clock::now();
    for (const SteadyOp& op : steady.ops) {
      if (op.kind == SteadyOp::Kind::kAlloc) {
        StatusOr<uint64_t> a = sim.Malloc(op.size, op.stream);
        if (!a.ok()) {
          status = a.status();
          break;
        }
        sim_cur[op.slot] = *a;
      } else if (op.kind == SteadyOp::Kind::kFree) {
        (void)sim.Free(op.previous ? sim_prev[op.slot] : sim_cur[op.slot]);
      } else {
        inside += Clock::now() - start;
        sim.OnMarker(op.marker);
        start = Clock::now();
      }
    }
    inside += Clock::now() - start;
    std::swap(sim_prev, sim_cur);
    result.sim_pair_ns.push_back(
        std::chrono::duration<double, std::nano>(inside).count() /
        std::max<uint32_t>(1, steady.allocs));
  }
  const LoomStats after = LoomStats::Read();

  // Figures over the repetitions.
  auto delta = [&](const std::string& key) {
    return after.Get(key) - before.Get(key);
  };
  const std::string waits = "loom.waits.";
  for (const auto& [key, value] : after.numbers()) {
    if (key.rfind(waits, 0) != 0) continue;
    const uint64_t n = delta(key);
    result.waits[key.substr(waits.size())] = n;
    if (key.ends_with(".events")) result.wait_events += n;
    if (key.ends_with(".stream_syncs")) result.stream_syncs += n;
    if (key.ends_with(".device_syncs")) result.device_syncs += n;
  }
  result.driver_calls = delta("loom.driver_calls.total");
  result.plan_hits = delta("loom.plan_hits");
  result.plan_misses = delta("loom.plan_misses");
  result.replan_attempts = delta("loom.replan_attempts");
  result.host_malloc_samples = delta("loom.host.malloc.samples");
  result.host_free_samples = delta("loom.host.free.samples");
  if (result.host_malloc_samples != 0) {
    result.host_malloc_mean_ns =
        static_cast<double>(delta("loom.host.malloc.sampled_ns")) /
        result.host_malloc_samples;
  }
  if (result.host_free_samples != 0) {
    result.host_free_mean_ns =
        static_cast<double>(delta("loom.host.free.sampled_ns")) /
        result.host_free_samples;
  }
  result.layout = after.Layout();
  result.sim_driver_calls = sim.driver_calls().total() - sim_calls_before;
  result.sim_segments =
      static_cast<uint64_t>(sim.stats().segment.all().current);
  result.sim_reserved_bytes =
      static_cast<uint64_t>(sim.stats().reserved_bytes.all().current);

  // Everything freed, then the runtime shut down for the next run.
  // (cur holds something only when a repetition stopped on an error.)
  for (const std::vector<LoomBlock>* blocks : {&prev, &cur}) {
    for (const LoomBlock& b : *blocks) {
      if (b.ptr != nullptr) loom_free(b.ptr, b.size, 0, nullptr);
    }
  }
  for (auto& [id, b] : live) loom_free(b.ptr, b.size, 0, nullptr);
  if (loom_shutdown() != 0 && status.ok()) status = CallFailed("loom_shutdown");
  if (!status.ok()) return status;
  return result;
}

}  // namespace loom::bench
