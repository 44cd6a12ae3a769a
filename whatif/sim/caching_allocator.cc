#include "whatif/sim/caching_allocator.h"

#include <algorithm>
#include <array>
#include <iterator>

#include "base/check.h"

namespace loom::whatif {

bool CachingAllocator::BySize::operator()(const Block* a,
                                          const Block* b) const {
  if (a->stream != b->stream) return a->stream < b->stream;
  if (a->size != b->size) return a->size < b->size;
  return a->ptr < b->ptr;
}

bool CachingAllocator::ByAddress::operator()(const Block* a,
                                             const Block* b) const {
  if (a->stream != b->stream) return a->stream < b->stream;
  return a->ptr < b->ptr;
}

CachingAllocator::CachingAllocator(const CachingConfig& config,
                                   const SimOptions& options)
    : config_(config), device_(options.capacity) {
  stats_.max_split_size = config_.max_split_size;
}

CachingAllocator::~CachingAllocator() {
  for (Block* block : all_blocks_) delete block;
}

std::string_view CachingAllocator::name() const {
  return config_.expandable_segments ? "pytorch_expandable" : "pytorch";
}

CachingAllocator::Block* CachingAllocator::NewBlock(uint64_t stream,
                                                    uint64_t size,
                                                    BlockPool* pool,
                                                    uint64_t ptr) {
  Block* block = new Block;
  block->stream = stream;
  block->size = size;
  block->pool = pool;
  block->ptr = ptr;
  all_blocks_.insert(block);
  return block;
}

void CachingAllocator::DeleteBlock(Block* block) {
  LOOM_CHECK_EQ(all_blocks_.erase(block), size_t{1});
  delete block;
}

StatusOr<uint64_t> CachingAllocator::Malloc(uint64_t orig_size,
                                            uint64_t stream) {
  if (orig_size == 0) return InvalidArgumentError("malloc of 0 bytes");
  if (orig_size >= kMaxRequestSize) {
    return OutOfMemoryError(
        "CUDA out of memory. Tried to allocate more than 1EB memory.");
  }
  AllocParams params;
  params.stream = stream;
  params.size = RoundSize(config_, orig_size);
  params.pool = params.size <= kSmallSize ? &small_blocks_ : &large_blocks_;
  params.alloc_size = GetAllocationSize(config_, params.size);

  // Cached block first; then a new segment; then the OOM fallbacks.
  bool found = GetFreeBlock(params);
  if (!found) {
    found = AllocBlock(params, /*is_retry=*/false) ||
            (ReleaseAvailableCachedBlocks(params) &&
             AllocBlock(params, /*is_retry=*/false));
  }
  if (!found) {
    ReleaseCachedBlocks();  // empty_cache(), then one retry
    found = AllocBlock(params, /*is_retry=*/true);
  }
  if (!found) {
    ++stats_.num_ooms;
    uint64_t allocated = stats_.allocated_bytes.all().current;
    uint64_t reserved = stats_.reserved_bytes.all().current;
    return OutOfMemoryError(
        "CUDA out of memory. Tried to allocate {} bytes. GPU has a total "
        "capacity of {} bytes of which {} bytes is free. Of the allocated "
        "memory {} bytes is allocated by PyTorch, and {} bytes is reserved "
        "by PyTorch but unallocated.",
        params.alloc_size, device_.capacity(), device_.physical_free(),
        allocated, reserved - allocated);
  }
  bool split = ShouldSplit(params.block, params.size);
  Block* block = AllocFoundBlock(params, orig_size, split);
  return block->ptr;
}

bool CachingAllocator::GetFreeBlock(AllocParams& p) {
  BlockPool& pool = *p.pool;
  Block key;
  key.stream = p.stream;
  key.size = p.size;
  key.ptr = 0;
  auto it = pool.blocks.lower_bound(&key);
  if (it == pool.blocks.end() || (*it)->stream != p.stream) return false;
  if ((*it)->expandable != nullptr) {
    // Best fit by "expandable size": a block next to unmapped address space
    // counts as big as it could grow, so it is used last.
    auto expandable_size = [](const Block* b) {
      return b->size + (b->next && !b->next->mapped ? b->next->size : 0);
    };
    auto next = std::next(it);
    while ((*it)->expandable != nullptr && next != pool.blocks.end() &&
           (*next)->stream == p.stream &&
           expandable_size(*next) < expandable_size(*it)) {
      it = next++;
    }
  }
  // Do not return an oversized block for a small request.
  if (p.size < config_.max_split_size &&
      (*it)->size >= config_.max_split_size) {
    return false;
  }
  // Allow an oversized block to be rounded up, but within a limit.
  if (p.size >= config_.max_split_size &&
      (*it)->size >= p.size + config_.NonSplitRounding()) {
    return false;
  }
  p.block = *it;
  pool.blocks.erase(it);
  return true;
}

bool CachingAllocator::ShouldSplit(const Block* block, uint64_t size) const {
  uint64_t remaining = block->size - size;
  if (block->pool->is_small || config_.expandable_segments) {
    return remaining >= kMinBlockSize;
  }
  return size < config_.max_split_size && remaining > kSmallSize;
}

CachingAllocator::Block* CachingAllocator::AllocFoundBlock(AllocParams& p,
                                                           uint64_t orig_size,
                                                           bool split) {
  Block* block = p.block;
  const bool small = p.pool->is_small;
  const bool already_split = block->is_split();
  if (split) {
    // The allocation takes the front; the remainder goes back to the pool.
    Block* remaining = block;
    block = NewBlock(p.stream, p.size, p.pool, remaining->ptr);
    block->expandable = remaining->expandable;
    block->prev = remaining->prev;
    if (block->prev) block->prev->next = block;
    block->next = remaining;
    remaining->prev = block;
    remaining->ptr += p.size;
    remaining->size -= p.size;
    bool inserted = p.pool->blocks.insert(remaining).second;
    LOOM_CHECK(inserted);
    if (already_split && block->expandable == nullptr) {
      // An already-split inactive block shrinks by size bytes.
      stats_.inactive_split_bytes.Decrease(small, block->size);
    } else if (block->expandable == nullptr) {
      // A new split inactive block of remaining->size bytes appears.
      stats_.inactive_split_bytes.Increase(small, remaining->size);
      stats_.inactive_split.Increase(small, 1);
    }
  } else if (already_split && block->expandable == nullptr) {
    stats_.inactive_split_bytes.Decrease(small, block->size);
    stats_.inactive_split.Decrease(small, 1);
  }
  block->allocated = true;
  block->requested_size = orig_size;
  bool inserted = allocated_blocks_.emplace(block->ptr, block).second;
  LOOM_CHECK(inserted, "address {:#x} handed out twice", block->ptr);
  stats_.allocation.Increase(small, 1);
  stats_.allocated_bytes.Increase(small, block->size);
  stats_.active.Increase(small, 1);
  stats_.active_bytes.Increase(small, block->size);
  stats_.requested_bytes.Increase(small, block->requested_size);
  if (block->size >= config_.max_split_size) {
    stats_.oversize_allocations.Increase(1);
  }
  return block;
}

Status CachingAllocator::Free(uint64_t address) {
  auto it = allocated_blocks_.find(address);
  if (it == allocated_blocks_.end()) {
    return InvalidArgumentError("free of {:#x}, which is not allocated",
                                address);
  }
  Block* block = it->second;
  allocated_blocks_.erase(it);
  const bool small = block->pool->is_small;
  block->allocated = false;
  stats_.allocation.Decrease(small, 1);
  stats_.allocated_bytes.Decrease(small, block->size);
  if (block->size >= config_.max_split_size) {
    stats_.oversize_allocations.Decrease(1);
  }
  // No stream uses are recorded in traces, so no events are pending: the
  // block is freed right away.
  FreeBlock(block);
  return OkStatus();
}

void CachingAllocator::FreeBlock(Block* block) {
  LOOM_CHECK(!block->allocated);
  const uint64_t original_size = block->size;
  const uint64_t requested_size = block->requested_size;
  BlockPool& pool = *block->pool;
  int64_t net_inactive_split_blocks = 0;
  int64_t net_inactive_split_size = 0;
  const std::array<Block*, 2> candidates = {block->prev, block->next};
  for (Block* candidate : candidates) {
    uint64_t subsumed = TryMergeBlocks(block, candidate, pool);
    if (subsumed > 0) {
      net_inactive_split_blocks -= 1;
      net_inactive_split_size -= static_cast<int64_t>(subsumed);
    }
  }
  bool inserted = pool.blocks.insert(block).second;
  LOOM_CHECK(inserted);
  if (block->is_split()) {
    net_inactive_split_blocks += 1;
    net_inactive_split_size += static_cast<int64_t>(block->size);
  }
  const bool small = pool.is_small;
  // inactive_split excludes expandable blocks: their whole free pages can
  // always be released.
  if (block->expandable == nullptr) {
    if (net_inactive_split_blocks > 0) {
      stats_.inactive_split.Increase(small, net_inactive_split_blocks);
    } else if (net_inactive_split_blocks < 0) {
      stats_.inactive_split.Decrease(small, -net_inactive_split_blocks);
    }
    if (net_inactive_split_size > 0) {
      stats_.inactive_split_bytes.Increase(small, net_inactive_split_size);
    } else if (net_inactive_split_size < 0) {
      stats_.inactive_split_bytes.Decrease(small, -net_inactive_split_size);
    }
  }
  stats_.active.Decrease(small, 1);
  stats_.active_bytes.Decrease(small, original_size);
  stats_.requested_bytes.Decrease(small, requested_size);
  block->requested_size = 0;
}

uint64_t CachingAllocator::TryMergeBlocks(Block* dst, Block* src,
                                          BlockPool& pool) {
  if (src == nullptr || src->allocated || dst->mapped != src->mapped) return 0;
  LOOM_CHECK(dst->is_split() && src->is_split());
  if (dst->prev == src) {  // [src dst]
    dst->ptr = src->ptr;
    dst->prev = src->prev;
    if (dst->prev) dst->prev->next = dst;
  } else {  // [dst src]
    dst->next = src->next;
    if (dst->next) dst->next->prev = dst;
  }
  const uint64_t subsumed = src->size;
  dst->size += subsumed;
  size_t erased =
      src->mapped ? pool.blocks.erase(src) : pool.unmapped.erase(src);
  LOOM_CHECK_EQ(erased, size_t{1});
  DeleteBlock(src);
  return subsumed;
}

bool CachingAllocator::AllocBlock(AllocParams& p, bool is_retry) {
  if (is_retry) ++stats_.num_alloc_retries;
  if (config_.expandable_segments) {
    p.block = TryAllocateExpandableBlock(p.stream, p.pool, p.size);
    return p.block != nullptr;
  }
  std::optional<uint64_t> ptr = device_.Malloc(p.alloc_size);
  if (!ptr) return false;
  total_allocated_memory_ += p.alloc_size;
  p.block = NewBlock(p.stream, p.alloc_size, p.pool, *ptr);
  stats_.segment.Increase(p.pool->is_small, 1);
  stats_.reserved_bytes.Increase(p.pool->is_small, p.alloc_size);
  if (p.alloc_size >= config_.max_split_size) {
    stats_.oversize_segments.Increase(1);
  }
  ++stats_.num_device_alloc;
  return true;
}

bool CachingAllocator::ReleaseAvailableCachedBlocks(const AllocParams& p) {
  if (config_.max_split_size == kNoMaxSplitSize) return false;
  BlockPool& pool = *p.pool;
  Block key;
  key.stream = p.stream;
  key.size = std::max(p.size, config_.max_split_size);
  key.ptr = 0;
  // Only whole (unsplit) native segments can be cudaFree'd. PyTorch never
  // meets a split block here with its default segment sizes; with a large
  // large_segment_size it could, and would free a non-base pointer.
  auto releasable = [](const Block* b) {
    return b->expandable == nullptr && !b->is_split();
  };
  auto it = pool.blocks.lower_bound(&key);
  if (it == pool.blocks.end() || (*it)->stream != p.stream ||
      !releasable(*it)) {
    // No single block is large enough: free oversize blocks, largest first.
    if (it == pool.blocks.begin()) return false;
    uint64_t released = 0;
    --it;
    while (released < key.size && (*it)->size >= config_.max_split_size &&
           (*it)->stream == p.stream) {
      auto cur = it;
      bool is_first = cur == pool.blocks.begin();
      if (!is_first) --it;
      if (releasable(*cur)) {
        released += (*cur)->size;
        ReleaseBlock(*cur);
      }
      if (is_first) break;
    }
    return released >= key.size;
  }
  ReleaseBlock(*it);
  return true;
}

void CachingAllocator::ReleaseCachedBlocks() {
  ReleaseBlocks(large_blocks_);
  ReleaseBlocks(small_blocks_);
}

void CachingAllocator::ReleaseBlocks(BlockPool& pool) {
  std::vector<Block*> to_unmap;
  for (auto it = pool.blocks.begin(); it != pool.blocks.end();) {
    Block* block = *it;
    ++it;
    if (block->expandable != nullptr) {
      to_unmap.push_back(block);  // unmapping mutates the pool
    } else if (!block->is_split()) {
      ReleaseBlock(block);
    }
  }
  for (Block* block : to_unmap) {
    UnmapBlock(block);
    if (!block->is_split()) ReleaseExpandableSegment(block);
  }
}

void CachingAllocator::ReleaseBlock(Block* block) {
  LOOM_CHECK(block->expandable == nullptr && !block->is_split() &&
             !block->allocated);
  ++stats_.num_device_free;
  device_.Free(block->ptr, block->size);
  total_allocated_memory_ -= block->size;
  const bool small = block->pool->is_small;
  stats_.segment.Decrease(small, 1);
  stats_.reserved_bytes.Decrease(small, block->size);
  if (block->size >= config_.max_split_size) {
    stats_.oversize_segments.Decrease(1);
  }
  LOOM_CHECK_EQ(block->pool->blocks.erase(block), size_t{1});
  DeleteBlock(block);
}

void CachingAllocator::EmptyCache() { ReleaseCachedBlocks(); }

std::vector<std::pair<std::string, uint64_t>> CachingAllocator::Counters()
    const {
  if (!config_.expandable_segments) return {};
  return {{"expandable_segments", expandable_segments_.size()}};
}

std::vector<CachingAllocator::SegmentInfo> CachingAllocator::Snapshot() const {
  std::vector<SegmentInfo> segments;
  for (const Block* head : all_blocks_) {
    if (head->prev != nullptr) continue;
    SegmentInfo info;
    info.address = head->ptr;
    info.stream = head->stream;
    info.small_pool = head->pool->is_small;
    info.expandable = head->expandable != nullptr;
    for (const Block* b = head; b != nullptr; b = b->next) {
      info.blocks.push_back(
          {b->ptr, b->size, b->requested_size, b->allocated, b->mapped});
      info.total_size += b->size;
    }
    segments.push_back(std::move(info));
  }
  std::sort(segments.begin(), segments.end(),
            [](const SegmentInfo& a, const SegmentInfo& b) {
              return a.address < b.address;
            });
  return segments;
}

std::vector<AddressRange> CachingAllocator::MappedRanges() const {
  std::vector<AddressRange> ranges;
  for (const Block* head : all_blocks_) {
    if (head->prev != nullptr || head->expandable != nullptr) continue;
    uint64_t size = 0;
    for (const Block* b = head; b != nullptr; b = b->next) size += b->size;
    ranges.push_back({head->ptr, size});
  }
  for (const auto& segment : expandable_segments_) {
    for (const AddressRange& range : segment->MappedRanges()) {
      ranges.push_back(range);
    }
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const AddressRange& a, const AddressRange& b) {
              return a.address < b.address;
            });
  return ranges;
}

}  // namespace loom::whatif
