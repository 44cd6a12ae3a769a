// The CPU proxy of step time without its timings (which CI cannot judge):
// a small training-shaped trace replayed through libloom's C ABI in auto
// mode's shape makes no wait (event, stream or device synchronisation) and
// no driver call in its steady iterations, every request hits the plan, and
// the layout it reports is consistent and does not change from one steady
// iteration to the next. A change that inserts a wait or a per-step mapping
// on the hot path fails here.
#include "bench/runtime/c_abi_replay.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

namespace loom::bench {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

std::string WorkDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

// Weights set up before the first iteration (most of the memory, as in a
// model: 2 GiB, so the few MiB an auto-mode switch leaves pinned stay
// within the plan referee's slack of 1/256, vmm/plan_referee.h; with 16 MiB
// of weights the switched plan rightly loses); `iterations` steps, each with
// a forward that keeps activations, a backward that frees them in reverse,
// and a buffer made at its end and freed early in the next step (as a
// gradient bucket or a loss kept for logging is); the optimizer state is
// made lazily in the first step and kept.
plan::Trace TrainingTrace(int iterations) {
  plan::Trace t;
  uint64_t id = 1;
  for (uint64_t size :
       {3 * kMiB, 5 * kMiB + 100, uint64_t{1024}, 8 * kMiB, 2048 * kMiB}) {
    t.AddAlloc(id++, size);
  }
  uint64_t carry = 0;
  const uint64_t activations[] = {6 * kMiB,   20 * kMiB + 512, kMiB,
                                  512 * 1024, 40 * kMiB,       3 * kMiB + 7};
  for (int it = 0; it < iterations; ++it) {
    t.AddIterationBegin(it);
    t.AddPhase("forward");
    if (carry != 0) t.AddFree(carry);
    const uint64_t first = id;
    for (uint64_t size : activations) t.AddAlloc(id++, size);
    t.AddPhase("backward");
    for (uint64_t a = id; a-- > first;) {
      t.AddAlloc(id, 2 * kMiB);  // a gradient's temporary
      t.AddFree(id++);
      t.AddFree(a);
    }
    t.AddPhase("optimizer");
    if (it == 0) t.AddAlloc(id++, 16 * kMiB);  // optimizer state, kept
    t.AddAlloc(id++, 4 * kMiB + 4);
    t.AddFree(id - 1);
    carry = id;
    t.AddAlloc(id++, 10 * kMiB);
    t.AddIterationEnd(it);
  }
  return t;
}

CAbiReplayOptions Options(uint32_t max_chunk_pages) {
  CAbiReplayOptions options;
  options.plan_from = 2;
  options.repetitions = 4;
  options.max_chunk_pages = max_chunk_pages;
  options.host_sample_every = 1;
  options.plan_time_limit = 2;
  options.work_dir = WorkDir();
  return options;
}

void ExpectConsistent(const LayoutFigures& l) {
  uint64_t handles = 0, bytes = 0, mappings = 0;
  for (const LayoutFigures::Bucket& b : l.buckets) {
    handles += b.handles;
    bytes += b.bytes;
    mappings += b.mappings;
  }
  EXPECT_EQ(handles, l.handles);
  EXPECT_EQ(bytes, l.handle_bytes);
  EXPECT_EQ(mappings, l.mappings);
  // A handle is mapped whole, at most once (a spare one nowhere).
  EXPECT_LE(l.mappings, l.handles);
  EXPECT_LE(l.mapped_bytes, l.handle_bytes);
  EXPECT_GT(l.mappings, 0u);
}

TEST(CAbiReplayTest, ExtractsTheSteadyIteration) {
  StatusOr<SteadyIteration> s = ExtractSteadyIteration(TrainingTrace(4));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->number, 3u);
  EXPECT_EQ(s->allocs, 6u + 6u + 2u);
  EXPECT_EQ(s->carried, 1u);
  int previous = 0;
  for (const SteadyOp& op : s->ops) previous += op.previous ? 1 : 0;
  EXPECT_EQ(previous, 1);
}

TEST(CAbiReplayTest, RefusesWhatCannotRepeat) {
  // The last iteration frees a weight made before the iterations.
  plan::Trace frees_weight = TrainingTrace(3);
  frees_weight.events.insert(frees_weight.events.end() - 1,
                             plan::Event::Free(1));
  EXPECT_FALSE(ExtractSteadyIteration(frees_weight).ok());
  // The last iteration keeps something the next one would not free.
  plan::Trace leaks = TrainingTrace(3);
  leaks.events.insert(leaks.events.end() - 1,
                      plan::Event::Alloc(999, 3 * kMiB));
  EXPECT_FALSE(ExtractSteadyIteration(leaks).ok());
  EXPECT_FALSE(ExtractSteadyIteration(plan::Trace{}).ok());
}

TEST(CAbiReplayTest, SteadyIterationsWaitForNothingAndMapNothing) {
  const plan::Trace trace = TrainingTrace(4);
  for (uint32_t pages : {512u, 10u, 1u}) {
    SCOPED_TRACE(pages);
    StatusOr<CAbiReplayResult> r = ReplayThroughCAbi(trace, Options(pages));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    const uint64_t requests = uint64_t{r->steady.allocs} * r->repetitions;
    EXPECT_EQ(r->wait_events, 0u);
    EXPECT_EQ(r->stream_syncs, 0u);
    EXPECT_EQ(r->device_syncs, 0u);
    EXPECT_FALSE(r->waits.empty());  // the instrument is there
    for (const auto& [site, n] : r->waits) EXPECT_EQ(n, 0u) << site;
    EXPECT_EQ(r->driver_calls, 0u);
    EXPECT_EQ(r->plan_misses, 0u);
    EXPECT_EQ(r->plan_hits, requests);
    EXPECT_EQ(r->replan_attempts, 0u);
    EXPECT_EQ(r->sim_driver_calls, 0u);
    // host_sample_every=1: every call of one thread is timed.
    EXPECT_EQ(r->host_malloc_samples, requests);
    EXPECT_EQ(r->host_free_samples, requests);
    EXPECT_EQ(r->loom_pair_ns.size(), 4u);
    EXPECT_EQ(r->sim_pair_ns.size(), 4u);
    ExpectConsistent(r->layout);
    EXPECT_EQ(r->layout, r->layout_first);
    if (pages == 1) {
      ASSERT_EQ(r->layout.buckets.size(), 1u);
      EXPECT_EQ(r->layout.buckets[0].size, "2MiB");
    }
    for (const LayoutFigures::Bucket& b : r->layout.buckets) {
      EXPECT_LE(b.bytes, b.handles * uint64_t{pages} * 2 * kMiB) << b.size;
    }
  }
}

TEST(CAbiReplayTest, PlansOnlyFromIterationsTheTraceHas) {
  CAbiReplayOptions options = Options(512);
  options.plan_from = 4;
  EXPECT_FALSE(ReplayThroughCAbi(TrainingTrace(4), options).ok());
}

TEST(CAbiReplayTest, ReadsFlatJson) {
  auto numbers =
      FlatJsonNumbers("{\"a.b\":12,\"s\":\"x,\\\"}\",\"t\":true,\"c\":0.5}");
  EXPECT_EQ(numbers.size(), 2u);
  EXPECT_EQ(numbers["a.b"], "12");
  EXPECT_EQ(numbers["c"], "0.5");
  EXPECT_EQ(Median({3, 1, 2}), 2);
  EXPECT_EQ(Median({4, 1, 2, 3}), 2.5);
}

}  // namespace
}  // namespace loom::bench
