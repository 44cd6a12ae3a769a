// GmlakeAllocator: request path, primitive blocks, release. Stitching,
// reuse, StitchFree GC and the invariant checks are in gmlake_stitch.cc.
#include "whatif/sim/gmlake_allocator.h"

#include <algorithm>
#include <vector>

#include "base/check.h"

namespace loom::whatif {

GmlakeAllocator::GmlakeAllocator(const GmlakeOptions& gmlake,
                                 const SimOptions& options)
    : options_(gmlake),
      device_(options.capacity, options.address_order),
      blocks_({.max_split_size = gmlake.max_split_size,
               .max_non_split_rounding = kLargeBuffer,  // PyTorch 2.0
               .min_large_remainder = kChunk},          // whole chunks
              &stats_) {}

GmlakeAllocator::~GmlakeAllocator() {
  for (Chunk* chunk : all_chunks_) delete chunk;
}

uint64_t GmlakeAllocator::RoundSize(uint64_t size) {
  if (size < kMinBlockSize) return kMinBlockSize;
  uint64_t rounded =
      kMinBlockSize * ((size + kMinBlockSize - 1) / kMinBlockSize);
  if (rounded > kSmallSize) {  // served from the large pool: whole chunks
    rounded = kChunk * ((size + kChunk - 1) / kChunk);
  }
  return rounded;
}

StatusOr<uint64_t> GmlakeAllocator::Malloc(uint64_t orig_size,
                                           uint64_t stream) {
  if (orig_size == 0) return InvalidArgumentError("malloc of 0 bytes");
  if (orig_size >= kMaxRequestSize) {
    return OutOfMemoryError(
        "CUDA out of memory. Tried to allocate more than 1EB memory.");
  }
  Params p;
  p.stream = stream;
  p.size = RoundSize(orig_size);
  p.small = p.size <= kSmallSize;
  p.alloc_size = GetAllocationSize(CachingConfig{}, p.size);

  // release_available_cached_blocks: only whole segments can be released.
  auto release_oversize = [this, &p] {
    return blocks_.ReleaseOversize(
        p.small, p.stream, p.size,
        [](const Block* b) { return !b->is_split(); },
        [this](Block* b) { ReleaseBlock(b); });
  };
  // GMLake's malloc: cache, stitch, new segment, then the fallbacks, each
  // followed by another stitching attempt.
  bool found = GetFreeBlock(p) || Stitch(p, 0);
  if (!found) {
    found = Realloc(p, /*is_retry=*/false) ||
            (release_oversize() && Realloc(p, /*is_retry=*/false)) ||
            Stitch(p, 1);
  }
  if (!found) {
    ReleaseCachedBlocks();
    found = Realloc(p, /*is_retry=*/true) || Stitch(p, 2);
  }
  if (!found) {
    ++stats_.num_ooms;
    return OutOfMemoryError(
        "CUDA out of memory. Tried to allocate {} bytes ({} bytes total "
        "capacity; {} bytes already allocated; {} bytes free; {} bytes "
        "reserved in total)",
        p.alloc_size, device_.capacity(), stats_.allocated_bytes.all().current,
        device_.physical_free(), stats_.reserved_bytes.all().current);
  }
  Block* block = p.block;
  // should_split: 512 B in the small pool; whole chunks (>= 2 MiB left,
  // PyTorch wants > 1 MiB) in the large pool.
  if (!block->fused && blocks_.ShouldSplit(block->small, block->size, p.size)) {
    // The allocation takes the front; the remainder's chunks become free.
    Block* remaining = block;
    block = SplitFront(remaining, p.size);
    for (Chunk* c : block->chunks) {
      c->user = block;  // was the same allocation: no sBlock changes
    }
    for (Chunk* c : remaining->chunks) SetChunkUser(c, nullptr);
    blocks_.AddFree(remaining);
  }
  block->actual = p.size;
  blocks_.AddLive(block, orig_size);
  stats_.allocated_bytes.Increase(p.small, block->actual);
  return block->ptr;
}

bool GmlakeAllocator::GetFreeBlock(Params& p) {
  Block* block = blocks_.BestFit(p.small, p.stream, p.size);
  if (block == nullptr) {
    // No primitive block fits: try a cached stitched block.
    return options_.defragment && !p.small && ReuseStitched(p);
  }
  if (!blocks_.OversizeRulesAllow(block->size, p.size)) return false;
  blocks_.RemoveFree(block);
  for (Chunk* c : block->chunks) {
    LOOM_CHECK(c->user == nullptr, "free pBlock with a used chunk");
    SetChunkUser(c, block);
  }
  p.block = block;
  return true;
}

GmlakeAllocator::Block* GmlakeAllocator::SplitFront(Block* block,
                                                    uint64_t size) {
  Block* front = blocks_.SplitFront(block, size);
  if (!block->chunks.empty()) {
    LOOM_CHECK_EQ(size % kChunk, uint64_t{0});
    std::vector<Chunk*>& chunks = block->chunks;
    const uint64_t keep = size / kChunk;
    front->chunks.assign(chunks.begin(), chunks.begin() + keep);
    chunks.erase(chunks.begin(), chunks.begin() + keep);
    for (Chunk* c : front->chunks) c->pblock = front;
  }
  return front;
}

bool GmlakeAllocator::Realloc(Params& p, bool is_retry) {
  if (is_retry) ++stats_.num_alloc_retries;
  const uint64_t size = p.alloc_size;
  Block* block = nullptr;
  if (p.small || !options_.defragment) {
    std::optional<uint64_t> ptr = device_.Malloc(size);
    if (!ptr) return false;
    block = blocks_.NewSegment(p.stream, size, *ptr, p.small);
  } else {
    // VmmSegment(size / 2 MiB): one handle per chunk, then a fresh range
    // with every chunk mapped and made accessible.
    const uint64_t n = size / kChunk;
    for (uint64_t i = 0; i < n; ++i) {
      if (!device_.CreateHandle(kChunk)) {
        for (uint64_t j = 0; j < i; ++j) device_.ReleaseHandle(kChunk);
        return false;
      }
    }
    std::optional<uint64_t> ptr = device_.ReserveAddress(size);
    if (!ptr) {
      for (uint64_t j = 0; j < n; ++j) device_.ReleaseHandle(kChunk);
      return false;
    }
    device_.CountMap(n, kChunk);
    device_.CountSetAccess(n, kChunk);
    block = blocks_.NewSegment(p.stream, size, *ptr, /*small=*/false);
    block->chunks.reserve(n);
    for (uint64_t i = 0; i < n; ++i) {
      Chunk* c = new Chunk;
      c->pblock = block;
      c->user = block;  // the new segment serves this request
      all_chunks_.insert(c);
      block->chunks.push_back(c);
    }
  }
  p.block = block;
  return true;
}

void GmlakeAllocator::ReleaseCachedBlocks() {
  for (bool small : {false, true}) {  // the large pool first
    blocks_.ForEachFree(small, [this](Block* block) {
      if (!block->is_split()) ReleaseBlock(block);
    });
  }
}

void GmlakeAllocator::ReleaseBlock(Block* block) {
  LOOM_CHECK(!block->allocated && !block->is_split() && !block->fused);
  if (!block->chunks.empty()) {
    // Stitched blocks mapping these chunks: cached ones are dropped, an
    // active one loses the chunk (it lies beyond what it uses) and is
    // dropped when freed.
    for (Chunk* c : block->chunks) {
      std::vector<Block*> stitched = c->stitched;
      for (Block* s : stitched) {
        if (s->state == SState::kActive) {
          s->doomed = true;
          std::replace(s->chunks.begin(), s->chunks.end(), c,
                       static_cast<Chunk*>(nullptr));
          c->stitched.erase(
              std::find(c->stitched.begin(), c->stitched.end(), s));
        } else {
          DropStitched(s);
        }
      }
    }
    for (Chunk* c : block->chunks) {
      LOOM_CHECK(c->user == nullptr && c->stitched.empty());
      device_.ReleaseHandle(kChunk);
      all_chunks_.erase(c);
      delete c;
    }
    block->chunks.clear();
    device_.CountUnmap(1, block->size);
    device_.FreeAddress(block->ptr, block->size);
  } else {
    device_.Free(block->ptr, block->size);
  }
  blocks_.ReleaseSegment(block);
}

Status GmlakeAllocator::Free(uint64_t address) {
  LOOM_ASSIGN_OR_RETURN(Block * block, blocks_.RemoveLive(address));
  stats_.allocated_bytes.Decrease(block->small, block->actual);
  block->actual = 0;
  if (block->fused) {
    std::vector<Block*> touched;
    for (uint64_t i = 0; i < block->used_chunks; ++i) {
      Chunk* c = block->chunks[i];
      LOOM_CHECK(c != nullptr && c->user == block);
      SetChunkUser(c, nullptr);
      touched.push_back(c->pblock);
    }
    block->used_chunks = 0;
    FreeIdleHeld(touched);
    if (block->doomed) {
      block->state = SState::kNone;
      DropStitched(block);
    } else {
      SetState(block,
               block->busy_chunks == 0 ? SState::kFree : SState::kFragmented);
    }
    return OkStatus();
  }
  for (Chunk* c : block->chunks) SetChunkUser(c, nullptr);
  FreeBlock(block);
  return OkStatus();
}

void GmlakeAllocator::FreeBlock(Block* block) {
  block->allocated = false;
  block->held = false;
  TryMerge(block, block->prev);
  TryMerge(block, block->next);
  blocks_.AddFree(block);
}

void GmlakeAllocator::TryMerge(Block* dst, Block* src) {
  if (src == nullptr || src->allocated) return;
  // The chunks follow the addresses: [src dst] or [dst src].
  auto at = dst->prev == src ? dst->chunks.begin() : dst->chunks.end();
  dst->chunks.insert(at, src->chunks.begin(), src->chunks.end());
  for (Chunk* c : src->chunks) c->pblock = dst;
  blocks_.RemoveFree(src);
  blocks_.Absorb(dst, src);
}

std::vector<std::pair<std::string, uint64_t>> GmlakeAllocator::Counters()
    const {
  return {{"stitches", num_stitches_},
          {"stitch_reuses", num_reuses_},
          {"stitched_blocks", num_stitched_}};
}

void GmlakeAllocator::EmptyCache() {
  ReleaseCachedBlocks();
  GarbageCollectStitched();
}

std::vector<AddressRange> GmlakeAllocator::MappedRanges() const {
  std::vector<AddressRange> ranges;
  blocks_.ForEachSegment([&ranges](const Block* head, uint64_t bytes) {
    if (!head->fused) ranges.push_back({head->ptr, bytes});
  });
  for (const Block* s : stitched_) {
    for (size_t i = 0; i < s->chunks.size(); ++i) {
      if (s->chunks[i] == nullptr) continue;
      uint64_t address = s->ptr + i * kChunk;
      if (i > 0 && s->chunks[i - 1] != nullptr) {
        ranges.back().size += kChunk;
      } else {
        ranges.push_back({address, kChunk});
      }
    }
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const AddressRange& a, const AddressRange& b) {
              return a.address < b.address;
            });
  return ranges;
}

}  // namespace loom::whatif
