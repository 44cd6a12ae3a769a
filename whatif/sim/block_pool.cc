#include "whatif/sim/block_pool.h"

namespace loom::whatif {

BlockPoolBase::BlockPoolBase(const BlockPoolOptions& options,
                             MemoryStats* stats)
    : options_(options), stats_(stats) {
  stats_->max_split_size = options_.max_split_size;
}

bool BlockPoolBase::OversizeRulesAllow(uint64_t block_size,
                                       uint64_t size) const {
  // Do not return an oversized block for a small request.
  if (size < options_.max_split_size && block_size >= options_.max_split_size) {
    return false;
  }
  // Allow an oversized block to be rounded up, but within a limit.
  if (size >= options_.max_split_size &&
      block_size >= size + options_.max_non_split_rounding) {
    return false;
  }
  return true;
}

bool BlockPoolBase::ShouldSplit(bool small, uint64_t block_size,
                                uint64_t size) const {
  LOOM_CHECK_LE(size, block_size);
  const uint64_t remaining = block_size - size;
  if (small) return remaining >= kMinBlockSize;
  return size < options_.max_split_size &&
         remaining >= options_.min_large_remainder;
}

void BlockPoolBase::CountSegment(bool small, uint64_t size) {
  stats_->segment.Increase(small, 1);
  stats_->reserved_bytes.Increase(small, size);
  if (size >= options_.max_split_size) stats_->oversize_segments.Increase(1);
  ++stats_->num_device_alloc;
}

void BlockPoolBase::UncountSegment(bool small, uint64_t size) {
  stats_->segment.Decrease(small, 1);
  stats_->reserved_bytes.Decrease(small, size);
  if (size >= options_.max_split_size) stats_->oversize_segments.Decrease(1);
  ++stats_->num_device_free;
}

void BlockPoolBase::CountAllocation(bool small, uint64_t block_size,
                                    uint64_t requested) {
  stats_->allocation.Increase(small, 1);
  stats_->requested_bytes.Increase(small, requested);
  if (block_size >= options_.max_split_size) {
    stats_->oversize_allocations.Increase(1);
  }
}

void BlockPoolBase::UncountAllocation(bool small, uint64_t block_size,
                                      uint64_t requested) {
  stats_->allocation.Decrease(small, 1);
  stats_->requested_bytes.Decrease(small, requested);
  if (block_size >= options_.max_split_size) {
    stats_->oversize_allocations.Decrease(1);
  }
}

}  // namespace loom::whatif
