#include "whatif/sim/expandable_segment.h"

#include "base/check.h"

namespace loom::whatif {

std::unique_ptr<ExpandableSegment> ExpandableSegment::Create(
    SimDevice* device, uint64_t stream, uint64_t address_space_size,
    uint64_t page_size) {
  LOOM_CHECK(page_size > 0 && address_space_size > 0);
  uint64_t max_pages = (address_space_size + page_size - 1) / page_size;
  std::optional<uint64_t> ptr = device->ReserveAddress(page_size * max_pages);
  if (!ptr) return nullptr;
  return std::unique_ptr<ExpandableSegment>(
      new ExpandableSegment(device, stream, *ptr, page_size, max_pages));
}

ExpandableSegment::ExpandableSegment(SimDevice* device, uint64_t stream,
                                     uint64_t ptr, uint64_t page_size,
                                     uint64_t max_pages)
    : device_(device),
      stream_(stream),
      ptr_(ptr),
      page_size_(page_size),
      max_pages_(max_pages) {}

ExpandableSegment::~ExpandableSegment() {
  for (const AddressRange& range : MappedRanges()) {
    AddressRange unmapped = Unmap(range);
    LOOM_CHECK_EQ(unmapped.size, range.size);
  }
  device_->FreeAddress(ptr_, size());
}

AddressRange ExpandableSegment::Map(AddressRange range) {
  LOOM_CHECK(range.address >= ptr_ && range.end() <= ptr_ + size(),
             "map outside the segment");
  uint64_t begin = (range.address - ptr_) / page_size_;  // segmentLeft
  uint64_t end = (range.end() - ptr_ + page_size_ - 1) / page_size_;
  LOOM_CHECK_EQ(ptr_ + begin * page_size_, range.address);
  if (begin == end) return {range.address, 0};
  if (mapped_.size() < end) mapped_.resize(end, false);
  for (uint64_t i = begin; i < end; ++i) {
    LOOM_CHECK(!mapped_[i], "page {} mapped twice", i);
    if (!device_->CreateHandle(page_size_)) {
      // cuMemCreate ran out of memory: release what this call created.
      for (uint64_t j = begin; j < i; ++j) device_->ReleaseHandle(page_size_);
      return {range.address, 0};
    }
  }
  for (uint64_t i = begin; i < end; ++i) mapped_[i] = true;
  device_->CountMap(end - begin, page_size_);  // one cuMemMap per page
  // One cuMemSetAccess for the whole range.
  device_->CountSetAccess(1, (end - begin) * page_size_);
  mapped_pages_ += end - begin;
  return {ptr_ + begin * page_size_, (end - begin) * page_size_};
}

AddressRange ExpandableSegment::Unmap(AddressRange range) {
  LOOM_CHECK(range.address >= ptr_ && range.end() <= ptr_ + size(),
             "unmap outside the segment");
  // Only whole pages strictly inside the range (segmentRight/segmentLeft).
  uint64_t begin = (range.address - ptr_ + page_size_ - 1) / page_size_;
  uint64_t end = (range.end() - ptr_) / page_size_;
  if (begin >= end) return {range.address, 0};
  device_->CountSynchronize();  // unmapHandles syncs the stream first
  for (uint64_t i = begin; i < end; ++i) {
    LOOM_CHECK(i < mapped_.size() && mapped_[i], "page {} not mapped", i);
    mapped_[i] = false;
    device_->CountUnmap(1, page_size_);
    device_->ReleaseHandle(page_size_);
  }
  while (!mapped_.empty() && !mapped_.back()) mapped_.pop_back();  // trim
  mapped_pages_ -= end - begin;
  return {ptr_ + begin * page_size_, (end - begin) * page_size_};
}

std::vector<AddressRange> ExpandableSegment::MappedRanges() const {
  std::vector<AddressRange> ranges;
  for (uint64_t i = 0; i < mapped_.size(); ++i) {
    if (!mapped_[i]) continue;
    uint64_t address = ptr_ + i * page_size_;
    if (!ranges.empty() && ranges.back().end() == address) {
      ranges.back().size += page_size_;
    } else {
      ranges.push_back({address, page_size_});
    }
  }
  return ranges;
}

bool ExpandableSegment::IsMapped(uint64_t address) const {
  LOOM_CHECK(address >= ptr_ && address < ptr_ + size());
  uint64_t page = (address - ptr_) / page_size_;
  return page < mapped_.size() && mapped_[page];
}

}  // namespace loom::whatif
