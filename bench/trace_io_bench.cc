// Trace file speed: writing and reading a 1,000,000-event synthetic trace in
// the binary and the text form, in memory (encoding cost only) and through a
// file (plus the page cache). Target: well under a second each way.
//
//   bazel run -c opt //bench:trace_io_bench
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>

#include "plan/analysis/analysis.h"
#include "plan/trace/synthetic_trace.h"
#include "plan/trace/trace_io.h"
#include "plan/analysis/workload.h"

namespace loom::plan {
namespace {

constexpr uint64_t kEvents = 1000000;

const Trace& MillionEvents() {
  static const Trace* trace = [] {
    SyntheticTraceOptions options;
    options.events = kEvents;
    options.layers = 24;
    auto* t = new Trace(MakeSyntheticTrace(options));
    t->header.granularity = 2097152;
    t->header.provenance = "trace_io_bench";
    return t;
  }();
  return *trace;
}

const std::string& Serialized(TraceFormat format) {
  static std::string forms[3];
  std::string& data = forms[static_cast<int>(format)];
  if (data.empty()) {
    StatusOr<std::string> s = SerializeTrace(MillionEvents(), format);
    if (!s.ok()) std::abort();
    data = std::move(*s);
  }
  return data;
}

std::string TempPath(TraceFormat format) {
  const char* dir = std::getenv("TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/loom_trace_io_bench." +
         std::string(format == TraceFormat::kBinary ? "ltb" : "ltt");
}

// Writes every event through a streaming writer.
void WriteAll(benchmark::State& state, std::unique_ptr<ByteSink> sink,
              TraceFormat format) {
  const Trace& trace = MillionEvents();
  StatusOr<std::unique_ptr<TraceWriter>> writer =
      NewTraceWriter(std::move(sink), trace.header, format);
  if (!writer.ok()) state.SkipWithError(writer.status().ToString().c_str());
  for (const std::string& name : trace.names) {
    if (!(*writer)->AddName(name).ok()) state.SkipWithError("name");
  }
  for (const Event& event : trace.events) {
    if (!(*writer)->Write(event).ok()) state.SkipWithError("write");
  }
  if (!(*writer)->Finish().ok()) state.SkipWithError("finish");
}

// Reads every event through a streaming reader.
void ReadAll(benchmark::State& state,
             StatusOr<std::unique_ptr<TraceReader>> reader) {
  if (!reader.ok()) {
    state.SkipWithError(reader.status().ToString().c_str());
    return;
  }
  Event event;
  uint64_t events = 0;
  while (true) {
    StatusOr<bool> more = (*reader)->Next(&event);
    if (!more.ok()) state.SkipWithError(more.status().ToString().c_str());
    if (!more.ok() || !*more) break;
    ++events;
  }
  if (events != kEvents) state.SkipWithError("wrong event count");
  benchmark::DoNotOptimize(event);
}

void BM_WriteMemory(benchmark::State& state) {
  TraceFormat format = static_cast<TraceFormat>(state.range(0));
  MillionEvents();
  size_t bytes = 0;
  for (auto _ : state) {
    std::string out;
    out.reserve(Serialized(format).size());
    WriteAll(state, NewStringSink(&out, "mem"), format);
    bytes = out.size();
  }
  state.counters["bytes"] = bytes;
  state.SetItemsProcessed(state.iterations() * kEvents);
  state.SetLabel(std::string(TraceFormatName(format)));
}

void BM_ReadMemory(benchmark::State& state) {
  TraceFormat format = static_cast<TraceFormat>(state.range(0));
  const std::string& data = Serialized(format);
  for (auto _ : state) {
    ReadAll(state, OpenTraceReader(NewMemorySource(data, "mem")));
  }
  state.counters["bytes"] = data.size();
  state.SetItemsProcessed(state.iterations() * kEvents);
  state.SetLabel(std::string(TraceFormatName(format)));
}

void BM_WriteFile(benchmark::State& state) {
  TraceFormat format = static_cast<TraceFormat>(state.range(0));
  MillionEvents();
  for (auto _ : state) {
    StatusOr<std::unique_ptr<ByteSink>> sink = OpenFileSink(TempPath(format));
    if (!sink.ok()) {
      state.SkipWithError(sink.status().ToString().c_str());
      break;
    }
    WriteAll(state, std::move(*sink), format);
  }
  state.SetItemsProcessed(state.iterations() * kEvents);
  state.SetLabel(std::string(TraceFormatName(format)));
}

void BM_ReadFile(benchmark::State& state) {
  TraceFormat format = static_cast<TraceFormat>(state.range(0));
  std::string path = TempPath(format);
  if (!WriteTrace(path, MillionEvents(), format).ok()) {
    state.SkipWithError("cannot write the input file");
    return;
  }
  for (auto _ : state) ReadAll(state, OpenTraceReader(path));
  state.SetItemsProcessed(state.iterations() * kEvents);
  state.SetLabel(std::string(TraceFormatName(format)));
  std::remove(path.c_str());
}

// Copying the serialized bytes: a floor for any reader of the same file.
void BM_MemcpyBaseline(benchmark::State& state) {
  TraceFormat format = static_cast<TraceFormat>(state.range(0));
  const std::string& data = Serialized(format);
  for (auto _ : state) {
    std::string copy = data;
    benchmark::DoNotOptimize(copy.data());
  }
  state.SetLabel(std::string(TraceFormatName(format)));
}

// Streaming the binary form into a Workload and analysing it; with
// state.range(0) == 0 the iteration markers are stripped first, so the
// iterations come from period detection.
void BM_AnalyzeMillion(benchmark::State& state) {
  bool markers = state.range(0) != 0;
  Trace trace = MillionEvents();
  if (!markers) {
    std::erase_if(trace.events, [](const Event& e) {
      return e.kind == EventKind::kIterationBegin ||
             e.kind == EventKind::kIterationEnd;
    });
  }
  StatusOr<std::string> data = SerializeTrace(trace, TraceFormat::kBinary);
  if (!data.ok()) std::abort();
  size_t iterations = 0;
  for (auto _ : state) {
    StatusOr<std::unique_ptr<TraceReader>> reader =
        OpenTraceReader(NewMemorySource(*data, "mem"));
    StatusOr<Workload> workload = LoadWorkload(**reader);
    if (!workload.ok()) std::abort();
    WorkloadAnalysis analysis = AnalyzeWorkload(*workload);
    iterations = workload->iterations.size();
    benchmark::DoNotOptimize(analysis.peak_live_bytes);
  }
  state.counters["iterations"] = iterations;
  state.SetItemsProcessed(state.iterations() * trace.events.size());
  state.SetLabel(markers ? "markers" : "period detection");
}

constexpr int kBinary = static_cast<int>(TraceFormat::kBinary);
constexpr int kText = static_cast<int>(TraceFormat::kText);

BENCHMARK(BM_WriteMemory)
    ->Arg(kBinary)
    ->Arg(kText)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ReadMemory)
    ->Arg(kBinary)
    ->Arg(kText)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_WriteFile)
    ->Arg(kBinary)
    ->Arg(kText)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ReadFile)->Arg(kBinary)->Arg(kText)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_AnalyzeMillion)->Arg(1)->Arg(0)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_MemcpyBaseline)
    ->Arg(kBinary)
    ->Arg(kText)
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace loom::plan
