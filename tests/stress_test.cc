// The stress program (stress/stress.h) on the async backend, short runs of
// the configurations and seeds that failed before the stream-order fixes
// (bench/results/stress.md): every one faulted, corrupted data or broke the
// no-shared-byte invariant on bf3ab38. The long runs are in bench/.
#include "stress/stress.h"

#include <gtest/gtest.h>

#include <string>

namespace loom::stress {
namespace {

struct Case {
  std::string name;
  uint64_t seed;
  int streams;
  int threads;
  int devices;
  uint64_t cap;
  bool plan;
  bool graphs;
};

class StressTest : public ::testing::TestWithParam<Case> {};

// A short run on the async backend: 2,500 operations (the time limit only
// guards against a hang).
StressOptions ShortAsyncRun(uint64_t seed) {
  StressOptions o;
  o.backend = "async";
  o.seed = seed;
  o.max_ops = 2500;
  o.seconds = 120;
  return o;
}

TEST_P(StressTest, NoFaultNoCorruptionNoSharedByte) {
  const Case& c = GetParam();
  StressOptions o = ShortAsyncRun(c.seed);
  o.streams = c.streams;
  o.threads = c.threads;
  o.devices = c.devices;
  o.cap_bytes = c.cap;
  o.plan = c.plan;
  o.graphs = c.graphs;
  StatusOr<StressReport> r = RunStress(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->ok()) << r->Summary();
  EXPECT_GT(r->kernels, 1000u);
  if (c.streams > 1) EXPECT_GT(r->cross_stream_uses, 0u);
  if (c.graphs) EXPECT_GT(r->graph_captures, 0u);
}

constexpr uint64_t kCap = uint64_t{12} << 20;

INSTANTIATE_TEST_SUITE_P(
    FailedBeforeTheFixes, StressTest,
    ::testing::Values(
        // Everything at once (faults, corruption and graph memory given to
        // eager code before the fixes).
        Case{"all_seed1", 1, 3, 2, 1, kCap, true, true},
        Case{"all_seed2", 2, 3, 2, 1, kCap, true, true},
        Case{"all_seed3", 3, 3, 2, 1, kCap, true, true},
        // Streams only: another stream's bytes handed out, unmaps under
        // queued kernels during the out-of-memory retry.
        Case{"streams_seed2", 2, 3, 2, 1, kCap, false, false},
        Case{"streams_uncapped_seed3", 3, 3, 2, 1, 0, false, false},
        // One stream, one thread: empty_cache unmapped before waiting.
        Case{"one_stream_seed1", 1, 1, 1, 1, kCap, false, false},
        // Graph capture: memory freed in a capture went back to eager code.
        Case{"graphs_seed1", 1, 1, 1, 1, 0, false, true},
        // Two devices.
        Case{"two_devices_seed3", 3, 3, 2, 2, kCap, true, true}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

// A plan suspended mid-run lends its region's idle bytes in place
// (vmm::Allocator::PlaceInIdleRegion) while kernels queued on three
// streams still use memory: no fault, no corruption, no shared byte. How
// many requests take the region depends on the kernels' timing, so the
// seeds are summed (each reused the region in every run measured).
TEST(StressRegionReuseTest, TheIdleRegionServesUnderQueuedKernels) {
  uint64_t reuses = 0;
  for (uint64_t seed : {3u, 4u}) {
    StressOptions o = ShortAsyncRun(seed);
    o.threads = 1;
    StatusOr<StressReport> r = RunStress(o);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_TRUE(r->ok()) << r->Summary();
    EXPECT_GT(r->plan_suspensions, 0u);
    reuses += r->region_reuses;
  }
  EXPECT_GT(reuses, 0u);
}

// Driver failures now and then (creates, maps, set-access, unmaps and
// releases that fail as a driver would, on whichever thread makes the next
// such call) while kernels queued on three streams use memory: what they
// fail is retried or refused, never half done, so no fault, no corruption,
// no shared byte. Seeds summed: which requests the failures meet depends
// on the threads' timing.
TEST(StressDriverFailureTest, FailuresLoseNothingUnderQueuedKernels) {
  uint64_t failed = 0;
  for (uint64_t seed : {1u, 2u, 3u}) {
    StressOptions o = ShortAsyncRun(seed);
    o.driver_failure_percent = 10;
    StatusOr<StressReport> r = RunStress(o);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_TRUE(r->ok()) << "seed " << seed << ": " << r->Summary();
    EXPECT_GT(r->kernels, 1000u);
    failed += r->driver_failures;
  }
  EXPECT_GT(failed, 0u);
}

TEST(StressOptionsTest, BadOptionsAreRefused) {
  StressOptions o;
  o.threads = 0;
  EXPECT_EQ(RunStress(o).status().code(), StatusCode::kInvalidArgument);
  o = StressOptions();
  o.driver_failure_percent = 101;
  EXPECT_EQ(RunStress(o).status().code(), StatusCode::kInvalidArgument);
  o = StressOptions();
  o.backend = "warp-drive";
  o.max_ops = 10;
  EXPECT_EQ(RunStress(o).status().code(), StatusCode::kInvalidArgument);
}

// The host and fake backends run kernels at once: the same program, the
// invariants only.
TEST(StressOptionsTest, OtherBackendsRunTheSameProgram) {
  for (const char* backend : {"host", "fake"}) {
    StressOptions o;
    o.backend = backend;
    o.max_ops = 1500;
    o.seconds = 60;
    StatusOr<StressReport> r = RunStress(o);
    ASSERT_TRUE(r.ok()) << backend << ": " << r.status().ToString();
    EXPECT_TRUE(r->ok()) << backend << ": " << r->Summary();
    EXPECT_EQ(r->faults, 0u);
  }
}

}  // namespace
}  // namespace loom::stress
