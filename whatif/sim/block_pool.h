// BlockPool: the block bookkeeping shared by the simulators of PyTorch's
// caching allocator (caching_allocator.h) and of GMLake's stitcher
// (gmlake_allocator.h), which is a fork of PyTorch 2.0's allocator and
// keeps its blocks the same way:
//  - blocks: a segment is a chain of blocks linked by prev/next in address
//    order; the pool owns every block, in a chain or not;
//  - free sets: one per pool (small, large), ordered by (stream, size,
//    address); best fit (get_free_block) with the oversize rules of
//    max_split_size and the maximum non-split rounding;
//  - splitting a block's front off and merging free neighbours; should_split;
//  - releasing cached segments: release_available_cached_blocks and the walk
//    of empty_cache;
//  - live allocations by address, and the memory_stats() counters that
//    segments and allocations imply: segment, reserved_bytes,
//    oversize_segments, num_device_alloc/free; allocation, requested_bytes,
//    oversize_allocations.
// The pool is a template on the simulator's block type, which derives from
// PoolBlock<Block>, so neither simulator casts; what does not depend on the
// type (the size rules and the counters) is BlockPoolBase, in block_pool.cc.
//
// What stays in the simulators, because it really differs:
//  - the device side of a segment (cudaMalloc; expandable segments' pages;
//    GMLake's 2 MiB chunks mapped into fresh ranges): the pool only books the
//    segment it is handed (NewSegment, ReleaseSegment);
//  - what a block carries beyond PoolBlock: the expandable segment and the
//    mapped state (PyTorch), physical chunks and stitching state (GMLake).
//    SplitFront and Absorb move addresses and links only; the caller moves
//    the rest (GMLake's chunks follow addresses, so it looks at which side
//    the neighbour is on before absorbing it);
//  - when two free neighbours merge and where the absorbed one was filed:
//    expandable segments keep unmapped ranges in a second set per pool, by
//    address, and merge only blocks of equal mapped state;
//  - allocated_bytes: PyTorch counts block sizes, GMLake the rounded request
//    (actual_size); active* and inactive_split*: PyTorch only;
//  - the split exception of expandable segments (every block splits like a
//    small one) and GMLake's reuse of stitched blocks, which are blocks the
//    pool owns but outside any chain and any free set of the pool.
//
// Invariants (CheckChains): in a chain, each block's next starts where it
// ends, points back to it, and has its stream and pool; no block is empty;
// no two free neighbours that could merge are left unmerged; a block in a
// free set is not allocated; every live allocation is an allocated block of
// the pool at its own address.
#ifndef LOOM_WHATIF_SIM_BLOCK_POOL_H_
#define LOOM_WHATIF_SIM_BLOCK_POOL_H_

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "base/check.h"
#include "base/status.h"
#include "whatif/sim/caching_config.h"
#include "whatif/sim/stats.h"

namespace loom::whatif {

// The fields every simulated block has. A simulator's block type derives
// from PoolBlock<itself> and adds its own, so links keep its type.
template <typename Block>
struct PoolBlock {
  uint64_t stream = 0;
  uint64_t size = 0;
  uint64_t ptr = 0;
  uint64_t requested_size = 0;  // request of a live allocation, else 0
  Block* prev = nullptr;        // neighbours in the segment, by address
  Block* next = nullptr;
  bool small = false;      // small pool
  bool allocated = false;  // in use: a live allocation (or held, GMLake)
  bool is_split() const { return prev != nullptr || next != nullptr; }
};

struct BlockPoolOptions {
  uint64_t max_split_size = kNoMaxSplitSize;  // max_split_size_mb
  // A block of at least max_split_size serves a request of `size` only
  // when it is smaller than size + this (PyTorch 2.6+: the configured
  // max_non_split_rounding_size; PyTorch <= 2.5 and GMLake: kLargeBuffer).
  uint64_t max_non_split_rounding = kLargeBuffer;
  // A large block splits only when the request is below max_split_size and
  // at least this much would remain (PyTorch: more than 1 MiB; GMLake:
  // whole chunks, 2 MiB).
  uint64_t min_large_remainder = kSmallSize + 1;
};

// The half of the pool that does not depend on the block type: the size
// rules and the counters.
class BlockPoolBase {
 public:
  // Sets stats->max_split_size; `stats` must outlive the pool.
  BlockPoolBase(const BlockPoolOptions& options, MemoryStats* stats);

  const BlockPoolOptions& options() const { return options_; }

  // get_free_block's oversize rules: whether a free block of `block_size`
  // bytes may serve a rounded request of `size`. No block of at least
  // max_split_size for a request below it; above it, a bounded rounding.
  bool OversizeRulesAllow(uint64_t block_size, uint64_t size) const;

