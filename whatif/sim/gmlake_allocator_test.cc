// Pins the rules of the GMLake-style stitching simulator with small
// hand-checked sequences.
#include "whatif/sim/gmlake_allocator.h"

#include <gtest/gtest.h>

namespace loom::whatif {
namespace {

class GmlakeTest : public ::testing::Test {
 protected:
  void Make(GmlakeOptions options = {}, uint64_t capacity = 0) {
    allocator_ =
        std::make_unique<GmlakeAllocator>(options, SimOptions{capacity});
  }
  // Stitching from 20 MiB up, so tests stay small.
  void MakeSmallFragLimit(uint64_t capacity = 0) {
    GmlakeOptions options;
    options.frag_limit = 20 * kMiB;
    Make(options, capacity);
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
  void EmptyCache() {
    allocator_->EmptyCache();
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

  std::unique_ptr<GmlakeAllocator> allocator_;
};

TEST(GmlakeRoundSizeTest, LargeRequestsRoundToChunks) {
  EXPECT_EQ(GmlakeAllocator::RoundSize(100), 512u);
  EXPECT_EQ(GmlakeAllocator::RoundSize(600 * kKiB), 600 * kKiB);
  EXPECT_EQ(GmlakeAllocator::RoundSize(kMiB), kMiB);
  EXPECT_EQ(GmlakeAllocator::RoundSize(kMiB + 1), 2 * kMiB);
  EXPECT_EQ(GmlakeAllocator::RoundSize(5 * kMiB + 1), 6 * kMiB);
  EXPECT_EQ(GmlakeAllocator::RoundSize(12 * kMiB), 12 * kMiB);
}

TEST_F(GmlakeTest, SmallPoolIsPyTorchs) {
  Make();
  const uint64_t kSize = 600 * kKiB;
  uint64_t a = Alloc(kSize);
  EXPECT_EQ(Alloc(kSize), a + kSize);
  EXPECT_EQ(Alloc(kSize), a + 2 * kSize);
  EXPECT_EQ(Reserved(), int64_t(2 * kMiB));
  EXPECT_EQ(Calls().malloc, 1u);
  EXPECT_EQ(Calls().mem_create, 0u);
}

TEST_F(GmlakeTest, LargeSegmentsAreChunkedPrimitiveBlocks) {
  Make();
  uint64_t a = Alloc(5 * kMiB);  // 20 MiB pBlock of 10 chunks, split
  EXPECT_EQ(Reserved(), int64_t(20 * kMiB));
  EXPECT_EQ(S().segment.all().current, 1);
  EXPECT_EQ(Calls().mem_create, 10u);
  EXPECT_EQ(Calls().address_reserve, 1u);
  EXPECT_EQ(Calls().mem_map, 10u);
  EXPECT_EQ(Calls().set_access, 10u);
  EXPECT_EQ(Calls().malloc, 0u);
  // 3 MiB + 1 rounds to 4 MiB (PyTorch: 3 MiB + 512) and splits off whole
  // chunks from the 14 MiB remainder (GMLake's size was 6 MiB: 5 MiB -> 6).
  uint64_t b = Alloc(3 * kMiB + 1);
  EXPECT_EQ(b, a + 6 * kMiB);
  EXPECT_EQ(Allocated(), int64_t(10 * kMiB));  // rounded sizes (actual)
  EXPECT_EQ(S().requested_bytes.all().current, int64_t(8 * kMiB + 1));
  // 11 MiB rounds to 12 MiB: a 12 MiB segment, nothing to split.
  Alloc(11 * kMiB);
  EXPECT_EQ(Reserved(), int64_t(32 * kMiB));
  EXPECT_EQ(S().segment.all().current, 2);
  Free(a);
  Free(b);
  // The pBlock merged back whole; EmptyCache releases both segments.
  EmptyCache();
  EXPECT_EQ(Reserved(), int64_t(12 * kMiB));
  EXPECT_EQ(Calls().mem_release, 10u);
  EXPECT_EQ(Calls().mem_unmap, 1u);
  EXPECT_EQ(Calls().address_free, 1u);
}

TEST_F(GmlakeTest, StitchesTwoFreeBlocksWithoutNewMemory) {
  MakeSmallFragLimit();
  uint64_t a = Alloc(30 * kMiB);
  uint64_t b = Alloc(30 * kMiB);
  Free(a);
  Free(b);
  // 50 MiB: no free block fits; the two largest free blocks (30 + 30) are
  // stitched, the second split so that only 20 MiB of it is used.
  uint64_t c = Alloc(50 * kMiB);
  EXPECT_NE(c, a);
  EXPECT_NE(c, b);
  EXPECT_EQ(Reserved(), int64_t(60 * kMiB));
  EXPECT_EQ(Allocated(), int64_t(50 * kMiB));
  EXPECT_EQ(Calls().mem_create, 30u);      // no new physical memory
  EXPECT_EQ(Calls().address_reserve, 3u);  // one more range ...
  EXPECT_EQ(Calls().mem_map, 30u + 25u);   // ... mapping 25 chunks
  EXPECT_EQ(allocator_->stitches(), 1u);
  EXPECT_EQ(allocator_->stitched_blocks(), 1u);
  EXPECT_EQ(S().num_alloc_retries, 0u);
  Free(c);
  EXPECT_EQ(allocator_->free_stitched_blocks(), 1u);  // cached, all free
  // 40 MiB: no primitive block fits (30 max); the cached 50 MiB stitched
  // block is reused (50 <= 10 x 40), using its first 20 chunks.
  uint64_t d = Alloc(40 * kMiB);
  EXPECT_EQ(d, c);
  EXPECT_EQ(allocator_->stitch_reuses(), 1u);
  EXPECT_EQ(Calls().mem_map, 55u);  // no new mapping
  // 10 MiB takes the free run of the first block, 5 of whose chunks lie in
  // the stitched block beyond what it uses.
  Alloc(10 * kMiB);
  EXPECT_EQ(Reserved(), int64_t(60 * kMiB));
  Free(d);
  EXPECT_EQ(allocator_->free_stitched_blocks(), 0u);  // fragmented now
  EXPECT_EQ(allocator_->cached_stitched_blocks(), 1u);
  // EmptyCache releases the unsplit second segment, which drops the
  // stitched block mapping its chunks.
  EmptyCache();
  EXPECT_EQ(Reserved(), int64_t(30 * kMiB));
  EXPECT_EQ(allocator_->stitched_blocks(), 0u);
  EXPECT_EQ(Calls().mem_release, 15u);
  EXPECT_EQ(Calls().mem_unmap, 2u);
  EXPECT_EQ(Calls().address_free, 2u);
}

TEST_F(GmlakeTest, StitchingAvoidsTheRetryPyTorchNeeds) {
  MakeSmallFragLimit(/*capacity=*/60 * kMiB);
  uint64_t a = Alloc(30 * kMiB);
  uint64_t b = Alloc(30 * kMiB);
  Free(a);
  Free(b);
  Alloc(50 * kMiB);  // PyTorch would free both segments and cudaMalloc
  EXPECT_EQ(S().num_alloc_retries, 0u);
  EXPECT_EQ(S().num_ooms, 0u);
  EXPECT_EQ(Reserved(), int64_t(60 * kMiB));
}

TEST_F(GmlakeTest, NoStitchBelowFragLimitOrBeforeDefragLevel) {
  for (int variant = 0; variant < 2; ++variant) {
    GmlakeOptions options;  // default fragLimit: 512 MiB
    if (variant == 1) {
      options.frag_limit = 20 * kMiB;
      options.defrag_level = 1;  // stitch only after a new segment failed
    }
    Make(options);
    uint64_t a = Alloc(30 * kMiB);
    uint64_t b = Alloc(30 * kMiB);
    Free(a);
    Free(b);
    Alloc(50 * kMiB);
    EXPECT_EQ(allocator_->stitches(), 0u) << variant;
    EXPECT_EQ(Reserved(), int64_t(110 * kMiB)) << variant;
  }
}

TEST_F(GmlakeTest, ReuseLimitForcesANewStitch) {
  GmlakeOptions options;
  options.frag_limit = 20 * kMiB;
  options.reuse_limit = 1.2;
  Make(options);
  uint64_t a = Alloc(30 * kMiB);
  uint64_t b = Alloc(30 * kMiB);
  Free(a);
  Free(b);
  Free(Alloc(50 * kMiB));
  // 34 MiB: 50 > 1.2 x 34, so the cached block is not reused; a new one is
  // stitched from the 30 MiB blocks, fragmenting the cached one.
  uint64_t c = Alloc(34 * kMiB);
  EXPECT_EQ(allocator_->stitches(), 2u);
  EXPECT_EQ(allocator_->stitch_reuses(), 0u);
  EXPECT_EQ(allocator_->cached_stitched_blocks(), 1u);
  EXPECT_EQ(allocator_->free_stitched_blocks(), 0u);
  EXPECT_EQ(Reserved(), int64_t(60 * kMiB));
  Free(c);
  EXPECT_EQ(allocator_->free_stitched_blocks(), 2u);
}

TEST_F(GmlakeTest, EmptyCacheCollectsStitchedBlocks) {
  MakeSmallFragLimit();
  Alloc(4 * kMiB);                // P1: [a 4][16 free]
  uint64_t b = Alloc(30 * kMiB);  // P2: [b 30]
  Free(b);
  Alloc(6 * kMiB);                // P1: [a][c 6][10 free]
  Alloc(6 * kMiB);                // P1: [a][c][d 6][4 free]
  Alloc(8 * kMiB);                // P2: [e 8][22 free]
  uint64_t f = Alloc(26 * kMiB);  // stitch 22 + 4
  EXPECT_EQ(allocator_->stitches(), 1u);
  EXPECT_EQ(Reserved(), int64_t(50 * kMiB));
  Free(f);
  EXPECT_EQ(allocator_->free_stitched_blocks(), 1u);
  uint64_t g = Alloc(4 * kMiB);  // best fit: P1's 4 MiB tail, in the sBlock
  EXPECT_EQ(allocator_->free_stitched_blocks(), 0u);
  Free(g);
  EXPECT_EQ(allocator_->free_stitched_blocks(), 1u);
  // Both segments are split, so nothing is released; StitchFree drops the
  // cached stitched block.
  uint64_t unmaps = Calls().mem_unmap;
  EmptyCache();
  EXPECT_EQ(allocator_->stitched_blocks(), 0u);
  EXPECT_EQ(Calls().mem_unmap, unmaps + 1);
  EXPECT_EQ(Reserved(), int64_t(50 * kMiB));
}

TEST_F(GmlakeTest, ReleasingAChunkOfAnActiveStitchedBlockDropsItAtFree) {
  MakeSmallFragLimit();
  uint64_t a = Alloc(20 * kMiB);
  uint64_t b = Alloc(30 * kMiB);
  uint64_t c = Alloc(10 * kMiB);
  Free(a);
  Free(b);
  Free(c);
  uint64_t x = Alloc(60 * kMiB);  // stitches 30 + 20 + 10
  Free(x);
  uint64_t y = Alloc(50 * kMiB);  // reuses it, using the 30 + 20 MiB parts
  EXPECT_EQ(y, x);
  EmptyCache();  // releases the untouched 10 MiB segment under the sBlock
  EXPECT_EQ(Reserved(), int64_t(50 * kMiB));
  EXPECT_EQ(allocator_->stitched_blocks(), 1u);
  uint64_t mapped = 0;
  for (const auto& r : allocator_->MappedRanges()) mapped += r.size;
  EXPECT_EQ(mapped, 50 * kMiB + 50 * kMiB);  // segments + live sBlock part
  Free(y);
  EXPECT_EQ(allocator_->stitched_blocks(), 0u);
  EXPECT_EQ(allocator_->cached_stitched_blocks(), 0u);
}

TEST_F(GmlakeTest, OutOfMemoryAfterTheFallbacks) {
  Make({}, /*capacity=*/40 * kMiB);
  Alloc(30 * kMiB);
  auto b = allocator_->Malloc(20 * kMiB, 0);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kOutOfMemory);
  EXPECT_EQ(S().num_ooms, 1u);
  EXPECT_EQ(S().num_alloc_retries, 1u);
  // Each attempt creates 5 chunks, fails on the 6th and releases the 5.
  EXPECT_EQ(Calls().mem_create, 15u + 12u);
  EXPECT_EQ(Calls().mem_release, 10u);
  EXPECT_EQ(Reserved(), int64_t(30 * kMiB));
  Check();
}

TEST_F(GmlakeTest, StreamsDoNotShareBlocks) {
  MakeSmallFragLimit();
  uint64_t a = Alloc(30 * kMiB, /*stream=*/1);
  uint64_t b = Alloc(30 * kMiB, /*stream=*/2);
  Free(a);
  Free(b);
  Alloc(50 * kMiB, /*stream=*/1);  // one free block on stream 1: no stitch
  EXPECT_EQ(allocator_->stitches(), 0u);
  EXPECT_EQ(Reserved(), int64_t(110 * kMiB));
}

}  // namespace
}  // namespace loom::whatif
