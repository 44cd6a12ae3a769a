// Pins the rules of the PyTorch caching-allocator simulator (native
// segments) with small hand-checked sequences.
#include "whatif/sim/caching_allocator.h"

#include <gtest/gtest.h>

namespace loom::whatif {
namespace {

using Segment = CachingAllocator::SegmentInfo;

class CachingAllocatorTest : public ::testing::Test {
 protected:
  void Make(const std::string& conf = "", uint64_t capacity = 0) {
    auto config = ParseAllocConf(conf);
    ASSERT_TRUE(config.ok()) << config.status().ToString();
    allocator_ =
        std::make_unique<CachingAllocator>(*config, SimOptions{capacity});
  }
  uint64_t Alloc(uint64_t size, uint64_t stream = 0) {
    auto ptr = allocator_->Malloc(size, stream);
    EXPECT_TRUE(ptr.ok()) << ptr.status().ToString();
    Check();
    return ptr.ok() ? *ptr : 0;
  }
  void Free(uint64_t ptr) {
    ASSERT_TRUE(allocator_->Free(ptr).ok());
    Check();
  }
  void Check() {
    Status status = allocator_->CheckInvariants();
    EXPECT_TRUE(status.ok()) << status.ToString();
  }
  int64_t Allocated() { return S().allocated_bytes.all().current; }
  int64_t Reserved() { return S().reserved_bytes.all().current; }
  int64_t Segments() { return S().segment.all().current; }
  const MemoryStats& S() { return allocator_->stats(); }

