// Pins the rules of the expandable_segments:True simulator.
#include <gtest/gtest.h>

#include "whatif/sim/caching_allocator.h"

namespace loom::whatif {
namespace {

class ExpandableTest : public ::testing::Test {
 protected:
  void Make(uint64_t capacity = 0, const std::string& extra = "") {
    auto config = ParseAllocConf("expandable_segments:True" + extra);
    ASSERT_TRUE(config.ok()) << config.status().ToString();
    allocator_ =
        std::make_unique<CachingAllocator>(*config, SimOptions{capacity});
    EXPECT_EQ(allocator_->name(), "pytorch_expandable");
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
  int64_t Reserved() { return S().reserved_bytes.all().current; }
  int64_t Allocated() { return S().allocated_bytes.all().current; }
  const MemoryStats& S() { return allocator_->stats(); }
  const DriverCalls& Calls() { return allocator_->driver_calls(); }

  std::unique_ptr<CachingAllocator> allocator_;
};

TEST_F(ExpandableTest, SmallPoolGrowsByTwoMiBPagesContiguously) {
  Make();
  const uint64_t kSize = 600 * kKiB;
  uint64_t a = Alloc(kSize);
  EXPECT_EQ(Reserved(), int64_t(2 * kMiB));
  EXPECT_EQ(S().segment.all().current, 0);  // never counted for expandable
  EXPECT_EQ(S().num_device_alloc, 1u);
  EXPECT_EQ(Calls().address_reserve, 1u);
  EXPECT_EQ(Calls().mem_create, 1u);
  EXPECT_EQ(Calls().mem_map, 1u);
  EXPECT_EQ(Calls().set_access, 1u);
  EXPECT_EQ(Calls().malloc, 0u);
  Alloc(kSize);
  Alloc(kSize);
  EXPECT_EQ(Reserved(), int64_t(2 * kMiB));
  // The fourth crosses the page boundary: one more page, same segment, the
  // block continues right after the third (unlike native segments).
  uint64_t d = Alloc(kSize);
  EXPECT_EQ(d, a + 3 * kSize);
  EXPECT_EQ(Reserved(), int64_t(4 * kMiB));
  EXPECT_EQ(S().num_device_alloc, 2u);
  EXPECT_EQ(Calls().address_reserve, 1u);
  EXPECT_EQ(Allocated(), int64_t(4 * kSize));
}

TEST_F(ExpandableTest, LargePoolMapsTwentyMiBPagesAndSplitsAt512) {
  Make();
  uint64_t a = Alloc(5 * kMiB);
  EXPECT_EQ(Reserved(), int64_t(20 * kMiB));
  EXPECT_EQ(Allocated(), int64_t(5 * kMiB));
  // 11 MiB + 1 rounds to 11 MiB + 512; the 512 B split rule applies (a
  // native segment would keep the 1 MiB - 512 remainder).
  uint64_t b = Alloc(11 * kMiB + 1);
  EXPECT_EQ(b, a + 5 * kMiB);
  EXPECT_EQ(Reserved(), int64_t(20 * kMiB));
  EXPECT_EQ(Allocated(), int64_t(16 * kMiB + 512));
  // 30 MiB: the 4 MiB - 512 free tail plus one new 20 MiB page... not
  // enough (24 MiB - 512); two pages are mapped in one map_block call.
  uint64_t c = Alloc(30 * kMiB);
  EXPECT_EQ(c, b + 11 * kMiB + 512);
  EXPECT_EQ(Reserved(), int64_t(60 * kMiB));
  EXPECT_EQ(S().num_device_alloc, 2u);
  EXPECT_EQ(Calls().mem_create, 3u);
  EXPECT_EQ(Calls().mem_map, 3u);
  EXPECT_EQ(Calls().set_access, 2u);
}

TEST_F(ExpandableTest, EmptyCacheUnmapsOnlyWholeFreePages) {
  Make();
  uint64_t a = Alloc(5 * kMiB);   // [0, 5)
  uint64_t b = Alloc(30 * kMiB);  // [5, 35); pages [0,20) [20,40) mapped
  EXPECT_EQ(Reserved(), int64_t(40 * kMiB));
  Free(a);
  allocator_->EmptyCache();  // [0,5) holds no whole page; nor does [35,40)
  Check();
  EXPECT_EQ(Reserved(), int64_t(40 * kMiB));
  EXPECT_EQ(S().num_device_free, 0u);
  Free(b);
  allocator_->EmptyCache();  // now both pages are free: unmapped, and the
  Check();                   // segment (one unmapped block) is released
  EXPECT_EQ(Reserved(), 0);
  EXPECT_EQ(S().num_device_free, 1u);
  EXPECT_EQ(Calls().mem_unmap, 2u);
  EXPECT_EQ(Calls().mem_release, 2u);
  EXPECT_EQ(Calls().synchronize, 1u);
  EXPECT_EQ(Calls().address_free, 1u);
  EXPECT_TRUE(allocator_->Snapshot().empty());
}

TEST_F(ExpandableTest, EmptyCacheUnmapsFreePagesInsideASegment) {
  Make();
  uint64_t a = Alloc(30 * kMiB);  // [0, 30)
  uint64_t b = Alloc(30 * kMiB);  // [30, 60); three pages mapped
  Free(a);
  allocator_->EmptyCache();  // page [0, 20) is wholly free
  Check();
  EXPECT_EQ(Reserved(), int64_t(40 * kMiB));
  // 12 MiB fits no mapped free block ([20,30) is 10 MiB): the lowest
  // unmapped range [0,20) plus the free [20,30) after it is mapped again.
  uint64_t c = Alloc(12 * kMiB);
  EXPECT_EQ(c, a);
  EXPECT_EQ(Reserved(), int64_t(60 * kMiB));
  (void)b;
}

TEST_F(ExpandableTest, EachStreamHasItsOwnSegment) {
  Make();
  uint64_t a = Alloc(4 * kMiB, /*stream=*/1);
  Free(a);
  uint64_t b = Alloc(4 * kMiB, /*stream=*/2);
  EXPECT_EQ(Reserved(), int64_t(40 * kMiB));
  EXPECT_EQ(Calls().address_reserve, 2u);
  auto segments = allocator_->Snapshot();
  ASSERT_EQ(segments.size(), 2u);
  EXPECT_NE(segments[0].stream, segments[1].stream);
  EXPECT_TRUE(segments[0].expandable);
  (void)b;
}

TEST_F(ExpandableTest, OutOfMemoryRetryUnmapsCachedPages) {
  Make(/*capacity=*/40 * kMiB);
  uint64_t x = Alloc(30 * kMiB);  // two 20 MiB pages on stream 0
  Free(x);
  uint64_t y = Alloc(10 * kMiB, /*stream=*/1);  // needs a page: device full
  EXPECT_NE(y, 0u);
  EXPECT_EQ(S().num_alloc_retries, 1u);
  EXPECT_EQ(Reserved(), int64_t(20 * kMiB));
  EXPECT_EQ(Calls().mem_unmap, 2u);
  EXPECT_EQ(Calls().mem_create, 4u);          // 2 + 1 failed + 1 retried
  auto z = allocator_->Malloc(50 * kMiB, 1);  // two more pages: no room
  EXPECT_EQ(z.status().code(), StatusCode::kOutOfMemory);
  EXPECT_EQ(S().num_ooms, 1u);
  Check();
  EXPECT_EQ(Reserved(), int64_t(20 * kMiB));
}

TEST_F(ExpandableTest, BestFitUsesTheBlockNextToUnmappedSpaceLast) {
  Make();
  uint64_t a = Alloc(6 * kMiB);  // [0,6)
  Alloc(6 * kMiB);               // [6,12)
  Alloc(6 * kMiB);               // [12,18), free tail [18,20)
  Free(a);
  // Free blocks: [18,20) (2 MiB, next to unmapped space) and [0,6).
  // Native best fit would take the 2 MiB tail; the expandable-size rule
  // counts the tail as growable and takes [0,6).
  EXPECT_EQ(Alloc(2 * kMiB), a);
}

TEST_F(ExpandableTest, OversizeRulesStillApply) {
  Make(0, ",max_split_size_mb:20");
  uint64_t big = Alloc(30 * kMiB);
  Free(big);
  allocator_->EmptyCache();
  EXPECT_EQ(Reserved(), 0);
  uint64_t a = Alloc(30 * kMiB);
  Free(a);
  // get_free_block refuses the 40 MiB oversize free block for 5 MiB, but
  // find_expandable_block then picks the same block (it lies right before
  // the unmapped tail), so PyTorch splits it anyway: no new page.
  uint64_t b = Alloc(5 * kMiB);
  EXPECT_EQ(b, a);
  EXPECT_EQ(Reserved(), int64_t(40 * kMiB));
}

}  // namespace
}  // namespace loom::whatif
