// CachingAllocator: a simulator of PyTorch's CUDA caching allocator
// (DeviceCachingAllocator in c10/cuda/CUDACachingAllocator.cpp), following
// PyTorch 2.11 (the "G3" generation of research/vmm_anchors.md §1-§2), with
// native cudaMalloc segments or expandable_segments:True.
//
// Request path (malloc): size = round_size(request) (caching_config.h);
// pool = small (<= 1 MiB) or large; best fit among the pool's free blocks
// ordered by (stream, size, address) -- a block is never reused by another
// stream; oversize rules with max_split_size / max_non_split_rounding;
// otherwise a new segment (cudaMalloc of get_allocation_size(size): 2 MiB,
// large_segment_size = 20 MiB below 10 MiB, else rounded to 2 MiB), then
// the OOM fallback chain: release oversize cached blocks, then every
// unsplit cached segment (num_alloc_retries), then OOM (num_ooms). The
// found block is split front-first when should_split allows (small pool or
// expandable: remainder >= 512 B; large: request < max_split_size and
// remainder > 1 MiB). Free merges with free neighbours of the same segment
// and caches the block; memory returns to the device only in EmptyCache
// (unsplit segments; whole free pages of expandable segments) and in the
// OOM fallback.
//
// Expandable mode: one ExpandableSegment per (stream, pool), 2 MiB pages for
// the small pool and large_segment_size (20 MiB) pages for the large one,
// grown at the lowest free address; best fit prefers the block whose
// "expandable size" (size + the unmapped tail next to it) is smallest.
//
// Not modelled (absent from traces): record_stream / cross-stream events,
// CUDA graph private pools and MemPools, per-process memory fraction and
// garbage_collection_threshold, IPC. Stats follow memory_stats() exactly
// for what is modelled (stats.h): allocated_bytes counts block sizes,
// segment counts cudaMalloc segments only, num_device_alloc/free count
// cudaMalloc/cudaFree and map_block/unmap_block calls.
//
// Blocks, free sets, splits and merges, the oversize rules and the release
// of cached segments are the shared BlockPool (block_pool.h).
//
// Invariants (CheckInvariants): blocks of a segment tile it exactly, linked
// by prev/next in address order; no two adjacent free blocks with the same
// mapped state; free mapped blocks are exactly the pool's cached blocks;
// allocated_bytes and reserved_bytes equal the sums over blocks and
// segments, and reserved == the device's physical memory in use.
#ifndef LOOM_WHATIF_SIM_CACHING_ALLOCATOR_H_
#define LOOM_WHATIF_SIM_CACHING_ALLOCATOR_H_

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "whatif/sim/block_pool.h"
#include "whatif/sim/caching_config.h"
#include "whatif/sim/device.h"
#include "whatif/sim/expandable_segment.h"
#include "whatif/sim/sim_allocator.h"

namespace loom::whatif {

class CachingAllocator final : public SimAllocator {
 public:
  // One block of a segment, as snapshot() reports it.
  struct BlockInfo {
    uint64_t address = 0;
    uint64_t size = 0;
    uint64_t requested_size = 0;  // 0 unless allocated
    bool allocated = false;
    bool mapped = true;  // false: unmapped part of an expandable segment
  };
  // A segment (native) or a whole expandable segment, with its blocks.
  struct SegmentInfo {
    uint64_t address = 0;
    uint64_t total_size = 0;  // address range, mapped or not
    uint64_t stream = 0;
    bool small_pool = false;
    bool expandable = false;
    std::vector<BlockInfo> blocks;
  };

  CachingAllocator(const CachingConfig& config, const SimOptions& options);
  ~CachingAllocator() override = default;

  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // "pytorch" or "pytorch_expandable".
  std::string_view name() const override;
  StatusOr<uint64_t> Malloc(uint64_t size, uint64_t stream) override;
  Status Free(uint64_t address) override;
  void EmptyCache() override;
  const MemoryStats& stats() const override { return stats_; }
  const DriverCalls& driver_calls() const override { return device_.calls(); }
  std::vector<AddressRange> MappedRanges() const override;
  Status CheckInvariants() const override;
  // expandable mode: expandable_segments (live at the end).
  std::vector<std::pair<std::string, uint64_t>> Counters() const override;

  // torch.cuda.memory_snapshot()'s segments, sorted by address.
  std::vector<SegmentInfo> Snapshot() const;
  const CachingConfig& config() const { return config_; }
  const SimDevice& device() const { return device_; }

 private:
  struct Block : PoolBlock<Block> {
    ExpandableSegment* expandable = nullptr;
    bool mapped = true;  // false: unmapped range of an expandable segment
  };
  struct ByAddress {
    bool operator()(const Block* a, const Block* b) const;
  };
  // Unmapped ranges of expandable segments, free and by (stream, address).
  using UnmappedSet = std::set<Block*, ByAddress>;
  struct AllocParams {
    uint64_t stream = 0;
    uint64_t size = 0;        // rounded request
    uint64_t alloc_size = 0;  // segment size if a new one is needed
    bool small = false;       // pool
    Block* block = nullptr;   // the block found or created
  };

  bool GetFreeBlock(AllocParams& p);
  Block* AllocFoundBlock(AllocParams& p, uint64_t orig_size, bool split);
  void FreeBlock(Block* block);
  uint64_t TryMergeBlocks(Block* dst, Block* src);
  bool AllocBlock(AllocParams& p, bool is_retry);
  void ReleaseCachedBlocks();
  void ReleaseBlock(Block* block);

  // Expandable segments (caching_allocator_expandable.cc).
  UnmappedSet& unmapped(bool small) {
    return small ? small_unmapped_ : large_unmapped_;
  }
  const UnmappedSet& unmapped(bool small) const {
    return small ? small_unmapped_ : large_unmapped_;
  }
  Block* TryAllocateExpandableBlock(uint64_t stream, bool small, uint64_t size);
  Block* FindExpandableBlock(uint64_t stream, bool small, uint64_t size);
  bool MapBlock(Block* to_map, uint64_t size);
  void UnmapBlock(Block* block);
  void ReleaseExpandableSegment(Block* block);
  Status CheckExpandableSegments() const;

  Status CheckBlockChains() const;

  CachingConfig config_;
  SimDevice device_;
  MemoryStats stats_;
  BlockPool<Block> blocks_;  // after stats_, which it updates
  UnmappedSet small_unmapped_;
  UnmappedSet large_unmapped_;
  std::vector<std::unique_ptr<ExpandableSegment>> expandable_segments_;
  uint64_t total_allocated_memory_ = 0;  // == reserved_bytes.all.current
};

}  // namespace loom::whatif

#endif  // LOOM_WHATIF_SIM_CACHING_ALLOCATOR_H_