  std::unique_ptr<CachingAllocator> allocator_;
};

TEST_F(CachingAllocatorTest, ThreeSmallRequestsShareOneSegment) {
  Make();
  const uint64_t kSize = 600 * kKiB;  // small pool: <= 1 MiB
  uint64_t a = Alloc(kSize);
  uint64_t b = Alloc(kSize);
  uint64_t c = Alloc(kSize);
  EXPECT_EQ(Segments(), 1);
  EXPECT_EQ(Reserved(), int64_t(2 * kMiB));
  EXPECT_EQ(Allocated(), int64_t(3 * kSize));
  EXPECT_EQ(b, a + kSize);  // split front-first, best fit by address
  EXPECT_EQ(c, a + 2 * kSize);
  EXPECT_EQ(S().segment[StatType::kSmallPool].current, 1);
  EXPECT_EQ(S().inactive_split.all().current, 1);  // the 248 KiB tail
  EXPECT_EQ(S().inactive_split_bytes.all().current,
            int64_t(2 * kMiB - 3 * kSize));
  // A fourth does not fit in the 248 KiB tail: a second segment.
  Alloc(kSize);
  EXPECT_EQ(Segments(), 2);
  EXPECT_EQ(Reserved(), int64_t(4 * kMiB));
  EXPECT_EQ(S().num_device_alloc, 2u);
  EXPECT_EQ(allocator_->driver_calls().malloc, 2u);
}

TEST_F(CachingAllocatorTest, MidSizeRequestTakesLargeSegmentAndSplits) {
  Make();
  uint64_t a = Alloc(5 * kMiB);
  EXPECT_EQ(Segments(), 1);
  EXPECT_EQ(Reserved(), int64_t(20 * kMiB));
  EXPECT_EQ(Allocated(), int64_t(5 * kMiB));
  EXPECT_EQ(S().segment[StatType::kLargePool].current, 1);
  uint64_t b = Alloc(5 * kMiB);  // served by the 15 MiB remainder
  EXPECT_EQ(b, a + 5 * kMiB);
  EXPECT_EQ(Segments(), 1);
  auto segments = allocator_->Snapshot();
  ASSERT_EQ(segments.size(), 1u);
  ASSERT_EQ(segments[0].blocks.size(), 3u);
  EXPECT_EQ(segments[0].blocks[2].size, 10 * kMiB);
  EXPECT_FALSE(segments[0].blocks[2].allocated);
}

TEST_F(CachingAllocatorTest, LargeRequestsRoundTo2MiBSegments) {
  Make();
  Alloc(12 * kMiB);  // exactly 12 MiB: segment of 12 MiB, no split
  EXPECT_EQ(Reserved(), int64_t(12 * kMiB));
  EXPECT_EQ(Allocated(), int64_t(12 * kMiB));
  EXPECT_EQ(S().inactive_split.all().current, 0);
  Alloc(12 * kMiB + 1);  // 12 MiB + 512 -> 14 MiB segment, remainder split
  EXPECT_EQ(Reserved(), int64_t(26 * kMiB));
  EXPECT_EQ(Allocated(), int64_t(24 * kMiB + 512));
  EXPECT_EQ(S().inactive_split.all().current, 1);
  // 11 MiB + 1: 12 MiB segment, remainder 1 MiB - 512 <= 1 MiB is not
  // split and counts as allocated (allocated_bytes counts block sizes).
  Alloc(11 * kMiB + 1);
  EXPECT_EQ(Reserved(), int64_t(38 * kMiB));
  EXPECT_EQ(Allocated(), int64_t(36 * kMiB + 512));
  EXPECT_EQ(S().requested_bytes.all().current,
            int64_t(12 * kMiB + (12 * kMiB + 1) + (11 * kMiB + 1)));
}

TEST_F(CachingAllocatorTest, FreeBlockOfAnotherStreamIsNotReused) {
  Make();
  uint64_t a = Alloc(5 * kMiB, /*stream=*/1);
  Free(a);
  EXPECT_EQ(Reserved(), int64_t(20 * kMiB));
  uint64_t b = Alloc(5 * kMiB, /*stream=*/2);
  EXPECT_EQ(Segments(), 2);
  EXPECT_EQ(Reserved(), int64_t(40 * kMiB));
  EXPECT_NE(b, a);
  uint64_t c = Alloc(5 * kMiB, /*stream=*/1);  // stream 1 reuses its own
  EXPECT_EQ(c, a);
  EXPECT_EQ(Segments(), 2);
}

TEST_F(CachingAllocatorTest, FreeMergesNeighboursAndCaches) {
  Make();
  uint64_t a = Alloc(4 * kMiB);
  uint64_t b = Alloc(4 * kMiB);
  uint64_t c = Alloc(4 * kMiB);
  Free(b);
  EXPECT_EQ(S().inactive_split.all().current, 2);  // b and the tail
  Free(a);                                         // merges with b
  EXPECT_EQ(S().inactive_split.all().current, 2);
  auto segments = allocator_->Snapshot();
  ASSERT_EQ(segments[0].blocks.size(), 3u);
  EXPECT_EQ(segments[0].blocks[0].size, 8 * kMiB);
  Free(c);  // everything merges back into one unsplit 20 MiB block
  segments = allocator_->Snapshot();
  ASSERT_EQ(segments[0].blocks.size(), 1u);
  EXPECT_EQ(segments[0].blocks[0].size, 20 * kMiB);
  EXPECT_EQ(S().inactive_split.all().current, 0);
  EXPECT_EQ(S().inactive_split_bytes.all().current, 0);
  EXPECT_EQ(Allocated(), 0);
  EXPECT_EQ(Reserved(), int64_t(20 * kMiB));  // cached, not returned
  EXPECT_EQ(S().allocated_bytes.all().peak, int64_t(12 * kMiB));
}

TEST_F(CachingAllocatorTest, EmptyCacheReleasesOnlyUnsplitSegments) {
  Make();
  uint64_t a = Alloc(5 * kMiB);
  Alloc(5 * kMiB);  // keeps the 20 MiB segment split
  uint64_t c = Alloc(12 * kMiB);
  uint64_t d = Alloc(600 * kKiB);
  Free(a);
  Free(c);
  Free(d);
  EXPECT_EQ(Reserved(), int64_t(34 * kMiB));
  allocator_->EmptyCache();
  Check();
  EXPECT_EQ(Reserved(), int64_t(20 * kMiB));  // only the split one stays
  EXPECT_EQ(Segments(), 1);
  EXPECT_EQ(S().num_device_free, 2u);
  EXPECT_EQ(allocator_->driver_calls().free, 2u);
  EXPECT_EQ(allocator_->device().physical_used(), 20 * kMiB);
}

TEST_F(CachingAllocatorTest, OutOfMemoryRetryReleasesTheCache) {
  Make("", /*capacity=*/40 * kMiB);
  uint64_t x = Alloc(30 * kMiB);
  Free(x);  // cached on stream 0
  // Stream 1 cannot use it; cudaMalloc(12 MiB) fails (30 + 12 > 40), the
  // cache is released and the retry succeeds.
  uint64_t y = Alloc(12 * kMiB, /*stream=*/1);
  EXPECT_NE(y, 0u);
  EXPECT_EQ(S().num_alloc_retries, 1u);
  EXPECT_EQ(S().num_ooms, 0u);
  EXPECT_EQ(Reserved(), int64_t(12 * kMiB));
  EXPECT_EQ(S().num_device_free, 1u);
  EXPECT_EQ(allocator_->driver_calls().malloc, 3u);  // one failed
  // Now nothing can be released: a real OOM.
  auto z = allocator_->Malloc(30 * kMiB, 1);
  ASSERT_FALSE(z.ok());
  EXPECT_EQ(z.status().code(), StatusCode::kOutOfMemory);
  EXPECT_NE(z.status().message().find("CUDA out of memory"), std::string::npos);
  EXPECT_EQ(S().num_ooms, 1u);
  EXPECT_EQ(S().num_alloc_retries, 2u);
  Check();
  EXPECT_EQ(Reserved(), int64_t(12 * kMiB));
}

TEST_F(CachingAllocatorTest, OversizeBlocksWithMaxSplitSize) {
  Make("max_split_size_mb:20");
  uint64_t big = Alloc(30 * kMiB);
  Free(big);
  // A request below max_split_size never takes an oversize cached block.
  Alloc(5 * kMiB);
  EXPECT_EQ(Reserved(), int64_t(50 * kMiB));
  EXPECT_EQ(S().oversize_segments.current, 2);  // 30 MiB and the 20 MiB
  // 25 MiB >= max_split: the 30 MiB block is within 25 + 20, reused whole.
  uint64_t again = Alloc(25 * kMiB);
  EXPECT_EQ(again, big);
  EXPECT_EQ(Allocated(), int64_t(35 * kMiB));  // 30 (unsplit) + 5
  EXPECT_EQ(S().oversize_allocations.current, 1);
}

TEST_F(CachingAllocatorTest, NonSplitRoundingLimitDependsOnVersion) {
  // max_non_split_rounding 40 MiB: a cached 50 MiB block may serve 25 MiB
  // (50 < 25 + 40) in 2.6+, but not under the older kLargeBuffer rule.
  for (bool legacy : {false, true}) {
    auto config =
        ParseAllocConf("max_split_size_mb:20,max_non_split_rounding_mb:40");
    ASSERT_TRUE(config.ok());
    if (legacy) config->non_split_rule = NonSplitRule::kLargeBuffer;
    CachingAllocator allocator(*config, SimOptions{});
    auto big = allocator.Malloc(50 * kMiB, 0);
    ASSERT_TRUE(big.ok());
    ASSERT_TRUE(allocator.Free(*big).ok());
    auto small = allocator.Malloc(25 * kMiB, 0);
    ASSERT_TRUE(small.ok());
    EXPECT_EQ(*small == *big, !legacy) << "legacy=" << legacy;
    EXPECT_EQ(allocator.stats().reserved_bytes.all().current,
              int64_t(legacy ? 76 * kMiB : 50 * kMiB));
  }
}

TEST_F(CachingAllocatorTest, ReleaseAvailableCachedBlocksFreesOversizeFirst) {
  Make("max_split_size_mb:20", /*capacity=*/100 * kMiB);
  uint64_t a = Alloc(40 * kMiB);
  uint64_t b = Alloc(30 * kMiB);
  Alloc(10 * kMiB);
  Free(a);
  Free(b);
  // 60 MiB needs cudaMalloc: 80 + 60 > 100. The oversize cached blocks are
  // released largest first until 60 MiB is freed (40 + 30), no full retry.
  Alloc(60 * kMiB, /*stream=*/0);
  EXPECT_EQ(S().num_alloc_retries, 0u);
  EXPECT_EQ(S().num_device_free, 2u);
  EXPECT_EQ(Reserved(), int64_t(70 * kMiB));
}

TEST_F(CachingAllocatorTest, BestFitPrefersSmallestThenLowestAddress) {
  Make();
  uint64_t a = Alloc(12 * kMiB);
  Alloc(2 * kMiB);
  uint64_t c = Alloc(10 * kMiB);
  Alloc(2 * kMiB);
  uint64_t e = Alloc(10 * kMiB);
  Free(a);
  Free(c);
  Free(e);
  EXPECT_EQ(Alloc(10 * kMiB), std::min(c, e));  // equal sizes: lowest address
  EXPECT_EQ(Alloc(10 * kMiB), std::max(c, e));
  // Then the 12 MiB block (smaller than the 16 MiB remainder of the 20 MiB
  // segment); its 2 MiB remainder (> 1 MiB) is split off.
  EXPECT_EQ(Alloc(10 * kMiB), a);
  EXPECT_EQ(Allocated(), int64_t(34 * kMiB));
}

TEST_F(CachingAllocatorTest, BadCallsAreErrors) {
  Make();
  EXPECT_EQ(allocator_->Malloc(0, 0).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(allocator_->Malloc(kMaxRequestSize, 0).status().code(),
            StatusCode::kOutOfMemory);
  uint64_t a = Alloc(100);
  EXPECT_EQ(allocator_->Free(a + 512).code(), StatusCode::kInvalidArgument);
  Free(a);
  EXPECT_EQ(allocator_->Free(a).code(), StatusCode::kInvalidArgument);
  Check();
}

TEST_F(CachingAllocatorTest, MappedRangesCoverSegments) {
  Make();
  uint64_t a = Alloc(600 * kKiB);
  uint64_t b = Alloc(12 * kMiB);
  auto ranges = allocator_->MappedRanges();
  ASSERT_EQ(ranges.size(), 2u);
  uint64_t total = ranges[0].size + ranges[1].size;
  EXPECT_EQ(total, 14 * kMiB);
  for (uint64_t p : {a, b}) {
    bool inside = false;
    for (const auto& r : ranges) inside |= r.address <= p && p < r.end();
    EXPECT_TRUE(inside);
  }
}

}  // namespace
}  // namespace loom::whatif
