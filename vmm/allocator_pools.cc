// The allocator's CUDA-graph pools (see BeginAllocateToPool in allocator.h).
#include <algorithm>

#include "vmm/allocator.h"

namespace loom::vmm {
Allocator::GraphPool* Allocator::PoolFor(Stream stream) const {
  for (const std::unique_ptr<GraphPool>& pool : pools_) {
    if (pool->open && pool->filter(stream)) return pool.get();
  }
  return nullptr;
}

StatusOr<DevicePtr> Allocator::AllocatePooled(GraphPool& pool, uint64_t size,
                                              Stream stream) {
  uint64_t block = 0;
  LOOM_ASSIGN_OR_RETURN(DevicePtr ptr,
                        AllocateInPool(pool, size, stream, &block));
  live_.Insert(ptr,
               Allocation{size, stream, Where::kArena, true, false, false, 0});
  pool_allocations_[ptr] = PoolAllocation{&pool, block};
  ++pool.live;
  stats_.allocated_bytes.Increase(size);
  stats_.active_bytes.Increase(size);
  stats_.allocation.Increase(1);
  stats_.dynamic_bytes.Increase(size);
  return ptr;
}

StatusOr<DevicePtr> Allocator::AllocateInPool(GraphPool& pool, uint64_t size,
                                              Stream stream, uint64_t* block) {
  // The smallest free block of the pool that fits (its kernels follow the
  // graph's order, so the pool's own memory is reused without a fence).
  size_t best = pool.free_blocks.size();
  for (size_t i = 0; i < pool.free_blocks.size(); ++i) {
    const uint64_t b = pool.free_blocks[i].second;
    if (b >= size && (best == pool.free_blocks.size() ||
                      b < pool.free_blocks[best].second)) {
      best = i;
    }
  }
  if (best != pool.free_blocks.size()) {
    const auto [ptr, b] = pool.free_blocks[best];
    pool.free_blocks[best] = pool.free_blocks.back();
    pool.free_blocks.pop_back();
    stats_.graph_pool_bytes -= b;
    *block = b;
    // The arena still counts the block live; it serves this request now.
    return ptr;
  }
  LOOM_ASSIGN_OR_RETURN(DevicePtr ptr, AllocateInArena(size, stream, -1));
  *block = RoundUp(size, kArenaAlignment);
  return ptr;
}

void Allocator::ReturnPoolBlock(DevicePtr ptr, uint64_t block) {
  // A replay of the graph may still be queued on any stream it ran on: every
  // stream's work before now must be done before another stream reuses the
  // block (each stream's own later work is ordered after it anyway).
  std::vector<FreeTag> tags = tracker_.ReleasedEverywhere();
  arena_->Free(ptr, block, tags);
}

void Allocator::ForgetPoolIfDone(GraphPool* pool) {
  if (!pool->released || pool->live != 0) return;
  for (size_t i = 0; i < pools_.size(); ++i) {
    if (pools_[i].get() == pool) {
      pools_.erase(pools_.begin() + i);
      return;
    }
  }
}

Status Allocator::BeginAllocateToPool(PoolId id,
                                      std::function<bool(Stream)> filter) {
  std::lock_guard<FutexMutex> lock(mu_);
  if (!filter)
    return InvalidArgumentError("pool ({}, {}): no stream filter", id.first,
                                id.second);
  GraphPool* pool = nullptr;
  for (const std::unique_ptr<GraphPool>& p : pools_) {
    if (p->id == id && !p->released) pool = p.get();
  }
  if (pool == nullptr) {
    pools_.push_back(std::make_unique<GraphPool>());
    pool = pools_.back().get();
    pool->id = id;
  }
  if (!pool->open) ++open_pools_;
  pool->open = true;
  pool->filter = std::move(filter);
  return OkStatus();
}

Status Allocator::EndAllocateToPool(PoolId id) {
  std::lock_guard<FutexMutex> lock(mu_);
  for (const std::unique_ptr<GraphPool>& p : pools_) {
    if (p->id == id && !p->released) {
      if (p->open) --open_pools_;
      p->open = false;
      return OkStatus();
    }
  }
  return InvalidArgumentError("end of allocation to unknown pool ({}, {})",
                              id.first, id.second);
}

Status Allocator::ReleasePool(PoolId id) {
  std::lock_guard<FutexMutex> lock(mu_);
  tracker_.NewCall();
  for (const std::unique_ptr<GraphPool>& p : pools_) {
    if (p->id != id || p->released) continue;
    if (p->open) --open_pools_;
    p->open = false;
    p->released = true;
    for (const auto& [ptr, block] : p->free_blocks) {
      ReturnPoolBlock(ptr, block);
      stats_.graph_pool_bytes -= block;
    }
    p->free_blocks.clear();
    ForgetPoolIfDone(p.get());
    return OkStatus();
  }
  return InvalidArgumentError("release of unknown pool ({}, {})", id.first,
                              id.second);
}

}  // namespace loom::vmm
