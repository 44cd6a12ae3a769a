#include "cli/replay_iterations.h"

#include <cstdio>
#include <string>
#include <string_view>

#include "base/text.h"

namespace loom::cli {
namespace {

// The loom counters shown per iteration, as (key, column title).
constexpr std::pair<std::string_view, std::string_view> kColumns[] = {
    {"plan_hits", "hits"},
    {"plan_misses", "misses"},
    {"plan_suspensions", "suspended"},
    {"variant_switches", "switches"},
    {"plan_variants", "variants"},
    {"replans", "replans"},
    {"plan_losses", "lost"},
};

uint64_t CounterOf(const whatif::IterationSummary& s, std::string_view key) {
  for (const auto& [name, value] : s.counters) {
    if (name == key) return value;
  }
  return 0;
}

// The counter's change during iteration i (plan_variants: the count then).
uint64_t During(const whatif::ReplayResult& r, size_t i, std::string_view key) {
  const uint64_t now = CounterOf(r.iterations[i], key);
  if (key == "plan_variants" || i == 0) return now;
  const uint64_t before = CounterOf(r.iterations[i - 1], key);
  return now >= before ? now - before : 0;
}

}  // namespace

void PrintIterations(const whatif::ReplayResult& result) {
  if (result.iterations.empty()) return;
  std::printf("\nper iteration (counters: what changed during it)\n");
  std::printf("%9s %12s %14s %12s %7s", "iteration", "live peak",
              "reserved peak", "held at end", "calls");
  for (const auto& [key, title] : kColumns)
    std::printf(" %9s", std::string(title).c_str());
  std::printf("\n");
  for (size_t i = 0; i < result.iterations.size(); ++i) {
    const whatif::IterationSummary& s = result.iterations[i];
    std::printf("%9lld %12s %14s %12s %7llu",
                static_cast<long long>(s.iteration),
                FormatBytes(s.peak_requested).c_str(),
                FormatBytes(s.peak_reserved).c_str(),
                FormatBytes(s.reserved_at_end).c_str(),
                static_cast<unsigned long long>(s.driver_calls));
    for (const auto& [key, title] : kColumns) {
      std::printf(" %9llu",
                  static_cast<unsigned long long>(During(result, i, key)));
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
    for (const auto& [key, title] : kColumns)
      w.Key(std::string(key)).Uint(During(result, i, key));
    w.EndObject();
  }
  w.EndArray();
}

}  // namespace loom::cli
