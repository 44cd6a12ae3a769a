#include "vmm/driver_contract.h"

#include <bit>

#include "base/check.h"

namespace loom::vmm {
namespace {

bool Aligned(uint64_t value, uint64_t granularity) {
  return granularity != 0 && value % granularity == 0;
}

// True when [a, a + as) and [b, b + bs) intersect.
bool Overlap(uint64_t a, uint64_t as, uint64_t b, uint64_t bs) {
  return a < b + bs && b < a + as;
}

}  // namespace

Status DriverContract::CheckCreate(int device, uint64_t size,
                                   uint64_t granularity) const {
  if (device < 0)
    return InvalidArgumentError("create: negative device {}", device);
  if (size == 0) return InvalidArgumentError("create: size 0");
  if (!Aligned(size, granularity)) {
    return InvalidArgumentError(
        "create: size {} is not a multiple of the granularity {}", size,
        granularity);
  }
  return OkStatus();
}

Status DriverContract::CheckRelease(uint64_t handle) const {
  auto it = handles_.find(handle);
  if (it == handles_.end()) {
    return InvalidArgumentError("release: handle {:#x} is not a live handle",
                                handle);
  }
  if (it->second.mapped_bytes != 0) {
    return FailedPreconditionError(
        "release: handle {:#x} still has {} bytes mapped; unmap them first",
        handle, it->second.mapped_bytes);
  }
  return OkStatus();
}

Status DriverContract::CheckReserve(uint64_t size, uint64_t alignment,
                                    uint64_t granularity) const {
  if (size == 0) return InvalidArgumentError("reserve: size 0");
  if (!Aligned(size, granularity)) {
    return InvalidArgumentError(
        "reserve: size {} is not a multiple of the granularity {}", size,
        granularity);
  }
  if (alignment != 0 &&
      (!std::has_single_bit(alignment) || !Aligned(alignment, granularity))) {
    return InvalidArgumentError(
        "reserve: alignment {} is not a power-of-two multiple of the "
        "granularity {}",
        alignment, granularity);
  }
  return OkStatus();
}

Status DriverContract::CheckUnreserve(uint64_t ptr, uint64_t size) const {
  auto it = reservations_.find(ptr);
  if (it == reservations_.end() || it->second != size) {
    return InvalidArgumentError(
        "unreserve: [{:#x}, +{}) is not exactly a live reservation", ptr, size);
  }
  auto m = mappings_.lower_bound(ptr);
  if (m != mappings_.end() && m->first < ptr + size) {
    return FailedPreconditionError(
        "unreserve: [{:#x}, +{}) still has a mapping at {:#x}; unmap first",
        ptr, size, m->first);
  }
  return OkStatus();
}

std::map<uint64_t, uint64_t>::const_iterator DriverContract::FindReservation(
    uint64_t ptr, uint64_t size) const {
  auto it = reservations_.upper_bound(ptr);
  if (it == reservations_.begin()) return reservations_.end();
  --it;
  if (ptr + size <= it->first + it->second) return it;
  return reservations_.end();
}

Status DriverContract::CheckMap(uint64_t ptr, uint64_t size, uint64_t handle,
                                uint64_t offset, uint64_t granularity) const {
  if (size == 0) return InvalidArgumentError("map: size 0");
  if (!Aligned(ptr, granularity) || !Aligned(size, granularity) ||
      !Aligned(offset, granularity)) {
    return InvalidArgumentError(
        "map: address {:#x}, size {} and offset {} must be multiples of the "
        "granularity {}",
        ptr, size, offset, granularity);
  }
  if (ptr + size < ptr) return InvalidArgumentError("map: range wraps around");
  auto h = handles_.find(handle);
  if (h == handles_.end()) {
    return InvalidArgumentError("map: handle {:#x} is not a live handle",
                                handle);
  }
  // CUDA maps whole handles only: an offset into a handle, or a size other
  // than the handle's, is CUDA_ERROR_NOT_SUPPORTED (measured on an H200,
  // CUDA 13.0; cuMemMap's documentation: "offset ... currently must be
  // zero").
  if (offset != 0) {
    return UnimplementedError(
        "map: offset {} into handle {:#x}: CUDA maps whole handles only "
        "(cuMemMap: CUDA_ERROR_NOT_SUPPORTED)",
        offset, handle);
  }
  if (size != h->second.size) {
    return UnimplementedError(
        "map: {} bytes of handle {:#x} of {} bytes: CUDA maps whole handles "
        "only (cuMemMap: CUDA_ERROR_NOT_SUPPORTED)",
        size, handle, h->second.size);
  }
  if (FindReservation(ptr, size) == reservations_.end()) {
    return InvalidArgumentError(
        "map: [{:#x}, +{}) is not inside one reservation", ptr, size);
  }
  auto m = mappings_.upper_bound(ptr);
  if (m != mappings_.begin()) {
    auto prev = std::prev(m);
    if (Overlap(prev->first, prev->second.size, ptr, size)) {
      return AlreadyExistsError(
          "map: [{:#x}, +{}) overlaps the mapping at {:#x}", ptr, size,
          prev->first);
    }
  }
  if (m != mappings_.end() && Overlap(m->first, m->second.size, ptr, size)) {
    return AlreadyExistsError("map: [{:#x}, +{}) overlaps the mapping at {:#x}",
                              ptr, size, m->first);
  }
  return OkStatus();
}

Status DriverContract::CheckUnmap(uint64_t ptr, uint64_t size) const {
  if (size == 0) return InvalidArgumentError("unmap: size 0");
  auto m = mappings_.find(ptr);
  if (m == mappings_.end()) {
    return InvalidArgumentError("unmap: no mapping starts at {:#x}", ptr);
  }
  if (size < m->second.size) {
    return InvalidArgumentError(
        "unmap: [{:#x}, +{}) is part of the mapping [{:#x}, +{}); CUDA unmaps "
        "whole mappings only (cuMemUnmap: CUDA_ERROR_INVALID_VALUE)",
        ptr, size, ptr, m->second.size);
  }
  if (size > m->second.size) {
    return InvalidArgumentError(
        "unmap: [{:#x}, +{}) goes past the mapping [{:#x}, +{}); one unmap "
        "takes exactly the range of one map (cuMemUnmap: \"the entire "
        "contiguous address range that was mapped to\")",
        ptr, size, ptr, m->second.size);
  }
  return OkStatus();
}

Status DriverContract::CheckWholeMappings(uint64_t ptr, uint64_t size,
                                          std::string_view what) const {
  if (size == 0) return InvalidArgumentError("{}: size 0", what);
  uint64_t cursor = ptr;
  auto m = mappings_.find(ptr);
  if (m == mappings_.end()) {
    return InvalidArgumentError("{}: no mapping starts at {:#x}", what, ptr);
  }
  while (cursor < ptr + size) {
    if (m == mappings_.end() || m->first != cursor) {
      return InvalidArgumentError(
          "{}: [{:#x}, +{}) has unmapped bytes at {:#x}", what, ptr, size,
          cursor);
    }
    cursor += m->second.size;
    ++m;
  }
  if (cursor != ptr + size) {
    return InvalidArgumentError(
        "{}: [{:#x}, +{}) ends inside the mapping that ends at {:#x}; only "
        "whole mappings can be unmapped",
        what, ptr, size, cursor);
  }
  return OkStatus();
}

Status DriverContract::CheckAccessible(uint64_t ptr, uint64_t size) const {
  if (size == 0) return OkStatus();
  uint64_t cursor = ptr;
  auto m = mappings_.upper_bound(ptr);
  if (m == mappings_.begin()) {
    return InvalidArgumentError("access: {:#x} is not mapped", ptr);
  }
  --m;
  while (cursor < ptr + size) {
    if (m == mappings_.end() || m->first > cursor ||
        m->first + m->second.size <= cursor) {
      return InvalidArgumentError("access: {:#x} is not mapped", cursor);
    }
    if (!m->second.accessible) {
      return FailedPreconditionError(
          "access: {:#x} is mapped but access was never granted (SetAccess)",
          cursor);
    }
    cursor = m->first + m->second.size;
    ++m;
  }
  return OkStatus();
}

void DriverContract::OnCreate(uint64_t handle, int device, uint64_t size) {
  bool inserted = handles_.emplace(handle, HandleState{device, size, 0}).second;
  LOOM_CHECK(inserted, "backend returned live handle {:#x} twice", handle);
  handle_bytes_ += size;
}

void DriverContract::OnRelease(uint64_t handle) {
  auto it = handles_.find(handle);
  LOOM_CHECK(it != handles_.end());
  handle_bytes_ -= it->second.size;
  handles_.erase(it);
}

void DriverContract::OnReserve(uint64_t ptr, uint64_t size) {
  LOOM_CHECK(FindReservation(ptr, 1) == reservations_.end(),
             "backend returned an address {:#x} inside a live reservation",
             ptr);
  reservations_[ptr] = size;
  reserved_bytes_ += size;
}

void DriverContract::OnUnreserve(uint64_t ptr) {
  auto it = reservations_.find(ptr);
  LOOM_CHECK(it != reservations_.end());
  reserved_bytes_ -= it->second;
  reservations_.erase(it);
}

void DriverContract::OnMap(uint64_t ptr, uint64_t size, uint64_t handle,
                           uint64_t offset) {
  mappings_[ptr] = Mapping{size, handle, offset, false};
  handles_.at(handle).mapped_bytes += size;
  mapped_bytes_ += size;
}

void DriverContract::OnUnmap(uint64_t ptr, uint64_t size) {
  auto m = mappings_.find(ptr);
  while (m != mappings_.end() && m->first < ptr + size) {
    handles_.at(m->second.handle).mapped_bytes -= m->second.size;
    mapped_bytes_ -= m->second.size;
    m = mappings_.erase(m);
  }
}

void DriverContract::OnSetAccess(uint64_t ptr, uint64_t size) {
  for (auto m = mappings_.find(ptr);
       m != mappings_.end() && m->first < ptr + size; ++m) {
    m->second.accessible = true;
  }
}

int DriverContract::HandleDevice(uint64_t handle) const {
  return handles_.at(handle).device;
}

uint64_t DriverContract::HandleSize(uint64_t handle) const {
  return handles_.at(handle).size;
}

int DriverContract::DeviceAt(uint64_t ptr) const {
  auto m = mappings_.upper_bound(ptr);
  LOOM_CHECK(m != mappings_.begin(), "{:#x} is not mapped", ptr);
  --m;
  LOOM_CHECK(ptr < m->first + m->second.size, "{:#x} is not mapped", ptr);
  return handles_.at(m->second.handle).device;
}

ContractCounts DriverContract::counts() const {
  return ContractCounts{handles_.size(), handle_bytes_,    reservations_.size(),
                        reserved_bytes_, mappings_.size(), mapped_bytes_};
}

MappingLayout DriverContract::Layout(int device) const {
  auto bucket = [](uint64_t size) { return std::bit_ceil(size); };
  MappingLayout layout;
  for (const auto& [handle, h] : handles_) {
    if (h.device != device) continue;
    ++layout.handles;
    layout.handle_bytes += h.size;
    MappingLayout::Bucket& b = layout.by_handle_size[bucket(h.size)];
    ++b.handles;
    b.bytes += h.size;
  }
  for (const auto& [ptr, m] : mappings_) {
    const HandleState& h = handles_.at(m.handle);
    if (h.device != device) continue;
    ++layout.mappings;
    layout.mapped_bytes += m.size;
    ++layout.by_handle_size[bucket(h.size)].mappings;
  }
  return layout;
}

void DriverContract::CheckInvariants() const {
  std::unordered_map<uint64_t, uint64_t> mapped_per_handle;
  uint64_t end_of_previous = 0;
  uint64_t mapped = 0;
  for (const auto& [ptr, m] : mappings_) {
    LOOM_CHECK(ptr >= end_of_previous,
               "mapping at {:#x} overlaps the previous one", ptr);
    end_of_previous = ptr + m.size;
    LOOM_CHECK(FindReservation(ptr, m.size) != reservations_.end(),
               "mapping at {:#x} outside every reservation", ptr);
    auto h = handles_.find(m.handle);
    LOOM_CHECK(h != handles_.end(), "mapping at {:#x} of a released handle",
               ptr);
    LOOM_CHECK(m.size == h->second.size,
               "mapping at {:#x} is not of its whole handle", ptr);
    mapped_per_handle[m.handle] += m.size;
    mapped += m.size;
  }
  LOOM_CHECK_EQ(mapped, mapped_bytes_);
  uint64_t handle_bytes = 0;
  for (const auto& [handle, state] : handles_) {
    LOOM_CHECK_EQ(state.mapped_bytes, mapped_per_handle[handle]);
    handle_bytes += state.size;
  }
  LOOM_CHECK_EQ(handle_bytes, handle_bytes_);
}

std::string DriverContract::DescribeLive() const {
  std::string out;
  for (const auto& [handle, state] : handles_) {
    fmt::format_to(std::back_inserter(out),
                   "handle {:#x}: {} bytes on device {}\n", handle, state.size,
                   state.device);
  }
  for (const auto& [ptr, size] : reservations_) {
    fmt::format_to(std::back_inserter(out), "reservation [{:#x}, +{})\n", ptr,
                   size);
  }
  for (const auto& [ptr, m] : mappings_) {
    fmt::format_to(std::back_inserter(out),
                   "mapping [{:#x}, +{}) of handle {:#x}\n", ptr, m.size,
                   m.handle);
  }
  return out;
}

}  // namespace loom::vmm
