// GmlakeAllocator: a simulator of GMLake's virtual-memory stitching
// allocator (Guo et al., ASPLOS'24), a fork of PyTorch 2.0's caching
// allocator. Source followed: GMLake/src/CUDACachingAllocator.cpp and
// GMLake/include/cuda_vmm_allocator.h of intelligent-machine-learning/glake
// (commit 392d840, 2024); research/vmm_anchors.md §4.
//
// Model:
//  - Small pool (<= 1 MiB): PyTorch's, cudaMalloc'ed 2 MiB segments.
//  - Large pool: every segment (realloc_block) is a primitive block
//    (pBlock): alloc_size/2 MiB physical chunks (one cuMemCreate each)
//    mapped into a fresh address range. Requests > 1 MiB are rounded to
//    2 MiB multiples; a pBlock splits only when >= 2 MiB would remain (and
//    the request is below max_split_size), so pieces are whole chunks.
//  - Stitched blocks (sBlocks): a new address range mapping the chunks of
//    several free pBlocks, for requests >= frag_limit (512 MiB): the largest
//    free pBlocks of the stream are taken in descending size until they
//    cover the request; the last one is split if >= 2 MiB is left over.
//    A freed sBlock is cached: "free" while none of its chunks is in use,
//    "fragmented" once another allocation uses one of them. A request that
//    no pBlock fits may reuse the smallest free sBlock of size <=
//    reuse_limit (10) x request, using only its first request/2 MiB chunks;
//    the pBlocks under those chunks are carved into used and free runs.
//  - StitchFree: EmptyCache releases unsplit free segments, then drops every
//    cached sBlock (free and fragmented), as does the automatic GC once
//    stitched address space exceeds auto_gc_limit (1000 GiB). Releasing a
//    pBlock drops the cached sBlocks that map its chunks; an active sBlock
//    that maps one is dropped when freed.
//  - Allocation order (malloc): best-fit pBlock (else reuse a free sBlock)
//    -> stitch -> new segment -> release oversize cached blocks + new
//    segment -> stitch -> release the whole cache + new segment (retry) ->
//    stitch -> OOM.
//
// Stats follow GMLake's own accounting: allocated_bytes counts the rounded
// request (actual_size), not the block size; reserved_bytes is the physical
// memory of pBlocks and small segments; segment counts physical segments
// (GMLake also counts each stitch, which this simulator reports apart as
// stitched_blocks()). active* and inactive_split* are not maintained (0).
//
// Provenance: the rules above come from GMLake's code, not from the paper.
// The paper's "four states" naming (exact fit / split / stitch / allocate
// and stitch, via research/vmm_anchors.md §4) is a summary and unverified;
// the simulator follows the code's order instead.
//
// Simplifications (documented, not verified against a run of GMLake):
//  - The partial StitchFree GC on address-reservation failure (time <= 1
//    with a required size) never triggers here (address space does not run
//    out), and neither does realloc_block's GC branch (its condition
//    `device_free > size` cannot hold when cuMemCreate failed); GC is
//    always total.
//  - No record_stream events, CUDA graphs, reAlloc=1 or
//    garbage_collection_threshold; defragLevel is supported.
//  - Driver calls: a pBlock costs n cuMemCreate + 1 reserve + n cuMemMap +
//    n cuMemSetAccess; its release 1 cuMemUnmap + n cuMemRelease + 1
//    address free; an sBlock costs 1 reserve + k cuMemMap + k
//    cuMemSetAccess, its drop 1 cuMemUnmap + 1 address free (VirDevPtr
//    unmaps its whole range at once).
//
// Blocks, free sets, splits and merges, the oversize rules and the release
// of cached segments are the BlockPool shared with the PyTorch simulator
// (block_pool.h); chunks and stitched blocks are this simulator's own.
//
// Invariants (CheckInvariants): blocks of a segment tile it in address
// order; a large block's chunks tile it; each chunk has at most one user
// (a live pBlock allocation or an active sBlock), so no physical byte is
// shared by two live allocations; free pBlocks have no used chunk; a
// cached sBlock is "free" exactly when none of its chunks is used;
// reserved_bytes == physical memory on the device.
#ifndef LOOM_WHATIF_SIM_GMLAKE_ALLOCATOR_H_
#define LOOM_WHATIF_SIM_GMLAKE_ALLOCATOR_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "whatif/sim/block_pool.h"
#include "whatif/sim/caching_config.h"
#include "whatif/sim/device.h"
#include "whatif/sim/sim_allocator.h"

namespace loom::whatif {

struct GmlakeOptions {
  uint64_t frag_limit = 512 * kMiB;           // fragLimit: stitch at >= this
  double reuse_limit = 10.0;                  // reuseLimit
  int defrag_level = 0;                       // defragLevel: 0 eager
  uint64_t auto_gc_limit = 1000 * kGiB;       // autoGC: stitched bytes
  bool defragment = true;                     // vmmDefragment
  uint64_t max_split_size = kNoMaxSplitSize;  // max_split_size_mb
};

class GmlakeAllocator final : public SimAllocator {
 public:
  // The granularity of physical chunks.
  static constexpr uint64_t kChunk = 2 * kMiB;

