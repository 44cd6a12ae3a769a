// CachingAllocator: the expandable_segments:True paths
// (find_expandable_block, try_allocate_expandable_block, map_block,
// unmap_block, release_expandable_segment) and the invariant checks.
#include <algorithm>
#include <map>
#include <vector>

#include "base/check.h"
#include "whatif/sim/caching_allocator.h"

namespace loom::whatif {

CachingAllocator::Block* CachingAllocator::TryAllocateExpandableBlock(
    uint64_t stream, bool small, uint64_t size) {
  Block* candidate = FindExpandableBlock(stream, small, size);
  if (candidate == nullptr) return nullptr;  // address space exhausted
  // candidate is a run of free/unmapped blocks with at least `size` bytes:
  //   unmapped -> null | unmapped -> free -> * | free -> unmapped -> *
  if (!candidate->mapped &&
      !MapBlock(candidate, std::min(candidate->size, size))) {
    return nullptr;
  }
  LOOM_CHECK(candidate->mapped);
  while (candidate->size < size) {
    // free -> unmapped -> *: map some of the next block and merge.
    Block* next = candidate->next;
    if (next == nullptr || next->mapped || next->allocated) return nullptr;
    uint64_t remaining = size - candidate->size;
    if (!MapBlock(next, std::min(remaining, next->size))) return nullptr;
    candidate = next;  // MapBlock merged the old candidate into it
  }
  blocks_.RemoveFree(candidate);
  return candidate;
}

CachingAllocator::Block* CachingAllocator::FindExpandableBlock(uint64_t stream,
                                                               bool small,
                                                               uint64_t size) {
  auto allocatable = [](const Block* b) {
    return b != nullptr && !b->allocated;
  };
  auto has_room = [&](const Block* b) {
    uint64_t bytes = 0;
    while (bytes < size && allocatable(b)) {
      bytes += b->size;
      b = b->next;
    }
    return bytes >= size;
  };
  UnmappedSet& ranges = unmapped(small);
  Block key;
  key.stream = stream;
  key.ptr = 0;
  for (auto it = ranges.lower_bound(&key);
       it != ranges.end() && (*it)->stream == stream; ++it) {
    Block* c = *it;
    // The lowest unmapped address; a free block right before it helps.
    if (allocatable(c->prev)) c = c->prev;
    if (has_room(c)) return c;
  }
  // A new segment: 9/8 of the device memory of address space.
  uint64_t page = small ? kSmallBuffer : config_.large_segment_size;
  uint64_t total = device_.capacity();
  std::unique_ptr<ExpandableSegment> segment =
      ExpandableSegment::Create(&device_, stream, total + total / 8, page);
  if (segment == nullptr) return nullptr;
  Block* candidate =
      blocks_.New(stream, segment->size(), segment->ptr(), small);
  candidate->mapped = false;
  candidate->expandable = segment.get();
  expandable_segments_.push_back(std::move(segment));
  ranges.insert(candidate);
  return candidate;
}

bool CachingAllocator::MapBlock(Block* to_map, uint64_t size) {
  LOOM_CHECK(!to_map->mapped && size <= to_map->size);
  AddressRange mapped = to_map->expandable->Map({to_map->ptr, size});
  if (mapped.size == 0) return false;  // out of memory
  LOOM_CHECK(mapped.address == to_map->ptr && mapped.size >= size);
  UnmappedSet& ranges = unmapped(to_map->small);
  LOOM_CHECK_EQ(ranges.erase(to_map), size_t{1});
  to_map->mapped = true;
  if (mapped.size < to_map->size) {
    // to_map -> remaining (still unmapped) -> to_map->next
    Block* remaining = blocks_.SplitBack(to_map, to_map->size - mapped.size);
    remaining->mapped = false;
    remaining->expandable = to_map->expandable;
    ranges.insert(remaining);
  }
  TryMergeBlocks(to_map, to_map->prev);
  TryMergeBlocks(to_map, to_map->next);
  blocks_.AddFree(to_map);
  total_allocated_memory_ += mapped.size;
  stats_.reserved_bytes.Increase(to_map->small, mapped.size);
  ++stats_.num_device_alloc;
  return true;
}

void CachingAllocator::UnmapBlock(Block* block) {
  AddressRange unmapped_range =
      block->expandable->Unmap({block->ptr, block->size});
  if (unmapped_range.size == 0) return;
  blocks_.RemoveFree(block);
  const uint64_t before_size = unmapped_range.address - block->ptr;
  if (before_size > 0) {
    // prev? -> before (free) -> block
    Block* before = blocks_.SplitFront(block, before_size);
    before->expandable = block->expandable;
    blocks_.AddFree(before);
  }
  const uint64_t after_size = block->size - unmapped_range.size;
  if (after_size > 0) {
    // block -> after (free) -> next?
    Block* after = blocks_.SplitBack(block, after_size);
    after->expandable = block->expandable;
    blocks_.AddFree(after);
  }
  LOOM_CHECK(block->ptr == unmapped_range.address &&
             block->size == unmapped_range.size);
  block->mapped = false;
  TryMergeBlocks(block, block->prev);
  TryMergeBlocks(block, block->next);
  unmapped(block->small).insert(block);
  total_allocated_memory_ -= unmapped_range.size;
  stats_.reserved_bytes.Decrease(block->small, unmapped_range.size);
  ++stats_.num_device_free;
}

void CachingAllocator::ReleaseExpandableSegment(Block* block) {
  LOOM_CHECK(!block->mapped && block->size == block->expandable->size(),
             "block disagrees with its segment");
  auto it = std::find_if(
      expandable_segments_.begin(), expandable_segments_.end(),
      [block](const auto& s) { return s.get() == block->expandable; });
  LOOM_CHECK(it != expandable_segments_.end());
  LOOM_CHECK_EQ(unmapped(block->small).erase(block), size_t{1});
  expandable_segments_.erase(it);  // frees the address space
  blocks_.Delete(block);
}

Status CachingAllocator::CheckBlockChains() const {
  LOOM_RETURN_IF_ERROR(blocks_.CheckChains(
      [](const Block* b, const Block* next) {
        return next->expandable == b->expandable;
      },
      [](const Block* b, const Block* next) {
        return b->mapped == next->mapped;
      }));
  uint64_t allocated[2] = {0, 0};
  size_t allocated_count = 0;
  for (Block* b : blocks_.blocks()) {
    const int pool = b->small ? 0 : 1;
    bool in_blocks = blocks_.free_set(b->small).count(b) > 0;
    bool in_unmapped = unmapped(b->small).count(b) > 0;
    if (b->allocated) {
      auto it = blocks_.live().find(b->ptr);
      if (it == blocks_.live().end() || it->second != b || in_blocks ||
          in_unmapped || !b->mapped) {
        return InternalError("allocated block {:#x} misfiled", b->ptr);
      }
      allocated[pool] += b->size;
      ++allocated_count;
    } else if (in_blocks != b->mapped || in_unmapped == b->mapped) {
      return InternalError("free block {:#x} (mapped={}) misfiled", b->ptr,
                           b->mapped);
    }
  }
  if (allocated_count != blocks_.live().size()) {
    return InternalError("{} allocated blocks, {} in the address map",
                         allocated_count, blocks_.live().size());
  }
  for (bool small : {true, false}) {
    if (blocks_.free_set(small).size() + unmapped(small).size() >
        blocks_.blocks().size()) {
      return InternalError("pool holds blocks that do not exist");
    }
  }
  uint64_t native_reserved[2] = {0, 0};
  blocks_.ForEachSegment([&native_reserved](const Block* head, uint64_t bytes) {
    if (head->expandable == nullptr)
      native_reserved[head->small ? 0 : 1] += bytes;
  });
  const StatType types[2] = {StatType::kSmallPool, StatType::kLargePool};
  for (int i = 0; i < 2; ++i) {
    if (stats_.allocated_bytes[types[i]].current !=
        static_cast<int64_t>(allocated[i])) {
      return InternalError("allocated_bytes pool {} is {}, blocks sum to {}", i,
                           stats_.allocated_bytes[types[i]].current,
                           allocated[i]);
    }
    if (!config_.expandable_segments &&
        stats_.reserved_bytes[types[i]].current !=
            static_cast<int64_t>(native_reserved[i])) {
      return InternalError("reserved_bytes pool {} is {}, segments sum to {}",
                           i, stats_.reserved_bytes[types[i]].current,
                           native_reserved[i]);
    }
  }
  return OkStatus();
}

Status CachingAllocator::CheckExpandableSegments() const {
  uint64_t mapped = 0;
  std::map<const ExpandableSegment*, uint64_t> covered;
  std::map<const ExpandableSegment*, std::vector<AddressRange>> ranges;
  for (const auto& segment : expandable_segments_) {
    ranges[segment.get()] = segment->MappedRanges();
  }
  for (const Block* b : blocks_.blocks()) {
    if (b->expandable == nullptr) continue;
    covered[b->expandable] += b->size;
    if (b->prev == nullptr && b->ptr != b->expandable->ptr()) {
      return InternalError("segment {:#x} does not start with a block",
                           b->expandable->ptr());
    }
    // A mapped block lies on mapped pages only (its partial pages
    // included); an unmapped block touches no mapped page.
    const std::vector<AddressRange>& mapped_ranges = ranges[b->expandable];
    uint64_t page = b->expandable->page_size();
    uint64_t base = b->expandable->ptr();
    uint64_t first = base + (b->ptr - base) / page * page;
    uint64_t last = base + (b->ptr + b->size - base + page - 1) / page * page;
    bool inside = false;
    bool touches = false;
    for (const AddressRange& r : mapped_ranges) {
      if (r.address <= first && last <= r.end()) inside = true;
      if (r.address < b->ptr + b->size && b->ptr < r.end()) touches = true;
    }
    if (b->mapped ? !inside : touches) {
      return InternalError("block {:#x}+{} (mapped={}) disagrees with pages",
                           b->ptr, b->size, b->mapped);
    }
  }
  for (const auto& segment : expandable_segments_) {
    if (covered[segment.get()] != segment->size()) {
      return InternalError("segment {:#x}: blocks cover {} of {} bytes",
                           segment->ptr(), covered[segment.get()],
                           segment->size());
    }
    mapped += segment->mapped_bytes();
  }
  if (covered.size() != expandable_segments_.size()) {
    return InternalError("blocks refer to a released segment");
  }
  if (config_.expandable_segments &&
      stats_.reserved_bytes.all().current != static_cast<int64_t>(mapped)) {
    return InternalError("reserved_bytes {} but {} bytes mapped",
                         stats_.reserved_bytes.all().current, mapped);
  }
  return OkStatus();
}

Status CachingAllocator::CheckInvariants() const {
  LOOM_RETURN_IF_ERROR(CheckBlockChains());
  LOOM_RETURN_IF_ERROR(CheckExpandableSegments());
  const int64_t reserved = stats_.reserved_bytes.all().current;
  if (reserved != static_cast<int64_t>(device_.physical_used()) ||
      reserved != static_cast<int64_t>(total_allocated_memory_)) {
    return InternalError("reserved_bytes {} but the device holds {}", reserved,
                         device_.physical_used());
  }
  if (stats_.allocated_bytes.all().current > reserved) {
    return InternalError("allocated {} > reserved {}",
                         stats_.allocated_bytes.all().current, reserved);
  }
  return OkStatus();
}

}  // namespace loom::whatif
