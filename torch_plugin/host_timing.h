// HostTiming: sampled host time inside libloom's C ABI entry points.
//
// What loom costs the host per request is what PyTorch waits for at every
// tensor allocation. Timing every call would cost more than the call (two
// clock reads are ~50 ns; a planned allocation is ~90 ns), so one call in
// `every` (a power of two, default 256) of each entry point is timed. An
// unsampled call costs a relaxed load and store of its entry's counter and
// a test (the counter is not a read-modify-write: concurrent callers may
// lose a count, which only shifts which call is sampled; `calls` is exact
// for one calling thread and a lower bound otherwise).
//
// Process-wide (one set of counters for every device): the figures appear
// in every device's loom.memory_stats() as "loom.host.<entry>.*".
#ifndef LOOM_TORCH_PLUGIN_HOST_TIMING_H_
#define LOOM_TORCH_PLUGIN_HOST_TIMING_H_

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

namespace loom::plugin {

enum class Entry : uint8_t { kMalloc, kFree, kRecordStream, kCount };
inline constexpr size_t kEntryCount = static_cast<size_t>(Entry::kCount);
std::string_view EntryName(Entry entry);  // "malloc", "free", "record_stream"

class HostTiming {
 public:
  static constexpr uint32_t kDefaultEvery = 256;
  static constexpr uint32_t kMaxEvery = uint32_t{1} << 20;

  static HostTiming& Get();

  // One call in `every` is timed; 0 times none. REQUIRES: 0 or a power of
  // two <= kMaxEvery (the settings parser checks).
  void set_every(uint32_t every) {
    mask_.store(every == 0 ? kOff : every - 1, std::memory_order_relaxed);
  }
  uint32_t every() const {
    const uint64_t mask = mask_.load(std::memory_order_relaxed);
    return mask == kOff ? 0 : static_cast<uint32_t>(mask + 1);
  }

  // Runs `call` (returning a value), timing it when this call is sampled.
  template <typename Call>
  auto Time(Entry entry, Call&& call) {
    Counter& c = counters_[static_cast<size_t>(entry)];
    const uint64_t n = c.calls.load(std::memory_order_relaxed);
    c.calls.store(n + 1, std::memory_order_relaxed);
    const uint64_t mask = mask_.load(std::memory_order_relaxed);
    if (mask == kOff || (n & mask) != 0) return call();
    const auto start = std::chrono::steady_clock::now();
    auto result = call();
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                        std::chrono::steady_clock::now() - start)
                        .count();
    c.samples.fetch_add(1, std::memory_order_relaxed);
    c.sampled_ns.fetch_add(static_cast<uint64_t>(ns),
                           std::memory_order_relaxed);
    return result;
  }

  // ,"loom.host.sample_every":N,"loom.host.malloc.calls":N,... (to append
  // to a JSON object: starts with a comma).
  std::string JsonMembers() const;
  // Zeroes the counters (tests).
  void Reset();

 private:
  static constexpr uint64_t kOff = ~uint64_t{0};
  struct alignas(64) Counter {
    std::atomic<uint64_t> calls{0};
    std::atomic<uint64_t> samples{0};
    std::atomic<uint64_t> sampled_ns{0};
  };
  std::atomic<uint64_t> mask_{kDefaultEvery - 1};
  std::array<Counter, kEntryCount> counters_;
};

}  // namespace loom::plugin

#endif  // LOOM_TORCH_PLUGIN_HOST_TIMING_H_