  // should_split: a small block splits when >= kMinBlockSize bytes would
  // remain, a large one per BlockPoolOptions::min_large_remainder.
  // REQUIRES: size <= block_size.
  bool ShouldSplit(bool small, uint64_t block_size, uint64_t size) const;

 protected:
  void CountSegment(bool small, uint64_t size);
  void UncountSegment(bool small, uint64_t size);
  void CountAllocation(bool small, uint64_t block_size, uint64_t requested);
  void UncountAllocation(bool small, uint64_t block_size, uint64_t requested);

 private:
  BlockPoolOptions options_;
  MemoryStats* stats_;
};

template <typename Block>
class BlockPool : public BlockPoolBase {
 public:
  // (stream, size, address): best fit within a stream, lowest address
  // among equals.
  struct BySize {
    bool operator()(const Block* a, const Block* b) const {
      if (a->stream != b->stream) return a->stream < b->stream;
      if (a->size != b->size) return a->size < b->size;
      return a->ptr < b->ptr;
    }
  };
  using FreeSet = std::set<Block*, BySize>;

  BlockPool(const BlockPoolOptions& options, MemoryStats* stats)
      : BlockPoolBase(options, stats) {}
  ~BlockPool() {
    for (Block* block : blocks_) delete block;
  }

  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  // ---- Ownership.

  // A new block owned by the pool, in no chain and no set.
  Block* New(uint64_t stream, uint64_t size, uint64_t ptr, bool small);
  // REQUIRES: `block` is the pool's, in no set, and nothing links to it.
  void Delete(Block* block);
  const std::unordered_set<Block*>& blocks() const { return blocks_; }

  // ---- Free sets.

  FreeSet& free_set(bool small) { return small ? small_free_ : large_free_; }
  const FreeSet& free_set(bool small) const {
    return small ? small_free_ : large_free_;
  }
  // Files a free block in (removes it from) its pool's free set.
  // REQUIRES: it is not there (it is there).
  void AddFree(Block* block);
  void RemoveFree(Block* block);

  // The first block of `stream` in `set` with at least `size` bytes, or
  // nullptr: the best fit in any set ordered by BySize.
  static Block* LowerBound(const FreeSet& set, uint64_t stream, uint64_t size);
  // get_free_block's search in a pool: the best fit, or nullptr.
  Block* BestFit(bool small, uint64_t stream, uint64_t size) const {
    return LowerBound(free_set(small), stream, size);
  }
  // The same, moving on to the next blocks of the stream while their
  // fit_size(block) is smaller (PyTorch's "expandable size": a block next
  // to unmapped address space counts as big as it could grow).
  template <typename FitSize>
  Block* BestFit(bool small, uint64_t stream, uint64_t size,
                 FitSize fit_size) const;

  // ---- Segments and their chains.

  // Books a segment the caller obtained from the device as one block of
  // the pool (in no set) and counts it. REQUIRES: size > 0.
  Block* NewSegment(uint64_t stream, uint64_t size, uint64_t ptr, bool small);
  // Uncounts a whole free segment the caller gave back to the device,
  // removes it from its free set and deletes it.
  // REQUIRES: block free, unsplit, in its free set.
  void ReleaseSegment(Block* block);

  // Splits the first `size` bytes off `block` into a new block of the same
  // stream and pool, linked before it; `block` keeps the rest. Returns the
  // new block. REQUIRES: 0 < size < block->size; block in no set.
  Block* SplitFront(Block* block, uint64_t size);
  // Splits the last `size` bytes off `block` into a new block of the same
  // stream and pool, linked after it. REQUIRES as for SplitFront.
  Block* SplitBack(Block* block, uint64_t size);
  // Merges `src` into its neighbour `dst` and deletes it; returns the bytes
  // taken over. REQUIRES: src is dst->prev or dst->next; neither is in a
  // set.
  uint64_t Absorb(Block* dst, Block* src);

  // release_available_cached_blocks, for a request of `size` bytes on
  // `stream`: releases the smallest cached block of at least
  // max(size, max_split_size) bytes, else cached blocks of at least
  // max_split_size, largest first, until that much is released. Only blocks
  // `releasable` accepts (whole segments the device can take back) count;
  // `release(block)` gives one back and removes it from the free set (and
  // nothing else from it). Returns whether enough was released; false at
  // once without max_split_size.
  template <typename Releasable, typename Release>
  bool ReleaseOversize(bool small, uint64_t stream, uint64_t size,
                       Releasable releasable, Release release);

