// ExpandableSegment: one growable virtual range of PyTorch's
// expandable_segments:True mode (struct ExpandableSegment in
// c10/cuda/CUDACachingAllocator.cpp, PyTorch 2.11), on a SimDevice.
//
// A segment reserves `page_size * max_pages` bytes of address space once
// (PyTorch: 9/8 of the device memory, rounded up to pages) and backs it
// page by page: Map creates one physical handle per page (cuMemCreate),
// maps each page (cuMemMap) and sets access once for the new range
// (cuMemSetAccess); Unmap synchronises the stream, then unmaps and releases
// each page. Pages are never shared or split.
//
// Invariants: a page is mapped at most once; mapped_bytes() ==
// page_size * (number of mapped pages); the destructor unmaps every page
// and frees the reservation.
#ifndef LOOM_WHATIF_SIM_EXPANDABLE_SEGMENT_H_
#define LOOM_WHATIF_SIM_EXPANDABLE_SEGMENT_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "whatif/sim/device.h"

namespace loom::whatif {

class ExpandableSegment {
 public:
  // Reserves the address space; nullptr when the device's address space is
  // exhausted. REQUIRES: page_size > 0, address_space_size > 0, and
  // `device` outlives the segment.
  static std::unique_ptr<ExpandableSegment> Create(SimDevice* device,
                                                   uint64_t stream,
                                                   uint64_t address_space_size,
                                                   uint64_t page_size);
  ~ExpandableSegment();

  ExpandableSegment(const ExpandableSegment&) = delete;
  ExpandableSegment& operator=(const ExpandableSegment&) = delete;

  uint64_t ptr() const { return ptr_; }
  uint64_t size() const { return page_size_ * max_pages_; }
  uint64_t stream() const { return stream_; }
  uint64_t page_size() const { return page_size_; }
  uint64_t mapped_bytes() const { return mapped_pages_ * page_size_; }

  // Maps the pages covering `range` (rounded out to whole pages). Returns
  // the mapped range, or a range of size 0 at range.address when the device
  // is out of memory (handles created so far are released again).
  // REQUIRES: range.address is page aligned, inside the segment, and none
  // of the pages is mapped.
  AddressRange Map(AddressRange range);

  // Unmaps the pages lying entirely inside `range`; returns them (size 0
  // when there is none).
  AddressRange Unmap(AddressRange range);

  // The mapped address ranges, merged where contiguous, by address.
  std::vector<AddressRange> MappedRanges() const;

  // Whether the page containing `address` is mapped.
  // REQUIRES: address inside the segment.
  bool IsMapped(uint64_t address) const;

 private:
  ExpandableSegment(SimDevice* device, uint64_t stream, uint64_t ptr,
                    uint64_t page_size, uint64_t max_pages);

  SimDevice* device_;
  uint64_t stream_;
  uint64_t ptr_;
  uint64_t page_size_;
  uint64_t max_pages_;
  uint64_t mapped_pages_ = 0;
  std::vector<bool> mapped_;  // per page, grown on demand like handles_
};

}  // namespace loom::whatif

#endif  // LOOM_WHATIF_SIM_EXPANDABLE_SEGMENT_H_
