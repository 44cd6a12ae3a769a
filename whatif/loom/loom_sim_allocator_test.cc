#include "whatif/loom/loom_sim_allocator.h"

#include <gtest/gtest.h>

#include "whatif/sim/replay.h"
#include "whatif/workloads/load.h"

namespace loom::whatif {
namespace {

TEST(LoomSimAllocatorTest, ReplaysAGeneratedMoeTraceWithDataChecks) {
  StatusOr<Workload> w =
      LoadWorkload("builtin:moe:layers=2,iterations=3,seq_len=512");
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  LoomSimOptions options;
  options.backend = "host";
  options.check_data = true;
  options.capacity = uint64_t{64} << 30;
  options.names = w->trace.names;
  auto loom = LoomSimAllocator::Create(options);
  ASSERT_TRUE(loom.ok()) << loom.status().ToString();
  ReplayOptions replay_options;
  replay_options.check_invariants = true;
  StatusOr<ReplayResult> result = Replay(w->trace, **loom, replay_options);
  ASSERT_TRUE(result.ok()) << result.status().ToString();
  EXPECT_FALSE(result->oom);
  EXPECT_EQ((*loom)->corrupted(), 0u);
  EXPECT_GT(result->peak_requested, 0u);
  EXPECT_LE(result->peak_requested, result->peak_reserved);
  // Without a plan every request is served by the arena.
  EXPECT_EQ((*loom)->loom_stats().plan_hits, 0u);
}

TEST(LoomSimAllocatorTest, RepeatingDenseWorkloadMakesNoDriverCallsOnceWarm) {
  StatusOr<Workload> w =
      LoadWorkload("builtin:dense:layers=2,iterations=4,seq_len=512");
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  LoomSimOptions options;
  options.names = w->trace.names;
  auto loom = std::move(LoomSimAllocator::Create(options)).value();
  StatusOr<ReplayResult> result = Replay(w->trace, *loom);
  ASSERT_TRUE(result.ok()) << result.status().ToString();
  bool found_steady = false;
  for (const auto& [name, value] : result->counters) {
    if (name == "steady_driver_calls") {
      found_steady = true;
      EXPECT_EQ(value, 0u) << "a repeating workload maps nothing new once warm";
    }
  }
  EXPECT_TRUE(found_steady);
}

// Real memory (64 KiB pages, 64 MiB) with every allocation stamped.
LoomSimOptions CheckedHost() {
  LoomSimOptions options;
  options.backend = "host";
  options.check_data = true;
  options.granularity = 64 << 10;
  options.capacity = 64 << 20;
  return options;
}

TEST(LoomSimAllocatorTest, CorruptionIsDetected) {
  const LoomSimOptions options = CheckedHost();
  auto loom = std::move(LoomSimAllocator::Create(options)).value();
  uint64_t a = *loom->Malloc(100000, 0);
  uint64_t b = *loom->Malloc(1000, 0);
  // Scribble over a's last bytes, as an aliasing bug would.
  std::memset(reinterpret_cast<void*>(a + 100000 - 8), 0, 8);
  ASSERT_TRUE(loom->Free(a).ok());
  ASSERT_TRUE(loom->Free(b).ok());
  EXPECT_EQ(loom->corrupted(), 1u);
}

TEST(LoomSimAllocatorTest, CorruptionOfWhatIsNeverFreedIsDetectedAtTheEnd) {
  // A replay whose first allocation (a weight) is never freed: checked at
  // the replay's end, intact.
  plan::Trace trace;
  trace.events.push_back(plan::Event::Alloc(1, 100000, 0));
  trace.events.push_back(plan::Event::Alloc(2, 1000, 0));
  trace.events.push_back(plan::Event::Free(2));
  const LoomSimOptions options = CheckedHost();
  {
    auto loom = std::move(LoomSimAllocator::Create(options)).value();
    StatusOr<ReplayResult> result = Replay(trace, *loom);
    ASSERT_TRUE(result.ok()) << result.status().ToString();
    EXPECT_EQ(loom->corrupted(), 0u) << "nothing scribbled: nothing corrupted";
  }
  // The same events driven one by one, the weight scribbled over after it
  // was stamped (as an aliasing bug would): found at the end.
  auto loom = std::move(LoomSimAllocator::Create(options)).value();
  uint64_t weight = *loom->Malloc(100000, 0);
  std::memset(reinterpret_cast<void*>(weight + (64 << 10)), 0, 8);
  uint64_t other = *loom->Malloc(1000, 0);
  ASSERT_TRUE(loom->Free(other).ok());
  EXPECT_EQ(loom->corrupted(), 0u) << "the weight is not freed yet";
  loom->OnReplayEnd();
  EXPECT_EQ(loom->corrupted(), 1u);
  loom->OnReplayEnd();
  EXPECT_EQ(loom->corrupted(), 1u) << "each allocation counted once";
}

TEST(LoomSimAllocatorTest, OptionsAreChecked) {
  LoomSimOptions options;
  options.backend = "cuda";
  EXPECT_FALSE(LoomSimAllocator::Create(options).ok());
  options.backend = "fake";
  options.check_data = true;
  EXPECT_FALSE(LoomSimAllocator::Create(options).ok());
}

}  // namespace
}  // namespace loom::whatif