  // Calls fn(block) on every block of a free set, in its order; fn may
  // remove that block from the set, and no other.
  template <typename Fn>
  void ForEachFree(bool small, Fn fn);

  // Calls fn(head, bytes) for every chain, i.e. every block without prev,
  // with the bytes of the whole chain. A block outside any segment (GMLake's
  // stitched blocks) is a chain of one; callers skip what is not a segment.
  template <typename Fn>
  void ForEachSegment(Fn fn) const;

  // ---- Live allocations.

  // Makes `block` a live allocation of `requested` bytes at block->ptr
  // (allocated, requested_size) and counts allocation, requested_bytes and
  // oversize_allocations. allocated_bytes is the caller's to count.
  void AddLive(Block* block, uint64_t requested);
  // Ends the live allocation at `address` (not allocated, requested_size 0)
  // and uncounts it; INVALID_ARGUMENT when none is there.
  StatusOr<Block*> RemoveLive(uint64_t address);
  const std::unordered_map<uint64_t, Block*>& live() const { return live_; }

  // The invariants of the header comment. `same_segment(block, next)` adds
  // a simulator's own link condition, `mergeable(block, next)` says whether
  // two free neighbours could merge.
  template <typename SameSegment, typename Mergeable>
  Status CheckChains(SameSegment same_segment, Mergeable mergeable) const;

