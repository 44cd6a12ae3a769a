// GmlakeAllocator: stitched blocks (get_fused_fragmented_blocks), reuse of
// cached stitched blocks (get_free_block's fused path), chunk bookkeeping,
// StitchFree garbage collection, and the invariant checks.
#include <algorithm>
#include <iterator>
#include <limits>

#include "base/check.h"
#include "whatif/sim/gmlake_allocator.h"

namespace loom::whatif {

void GmlakeAllocator::SetState(Block* sblock, SState state) {
  if (sblock->state == SState::kFree) {
    LOOM_CHECK_EQ(free_fused_.erase(sblock), size_t{1});
  } else if (sblock->state == SState::kFragmented) {
    LOOM_CHECK_EQ(fragmented_.erase(sblock), size_t{1});
  }
  sblock->state = state;
  if (state == SState::kFree) {
    LOOM_CHECK(free_fused_.insert(sblock).second);
  } else if (state == SState::kFragmented) {
    LOOM_CHECK(fragmented_.insert(sblock).second);
  }
}

void GmlakeAllocator::SetChunkUser(Chunk* chunk, Block* user) {
  const bool was_used = chunk->user != nullptr;
  chunk->user = user;
  const bool used = user != nullptr;
  if (was_used == used) return;
  for (Block* s : chunk->stitched) {
    if (used) {
      ++s->busy_chunks;
      if (s->state == SState::kFree) SetState(s, SState::kFragmented);
    } else {
      LOOM_CHECK_GT(s->busy_chunks, uint64_t{0});
      --s->busy_chunks;
      if (s->busy_chunks == 0 && s->state == SState::kFragmented) {
        SetState(s, SState::kFree);
      }
    }
  }
}

void GmlakeAllocator::CarveHeld(Block* block) {
  LOOM_CHECK(!block->allocated && !block->fused && !block->chunks.empty());
  blocks_.RemoveFree(block);
  while (true) {
    // The leading run of chunks that are all used or all free.
    const std::vector<Chunk*>& chunks = block->chunks;
    const bool used = chunks.front()->user != nullptr;
    size_t n = 1;
    while (n < chunks.size() && (chunks[n]->user != nullptr) == used) ++n;
    Block* run = n < chunks.size() ? SplitFront(block, n * kChunk) : block;
    if (used) {
      run->allocated = true;
      run->held = true;
    } else {
      blocks_.AddFree(run);
    }
    if (run == block) return;
  }
}

void GmlakeAllocator::FreeIdleHeld(const std::vector<Block*>& pblocks) {
  std::vector<Block*> unique;
  for (Block* b : pblocks) {
    if (std::find(unique.begin(), unique.end(), b) == unique.end()) {
      unique.push_back(b);
    }
  }
  // Held blocks are allocated, so none is merged away before its turn.
  for (Block* b : unique) {
    if (!b->held) continue;
    bool idle = std::all_of(b->chunks.begin(), b->chunks.end(),
                            [](const Chunk* c) { return c->user == nullptr; });
    if (idle) FreeBlock(b);
  }
}

bool GmlakeAllocator::ReuseStitched(Params& p) {
  Block* s = BlockPool<Block>::LowerBound(free_fused_, p.stream, p.size);
  if (s == nullptr || static_cast<double>(s->size) >
                          static_cast<double>(p.size) * options_.reuse_limit) {
    return false;
  }
  SetState(s, SState::kActive);
  const uint64_t keep = p.size / kChunk;
  std::vector<Block*> touched;
  for (uint64_t i = 0; i < keep; ++i) {
    Chunk* c = s->chunks[i];
    LOOM_CHECK(c != nullptr && c->user == nullptr);
    SetChunkUser(c, s);
    if (std::find(touched.begin(), touched.end(), c->pblock) == touched.end()) {
      touched.push_back(c->pblock);
    }
  }
  for (Block* pblock : touched) CarveHeld(pblock);
  s->used_chunks = keep;
  ++num_reuses_;
  p.block = s;
  return true;
}

bool GmlakeAllocator::Stitch(Params& p, int time) {
  if (!options_.defragment || time < options_.defrag_level || p.small ||
      p.size < options_.frag_limit) {
    return false;
  }
  Block lo;
  lo.stream = p.stream;
  lo.size = 0;
  Block hi;
  hi.stream = p.stream;
  hi.size = std::numeric_limits<uint64_t>::max();
  hi.ptr = std::numeric_limits<uint64_t>::max();
  const BlockPool<Block>::FreeSet& large = blocks_.free_set(/*small=*/false);
  auto begin = large.lower_bound(&lo);
  auto end = large.lower_bound(&hi);
  if (begin == large.end() || (*begin)->stream != p.stream) {
    return false;
  }
  if (std::prev(end) == begin) return false;  // one free block cannot do
  // The largest free blocks of the stream, in descending size.
  std::vector<Block*> chosen;
  uint64_t fuse = 0;
  for (auto it = end; it != begin && fuse < p.size;) {
    --it;
    chosen.push_back(*it);
    fuse += (*it)->size;
  }
  if (fuse < p.size) return false;
  const uint64_t excess = fuse - p.size;
  const uint64_t stitched_size = excess >= kChunk ? p.size : fuse;
  std::optional<uint64_t> va = device_.ReserveAddress(stitched_size);
  if (!va) return false;
  for (Block* b : chosen) {
    blocks_.RemoveFree(b);
    b->allocated = true;
    b->held = true;
  }
  if (excess >= kChunk) {
    // Keep only the chunks needed of the last block; the rest stays free.
    Block* rest = chosen.back();
    Block* front = SplitFront(rest, rest->size - excess);
    front->allocated = true;
    front->held = true;
    rest->allocated = false;
    rest->held = false;
    blocks_.AddFree(rest);
    chosen.back() = front;
  }
  Block* s = blocks_.New(p.stream, stitched_size, *va, /*small=*/false);
  s->fused = true;
  for (Block* b : chosen) {
    s->chunks.insert(s->chunks.end(), b->chunks.begin(), b->chunks.end());
  }
  LOOM_CHECK_EQ(s->chunks.size() * kChunk, stitched_size);
  s->state = SState::kActive;
  for (Chunk* c : s->chunks) SetChunkUser(c, s);  // others: fragmented
  for (Chunk* c : s->chunks) c->stitched.push_back(s);
  s->busy_chunks = s->chunks.size();
  s->used_chunks = s->chunks.size();
  device_.CountMap(s->chunks.size(), kChunk);
  device_.CountSetAccess(s->chunks.size(), kChunk);
  stitched_.insert(s);
  ++num_stitched_;
  ++num_stitches_;
  total_fuse_size_ += stitched_size;
  if (total_fuse_size_ > options_.auto_gc_limit) GarbageCollectStitched();
  p.block = s;
  return true;
}

void GmlakeAllocator::DropStitched(Block* s) {
  LOOM_CHECK(s->fused && s->state != SState::kActive);
  SetState(s, SState::kNone);
  for (Chunk* c : s->chunks) {
    if (c == nullptr) continue;
    auto it = std::find(c->stitched.begin(), c->stitched.end(), s);
    LOOM_CHECK(it != c->stitched.end());
    c->stitched.erase(it);
  }
  LOOM_CHECK_EQ(stitched_.erase(s), size_t{1});
  --num_stitched_;
  device_.CountUnmap(1, s->size);
  device_.FreeAddress(s->ptr, s->size);
  blocks_.Delete(s);
}

void GmlakeAllocator::GarbageCollectStitched() {
  std::vector<Block*> victims(fragmented_.begin(), fragmented_.end());
  victims.insert(victims.end(), free_fused_.begin(), free_fused_.end());
  for (Block* s : victims) {
    total_fuse_size_ -= std::min(total_fuse_size_, s->size);
    DropStitched(s);
  }
}

Status GmlakeAllocator::CheckChains() const {
  auto always = [](const Block*, const Block*) { return true; };
  LOOM_RETURN_IF_ERROR(blocks_.CheckChains(always, always));
  uint64_t allocated[2] = {0, 0};
  for (Block* b : blocks_.blocks()) {
    if (b->fused) continue;
    bool in_pool = blocks_.free_set(b->small).count(b) > 0;
    if (in_pool == b->allocated) {
      return InternalError("block {:#x} (allocated={}) misfiled", b->ptr,
                           b->allocated);
    }
    if (b->held && !b->allocated) return InternalError("free held block");
    bool live = b->allocated && !b->held;
    auto it = blocks_.live().find(b->ptr);
    if (live != (it != blocks_.live().end() && it->second == b)) {
      return InternalError("block {:#x}: address map disagrees", b->ptr);
    }
    if (live) allocated[b->small ? 0 : 1] += b->actual;
    if (!b->chunks.empty() && b->chunks.size() * kChunk != b->size) {
      return InternalError("block {:#x}: {} chunks for {} bytes", b->ptr,
                           b->chunks.size(), b->size);
    }
    if (!b->small && options_.defragment && b->chunks.empty()) {
      return InternalError("large block {:#x} without chunks", b->ptr);
    }
    for (const Chunk* c : b->chunks) {
      if (c->pblock != b) return InternalError("chunk owner mismatch");
      const Block* want = live ? b : nullptr;
      if (b->held ? (c->user == nullptr || !c->user->fused) : c->user != want) {
        return InternalError("block {:#x}: chunk user disagrees", b->ptr);
      }
    }
  }
  uint64_t reserved[2] = {0, 0};
  blocks_.ForEachSegment([&reserved](const Block* head, uint64_t bytes) {
    if (!head->fused) reserved[head->small ? 0 : 1] += bytes;
  });
  for (const Block* s : stitched_) {
    if (s->state == SState::kActive) allocated[1] += s->actual;
  }
  const StatType types[2] = {StatType::kSmallPool, StatType::kLargePool};
  for (int i = 0; i < 2; ++i) {
    if (stats_.reserved_bytes[types[i]].current != int64_t(reserved[i]) ||
        stats_.allocated_bytes[types[i]].current != int64_t(allocated[i])) {
      return InternalError(
          "pool {}: reserved {} / allocated {} but blocks sum to {} / {}", i,
          stats_.reserved_bytes[types[i]].current,
          stats_.allocated_bytes[types[i]].current, reserved[i], allocated[i]);
    }
  }
  return OkStatus();
}

Status GmlakeAllocator::CheckChunks() const {
  // No chunk backs two live allocations.
  std::unordered_set<const Chunk*> in_use;
  for (const auto& [address, b] : blocks_.live()) {
    uint64_t n = b->fused ? b->used_chunks : b->chunks.size();
    if (b->fused && n * kChunk < b->actual) {
      return InternalError("sBlock {:#x} uses too few chunks", address);
    }
    for (uint64_t i = 0; i < n; ++i) {
      const Chunk* c = b->chunks[i];
      if (c == nullptr || c->user != b || !in_use.insert(c).second) {
        return InternalError("allocation {:#x}: chunk {} shared or lost",
                             address, i);
      }
    }
  }
  size_t users = 0;
  for (const Chunk* c : all_chunks_) {
    if (c->user != nullptr) ++users;
    if (blocks_.blocks().count(c->pblock) == 0) {
      return InternalError("orphan chunk");
    }
    for (const Block* s : c->stitched) {
      if (stitched_.count(const_cast<Block*>(s)) == 0 ||
          std::find(s->chunks.begin(), s->chunks.end(), c) == s->chunks.end()) {
        return InternalError("chunk maps a stale sBlock");
      }
    }
  }
  if (users != in_use.size()) {
    return InternalError("{} chunks used, {} by live allocations", users,
                         in_use.size());
  }
  for (const Block* s : stitched_) {
    uint64_t busy = 0;
    for (const Chunk* c : s->chunks) busy += c != nullptr && c->user != nullptr;
    if (busy != s->busy_chunks) {
      return InternalError("sBlock {:#x}: busy {} but {} chunks used", s->ptr,
                           s->busy_chunks, busy);
    }
    bool in_free = free_fused_.count(const_cast<Block*>(s)) > 0;
    bool in_fragmented = fragmented_.count(const_cast<Block*>(s)) > 0;
    bool ok = false;
    switch (s->state) {
      case SState::kActive:
        ok = !in_free && !in_fragmented && blocks_.live().count(s->ptr) > 0;
        break;
      case SState::kFree:
        ok = in_free && busy == 0 && !s->doomed;
        break;
      case SState::kFragmented:
        ok = in_fragmented && busy > 0 && !s->doomed;
        break;
      case SState::kNone:
        ok = false;
        break;
    }
    if (!ok) return InternalError("sBlock {:#x} in a wrong state", s->ptr);
  }
  if (free_fused_.size() + fragmented_.size() > stitched_.size()) {
    return InternalError("stale cached sBlocks");
  }
  return OkStatus();
}

Status GmlakeAllocator::CheckInvariants() const {
  LOOM_RETURN_IF_ERROR(CheckChains());
  LOOM_RETURN_IF_ERROR(CheckChunks());
  const int64_t reserved = stats_.reserved_bytes.all().current;
  if (reserved != static_cast<int64_t>(device_.physical_used())) {
    return InternalError("reserved_bytes {} but the device holds {}", reserved,
                         device_.physical_used());
  }
  if (stats_.allocated_bytes.all().current > reserved) {
    return InternalError("allocated {} > reserved {}",
                         stats_.allocated_bytes.all().current, reserved);
  }
  if (num_stitched_ != stitched_.size()) {
    return InternalError("stitched count {} vs {}", num_stitched_,
                         stitched_.size());
  }
  return OkStatus();
}

}  // namespace loom::whatif
