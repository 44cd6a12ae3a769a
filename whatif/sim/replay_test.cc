#include "whatif/sim/replay.h"

#include <gtest/gtest.h>

#include <map>

#include "whatif/sim/caching_allocator.h"

namespace loom::whatif {
namespace {

// A toy allocator for testing the harness itself: a bump pointer over one
// mapped range; `overlap_after` makes it return a used address on purpose.
class BumpAllocator final : public SimAllocator {
 public:
  explicit BumpAllocator(uint64_t capacity, int overlap_after = -1)
      : capacity_(capacity), overlap_after_(overlap_after) {}
  std::string_view name() const override { return "bump"; }
  StatusOr<uint64_t> Malloc(uint64_t size, uint64_t stream) override {
    (void)stream;
    if (next_ + size > capacity_) {
      ++stats_.num_ooms;
      return OutOfMemoryError("bump: full");
    }
    ++mallocs_;
    uint64_t address = kBase + next_;
    if (overlap_after_ >= 0 && calls_++ >= overlap_after_) address = kBase;
    next_ += size;
    live_[address] = size;
    stats_.allocated_bytes.Increase(false, size);
    if (stats_.reserved_bytes.all().current < int64_t(next_)) {
      stats_.reserved_bytes.Increase(
          false, next_ - stats_.reserved_bytes.all().current);
    }
    return address;
  }
  Status Free(uint64_t address) override {
    auto it = live_.find(address);
    if (it == live_.end()) return InvalidArgumentError("not live");
    stats_.allocated_bytes.Decrease(false, it->second);
    live_.erase(it);
    return OkStatus();
  }
  void EmptyCache() override {}
  void OnMarker(const plan::Event& event) override {
    markers_.push_back(event.kind);
  }
  const MemoryStats& stats() const override { return stats_; }
  const DriverCalls& driver_calls() const override { return calls_struct_; }
  std::vector<AddressRange> MappedRanges() const override {
    return {{kBase, capacity_}};
  }
  Status CheckInvariants() const override { return OkStatus(); }
  std::vector<std::pair<std::string, uint64_t>> Counters() const override {
    return {{"mallocs", static_cast<uint64_t>(mallocs_)}};
  }

  std::vector<plan::EventKind> markers_;