 private:
  std::unordered_set<Block*> blocks_;  // owns them
  FreeSet small_free_;
  FreeSet large_free_;
  std::unordered_map<uint64_t, Block*> live_;  // by address
};

// ---- Implementation.

template <typename Block>
Block* BlockPool<Block>::New(uint64_t stream, uint64_t size, uint64_t ptr,
                             bool small) {
  Block* block = new Block;
  block->stream = stream;
  block->size = size;
  block->ptr = ptr;
  block->small = small;
  blocks_.insert(block);
  return block;
}

template <typename Block>
void BlockPool<Block>::Delete(Block* block) {
  LOOM_CHECK_EQ(blocks_.erase(block), size_t{1});
  delete block;
}

template <typename Block>
void BlockPool<Block>::AddFree(Block* block) {
  bool inserted = free_set(block->small).insert(block).second;
  LOOM_CHECK(inserted);
}

template <typename Block>
void BlockPool<Block>::RemoveFree(Block* block) {
  LOOM_CHECK_EQ(free_set(block->small).erase(block), size_t{1});
}

template <typename Block>
Block* BlockPool<Block>::LowerBound(const FreeSet& set, uint64_t stream,
                                    uint64_t size) {
  Block key;
  key.stream = stream;
  key.size = size;
  auto it = set.lower_bound(&key);
  if (it == set.end() || (*it)->stream != stream) return nullptr;
  return *it;
}

template <typename Block>
template <typename FitSize>
Block* BlockPool<Block>::BestFit(bool small, uint64_t stream, uint64_t size,
                                 FitSize fit_size) const {
  const FreeSet& set = free_set(small);
  Block key;
  key.stream = stream;
  key.size = size;
  auto it = set.lower_bound(&key);
  if (it == set.end() || (*it)->stream != stream) return nullptr;
  for (auto next = std::next(it);
       next != set.end() && (*next)->stream == stream &&
       fit_size(*next) < fit_size(*it);
       ++next) {
    it = next;
  }
  return *it;
}

template <typename Block>
Block* BlockPool<Block>::NewSegment(uint64_t stream, uint64_t size,
                                    uint64_t ptr, bool small) {
  LOOM_CHECK_GT(size, uint64_t{0});
  CountSegment(small, size);
  return New(stream, size, ptr, small);
}

template <typename Block>
void BlockPool<Block>::ReleaseSegment(Block* block) {
  LOOM_CHECK(!block->allocated && !block->is_split());
  UncountSegment(block->small, block->size);
  RemoveFree(block);
  Delete(block);
}

template <typename Block>
Block* BlockPool<Block>::SplitFront(Block* block, uint64_t size) {
  LOOM_CHECK(size > 0 && size < block->size);
  Block* front = New(block->stream, size, block->ptr, block->small);
  front->prev = block->prev;
  if (front->prev) front->prev->next = front;
  front->next = block;
  block->prev = front;
  block->ptr += size;
  block->size -= size;
  return front;
}

template <typename Block>
Block* BlockPool<Block>::SplitBack(Block* block, uint64_t size) {
  LOOM_CHECK(size > 0 && size < block->size);
  block->size -= size;
  Block* back =
      New(block->stream, size, block->ptr + block->size, block->small);
  back->prev = block;
  back->next = block->next;
  if (back->next) back->next->prev = back;
  block->next = back;
  return back;
}

template <typename Block>
uint64_t BlockPool<Block>::Absorb(Block* dst, Block* src) {
  if (dst->prev == src) {  // [src dst]
    dst->ptr = src->ptr;
    dst->prev = src->prev;
    if (dst->prev) dst->prev->next = dst;
  } else {  // [dst src]
    LOOM_CHECK(dst->next == src);
    dst->next = src->next;
    if (dst->next) dst->next->prev = dst;
  }
  const uint64_t subsumed = src->size;
  dst->size += subsumed;
  Delete(src);
  return subsumed;
}

template <typename Block>
template <typename Releasable, typename Release>
bool BlockPool<Block>::ReleaseOversize(bool small, uint64_t stream,
                                       uint64_t size, Releasable releasable,
                                       Release release) {
  const uint64_t max_split_size = options().max_split_size;
  if (max_split_size == kNoMaxSplitSize) return false;
  FreeSet& set = free_set(small);
  Block key;
  key.stream = stream;
  key.size = std::max(size, max_split_size);
  auto it = set.lower_bound(&key);
  if (it != set.end() && (*it)->stream == stream && releasable(*it)) {
    release(*it);
    return true;
  }
  // No single block is large enough: release oversize blocks, largest
  // first.
  if (it == set.begin()) return false;
  uint64_t released = 0;
  --it;
  while (released < key.size && (*it)->size >= max_split_size &&
         (*it)->stream == stream) {
    auto cur = it;
    bool is_first = cur == set.begin();
    if (!is_first) --it;
    if (releasable(*cur)) {
      released += (*cur)->size;
      release(*cur);
    }
    if (is_first) break;
  }
  return released >= key.size;
}

template <typename Block>
template <typename Fn>
void BlockPool<Block>::ForEachFree(bool small, Fn fn) {
  FreeSet& set = free_set(small);
  for (auto it = set.begin(); it != set.end();) {
    Block* block = *it;
    ++it;
    fn(block);
  }
}

template <typename Block>
template <typename Fn>
void BlockPool<Block>::ForEachSegment(Fn fn) const {
  for (Block* head : blocks_) {
    if (head->prev != nullptr) continue;
    uint64_t bytes = 0;
    for (const Block* b = head; b != nullptr; b = b->next) bytes += b->size;
    fn(head, bytes);
  }
}

template <typename Block>
void BlockPool<Block>::AddLive(Block* block, uint64_t requested) {
  block->allocated = true;
  block->requested_size = requested;
  bool inserted = live_.emplace(block->ptr, block).second;
  LOOM_CHECK(inserted, "address {:#x} handed out twice", block->ptr);
  CountAllocation(block->small, block->size, requested);
}

template <typename Block>
StatusOr<Block*> BlockPool<Block>::RemoveLive(uint64_t address) {
  auto it = live_.find(address);
  if (it == live_.end()) {
    return InvalidArgumentError("free of {:#x}, which is not allocated",
                                address);
  }
  Block* block = it->second;
  live_.erase(it);
  UncountAllocation(block->small, block->size, block->requested_size);
  block->allocated = false;
  block->requested_size = 0;
  return block;
}

template <typename Block>
template <typename SameSegment, typename Mergeable>
Status BlockPool<Block>::CheckChains(SameSegment same_segment,
                                     Mergeable mergeable) const {
  for (const Block* b : blocks_) {
    if (b->size == 0) return InternalError("empty block at {:#x}", b->ptr);
    const Block* next = b->next;
    if (next != nullptr) {
      if (next->prev != b || b->ptr + b->size != next->ptr ||
          next->stream != b->stream || next->small != b->small ||
          !same_segment(b, next)) {
        return InternalError("block {:#x}+{}: broken link to next {:#x}",
                             b->ptr, b->size, next->ptr);
      }
      if (!b->allocated && !next->allocated && mergeable(b, next)) {
        return InternalError("adjacent free blocks {:#x} and {:#x} unmerged",
                             b->ptr, next->ptr);
      }
    }
  }
  for (const FreeSet* set : {&small_free_, &large_free_}) {
    for (Block* b : *set) {
      if (b->allocated || blocks_.count(b) == 0) {
        return InternalError("free set holds block {:#x}, not free", b->ptr);
      }
    }
  }
  for (const auto& [address, b] : live_) {
    if (blocks_.count(b) == 0 || !b->allocated || b->ptr != address) {
      return InternalError("live allocation {:#x} misfiled", address);
    }
  }
  return OkStatus();
}

}  // namespace loom::whatif

#endif  // LOOM_WHATIF_SIM_BLOCK_POOL_H_
