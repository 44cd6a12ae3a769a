#include "vmm/free_blocks.h"

#include <iterator>

#include "base/check.h"

namespace loom::vmm {

void FreeBlocks::Reset(uint64_t space) {
  by_offset_.clear();
  by_size_.clear();
  if (space > 0) Insert(0, space);
}

void FreeBlocks::Insert(uint64_t offset, uint64_t size) {
  by_offset_[offset] = size;
  by_size_.emplace(size, offset);
}

void FreeBlocks::Erase(std::map<uint64_t, uint64_t>::iterator it) {
  by_size_.erase({it->second, it->first});
  by_offset_.erase(it);
}

void FreeBlocks::Take(uint64_t block, uint64_t position, uint64_t size) {
  auto it = by_offset_.find(block);
  LOOM_CHECK(it != by_offset_.end());
  const uint64_t bsize = it->second;
  LOOM_CHECK(position >= block && position + size <= block + bsize);
  Erase(it);
  if (position > block) Insert(block, position - block);
  if (position + size < block + bsize) {
    Insert(position + size, block + bsize - position - size);
  }
}

void FreeBlocks::Give(uint64_t offset, uint64_t size, const char* what) {
  uint64_t start = offset;
  uint64_t length = size;
  auto next = by_offset_.lower_bound(offset);
  if (next != by_offset_.end()) {
    LOOM_CHECK(next->first >= offset + size,
               "{} free of a range overlapping a free block", what);
    if (next->first == offset + size) {
      length += next->second;
      Erase(next);
    }
  }
  auto after = by_offset_.lower_bound(offset);
  if (after != by_offset_.begin()) {
    auto prev = std::prev(after);
    LOOM_CHECK(prev->first + prev->second <= offset,
               "{} free of a range overlapping a free block", what);
    if (prev->first + prev->second == offset) {
      start = prev->first;
      length += prev->second;
      Erase(prev);
    }
  }
  Insert(start, length);
}

uint64_t FreeBlocks::CheckInvariants(uint64_t space, const char* what) const {
  uint64_t free_bytes = 0;
  uint64_t previous_end = 0;
  bool first = true;
  for (const auto& [offset, size] : by_offset_) {
    LOOM_CHECK(size > 0 && offset + size <= space);
    LOOM_CHECK(first || offset > previous_end,
               "{} free blocks touch or overlap at {}", what, offset);
    LOOM_CHECK(by_size_.contains({size, offset}));
    previous_end = offset + size;
    first = false;
    free_bytes += size;
  }
  LOOM_CHECK_EQ(by_size_.size(), by_offset_.size());
  return free_bytes;
}

}  // namespace loom::vmm