 private:
  static constexpr uint64_t kBase = uint64_t{1} << 40;
  uint64_t capacity_;
  int overlap_after_;
  int calls_ = 0;
  int mallocs_ = 0;
  uint64_t next_ = 0;
  std::map<uint64_t, uint64_t> live_;
  MemoryStats stats_;
  DriverCalls calls_struct_;
};

plan::Trace SmallTrace() {
  plan::Trace trace;
  trace.AddIterationBegin(0);
  trace.AddPhase(plan::kPhaseForward);
  trace.AddAlloc(1, 100);
  trace.AddAlloc(2, 300);
  trace.AddFree(1);
  trace.AddAlloc(3, 50);
  trace.AddFree(2);
  trace.AddFree(3);
  trace.AddIterationEnd(0);
  return trace;
}

TEST(ReplayTest, TracksLiveRequestedBytesAndPeaks) {
  BumpAllocator allocator(1 << 20);
  auto result = Replay(SmallTrace(), allocator, {.check_invariants = true});
  ASSERT_TRUE(result.ok()) << result.status().ToString();
  EXPECT_EQ(result->allocator, "bump");
  EXPECT_EQ(result->events, 9u);
  EXPECT_EQ(result->allocs, 3u);
  EXPECT_EQ(result->frees, 3u);
  EXPECT_EQ(result->peak_requested, 400u);  // 100 + 300
  EXPECT_EQ(result->peak_reserved, 450u);   // bump never reuses
  EXPECT_EQ(result->peak_allocated, 400u);
  EXPECT_DOUBLE_EQ(result->efficiency(), 400.0 / 450.0);
  EXPECT_FALSE(result->oom);
  ASSERT_EQ(result->series.size(), 9u);
  EXPECT_EQ(result->series[3].requested, 400u);
  EXPECT_EQ(result->series[3].iteration, 0);
  EXPECT_EQ(result->series[8].requested, 0u);
  EXPECT_EQ(allocator.markers_.size(), 3u);  // begin, phase, end
}

TEST(ReplayTest, SummarisesEachIteration) {
  plan::Trace trace;
  trace.AddAlloc(1, 10);  // set-up, live to the end
  trace.AddIterationBegin(0);
  trace.AddAlloc(2, 100);
  trace.AddFree(2);
  trace.AddIterationEnd(0);
  trace.AddIterationBegin(1);
  trace.AddAlloc(3, 300);
  trace.AddAlloc(4, 50);
  trace.AddFree(3);
  trace.AddFree(4);
  trace.AddIterationEnd(1);
  trace.AddFree(1);
  BumpAllocator allocator(1 << 20);
  auto result = Replay(trace, allocator, {});
  ASSERT_TRUE(result.ok()) << result.status().ToString();
  ASSERT_EQ(result->iterations.size(), 2u);
  const IterationSummary& first = result->iterations[0];
  const IterationSummary& second = result->iterations[1];
  EXPECT_EQ(first.iteration, 0);
  EXPECT_EQ(first.peak_requested, 110u);  // the set-up's 10 bytes included
  EXPECT_EQ(first.peak_reserved, 110u);
  EXPECT_EQ(first.reserved_at_end, 110u);
  EXPECT_EQ(second.iteration, 1);
  EXPECT_EQ(second.peak_requested, 360u);
  EXPECT_EQ(second.peak_reserved, 460u);  // bump never reuses
  EXPECT_EQ(second.reserved_at_end, 460u);
  EXPECT_EQ(first.driver_calls + second.driver_calls,
            result->driver_calls.total());
  // Counters when each iteration ended (cumulative).
  ASSERT_EQ(first.counters.size(), 1u);
  EXPECT_EQ(first.counters[0].second, 2u);
  EXPECT_EQ(second.counters[0].second, 4u);
}

TEST(ReplayTest, NoIterationSummaryWithoutMarkers) {
  plan::Trace trace;
  trace.AddAlloc(1, 10);
  trace.AddFree(1);
  BumpAllocator allocator(1 << 20);
  auto result = Replay(trace, allocator, {});
  ASSERT_TRUE(result.ok()) << result.status().ToString();
  EXPECT_TRUE(result->iterations.empty());
}

TEST(ReplayTest, DownsamplingKeepsPeaks) {
  BumpAllocator allocator(1 << 20);
  auto result = Replay(SmallTrace(), allocator, {.max_samples = 2});
  ASSERT_TRUE(result.ok());
  ASSERT_EQ(result->series.size(), 2u);  // buckets of 5 and 4 events
  EXPECT_EQ(result->series[0].time, 4u);
  EXPECT_EQ(result->series[0].requested, 400u);
  EXPECT_EQ(result->series[1].time, 8u);
  EXPECT_EQ(result->series[1].requested, 350u);  // 300 + 50 at event 5
  auto none = Replay(SmallTrace(), allocator, {.max_samples = 0});
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->series.empty());
}

TEST(ReplayTest, OutOfMemoryStopsTheReplay) {
  BumpAllocator allocator(420);
  auto result = Replay(SmallTrace(), allocator);
  ASSERT_TRUE(result.ok());
  EXPECT_TRUE(result->oom);
  EXPECT_EQ(result->oom_event, 5u);  // the 50-byte alloc
  EXPECT_EQ(result->ooms, 1u);
  EXPECT_EQ(result->events, 5u);
  EXPECT_EQ(result->peak_requested, 400u);
  EXPECT_NE(result->oom_message.find("full"), std::string::npos);
}

TEST(ReplayTest, SkippingOutOfMemoryDropsTheRequestAndGoesOn) {
  plan::Trace trace = SmallTrace();  // 100, 300, then 50 fails at 420
  trace.AddAlloc(4, 20);             // fits after the failure
  trace.AddFree(4);
  BumpAllocator allocator(420);
  auto result =
      Replay(trace, allocator,
             {.check_invariants = true, .skip_failed_allocations = true});
  // The failed request's free is dropped too: the bump allocator rejects a
  // free it never served, which would fail the replay.
  ASSERT_TRUE(result.ok()) << result.status().ToString();
  EXPECT_TRUE(result->oom);
  EXPECT_EQ(result->oom_event, 5u);
  EXPECT_EQ(result->ooms, 1u);
  EXPECT_EQ(result->events, trace.events.size());
  EXPECT_EQ(result->allocs, 3u);  // 100, 300 and 20
  EXPECT_EQ(result->frees, 3u);
  EXPECT_EQ(result->peak_reserved, 420u);
}

TEST(ReplayTest, DetectsOverlappingAllocations) {
  BumpAllocator allocator(1 << 20, /*overlap_after=*/1);
  auto result = Replay(SmallTrace(), allocator, {.check_invariants = true});
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), StatusCode::kInternal);
  EXPECT_NE(result.status().message().find("overlaps"), std::string::npos);
}

TEST(ReplayTest, RejectsBadTraces) {
  BumpAllocator allocator(1 << 20);
  plan::Trace trace;
  trace.AddAlloc(1, 10);
  trace.AddFree(2);
  auto result = Replay(trace, allocator);
  EXPECT_EQ(result.status().code(), StatusCode::kInvalidArgument);

  plan::Trace two_devices;
  two_devices.events.push_back(plan::Event::Alloc(1, 10, 0, 0));
  two_devices.events.push_back(plan::Event::Alloc(2, 20, 0, 1));
  result = Replay(two_devices, allocator);
  EXPECT_EQ(result.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(result.status().message().find("2 devices"), std::string::npos);
  BumpAllocator fresh(1 << 20);
  result = Replay(two_devices, fresh, {.device = 1});
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(result->allocs, 1u);
  EXPECT_EQ(result->peak_requested, 20u);
}

TEST(ReplayTest, RealAllocatorWithInvariantChecks) {
  plan::Trace trace;
  for (uint64_t i = 0; i < 3; ++i) trace.AddAlloc(i, 600 * kKiB);
  trace.AddAlloc(10, 5 * kMiB, /*stream=*/7);
  trace.AddFree(1);
  trace.AddFree(10);
  CachingAllocator allocator(CachingConfig{}, SimOptions{});
  auto result = Replay(trace, allocator, {.check_invariants = true});
  ASSERT_TRUE(result.ok()) << result.status().ToString();
  EXPECT_EQ(result->peak_requested, 3 * 600 * kKiB + 5 * kMiB);
  EXPECT_EQ(result->peak_reserved, 22 * kMiB);
  EXPECT_EQ(result->driver_calls.malloc, 2u);
  EXPECT_EQ(result->stats.segment.all().current, 2);
}

}  // namespace
}  // namespace loom::whatif
