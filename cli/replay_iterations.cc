#include "cli/replay_iterations.h"

#include <cstdio>
#include <string>
#include <string_view>

#include "base/text.h"

namespace loom::cli {
namespace {

// The loom counters shown per iteration: what changed during it, or (not
// `delta`) the value when it ended.
struct Column {
  std::string_view key;
  std::string_view title;
  bool delta = true;
};
constexpr Column kColumns[] = {
    {"plan_hits", "hits"},
    {"plan_misses", "misses"},
    {"plan_suspensions", "suspended"},
    {"variant_switches", "switches"},
    {"plan_variants", "variants", false},
    {"replans", "replans"},
    {"plan_losses", "lost"},
};

uint64_t CounterOf(const whatif::IterationSummary& s, std::string_view key) {
  for (const auto& [name, value] : s.counters) {
    if (name == key) return value;
  }
  return 0;
}

// Column `c` of iteration i.
uint64_t ValueAt(const whatif::ReplayResult& r, size_t i, const Column& c) {
  const uint64_t now = CounterOf(r.iterations[i], c.key);
  if (!c.delta || i == 0) return now;
  const uint64_t before = CounterOf(r.iterations[i - 1], c.key);
  return now >= before ? now - before : 0;
}

}  // namespace

void PrintIterations(const whatif::ReplayResult& result) {
  if (result.iterations.empty()) return;
  std::printf("\nper iteration (counters: what changed during it)\n");
  std::printf("%9s %12s %14s %12s %7s", "iteration", "live peak",
              "reserved peak", "held at end", "calls");
  for (const Column& c : kColumns)
    std::printf(" %9s", std::string(c.title).c_str());
  std::printf("\n");
  for (size_t i = 0; i < result.iterations.size(); ++i) {
    const whatif::IterationSummary& s = result.iterations[i];
    std::printf("%9lld %12s %14s %12s %7llu",
                static_cast<long long>(s.iteration),
                FormatBytes(s.peak_requested).c_str(),
                FormatBytes(s.peak_reserved).c_str(),
                FormatBytes(s.reserved_at_end).c_str(),
                static_cast<unsigned long long>(s.driver_calls));
    for (const Column& c : kColumns) {
      std::printf(" %9llu",
                  static_cast<unsigned long long>(ValueAt(result, i, c)));
    }
    std::printf("\n");
  }
}

void WriteIterationsJson(JsonWriter& w, const whatif::ReplayResult& result) {
  w.Key("iterations").BeginArray();
  for (size_t i = 0; i < result.iterations.size(); ++i) {
    const whatif::IterationSummary& s = result.iterations[i];
    w.BeginObject();
    w.Key("iteration").Int(s.iteration);
    w.Key("peak_allocated_bytes").Uint(s.peak_requested);
    w.Key("peak_reserved_bytes").Uint(s.peak_reserved);
    w.Key("reserved_at_end_bytes").Uint(s.reserved_at_end);
    w.Key("driver_calls").Uint(s.driver_calls);
    for (const Column& c : kColumns)
      w.Key(std::string(c.key)).Uint(ValueAt(result, i, c));
    w.EndObject();
  }
  w.EndArray();
}

}  // namespace loom::cli
