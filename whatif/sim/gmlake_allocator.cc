// GmlakeAllocator: request path, primitive blocks, release. Stitching,
// reuse, StitchFree GC and the invariant checks are in gmlake_stitch.cc.
#include "whatif/sim/gmlake_allocator.h"

#include <algorithm>
#include <iterator>

#include "base/check.h"

namespace loom::whatif {

bool GmlakeAllocator::BySize::operator()(const Block* a, const Block* b) const {
  if (a->stream != b->stream) return a->stream < b->stream;
  if (a->size != b->size) return a->size < b->size;
  return a->ptr < b->ptr;
}

GmlakeAllocator::GmlakeAllocator(const GmlakeOptions& gmlake,
                                 const SimOptions& options)
    : options_(gmlake), device_(options.capacity) {
  stats_.max_split_size = options_.max_split_size;
}

GmlakeAllocator::~GmlakeAllocator() {
  for (Block* block : all_blocks_) delete block;
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

GmlakeAllocator::Block* GmlakeAllocator::NewBlock(uint64_t stream,
                                                  uint64_t size, uint64_t ptr,
                                                  bool small) {
  Block* block = new Block;
  block->stream = stream;
  block->size = size;
  block->ptr = ptr;
  block->small = small;
  all_blocks_.insert(block);
  return block;
}

void GmlakeAllocator::DeleteBlock(Block* block) {
  LOOM_CHECK_EQ(all_blocks_.erase(block), size_t{1});
  delete block;
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

  // GMLake's malloc: cache, stitch, new segment, then the fallbacks, each
  // followed by another stitching attempt.
  bool found = GetFreeBlock(p) || Stitch(p, 0);
  if (!found) {
    found =
        Realloc(p, /*is_retry=*/false) ||
        (ReleaseAvailableCachedBlocks(p) && Realloc(p, /*is_retry=*/false)) ||
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
  if (!block->fused) {
    uint64_t remaining = block->size - p.size;
    // should_split: 512 B in the small pool; whole chunks (>= 2 MiB left,
    // PyTorch wants > 1 MiB) in the large pool.
    bool split = block->small
                     ? remaining >= kMinBlockSize
                     : p.size < options_.max_split_size && remaining >= kChunk;
    if (split) {
      // The allocation takes the front; the remainder's chunks become free.
      Block* remaining_block = block;
      block = NewBlock(p.stream, p.size, remaining_block->ptr, p.small);
      block->prev = remaining_block->prev;
      if (block->prev) block->prev->next = block;
      block->next = remaining_block;
      remaining_block->prev = block;
      remaining_block->ptr += p.size;
      remaining_block->size -= p.size;
      if (!remaining_block->chunks.empty()) {
        auto& chunks = remaining_block->chunks;
        uint64_t keep = p.size / kChunk;
        block->chunks.assign(chunks.begin(), chunks.begin() + keep);
        chunks.erase(chunks.begin(), chunks.begin() + keep);
        for (Chunk* c : block->chunks) {
          c->pblock = block;
          c->user = block;  // was the same allocation: no sBlock changes
        }
        for (Chunk* c : chunks) SetChunkUser(c, nullptr);
      }
      PoolOf(p.small).insert(remaining_block);
    }
  }
  block->allocated = true;
  block->requested = orig_size;
  block->actual = p.size;
  bool inserted = allocated_.emplace(block->ptr, block).second;
  LOOM_CHECK(inserted, "address {:#x} handed out twice", block->ptr);
  stats_.allocation.Increase(p.small, 1);
  stats_.allocated_bytes.Increase(p.small, block->actual);
  stats_.requested_bytes.Increase(p.small, orig_size);
  if (block->size >= options_.max_split_size) {
    stats_.oversize_allocations.Increase(1);
  }
  return block->ptr;
}

bool GmlakeAllocator::GetFreeBlock(Params& p) {
  Pool& pool = PoolOf(p.small);
  Block key;
  key.stream = p.stream;
  key.size = p.size;
  auto it = pool.lower_bound(&key);
  if (it == pool.end() || (*it)->stream != p.stream) {
    // No primitive block fits: try a cached stitched block.
    return options_.defragment && !p.small && ReuseStitched(p);
  }
  if (p.size < options_.max_split_size &&
      (*it)->size >= options_.max_split_size) {
    return false;
  }
  if (p.size >= options_.max_split_size &&
      (*it)->size >= p.size + kLargeBuffer) {
    return false;
  }
  Block* block = *it;
  pool.erase(it);
  for (Chunk* c : block->chunks) {
    LOOM_CHECK(c->user == nullptr, "free pBlock with a used chunk");
    SetChunkUser(c, block);
  }
  p.block = block;
  return true;
}

bool GmlakeAllocator::Realloc(Params& p, bool is_retry) {
  if (is_retry) ++stats_.num_alloc_retries;
  const uint64_t size = p.alloc_size;
  Block* block = nullptr;
  if (p.small || !options_.defragment) {
    std::optional<uint64_t> ptr = device_.Malloc(size);
    if (!ptr) return false;
    block = NewBlock(p.stream, size, *ptr, p.small);
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
    device_.CountMap(n);
    device_.CountSetAccess(n);
    block = NewBlock(p.stream, size, *ptr, /*small=*/false);
    block->chunks.reserve(n);
    for (uint64_t i = 0; i < n; ++i) {
      Chunk* c = new Chunk;
      c->pblock = block;
      c->user = block;  // the new segment serves this request
      all_chunks_.insert(c);
      block->chunks.push_back(c);
    }
  }
  stats_.segment.Increase(p.small, 1);
  stats_.reserved_bytes.Increase(p.small, size);
  ++stats_.num_device_alloc;
  if (size >= options_.max_split_size) stats_.oversize_segments.Increase(1);
  p.block = block;
  return true;
}

bool GmlakeAllocator::ReleaseAvailableCachedBlocks(const Params& p) {
  if (options_.max_split_size == kNoMaxSplitSize) return false;
  Pool& pool = PoolOf(p.small);
  Block key;
  key.stream = p.stream;
  key.size = std::max(p.size, options_.max_split_size);
  auto it = pool.lower_bound(&key);
  if (it == pool.end() || (*it)->stream != p.stream || (*it)->is_split()) {
    if (it == pool.begin()) return false;
    uint64_t released = 0;
    --it;
    while (released < key.size && (*it)->size >= options_.max_split_size &&
           (*it)->stream == p.stream) {
      auto cur = it;
      bool is_first = cur == pool.begin();
      if (!is_first) --it;
      if (!(*cur)->is_split()) {  // only whole segments can be released
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

void GmlakeAllocator::ReleaseCachedBlocks() {
  for (Pool* pool : {&large_blocks_, &small_blocks_}) {
    for (auto it = pool->begin(); it != pool->end();) {
      Block* block = *it;
      ++it;
      if (!block->is_split()) ReleaseBlock(block);
    }
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
    device_.CountUnmap(1);
    device_.FreeAddress(block->ptr, block->size);
  } else {
    device_.Free(block->ptr, block->size);
  }
  stats_.segment.Decrease(block->small, 1);
  stats_.reserved_bytes.Decrease(block->small, block->size);
  ++stats_.num_device_free;
  if (block->size >= options_.max_split_size) {
    stats_.oversize_segments.Decrease(1);
  }
  LOOM_CHECK_EQ(PoolOf(block->small).erase(block), size_t{1});
  DeleteBlock(block);
}

Status GmlakeAllocator::Free(uint64_t address) {
  auto it = allocated_.find(address);
  if (it == allocated_.end()) {
    return InvalidArgumentError("free of {:#x}, which is not allocated",
                                address);
  }
  Block* block = it->second;
  allocated_.erase(it);
  stats_.allocation.Decrease(block->small, 1);
  stats_.allocated_bytes.Decrease(block->small, block->actual);
  stats_.requested_bytes.Decrease(block->small, block->requested);
  if (block->size >= options_.max_split_size) {
    stats_.oversize_allocations.Decrease(1);
  }
  block->requested = 0;
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
    block->allocated = false;
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
  Pool& pool = PoolOf(block->small);
  block->allocated = false;
  block->held = false;
  TryMerge(block, block->prev, pool);
  TryMerge(block, block->next, pool);
  bool inserted = pool.insert(block).second;
  LOOM_CHECK(inserted);
}

bool GmlakeAllocator::TryMerge(Block* dst, Block* src, Pool& pool) {
  if (src == nullptr || src->allocated) return false;
  if (dst->prev == src) {  // [src dst]
    dst->ptr = src->ptr;
    dst->prev = src->prev;
    if (dst->prev) dst->prev->next = dst;
    dst->chunks.insert(dst->chunks.begin(), src->chunks.begin(),
                       src->chunks.end());
  } else {  // [dst src]
    dst->next = src->next;
    if (dst->next) dst->next->prev = dst;
    dst->chunks.insert(dst->chunks.end(), src->chunks.begin(),
                       src->chunks.end());
  }
  for (Chunk* c : src->chunks) c->pblock = dst;
  dst->size += src->size;
  LOOM_CHECK_EQ(pool.erase(src), size_t{1});
  DeleteBlock(src);
  return true;
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
  for (const Block* head : all_blocks_) {
    if (head->fused || head->prev != nullptr) continue;
    uint64_t size = 0;
    for (const Block* b = head; b != nullptr; b = b->next) size += b->size;
    ranges.push_back({head->ptr, size});
  }
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
