#include "torch_plugin/host_timing.h"

#include <fmt/format.h>

namespace loom::plugin {

std::string_view EntryName(Entry entry) {
  switch (entry) {
    case Entry::kMalloc:
      return "malloc";
    case Entry::kFree:
      return "free";
    case Entry::kRecordStream:
      return "record_stream";
    case Entry::kCount:
      break;
  }
  return "?";
}

HostTiming& HostTiming::Get() {
  static HostTiming timing;
  return timing;
}

std::string HostTiming::JsonMembers() const {
  std::string out = fmt::format(",\"loom.host.sample_every\":{}", every());
  for (size_t i = 0; i < kEntryCount; ++i) {
    const Counter& c = counters_[i];
    const uint64_t samples = c.samples.load(std::memory_order_relaxed);
    const uint64_t ns = c.sampled_ns.load(std::memory_order_relaxed);
    const std::string_view name = EntryName(static_cast<Entry>(i));
    out += fmt::format(
        ",\"loom.host.{0}.calls\":{1},\"loom.host.{0}.samples\":{2},"
        "\"loom.host.{0}.sampled_ns\":{3},\"loom.host.{0}.mean_ns\":{4}",
        name, c.calls.load(std::memory_order_relaxed), samples, ns,
        samples == 0 ? 0 : ns / samples);
  }
  return out;
}

void HostTiming::Reset() {
  for (Counter& c : counters_) {
    c.calls.store(0, std::memory_order_relaxed);
    c.samples.store(0, std::memory_order_relaxed);
    c.sampled_ns.store(0, std::memory_order_relaxed);
  }
}

}  // namespace loom::plugin
