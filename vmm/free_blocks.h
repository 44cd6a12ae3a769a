// FreeBlocks: the free blocks of a virtual space, indexed by offset and by
// size, with coalescing: the free list under the arena's best-fit placement
// (arena.h) and under the plan referee's shadow of it (plan_referee.h).
//
// Invariants: blocks are non-empty and never overlap or touch (a returned
// range merges with its free neighbours); the two indexes hold the same
// blocks. Not thread-safe.
#ifndef LOOM_VMM_FREE_BLOCKS_H_
#define LOOM_VMM_FREE_BLOCKS_H_

#include <cstdint>
#include <map>
#include <set>
#include <utility>

namespace loom::vmm {

class FreeBlocks {
 public:
  // (size, offset), ascending: best fit first.
  using BySize = std::set<std::pair<uint64_t, uint64_t>>;

  // Nothing free (ranges come with Give).
  FreeBlocks() = default;
  // The whole space [0, space) free.
  explicit FreeBlocks(uint64_t space) { Reset(space); }
  void Reset(uint64_t space);

  // The free blocks of at least `size` bytes, smallest first.
  BySize::const_iterator FirstFitting(uint64_t size) const {
    return by_size_.lower_bound({size, 0});
  }
  BySize::const_iterator end() const { return by_size_.end(); }
  bool empty() const { return by_offset_.empty(); }
  // The free block of the highest offset: (offset, size). REQUIRES: !empty.
  std::pair<uint64_t, uint64_t> Last() const { return *by_offset_.rbegin(); }

  // Takes [position, position + size) out of the free block at `block`.
  // REQUIRES: `block` is a free block's offset and holds the range.
  void Take(uint64_t block, uint64_t position, uint64_t size);
  // Returns [offset, offset + size), merged with its free neighbours.
  // REQUIRES: the range is not free (checked: `what` names the caller in
  // the failure).
  void Give(uint64_t offset, uint64_t size, const char* what);

  // Calls fn(offset, size) for every free block, by offset.
  template <typename Fn>
  void ForEach(Fn&& fn) const {
    for (const auto& [offset, size] : by_offset_) fn(offset, size);
  }

  // Checks the invariants; returns the free bytes. Every block lies below
  // `space`.
  uint64_t CheckInvariants(uint64_t space, const char* what) const;

 private:
  void Insert(uint64_t offset, uint64_t size);
  void Erase(std::map<uint64_t, uint64_t>::iterator it);
  std::map<uint64_t, uint64_t> by_offset_;  // offset -> size
  BySize by_size_;
};

}  // namespace loom::vmm

#endif  // LOOM_VMM_FREE_BLOCKS_H_
