#include "whatif/sim/caching_allocator.h"

#include <algorithm>
#include <array>
#include <vector>

#include "base/check.h"

namespace loom::whatif {

bool CachingAllocator::ByAddress::operator()(const Block* a,
                                             const Block* b) const {
  if (a->stream != b->stream) return a->stream < b->stream;
  return a->ptr < b->ptr;
}

CachingAllocator::CachingAllocator(const CachingConfig& config,
                                   const SimOptions& options)
    : config_(config),
      device_(options.capacity, options.address_order),
      blocks_({.max_split_size = config_.max_split_size,
               .max_non_split_rounding = config_.NonSplitRounding(),
               .min_large_remainder = kSmallSize + 1},
              &stats_) {}

std::string_view CachingAllocator::name() const {
  return config_.expandable_segments ? "pytorch_expandable" : "pytorch";
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
  params.small = params.size <= kSmallSize;
  params.alloc_size = GetAllocationSize(config_, params.size);

  // release_available_cached_blocks. Only whole (unsplit) native segments
  // can be cudaFree'd. PyTorch never meets a split block here with its
  // default segment sizes; with a large large_segment_size it could, and
  // would free a non-base pointer.
  auto release_oversize = [this, &params] {
    return blocks_.ReleaseOversize(
        params.small, params.stream, params.size,
        [](const Block* b) {
          return b->expandable == nullptr && !b->is_split();
        },
        [this](Block* b) { ReleaseBlock(b); });
  };
  // Cached block first; then a new segment; then the OOM fallbacks.
  bool found = GetFreeBlock(params);
  if (!found) {
    found = AllocBlock(params, /*is_retry=*/false) ||
            (release_oversize() && AllocBlock(params, /*is_retry=*/false));
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
  // should_split; expandable segments split every block like a small one.
  const Block* found_block = params.block;
  bool split = config_.expandable_segments
                   ? found_block->size - params.size >= kMinBlockSize
                   : blocks_.ShouldSplit(found_block->small, found_block->size,
                                         params.size);
  Block* block = AllocFoundBlock(params, orig_size, split);
  return block->ptr;
}

bool CachingAllocator::GetFreeBlock(AllocParams& p) {
  Block* block = nullptr;
  if (config_.expandable_segments) {
    // Best fit by "expandable size": a block next to unmapped address space
    // counts as big as it could grow, so it is used last.
    block = blocks_.BestFit(p.small, p.stream, p.size, [](const Block* b) {
      return b->size + (b->next && !b->next->mapped ? b->next->size : 0);
    });
  } else {
    block = blocks_.BestFit(p.small, p.stream, p.size);
  }
  if (block == nullptr || !blocks_.OversizeRulesAllow(block->size, p.size)) {
    return false;
  }
  blocks_.RemoveFree(block);
  p.block = block;
  return true;
}

CachingAllocator::Block* CachingAllocator::AllocFoundBlock(AllocParams& p,
                                                           uint64_t orig_size,
                                                           bool split) {
  Block* block = p.block;
  const bool small = p.small;
  const bool already_split = block->is_split();
  if (split) {
    // The allocation takes the front; the remainder goes back to the pool.
    Block* remaining = block;
    block = blocks_.SplitFront(remaining, p.size);
    block->expandable = remaining->expandable;
    blocks_.AddFree(remaining);
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
  blocks_.AddLive(block, orig_size);
  stats_.allocated_bytes.Increase(small, block->size);
  stats_.active.Increase(small, 1);
  stats_.active_bytes.Increase(small, block->size);
  return block;
}

Status CachingAllocator::Free(uint64_t address) {
  LOOM_ASSIGN_OR_RETURN(Block * block, blocks_.RemoveLive(address));
  stats_.allocated_bytes.Decrease(block->small, block->size);
  // No stream uses are recorded in traces, so no events are pending: the
  // block is freed right away.
  FreeBlock(block);
  return OkStatus();
}

void CachingAllocator::FreeBlock(Block* block) {
  LOOM_CHECK(!block->allocated);
  const uint64_t original_size = block->size;
  int64_t net_inactive_split_blocks = 0;
  int64_t net_inactive_split_size = 0;
  const std::array<Block*, 2> candidates = {block->prev, block->next};
  for (Block* candidate : candidates) {
    uint64_t subsumed = TryMergeBlocks(block, candidate);
    if (subsumed > 0) {
      net_inactive_split_blocks -= 1;
      net_inactive_split_size -= static_cast<int64_t>(subsumed);
    }
  }
  blocks_.AddFree(block);
  if (block->is_split()) {
    net_inactive_split_blocks += 1;
    net_inactive_split_size += static_cast<int64_t>(block->size);
  }
  const bool small = block->small;
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
}

uint64_t CachingAllocator::TryMergeBlocks(Block* dst, Block* src) {
  if (src == nullptr || src->allocated || dst->mapped != src->mapped) return 0;
  LOOM_CHECK(dst->is_split() && src->is_split());
  if (src->mapped) {
    blocks_.RemoveFree(src);
  } else {
    LOOM_CHECK_EQ(unmapped(src->small).erase(src), size_t{1});
  }
  return blocks_.Absorb(dst, src);
}

bool CachingAllocator::AllocBlock(AllocParams& p, bool is_retry) {
  if (is_retry) ++stats_.num_alloc_retries;
  if (config_.expandable_segments) {
    p.block = TryAllocateExpandableBlock(p.stream, p.small, p.size);
    return p.block != nullptr;
  }
  std::optional<uint64_t> ptr = device_.Malloc(p.alloc_size);
  if (!ptr) return false;
  total_allocated_memory_ += p.alloc_size;
  p.block = blocks_.NewSegment(p.stream, p.alloc_size, *ptr, p.small);
  return true;
}

void CachingAllocator::ReleaseCachedBlocks() {
  for (bool small : {false, true}) {  // the large pool first
    std::vector<Block*> to_unmap;
    blocks_.ForEachFree(small, [&](Block* block) {
      if (block->expandable != nullptr) {
        to_unmap.push_back(block);  // unmapping mutates the pool
      } else if (!block->is_split()) {
        ReleaseBlock(block);
      }
    });
    for (Block* block : to_unmap) {
      UnmapBlock(block);
      if (!block->is_split()) ReleaseExpandableSegment(block);
    }
  }
}

void CachingAllocator::ReleaseBlock(Block* block) {
  LOOM_CHECK(block->expandable == nullptr);
  device_.Free(block->ptr, block->size);
  total_allocated_memory_ -= block->size;
  blocks_.ReleaseSegment(block);
}

void CachingAllocator::EmptyCache() { ReleaseCachedBlocks(); }

std::vector<std::pair<std::string, uint64_t>> CachingAllocator::Counters()
    const {
  if (!config_.expandable_segments) return {};
  return {{"expandable_segments", expandable_segments_.size()}};
}

std::vector<CachingAllocator::SegmentInfo> CachingAllocator::Snapshot() const {
  std::vector<SegmentInfo> segments;
  blocks_.ForEachSegment([&segments](const Block* head, uint64_t bytes) {
    SegmentInfo info;
    info.address = head->ptr;
    info.total_size = bytes;
    info.stream = head->stream;
    info.small_pool = head->small;
    info.expandable = head->expandable != nullptr;
    for (const Block* b = head; b != nullptr; b = b->next) {
      info.blocks.push_back(
          {b->ptr, b->size, b->requested_size, b->allocated, b->mapped});
    }
    segments.push_back(std::move(info));
  });
  std::sort(segments.begin(), segments.end(),
            [](const SegmentInfo& a, const SegmentInfo& b) {
              return a.address < b.address;
            });
  return segments;
}

std::vector<AddressRange> CachingAllocator::MappedRanges() const {
  std::vector<AddressRange> ranges;
  blocks_.ForEachSegment([&ranges](const Block* head, uint64_t bytes) {
    if (head->expandable == nullptr) ranges.push_back({head->ptr, bytes});
  });
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