  GmlakeAllocator(const GmlakeOptions& gmlake, const SimOptions& options);
  ~GmlakeAllocator() override;

  GmlakeAllocator(const GmlakeAllocator&) = delete;
  GmlakeAllocator& operator=(const GmlakeAllocator&) = delete;

  std::string_view name() const override { return "gmlake"; }
  StatusOr<uint64_t> Malloc(uint64_t size, uint64_t stream) override;
  Status Free(uint64_t address) override;
  void EmptyCache() override;
  const MemoryStats& stats() const override { return stats_; }
  const DriverCalls& driver_calls() const override { return device_.calls(); }
  std::vector<AddressRange> MappedRanges() const override;
  Status CheckInvariants() const override;
  // stitches, stitch_reuses, stitched_blocks (live at the end).
  std::vector<std::pair<std::string, uint64_t>> Counters() const override;

  // GMLake's round_size: 512 B units; above 1 MiB, 2 MiB units.
  static uint64_t RoundSize(uint64_t size);

  // Inspection for tests and reports.
  uint64_t stitched_blocks() const { return num_stitched_; }  // live sBlocks
  uint64_t stitches() const { return num_stitches_; }         // ever made
  uint64_t stitch_reuses() const { return num_reuses_; }
  uint64_t cached_stitched_blocks() const {
    return free_fused_.size() + fragmented_.size();
  }
  uint64_t free_stitched_blocks() const { return free_fused_.size(); }
  const SimDevice& device() const { return device_; }

 private:
  struct Block;
  struct Chunk {
    Block* pblock = nullptr;       // the primitive block containing the chunk
    Block* user = nullptr;         // the live allocation using it, or none
    std::vector<Block*> stitched;  // sBlocks mapping it
  };
  enum class SState { kNone, kActive, kFree, kFragmented };
  // A pBlock (or a piece of one), a small-pool block or an sBlock. The
  // pool's `allocated` also covers pBlocks held by an sBlock.
  struct Block : PoolBlock<Block> {
    uint64_t actual = 0;  // rounded request (GMLake's actual_size) if live
    bool held = false;    // pBlock whose chunks an sBlock uses
    bool fused = false;   // sBlock: outside any chain and free set
    bool doomed = false;  // active sBlock that lost a chunk: drop at free
    SState state = SState::kNone;  // sBlocks only
    std::vector<Chunk*> chunks;    // large pool; sBlock: nullptr = dropped
    uint64_t used_chunks = 0;      // active sBlock: leading chunks in use
    uint64_t busy_chunks = 0;      // sBlock: its chunks with a user
  };
  struct Params {
    uint64_t stream = 0;
    uint64_t size = 0;
    uint64_t alloc_size = 0;
    bool small = false;
    Block* block = nullptr;
  };

  bool GetFreeBlock(Params& p);
  bool ReuseStitched(Params& p);
  bool Stitch(Params& p, int time);
  bool Realloc(Params& p, bool is_retry);
  void ReleaseCachedBlocks();
  void ReleaseBlock(Block* block);
  // BlockPool::SplitFront, the chunks of the front going with it.
  Block* SplitFront(Block* block, uint64_t size);
  void FreeBlock(Block* block);
  void TryMerge(Block* dst, Block* src);
  // Marks `chunk` used by `user` (nullptr: free) and updates the cached
  // sBlocks that map it.
  void SetChunkUser(Chunk* chunk, Block* user);
  // Splits the free pBlock `block` into runs of free and used chunks; used
  // runs become held blocks, free runs go back to the pool.
  void CarveHeld(Block* block);
  // Frees the held pBlocks among `pblocks` whose chunks are all free now.
  void FreeIdleHeld(const std::vector<Block*>& pblocks);
  void DropStitched(Block* sblock);
  void GarbageCollectStitched();
  void SetState(Block* sblock, SState state);

  Status CheckChains() const;
  Status CheckChunks() const;

  GmlakeOptions options_;
  SimDevice device_;
  MemoryStats stats_;
  BlockPool<Block> blocks_;                // after stats_, which it updates
  BlockPool<Block>::FreeSet free_fused_;   // cached sBlocks, no chunk in use
  std::unordered_set<Block*> fragmented_;  // cached sBlocks, some in use
  std::unordered_set<Chunk*> all_chunks_;  // owns the chunks
  std::unordered_set<Block*> stitched_;    // live sBlocks
  uint64_t total_fuse_size_ = 0;
  uint64_t num_stitched_ = 0;
  uint64_t num_stitches_ = 0;
  uint64_t num_reuses_ = 0;
};

}  // namespace loom::whatif

#endif  // LOOM_WHATIF_SIM_GMLAKE_ALLOCATOR_H_
