#include "whatif/sim/block_pool.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace loom::whatif {
namespace {

struct TestBlock : PoolBlock<TestBlock> {
  int tag = 0;  // a simulator's own data
};
using Pool = BlockPool<TestBlock>;

bool Always(const TestBlock*, const TestBlock*) { return true; }

// The blocks of the chain starting at `head`, as (ptr, size, allocated).
std::vector<std::vector<uint64_t>> Chain(const TestBlock* head) {
  std::vector<std::vector<uint64_t>> out;
  for (const TestBlock* b = head; b != nullptr; b = b->next) {
    out.push_back({b->ptr, b->size, b->allocated ? 1u : 0u});
  }
  return out;
}

TEST(BlockPoolTest, BestFitIsSmallestThenLowestAddressWithinTheStream) {
  MemoryStats stats;
  Pool pool({}, &stats);
  pool.AddFree(pool.New(/*stream=*/0, 4096, 0x10000, /*small=*/true));
  pool.AddFree(pool.New(0, 2048, 0x30000, true));
  pool.AddFree(pool.New(0, 2048, 0x20000, true));
  pool.AddFree(pool.New(1, 1024, 0x40000, true));
  pool.AddFree(pool.New(0, 1024, 0x50000, /*small=*/false));

  TestBlock* fit = pool.BestFit(/*small=*/true, /*stream=*/0, 1024);
  ASSERT_NE(fit, nullptr);
  EXPECT_EQ(fit->ptr, 0x20000u);
  EXPECT_EQ(pool.BestFit(true, 0, 3000)->ptr, 0x10000u);
  EXPECT_EQ(pool.BestFit(true, 0, 8192), nullptr);
  // Never another stream's block, nor another pool's.
  EXPECT_EQ(pool.BestFit(true, 1, 2048), nullptr);
  EXPECT_EQ(pool.BestFit(true, 2, 1), nullptr);
  EXPECT_EQ(pool.BestFit(false, 0, 1)->ptr, 0x50000u);
  EXPECT_EQ(Pool::LowerBound(pool.free_set(true), 1, 512)->ptr, 0x40000u);

  pool.RemoveFree(fit);
  EXPECT_EQ(pool.BestFit(true, 0, 1024)->ptr, 0x30000u);
  EXPECT_TRUE(pool.CheckChains(Always, Always).ok());
}

TEST(BlockPoolTest, BestFitWithFitSizeMovesOnWhileItShrinks) {
  MemoryStats stats;
  Pool pool({}, &stats);
  TestBlock* a = pool.New(0, 1000, 0x1000, true);
  TestBlock* b = pool.New(0, 2000, 0x2000, true);
  TestBlock* c = pool.New(0, 3000, 0x3000, true);
  a->tag = 10000;  // "could grow" by this much
  b->tag = 500;
  c->tag = 0;
  for (TestBlock* x : {a, b, c}) pool.AddFree(x);
  auto fit_size = [](const TestBlock* x) { return x->size + x->tag; };
  // 11000 > 2500 < 3000: stops at b.
  EXPECT_EQ(pool.BestFit(true, 0, 1, fit_size), b);
  // The plain size never moves on (the set is ordered by size).
  EXPECT_EQ(
      pool.BestFit(true, 0, 1, [](const TestBlock* x) { return x->size; }), a);
  EXPECT_EQ(pool.BestFit(true, 1, 1, fit_size), nullptr);
}

TEST(BlockPoolTest, OversizeRules) {
  MemoryStats stats;
  Pool pool({.max_split_size = 100 * kMiB, .max_non_split_rounding = 20 * kMiB},
            &stats);
  EXPECT_EQ(stats.max_split_size, 100 * kMiB);
  // Below max_split_size: never an oversize block.
  EXPECT_TRUE(pool.OversizeRulesAllow(99 * kMiB, 50 * kMiB));
  EXPECT_FALSE(pool.OversizeRulesAllow(100 * kMiB, 50 * kMiB));
  // Above it: less than 20 MiB of rounding.
  EXPECT_TRUE(pool.OversizeRulesAllow(119 * kMiB, 100 * kMiB));
  EXPECT_FALSE(pool.OversizeRulesAllow(120 * kMiB, 100 * kMiB));

  Pool unlimited({}, &stats);
  EXPECT_TRUE(unlimited.OversizeRulesAllow(64 * kGiB, 1));
}

TEST(BlockPoolTest, ShouldSplit) {
  MemoryStats stats;
  Pool pytorch({.max_split_size = 100 * kMiB}, &stats);
  EXPECT_TRUE(pytorch.ShouldSplit(/*small=*/true, 1024, 512));
  EXPECT_FALSE(pytorch.ShouldSplit(true, 1023, 512));
  // Large: more than 1 MiB must remain, below max_split_size.
  EXPECT_TRUE(pytorch.ShouldSplit(false, 20 * kMiB, 19 * kMiB - 1));
  EXPECT_FALSE(pytorch.ShouldSplit(false, 20 * kMiB, 19 * kMiB));
  EXPECT_FALSE(pytorch.ShouldSplit(false, 300 * kMiB, 100 * kMiB));

  Pool chunks({.min_large_remainder = 2 * kMiB}, &stats);
  EXPECT_TRUE(chunks.ShouldSplit(false, 20 * kMiB, 18 * kMiB));
  EXPECT_FALSE(chunks.ShouldSplit(false, 20 * kMiB, 18 * kMiB + 512));
}

TEST(BlockPoolTest, SplitAndAbsorbKeepTheChain) {
  MemoryStats stats;
  Pool pool({}, &stats);
  TestBlock* seg = pool.NewSegment(3, 0x10000, 0x100000, false);
  EXPECT_EQ(stats.segment.all().current, 1);
  EXPECT_EQ(stats.reserved_bytes.all().current, 0x10000);
  EXPECT_EQ(stats.num_device_alloc, 1u);

  TestBlock* front = pool.SplitFront(seg, 0x1000);
  TestBlock* back = pool.SplitBack(seg, 0x2000);
  EXPECT_EQ(front->stream, 3u);
  EXPECT_FALSE(front->small);
  EXPECT_EQ(Chain(front),
            (std::vector<std::vector<uint64_t>>{{0x100000, 0x1000, 0},
                                                {0x101000, 0xd000, 0},
                                                {0x10e000, 0x2000, 0}}));
  front->allocated = true;
  // Free neighbours that could merge are reported.
  Status unmerged = pool.CheckChains(Always, Always);
  EXPECT_EQ(unmerged.code(), StatusCode::kInternal);
  auto never = [](const TestBlock*, const TestBlock*) { return false; };
  EXPECT_TRUE(pool.CheckChains(Always, never).ok());

  EXPECT_EQ(pool.Absorb(seg, back), 0x2000u);  // [seg back]
  front->allocated = false;
  EXPECT_EQ(pool.Absorb(seg, front), 0x1000u);  // [front seg]
  EXPECT_EQ(Chain(seg),
            (std::vector<std::vector<uint64_t>>{{0x100000, 0x10000, 0}}));
  EXPECT_FALSE(seg->is_split());
  EXPECT_EQ(pool.blocks().size(), 1u);
  EXPECT_TRUE(pool.CheckChains(Always, Always).ok());

  pool.AddFree(seg);
  pool.ReleaseSegment(seg);
  EXPECT_TRUE(pool.blocks().empty());
  EXPECT_EQ(stats.segment.all().current, 0);
  EXPECT_EQ(stats.reserved_bytes.all().current, 0);
  EXPECT_EQ(stats.reserved_bytes.all().peak, 0x10000);
  EXPECT_EQ(stats.num_device_free, 1u);
}

TEST(BlockPoolTest, CheckChainsFindsABrokenLink) {
  MemoryStats stats;
  Pool pool({}, &stats);
  TestBlock* seg = pool.New(0, 4096, 0x1000, true);
  TestBlock* front = pool.SplitFront(seg, 1024);
  front->allocated = true;
  EXPECT_TRUE(pool.CheckChains(Always, Always).ok());
  auto same_tag = [](const TestBlock* b, const TestBlock* next) {
    return b->tag == next->tag;
  };
  seg->tag = 1;
  EXPECT_EQ(pool.CheckChains(same_tag, Always).code(), StatusCode::kInternal);
  seg->tag = 0;
  seg->ptr += 512;
  EXPECT_EQ(pool.CheckChains(Always, Always).code(), StatusCode::kInternal);
}

TEST(BlockPoolTest, LiveAllocationsAndTheirCounters) {
  MemoryStats stats;
  Pool pool({.max_split_size = 100 * kMiB}, &stats);
  TestBlock* big = pool.NewSegment(0, 200 * kMiB, 0x40000000, false);
  TestBlock* small = pool.NewSegment(0, 2 * kMiB, 0x80000000, true);
  EXPECT_EQ(stats.oversize_segments.current, 1);
  pool.AddLive(big, 150 * kMiB);
  pool.AddLive(small, 1000);
  EXPECT_TRUE(big->allocated);
  EXPECT_EQ(small->requested_size, 1000u);
  EXPECT_EQ(stats.allocation.all().current, 2);
  EXPECT_EQ(stats.requested_bytes[StatType::kSmallPool].current, 1000);
  EXPECT_EQ(stats.requested_bytes.all().current,
            static_cast<int64_t>(150 * kMiB + 1000));
  EXPECT_EQ(stats.oversize_allocations.current, 1);
  // allocated_bytes is the simulator's.
  EXPECT_EQ(stats.allocated_bytes.all().current, 0);
  EXPECT_EQ(pool.live().size(), 2u);
  EXPECT_TRUE(pool.CheckChains(Always, Always).ok());

  StatusOr<TestBlock*> freed = pool.RemoveLive(0x40000000);
  ASSERT_TRUE(freed.ok());
  EXPECT_EQ(*freed, big);
  EXPECT_FALSE(big->allocated);
  EXPECT_EQ(big->requested_size, 0u);
  EXPECT_EQ(stats.allocation.all().current, 1);
  EXPECT_EQ(stats.oversize_allocations.current, 0);
  EXPECT_EQ(pool.RemoveLive(0x40000000).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(pool.RemoveLive(0x1234).status().code(),
            StatusCode::kInvalidArgument);
}

// Three cached oversize segments of stream 0 (40, 60, 80 MiB, one split),
// one of stream 1, and the releases ReleaseOversize asks for.
class ReleaseOversizeTest : public ::testing::Test {
 protected:
  ReleaseOversizeTest() {
    for (uint64_t mib : {40, 60, 80}) {
      pool_.AddFree(pool_.NewSegment(0, mib * kMiB, mib * kGiB, false));
    }
    pool_.AddFree(pool_.NewSegment(1, 500 * kMiB, 500 * kGiB, false));
  }

  bool Release(uint64_t stream, uint64_t size) {
    return pool_.ReleaseOversize(
        /*small=*/false, stream, size,
        [](const TestBlock* b) { return !b->is_split() && b->tag == 0; },
        [this](TestBlock* b) {
          released_.push_back(b->size / kMiB);
          pool_.ReleaseSegment(b);
        });
  }

  MemoryStats stats_;
  Pool pool_{{.max_split_size = 30 * kMiB}, &stats_};
  std::vector<uint64_t> released_;
};

TEST_F(ReleaseOversizeTest, OneBlockLargeEnough) {
  EXPECT_TRUE(Release(0, 50 * kMiB));
  EXPECT_EQ(released_, (std::vector<uint64_t>{60}));
}

TEST_F(ReleaseOversizeTest, AtLeastMaxSplitSize) {
  EXPECT_TRUE(Release(0, 1 * kMiB));
  EXPECT_EQ(released_, (std::vector<uint64_t>{40}));
}

TEST_F(ReleaseOversizeTest, LargestFirstUntilEnough) {
  EXPECT_TRUE(Release(0, 100 * kMiB));
  EXPECT_EQ(released_, (std::vector<uint64_t>{80, 60}));
  EXPECT_EQ(stats_.segment.all().current, 2);
}

TEST_F(ReleaseOversizeTest, SkipsWhatCannotBeReleased) {
  pool_.BestFit(false, 0, 80 * kMiB)->tag = 1;
  EXPECT_TRUE(Release(0, 70 * kMiB));  // 80 MiB kept: 60 + 40
  EXPECT_EQ(released_, (std::vector<uint64_t>{60, 40}));
}

TEST_F(ReleaseOversizeTest, NotEnough) {
  EXPECT_FALSE(Release(0, 300 * kMiB));
  EXPECT_EQ(released_, (std::vector<uint64_t>{80, 60, 40}));
  EXPECT_FALSE(Release(2, 1));
  EXPECT_EQ(pool_.free_set(false).size(), 1u);  // stream 1's
}

TEST_F(ReleaseOversizeTest, NothingWithoutMaxSplitSize) {
  Pool unlimited({}, &stats_);
  unlimited.AddFree(unlimited.NewSegment(0, 40 * kMiB, 0, false));
  EXPECT_FALSE(unlimited.ReleaseOversize(
      false, 0, 1, [](const TestBlock*) { return true; },
      [](TestBlock*) { ADD_FAILURE(); }));
}

TEST(BlockPoolTest, ForEachFreeAllowsRemovingTheCurrentBlock) {
  MemoryStats stats;
  Pool pool({}, &stats);
  for (uint64_t i = 1; i <= 4; ++i) {
    pool.AddFree(pool.NewSegment(0, i * kMiB, i * kGiB, false));
  }
  std::vector<uint64_t> seen;
  pool.ForEachFree(false, [&](TestBlock* b) {
    seen.push_back(b->size / kMiB);
    if (b->size % (2 * kMiB) == 0) pool.ReleaseSegment(b);
  });
  EXPECT_EQ(seen, (std::vector<uint64_t>{1, 2, 3, 4}));
  EXPECT_EQ(pool.free_set(false).size(), 2u);
}

TEST(BlockPoolTest, ForEachSegmentSumsEachChain) {
  MemoryStats stats;
  Pool pool({}, &stats);
  TestBlock* seg = pool.New(0, 3 * kMiB, 0x200000, false);
  pool.SplitFront(seg, kMiB);
  pool.New(0, 5 * kMiB, 0x800000, false);
  uint64_t total = 0;
  int heads = 0;
  pool.ForEachSegment([&](const TestBlock* head, uint64_t bytes) {
    ++heads;
    total += bytes;
    EXPECT_EQ(head->prev, nullptr);
  });
  EXPECT_EQ(heads, 2);
  EXPECT_EQ(total, 8 * kMiB);
}

}  // namespace
}  // namespace loom::whatif
